// Image folders: scanning, decoding (stb_image, JPEG/PNG/BMP/PPM/PGM only) and the crop/resize transforms.
#include "io/images.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "base/thread_pool.h"
#include "engine/random.h"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_JPEG
#define STBI_ONLY_PNG
#define STBI_ONLY_BMP
#define STBI_ONLY_PNM
// Static, so GCC names every stb function this file does not call (stb's own header, not Kiln's code).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include <stb_image.h>
#pragma GCC diagnostic pop

namespace kiln::io {
namespace fs = std::filesystem;

namespace {
std::string lower_extension(const fs::path& p) {
  std::string e = p.extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return e;
}
bool is_image(const fs::path& p) {
  const std::string e = lower_extension(p);
  return e == ".jpg" || e == ".jpeg" || e == ".png" || e == ".bmp" || e == ".ppm" || e == ".pgm";
}
bool hidden(const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; }
// p is dir or inside it (both canonical).
bool within(const fs::path& p, const fs::path& dir) {
  return std::mismatch(dir.begin(), dir.end(), p.begin(), p.end()).first == dir.end();
}

uint32_t be32(const unsigned char* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3];
}
constexpr unsigned char kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
bool is_png(const unsigned char* p, size_t n) { return n >= 8 && std::equal(kPngMagic, kPngMagic + 8, p); }

// A binary PGM or PPM's (P5, P6) header, read as stb_image reads it (whitespace and '#' comments
// between the fields). A number is read to its last digit, its value capped at kPnmCap (a side of
// 700000 px is 700000, not 70000 then a height of 0); `cut` when the data ends before the maxval's
// digits; `pixels` is where the samples start (one whitespace character after the maxval).
constexpr int64_t kPnmCap = int64_t(1) << 40;
struct PnmHeader {
  bool grey = false;
  int64_t width = 0, height = 0, maxval = 0;
  bool cut = false;
  size_t pixels = 0;
};
// False when the data is not a P5 or P6 file.
bool pnm_header(const unsigned char* data, size_t n, PnmHeader* h) {
  if (n < 2 || data[0] != 'P' || (data[1] != '5' && data[1] != '6')) return false;
  h->grey = data[1] == '5';
  size_t i = 2;
  const auto space = [](unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
  };
  const auto skip = [&] {
    for (;;) {
      while (i < n && space(data[i])) ++i;
      if (i >= n || data[i] != '#') return;
      while (i < n && data[i] != '\n' && data[i] != '\r') ++i;
    }
  };
  const auto number = [&] {
    int64_t v = 0;
    for (; i < n && data[i] >= '0' && data[i] <= '9'; ++i) v = std::min(v * 10 + (data[i] - '0'), kPnmCap);
    return v;
  };
  int64_t* fields[3] = {&h->width, &h->height, &h->maxval};
  for (int64_t* f : fields) {
    skip();
    if (i >= n) {
      h->cut = true;
      return true;
    }
    *f = number();
  }
  h->pixels = i + 1;
  return true;
}

// What is wrong with a P5/P6 header that stb_image takes (it reads a missing maxval as 0), or "".
std::string pnm_problem(const PnmHeader& h) {
  if (h.cut) return "truncated header: the PGM/PPM header ends before its maxval";
  if (h.maxval < 1 || h.maxval > 65535)
    return "a PGM/PPM maxval of " + std::string(h.maxval >= kPnmCap ? "over " : "") + std::to_string(h.maxval) +
           "; it must be 1 to 65535";
  return "";
}
}  // namespace

namespace {
// The one PNG chunk walker, over bytes fetched by `at(offset, length)` (nullptr when they cannot be
// read) from a file of `n` bytes. The rules are libpng's and PIL's: a chunk cut short is an error; a
// critical chunk's (IHDR, PLTE, IDAT, IEND: an upper-case first letter) CRC must match when `crcs` is
// set (an ancillary chunk's bad CRC is only a warning in libpng: accepted); a file that ends at a chunk
// boundary after image data but without IEND is accepted (stb_image and PIL decode it).
std::string walk_png(size_t n, const std::function<const unsigned char*(size_t, size_t)>& at_bytes, bool crcs,
                     bool* no_iend = nullptr) {
  const unsigned char* magic = n >= 8 ? at_bytes(0, 8) : nullptr;
  if (magic == nullptr || !is_png(magic, 8)) return "";
  size_t at = 8;
  bool image_data = false;
  while (true) {
    if (at == n && image_data) {  // no IEND after the image data: accepted
      if (no_iend != nullptr) *no_iend = true;
      return "";
    }
    const unsigned char* head = n - at >= 12 ? at_bytes(at, 8) : nullptr;
    if (head == nullptr) return "cut short after " + std::to_string(at) + " bytes (no IEND chunk)";
    const uint32_t len = be32(head);
    const std::string type(reinterpret_cast<const char*>(head + 4), 4);
    if (len > n - at - 12)
      return "chunk " + type + " at byte " + std::to_string(at) + " runs past the end of the file (cut short)";
    const bool critical = (head[4] & 0x20) == 0;
    if (crcs && critical) {
      const unsigned char* chunk = at_bytes(at + 4, size_t(len) + 8);
      if (chunk == nullptr) return "cannot read chunk " + type + " at byte " + std::to_string(at);
      const uint32_t want = be32(chunk + 4 + len);
      const uint32_t got = uint32_t(crc32(crc32(0L, Z_NULL, 0), chunk, uInt(len + 4)));
      if (got != want) return "chunk " + type + " at byte " + std::to_string(at) + " fails its CRC check (corrupt)";
    }
    if (type == "IDAT") image_data = true;
    at += 12 + size_t(len);
    if (type == "IEND") return "";
  }
}
}  // namespace

int64_t max_image_pixels() {
  const char* v = std::getenv("KILN_MAX_IMAGE_PIXELS");
  if (v == nullptr || *v == '\0') return kDefaultMaxImagePixels;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  KILN_CHECK(*end == '\0' && errno == 0 && n >= 0, "KILN_MAX_IMAGE_PIXELS=", v,
             ": not a whole number of pixels (0 for no limit; unset, ", kDefaultMaxImagePixels, ")");
  return n == 0 ? INT64_MAX : int64_t(n);
}

namespace {
// An image above the pixel limit, or "": a few hundred KB of PNG can hold 14000x14000 pixels that
// take gigabytes and many seconds to decode (PIL refuses the same, as a DecompressionBombError).
// w and h below 2^32 (a PNG's IHDR holds up to 2^32 - 1): their product fits 64 bits unsigned.
std::string too_many_pixels(int64_t w, int64_t h) {
  const int64_t limit = max_image_pixels();
  const uint64_t pixels = uint64_t(w) * uint64_t(h);
  if (pixels <= uint64_t(limit)) return "";
  return std::to_string(w) + "x" + std::to_string(h) + " is " + std::to_string(pixels) +
         " pixels, above the limit of " + std::to_string(limit) +
         " (a decompression bomb?); set KILN_MAX_IMAGE_PIXELS to raise it (0: no limit)";
}

// When stb_image refuses a PNG (its info and its load alike): an IHDR whose image is past stb_image's
// own limits, a side over 2^24 px or more than 2^30 bytes of pixels, as "WxH: too large ...", or "".
// stb_image then tries its other formats, and says "unknown image type" whatever the limit above is.
// `head`: the file's first n bytes (the IHDR is in the first 33).
std::string png_too_large(const unsigned char* head, size_t n) {
  if (n < 33 || !is_png(head, n) || be32(head + 8) != 13 || std::memcmp(head + 12, "IHDR", 4) != 0) return "";
  const uint64_t w = be32(head + 16), h = be32(head + 20);
  const int color = head[25];
  // The bytes per pixel stb_image reckons for the check: 4 for a palette's (expanded to RGBA), else
  // grey or RGB, with alpha.
  const uint64_t channels = color == 3 ? 4 : uint64_t(color & 2 ? 3 : 1) + (color & 4 ? 1 : 0);
  if (w == 0 || h == 0) return "";
  if (w <= (1u << 24) && h <= (1u << 24) && w * h * channels <= (uint64_t(1) << 30)) return "";
  return std::to_string(w) + "x" + std::to_string(h) +
         ": too large to decode (stb_image's limit of 2^30 bytes of pixels, a side of at most 2^24 px; "
         "KILN_MAX_IMAGE_PIXELS does not raise it)";
}
}  // namespace

std::string png_problem(const unsigned char* data, size_t n, bool* no_iend) {
  if (no_iend != nullptr) *no_iend = false;
  return walk_png(
      n, [&](size_t at, size_t) { return data + at; }, /*crcs=*/true, no_iend);
}

std::string image_header_problem(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return "cannot open the file";
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, std::fclose);
  int w = 0, h = 0, n = 0;
  if (!stbi_info_from_file(f, &w, &h, &n)) {
    std::error_code ec;
    if (fs::file_size(path, ec) == 0 && !ec) return "the file is empty (0 bytes), not an image";
    const std::string reason = stbi_failure_reason();
    unsigned char head[33];
    std::rewind(f);
    if (std::string big = png_too_large(head, std::fread(head, 1, sizeof head, f)); !big.empty()) {
      const uint64_t pw = be32(head + 16), ph = be32(head + 20);
      const std::string over = too_many_pixels(int64_t(pw), int64_t(ph));  // the limit a user sets, first
      return over.empty() ? big : over;
    }
    return "cannot decode the image (" + reason + ")";
  }
  if (w <= 0 || h <= 0) return "empty image " + std::to_string(w) + "x" + std::to_string(h);
  if (std::string big = too_many_pixels(w, h); !big.empty()) return big;
  // A PGM/PPM's maxval, as decode_image checks it: its header is in the first bytes (unless comments
  // make it longer than these, when it is left to the decode).
  {
    unsigned char start[4096];
    std::rewind(f);
    const size_t got = std::fread(start, 1, sizeof start, f);
    PnmHeader pnm;
    if (pnm_header(start, got, &pnm) && (!pnm.cut || got < sizeof start))
      if (std::string p = pnm_problem(pnm); !p.empty()) return "cannot decode the image (" + p + ")";
  }
  // A PNG's chunks by their lengths only, the same walk as png_problem's (the CRCs are checked when it
  // is decoded): a file cut short.
  if (std::fseek(f, 0, SEEK_END) != 0) return "cannot read the file";
  const long size = std::ftell(f);
  if (size < 0) return "cannot read the file";
  unsigned char head[8];
  const std::string p = walk_png(
      size_t(size),
      [&](size_t at, size_t len) -> const unsigned char* {
        if (len > sizeof head || std::fseek(f, long(at), SEEK_SET) != 0 || std::fread(head, 1, len, f) != len)
          return nullptr;
        return head;
      },
      /*crcs=*/false);
  return p.empty() ? "" : "corrupt PNG: " + p;
}

Tensor decode_image(const std::string& path, int64_t channels) {
  KILN_CHECK(channels == 1 || channels == 3, path, ": images decode to 1 or 3 channels, not ", channels);
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in, path, ": cannot open the file");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  KILN_CHECK(!in.bad(), path, ": read failed");
  // stb_image does not check a PNG's chunk CRCs: a flipped bit in the pixel data would decode silently.
  bool no_iend = false;
  if (const std::string p = png_problem(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), &no_iend);
      !p.empty())
    KILN_FAIL(path, ": corrupt PNG: ", p);
  // A PNG that ends after its image data without IEND, which libpng and PIL read: stb_image needs the
  // IEND, so it is added here.
  if (no_iend) bytes += std::string("\0\0\0\0IEND\xae\x42\x60\x82", 12);
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  int w = 0, h = 0, n = 0;
  // The size from the header before the pixels are decoded (the folder scan checks it too, but not
  // with check_headers off, nor for a file replaced since).
  if (stbi_info_from_memory(data, int(bytes.size()), &w, &h, &n)) {
    const std::string big = too_many_pixels(w, h);
    KILN_CHECK(big.empty(), path, ": ", big);
  } else if (std::string big = png_too_large(data, bytes.size()); !big.empty()) {
    const std::string over = too_many_pixels(int64_t(be32(data + 16)), int64_t(be32(data + 20)));
    KILN_FAIL(path, ": ", over.empty() ? big : over);
  }
  // A PGM/PPM's header as stb_image reads it, checked first: it takes a header cut before its maxval
  // (maxval 0) and a maxval of 0.
  PnmHeader pnm;
  const bool is_pnm = pnm_header(data, bytes.size(), &pnm);
  if (is_pnm)
    if (const std::string p = pnm_problem(pnm); !p.empty()) KILN_FAIL(path, ": cannot decode the image (", p, ")");
  // Always RGB (a grey file's value in all three; alpha dropped, as PIL's convert does): stb_image's own
  // grey conversion truncates (77 r + 150 g + 29 b) >> 8, darker than PIL's convert('L') by up to 1.
  std::vector<unsigned char> wide;  // a 16-bit PGM/PPM's pixels, decoded here
  unsigned char* px = nullptr;
  std::unique_ptr<unsigned char, void (*)(void*)> guard(nullptr, stbi_image_free);
  if (is_pnm && pnm.maxval > 255) {
    // 16-bit samples, big-endian, which stb_image returns byte-swapped and puts through its 8-bit grey
    // to RGB path. PIL (13) reads a PPM's as min(255, round(v / maxval * 255)), and a PGM's as mode I,
    // min(65535, round(v / maxval * 65535)), which convert('RGB') and convert('L') clip to 255: such a
    // PGM is white from v = maxval / 257 up (maxval 65535: v itself, clipped). Round is Python's, half
    // to even, as std::nearbyint.
    w = int(pnm.width);
    h = int(pnm.height);
    KILN_CHECK(pnm.width > 0 && pnm.height > 0, path, ": empty image ", pnm.width, "x", pnm.height);
    KILN_CHECK(pnm.width <= (1 << 24) && pnm.height <= (1 << 24), path, ": cannot decode the image (", pnm.width, "x",
               pnm.height, " is too large: a side over 16777216 px)");
    const std::string big = too_many_pixels(pnm.width, pnm.height);
    KILN_CHECK(big.empty(), path, ": ", big);
    const int64_t bands = pnm.grey ? 1 : 3, samples = pnm.width * pnm.height * bands;
    KILN_CHECK(pnm.pixels <= bytes.size() && int64_t(bytes.size() - pnm.pixels) / 2 >= samples, path,
               ": cut short: a 16-bit ", pnm.grey ? "PGM" : "PPM", " of ", pnm.width, "x", pnm.height, " needs ",
               samples * 2, " bytes of pixels after its header, the file has ",
               pnm.pixels <= bytes.size() ? bytes.size() - pnm.pixels : 0);
    const double out_max = pnm.grey ? 65535.0 : 255.0;
    wide.resize(size_t(pnm.width * pnm.height * 3));
    const unsigned char* in = data + pnm.pixels;
    for (int64_t i = 0; i < samples; ++i) {
      const double v = double(uint32_t(in[2 * i]) << 8 | in[2 * i + 1]);
      const double q = std::min(255.0, std::min(out_max, std::nearbyint(v / double(pnm.maxval) * out_max)));
      if (pnm.grey)
        wide[size_t(3 * i)] = wide[size_t(3 * i + 1)] = wide[size_t(3 * i + 2)] = uint8_t(q);
      else
        wide[size_t(i)] = uint8_t(q);
    }
    px = wide.data();
  } else {
    px = stbi_load_from_memory(data, int(bytes.size()), &w, &h, &n, 3);
    if (px == nullptr) {
      // stb_image calls an empty file an "unknown image type"; an interrupted copy is the likelier cause.
      const char* why = stbi_failure_reason();
      KILN_CHECK(!bytes.empty(), path, ": the file is empty (0 bytes), not an image");
      KILN_FAIL(path, ": cannot decode the image (", why, ")");
    }
    guard.reset(px);
  }
  KILN_CHECK(w > 0 && h > 0, path, ": empty image ", w, "x", h);
  // A PGM or PPM of maxval below 255 holds values 0..maxval, which stb_image returns as they are: PIL
  // scales them to 0-255, round(v / maxval * 255) (Python's round, half to even; a value above maxval
  // gives 255), so 50 of maxval 100 is 128, as here.
  if (is_pnm && pnm.maxval < 255) {
    uint8_t scaled[256];
    for (int v = 0; v < 256; ++v)
      scaled[v] = uint8_t(std::min(255.0, std::nearbyint(double(v) / double(pnm.maxval) * 255.0)));
    for (int64_t i = 0; i < int64_t(w) * h * 3; ++i) px[i] = scaled[px[i]];
  }
  Tensor t = make_tensor({channels, h, w}, DType::u8, kCPU);
  uint8_t* out = t.data<uint8_t>();
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      const unsigned char* rgb = px + (y * w + x) * 3;
      if (channels == 1) {
        // PIL's L = R 299/1000 + G 587/1000 + B 114/1000, in 16-bit fixed point and rounded (Convert.c's
        // L24); the weights sum to 65536, so a grey pixel keeps its value exactly.
        out[y * w + x] = uint8_t((19595u * rgb[0] + 38470u * rgb[1] + 7471u * rgb[2] + 0x8000u) >> 16);
      } else {
        for (int64_t ch = 0; ch < 3; ++ch) out[(ch * h + y) * w + x] = rgb[ch];
      }
    }
  return t;
}

namespace {
// One axis of PIL's resampling (ImagingResample with its bilinear filter, which torchvision's Resize
// calls on a PIL image): output pixel i is centred at b0 + (i + 0.5) * scale in the source, scale =
// bsize / out, and averages the source pixels under a triangle as wide as one output pixel when
// shrinking (support = scale, so every source pixel counts: antialiasing) or one source pixel when
// enlarging (plain bilinear). The window is cut at the image's edges and the weights renormalised.
struct Taps {
  std::vector<int64_t> first, count;  // per output pixel: its first source pixel and how many
  std::vector<double> weight;         // per output pixel, `stride` apart
  int64_t stride = 0;
};
Taps bilinear_taps(int64_t in, double b0, double bsize, int64_t out) {
  const double scale = bsize / double(out), filterscale = std::max(scale, 1.0), support = 1.0 * filterscale;
  Taps t;
  t.stride = int64_t(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out));
  t.count.resize(size_t(out));
  t.weight.assign(size_t(out * t.stride), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const double centre = b0 + (double(i) + 0.5) * scale;
    // Truncated as PIL's (int) casts; the clamps keep the window inside the image.
    const int64_t lo = std::max<int64_t>(int64_t(centre - support + 0.5), 0);
    const int64_t hi = std::min<int64_t>(int64_t(centre + support + 0.5), in);
    const int64_t n = std::min(std::max<int64_t>(hi - lo, 0), t.stride);
    double* w = t.weight.data() + i * t.stride;
    double sum = 0;
    for (int64_t x = 0; x < n; ++x) {
      const double d = std::abs((double(lo + x) - centre + 0.5) * (1.0 / filterscale));
      w[x] = d < 1.0 ? 1.0 - d : 0.0;
      sum += w[x];
    }
    if (sum != 0)
      for (int64_t x = 0; x < n; ++x) w[x] /= sum;
    t.first[size_t(i)] = lo;
    t.count[size_t(i)] = n;
  }
  return t;
}
}  // namespace

namespace {
// One axis's taps as the passes read them, in f32: output pixel i reads `taps` source pixels from
// start[i], its weights `taps` apart in `weight`. PIL's windows differ in length and are cut at the
// edges; here each is padded with zero weights to one length and shifted to stay inside [0, in), so the
// inner loops have one trip count and every read is in bounds. Adding 0 * v leaves an f32 sum as it
// was (v finite), so each output is still its PIL window summed in order.
struct Axis {
  std::vector<int64_t> start;
  std::vector<float> weight;
  int64_t taps = 0;
  int64_t lo = 0, hi = 0;  // the source pixels some window reads
};
Axis make_axis(int64_t in, double b0, double bsize, int64_t out) {
  const Taps t = bilinear_taps(in, b0, bsize, out);
  Axis a;
  a.taps = std::min(t.stride, in);
  a.start.resize(size_t(out));
  a.weight.assign(size_t(out * a.taps), 0.0f);
  a.lo = in;
  for (int64_t i = 0; i < out; ++i) {
    const int64_t first = t.first[size_t(i)], s = std::min(first, in - a.taps);
    for (int64_t x = 0; x < t.count[size_t(i)]; ++x)
      a.weight[size_t(i * a.taps + first - s + x)] = float(t.weight[size_t(i * t.stride + x)]);
    a.start[size_t(i)] = s;
    a.lo = std::min(a.lo, s);
    a.hi = std::max(a.hi, s + a.taps);
  }
  a.hi = std::max(a.hi, a.lo);
  return a;
}
// The tables for (in, box, out), kept per thread and axis: images of one size (an evaluation set's)
// reuse them rather than recompute them per image.
const Axis& cached_axis(int slot, int64_t in, double b0, double bsize, int64_t out) {
  struct Entry {
    int64_t in = -1, out = -1;
    double b0 = 0, bsize = 0;
    Axis axis;
  };
  thread_local Entry cache[2];
  Entry& e = cache[slot];
  if (e.in != in || e.out != out || e.b0 != b0 || e.bsize != bsize) {
    e.axis = make_axis(in, b0, bsize, out);
    e.in = in, e.out = out, e.b0 = b0, e.bsize = bsize;
  }
  return e.axis;
}

// A source pixel as the resampler reads it: float pixels as they are, 8-bit ones as float(v) / 255.0f
// (the values the loader used to convert the whole image to; now only the pixels a window reads).
// That division is computed as a multiplication in f64, several times faster than an f32 division
// and the same float for each of the 256 values (tests/test_images.cpp checks them all).
inline float pixel(float v) { return v; }
inline float pixel(uint8_t v) { return float(double(v) * (1.0 / 255.0)); }

// resize_bilinear on the region (ry, rx, rh, rw) of the image [C, H, W] at src: the box (y0, x0, bh,
// bw) is in the region's coordinates and the filter windows stop at the region's edges (the whole
// image for Resize, the cut-out box for RandomResizedCrop). Rows first, as PIL: the horizontal pass
// reads only the source rows some output row needs, 8 rows at a time laid side by side (column x of
// the 8 rows is 8 adjacent floats), so each tap is one multiply-add of 8 lanes that the compiler
// vectorises while each lane keeps its window's order; the vertical pass then runs along the
// intermediate's rows.
template <class T> void resample(const T* src, int64_t c, int64_t h, int64_t w, int64_t ry, int64_t rx, int64_t rh,
                                 int64_t rw, double y0, double x0, double bh, double bw, float* dst, int64_t out_h,
                                 int64_t out_w) {
  const Axis& ay = cached_axis(0, rh, y0, bh, out_h);
  const Axis& ax = cached_axis(1, rw, x0, bw, out_w);
  const int64_t rows = ay.hi - ay.lo, cols = ax.hi - ax.lo, n = c * rows;
  // R rows as two GCC/Clang vectors of 4 floats (an SSE register each, scalar code where there is no
  // SIMD): the autovectoriser turned the plain loop over R floats into shuffles and stack traffic.
  constexpr int64_t R = 8;
  typedef float Lanes __attribute__((vector_size(4 * sizeof(float))));
// Four lanes of a and b picked by index (0-3 a's, 4-7 b's). GCC before 12 lacks __builtin_shufflevector;
// its __builtin_shuffle takes the indices as a vector.
#if defined(__clang__) || !defined(__GNUC__) || __GNUC__ >= 12
#define KILN_SHUFFLE4(a, b, i, j, k, l) __builtin_shufflevector(a, b, i, j, k, l)
#else
  typedef int32_t LaneIndex __attribute__((vector_size(4 * sizeof(int32_t))));
#define KILN_SHUFFLE4(a, b, i, j, k, l) __builtin_shuffle(a, b, LaneIndex{i, j, k, l})
#endif
  // Kept per thread: a fresh 7 MB intermediate per 12-megapixel image costs as much in page faults
  // as the arithmetic.
  thread_local std::vector<float> tmp_buf, line_buf, side_buf;
  const int64_t cols4 = (cols + 3) / 4 * 4;  // the columns rounded up to whole vectors (the rest never read)
  tmp_buf.resize(size_t(n * out_w));
  line_buf.assign(size_t(R * cols4), 0.0f);
  side_buf.resize(size_t(cols4 * R));
  float *const tmp = tmp_buf.data(), *const line = line_buf.data(), *const side = side_buf.data();
  for (int64_t r0 = 0; r0 < n; r0 += R) {
    const int64_t nr = std::min(R, n - r0);
    // The R rows as floats, one after another (a loop the compiler vectorises), then side by side,
    // four columns of four rows at a time.
    for (int64_t r = 0; r < R; ++r) {
      const int64_t row = r0 + std::min(r, nr - 1);  // a short last block repeats its last row
      const T* p = src + ((row / rows) * h + ry + ay.lo + row % rows) * w + rx + ax.lo;
      float* f = line + r * cols4;
      for (int64_t x = 0; x < cols; ++x) f[x] = pixel(p[x]);
    }
    for (int64_t x = 0; x < cols4; x += 4)
      for (int64_t half = 0; half < R; half += 4) {
        Lanes a[4];
        for (int64_t r = 0; r < 4; ++r) std::memcpy(&a[r], line + (half + r) * cols4 + x, sizeof(Lanes));
        const Lanes t0 = KILN_SHUFFLE4(a[0], a[1], 0, 4, 1, 5), t1 = KILN_SHUFFLE4(a[2], a[3], 0, 4, 1, 5);
        const Lanes t2 = KILN_SHUFFLE4(a[0], a[1], 2, 6, 3, 7), t3 = KILN_SHUFFLE4(a[2], a[3], 2, 6, 3, 7);
        const Lanes col[4] = {KILN_SHUFFLE4(t0, t1, 0, 1, 4, 5), KILN_SHUFFLE4(t0, t1, 2, 3, 6, 7),
                              KILN_SHUFFLE4(t2, t3, 0, 1, 4, 5), KILN_SHUFFLE4(t2, t3, 2, 3, 6, 7)};
        for (int64_t j = 0; j < 4; ++j) std::memcpy(side + (x + j) * R + half, &col[j], sizeof(Lanes));
      }
#undef KILN_SHUFFLE4
    for (int64_t ox = 0; ox < out_w; ++ox) {
      const float* k = ax.weight.data() + ox * ax.taps;
      const float* q = side + (ax.start[size_t(ox)] - ax.lo) * R;
      Lanes lo = {}, hi = {};
      for (int64_t t = 0; t < ax.taps; ++t) {
        Lanes a, b;
        std::memcpy(&a, q + t * R, sizeof a);
        std::memcpy(&b, q + t * R + 4, sizeof b);
        lo += a * k[t];
        hi += b * k[t];
      }
      const float acc[R] = {lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]};
      for (int64_t r = 0; r < nr; ++r) tmp[(r0 + r) * out_w + ox] = acc[r];
    }
  }
  for (int64_t ch = 0; ch < c; ++ch)
    for (int64_t oy = 0; oy < out_h; ++oy) {
      const float* k = ay.weight.data() + oy * ay.taps;
      const float* q = tmp + (ch * rows + ay.start[size_t(oy)] - ay.lo) * out_w;
      float* o = dst + (ch * out_h + oy) * out_w;
      std::fill_n(o, out_w, 0.0f);
      for (int64_t t = 0; t < ay.taps; ++t)
        for (int64_t ox = 0; ox < out_w; ++ox) o[ox] += q[t * out_w + ox] * k[t];
    }
}
}  // namespace

void resize_bilinear(const float* src, int64_t c, int64_t h, int64_t w, double y0, double x0, double bh, double bw,
                     float* dst, int64_t out_h, int64_t out_w) {
  resample(src, c, h, w, 0, 0, h, w, y0, x0, bh, bw, dst, out_h, out_w);
}

void resize_bilinear(const uint8_t* src, int64_t c, int64_t h, int64_t w, double y0, double x0, double bh, double bw,
                     float* dst, int64_t out_h, int64_t out_w) {
  resample(src, c, h, w, 0, 0, h, w, y0, x0, bh, bw, dst, out_h, out_w);
}

void resize_box_bilinear(const uint8_t* src, int64_t c, int64_t h, int64_t w, int64_t y0, int64_t x0, int64_t bh,
                         int64_t bw, float* dst, int64_t out_h, int64_t out_w) {
  KILN_CHECK(y0 >= 0 && x0 >= 0 && bh >= 1 && bw >= 1 && y0 + bh <= h && x0 + bw <= w, "resize_box_bilinear: box ", bw,
             "x", bh, " at (", x0, ", ", y0, ") is not inside the ", w, "x", h, " image");
  resample(src, c, h, w, y0, x0, bh, bw, 0, 0, double(bh), double(bw), dst, out_h, out_w);
}

ImageFolderDataset::ImageFolderDataset(const std::string& root, ImageFolderOptions o, std::vector<std::string> classes)
    : root_(root), o_(std::move(o)), classes_(std::move(classes)) {
  try {
    scan();
  } catch (const fs::filesystem_error& e) {
    // A folder that cannot be listed, a link loop the checks missed: a Kiln error naming the path.
    KILN_FAIL(root_,
              ": cannot read the image folder (--data-dir): ", e.path1().empty() ? "" : e.path1().string() + ": ",
              e.code().message());
  }
}

void ImageFolderDataset::note(const std::string& line) {
  notes_.push_back(line);
  std::fprintf(stderr, "kiln: note: %s\n", line.c_str());
}

void ImageFolderDataset::scan() {
  KILN_CHECK(fs::is_directory(root_), root_, ": not a directory (an image folder holds one sub-directory per class)");
  KILN_CHECK(o_.size >= 1 && o_.resize >= o_.size, root_, ": image size ", o_.size, " and resize ", o_.resize,
             " (need 1 <= size <= resize)");
  KILN_CHECK(o_.channels == 1 || o_.channels == 3, root_, ": images decode to 1 or 3 channels, not ", o_.channels);
  KILN_CHECK(o_.mean.size() == size_t(o_.channels) && o_.std.size() == size_t(o_.channels), root_, ": normalisation has ",
             o_.mean.size(), " means and ", o_.std.size(), " stds for ", o_.channels, " channels");
  // Class folders: the sub-directories (or links to them), sorted; hidden ones (.ipynb_checkpoints,
  // .git) are not classes.
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(root_))
    if (!hidden(e.path()) && e.is_directory()) found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  const bool own_classes = classes_.empty();
  if (own_classes) classes_ = found;
  KILN_CHECK(!classes_.empty(), root_, ": no class sub-directories");
  for (const auto& f : found)
    KILN_CHECK(std::find(classes_.begin(), classes_.end(), f) != classes_.end(), root_, ": class '", f,
               "' is not among the training classes");
  KILN_CHECK(!own_classes || classes_.size() >= 2, root_, ": only one class folder ('", classes_[0],
             "'): a classifier needs two or more (one class trains at loss 0)");
  // Canonical class folders: a symbolic link into another class's folder would give its images two labels.
  std::vector<fs::path> class_dirs(classes_.size());
  std::map<fs::path, size_t> class_of_dir;  // canonical class folder -> its class
  for (size_t ci = 0; ci < classes_.size(); ++ci) {
    const fs::path dir = fs::path(root_) / classes_[ci];
    if (!fs::is_directory(dir)) continue;  // a class the validation folder lacks
    class_dirs[ci] = fs::canonical(dir);
    const auto [it, fresh] = class_of_dir.emplace(class_dirs[ci], ci);
    KILN_CHECK(fresh, dir.string(), ": the class folders '", classes_[it->second], "' and '", classes_[ci],
               "' are the same folder (a symbolic link?): images would get two labels");
  }
  // Sorted by path parts, a folder's sub-folders follow it at once: a class folder inside another is
  // next to one (as the map is sorted), so neighbours are all that need comparing.
  for (auto it = class_of_dir.begin(); it != class_of_dir.end() && std::next(it) != class_of_dir.end(); ++it)
    KILN_CHECK(!within(std::next(it)->first, it->first), (fs::path(root_) / classes_[std::next(it)->second]).string(),
               ": the class folders '", classes_[it->second], "' and '", classes_[std::next(it)->second],
               "' are one inside the other (a symbolic link?): images would get two labels");
  // The class whose folder holds `canon` (-1: none), and whether `canon` holds a class folder.
  auto class_holding = [&](const fs::path& canon) -> int64_t {
    for (fs::path a = canon;; a = a.parent_path()) {
      if (auto it = class_of_dir.find(a); it != class_of_dir.end()) return int64_t(it->second);
      if (a == a.parent_path()) return -1;
    }
  };
  auto holds_class = [&](const fs::path& canon) -> int64_t {
    auto it = class_of_dir.lower_bound(canon);
    return it != class_of_dir.end() && within(it->first, canon) ? int64_t(it->second) : -1;
  };
  std::map<fs::path, size_t> visited;  // canonical folders read so far, and for which class: each is read once
  for (size_t ci = 0; ci < classes_.size(); ++ci) {
    const fs::path dir = fs::path(root_) / classes_[ci];
    if (class_dirs[ci].empty()) continue;  // a class the validation folder lacks
    std::vector<std::string> files;
    visited.emplace(class_dirs[ci], ci);
    // Depth first, sorted; symbolic links to files and folders are followed. A broken link, a link to a
    // folder it is inside (a loop), a link to a file or folder of another class, or to a folder that
    // holds one, is an error naming it; a folder reached again within the class is left out with a note.
    std::vector<std::pair<fs::path, fs::path>> todo = {{dir, class_dirs[ci]}};  // (path, canonical)
    while (!todo.empty()) {
      const auto [here, here_canon] = todo.back();
      todo.pop_back();
      std::vector<fs::directory_entry> entries(fs::directory_iterator(here), fs::directory_iterator{});
      std::sort(entries.begin(), entries.end(),
                [](const auto& a, const auto& b) { return a.path().filename() < b.path().filename(); });
      std::vector<std::pair<fs::path, fs::path>> subdirs;
      for (const auto& e : entries) {
        const fs::path& p = e.path();
        if (hidden(p)) continue;
        KILN_CHECK(!e.is_symlink() || fs::exists(p), p.string(), ": a broken symbolic link (its target ",
                   fs::read_symlink(p).string(), " does not exist)");
        const fs::path canon = e.is_symlink() ? fs::canonical(p) : fs::path();
        if (e.is_symlink()) {
          const int64_t other = class_holding(canon);
          KILN_CHECK(other < 0 || other == int64_t(ci), p.string(), ": a symbolic link into the class folder '",
                     classes_[size_t(other)], "' (", canon.string(),
                     "): its images would get two labels (remove the link)");
        }
        if (e.is_directory()) {
          const fs::path dir_canon = e.is_symlink() ? canon : fs::canonical(p);
          if (e.is_symlink()) {
            KILN_CHECK(!within(here_canon, dir_canon), p.string(), ": a symbolic link to ", dir_canon.string(),
                       ", a folder it is inside: it would be read forever (remove the link)");
            const int64_t held = holds_class(dir_canon);
            KILN_CHECK(held < 0, p.string(), ": a symbolic link to ", dir_canon.string(),
                       ", which holds the class folder '", held < 0 ? "" : classes_[size_t(held)],
                       "': its images would get two labels (remove the link)");
          }
          const auto [seen, fresh] = visited.emplace(dir_canon, ci);
          if (!fresh) {
            KILN_CHECK(seen->second == ci, p.string(), ": a link to ", dir_canon.string(), ", which the class '",
                       classes_[seen->second], "' reads already: its images would get two labels (remove the link)");
            note(p.string() + ": left out, a link to (or the target of a link to) " + dir_canon.string() +
                 ", which is read already");
            continue;
          }
          subdirs.emplace_back(p, dir_canon);
          continue;
        }
        if (!e.is_regular_file()) continue;
        if (is_image(p))
          files.push_back(p.string());
        else
          ++other_[lower_extension(p).empty() ? "(none)" : lower_extension(p)];
      }
      todo.insert(todo.end(), subdirs.rbegin(), subdirs.rend());
    }
    // A validation folder's class may be empty (a small split can leave a rare class out); a training
    // one may not.
    if (files.empty()) {
      KILN_CHECK(!own_classes, dir.string(),
                 ": the class folder holds no .jpg, .jpeg, .png, .bmp, .ppm or .pgm images (remove it, or add images)");
      note(dir.string() + ": the class folder holds no images (none of this class is evaluated)");
    }
    // torchvision's order (ImageFolder walks sorted(os.walk(...)), each folder's files sorted): by folder
    // path, then by name, so a folder's own files come before its sub-folders' (c/z.png before
    // c/b/x.png), not sorted by full path.
    std::sort(files.begin(), files.end(), [](const std::string& a, const std::string& b) {
      const fs::path pa(a), pb(b);
      const std::string da = pa.parent_path().string(), db = pb.parent_path().string();
      return da != db ? da < db : pa.filename().string() < pb.filename().string();
    });
    for (auto& f : files) {
      files_.push_back(std::move(f));
      labels_.push_back(int64_t(ci));
    }
  }
  KILN_CHECK(!files_.empty(), root_, ": no .jpg, .jpeg, .png, .bmp, .ppm or .pgm images under its class directories");
  // A bad KILN_MAX_IMAGE_PIXELS is an error here, with or without the header checks: decode_image reads
  // it too, and there (skip_bad) it would count every image as a bad file.
  max_image_pixels();
  // Every image's header (format, dimensions; a PNG's chunk lengths) before any work: a bad file is an
  // error naming it now, not hours into a run, or (skip_bad) is left out here, once.
  if (o_.check_headers) {
    // In parallel (file opens dominate); the first bad file in list order is the one named.
    std::vector<std::string> problems(files_.size());
    parallel_for(0, int64_t(files_.size()), 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) problems[size_t(i)] = image_header_problem(files_[size_t(i)]);
    });
    size_t kept = 0;
    for (size_t i = 0; i < files_.size(); ++i) {
      const std::string& why = problems[i];
      if (!why.empty()) {
        KILN_CHECK(o_.skip_bad, files_[i], ": ", why);
        note_bad(files_[i], why);
        continue;
      }
      if (kept != i) {
        files_[kept] = std::move(files_[i]);
        labels_[kept] = labels_[i];
      }
      ++kept;
    }
    files_.resize(kept);
    labels_.resize(kept);
    KILN_CHECK(!files_.empty(), root_, ": every image is unreadable (", bad_.load(), " skipped)");
  }
}

std::string ImageFolderDataset::other_files_note() const {
  if (other_.empty()) return "";
  int64_t total = 0;
  std::string kinds;
  for (const auto& [ext, n] : other_) {
    total += n;
    kinds += (kinds.empty() ? "" : ", ") + ext + " " + std::to_string(n);
  }
  return root_ + ": left out " + std::to_string(total) +
         " file(s) that are not .jpg, .jpeg, .png, .bmp, .ppm or .pgm (" + kinds + ")";
}

void ImageFolderDataset::note_bad(const std::string& file, const std::string& why) const {
  std::lock_guard<std::mutex> lock(bad_mu_);
  if (!bad_files_.insert(file).second) return;  // counted and reported the first time only
  bad_.store(int64_t(bad_files_.size()));
  std::fprintf(stderr, "kiln: warning: skipped %s: %s\n", file.c_str(), why.c_str());
}

Batch ImageFolderDataset::get_batch(const std::vector<int64_t>& indices, uint64_t seed) const {
  const int64_t c = o_.channels, s = o_.size;
  std::vector<float> pixels;
  std::vector<int64_t> targets;
  for (int64_t n : indices) {
    KILN_CHECK(n >= 0 && n < size(), root_, ": sample ", n, " out of range [0, ", size(), ")");
    Tensor raw;
    try {
      raw = decode_image(files_[size_t(n)], c);
    } catch (const Error& e) {
      if (!o_.skip_bad) throw;
      std::string why = e.message();
      if (why.rfind(files_[size_t(n)] + ": ", 0) == 0) why = why.substr(files_[size_t(n)].size() + 2);
      note_bad(files_[size_t(n)], why);
      continue;
    }
    const int64_t h = raw.size(1), w = raw.size(2);
    const uint8_t* img = raw.data<uint8_t>();
    const size_t at = pixels.size();
    pixels.resize(at + size_t(c * s * s));
    float* out = pixels.data() + at;
    bool flip = false;
    if (o_.train) {
      // torchvision's RandomResizedCrop: a box of 8-100% of the area at an aspect of 3/4-4/3, cut out
      // and resized (so the resampling window stops at the box's edges). Python's round() is
      // half-to-even, as std::nearbyint.
      PhiloxStream rng(seed, uint64_t(n) << 8);
      const double area = double(h) * double(w);
      int64_t bh = 0, bw = 0, y0 = 0, x0 = 0;
      bool done = false;
      for (int attempt = 0; attempt < 10 && !done; ++attempt) {
        const double scale = 0.08 + 0.92 * rng.uniform();
        const double ratio = std::exp(std::log(3.0 / 4.0) + (std::log(4.0 / 3.0) - std::log(3.0 / 4.0)) * rng.uniform());
        bw = int64_t(std::nearbyint(std::sqrt(area * scale * ratio)));
        bh = int64_t(std::nearbyint(std::sqrt(area * scale / ratio)));
        if (bw >= 1 && bh >= 1 && bw <= w && bh <= h) {
          y0 = int64_t(std::floor(rng.uniform() * double(h - bh + 1)));
          x0 = int64_t(std::floor(rng.uniform() * double(w - bw + 1)));
          done = true;
        }
      }
      if (!done) {
        // No box fitted in 10 draws (a very wide or tall image): torchvision's fallback, the centre
        // box of the whole height or width at the aspect clamped to [3/4, 4/3].
        bh = h;
        bw = w;
        if (double(w) / double(h) < 3.0 / 4.0)
          bh = int64_t(std::nearbyint(double(w) / (3.0 / 4.0)));
        else if (double(w) / double(h) > 4.0 / 3.0)
          bw = int64_t(std::nearbyint(double(h) * (4.0 / 3.0)));
        y0 = (h - bh) / 2;
        x0 = (w - bw) / 2;
      }
      flip = rng.uniform() < 0.5f;
      resize_box_bilinear(img, c, h, w, y0, x0, bh, bw, out, s, s);
    } else {
      // torchvision's Resize(resize) then CenterCrop(size): the shorter side to `resize`, the longer
      // in proportion (truncated), then the centre size x size (its offset rounded half to even).
      // The crop's pixels of the resized image are resampled straight from the source, their windows
      // reaching past the crop as they do in the resized image.
      const int64_t shorter = std::min(h, w), longer = std::max(h, w);
      const int64_t rlong = int64_t(double(o_.resize * longer) / double(shorter));
      const int64_t rh = h <= w ? o_.resize : rlong, rw = h <= w ? rlong : o_.resize;
      const double sy = double(h) / double(rh), sx = double(w) / double(rw);
      const double top = std::nearbyint(double(rh - s) / 2.0), left = std::nearbyint(double(rw - s) / 2.0);
      resize_bilinear(img, c, h, w, top * sy, left * sx, double(s) * sy, double(s) * sx, out, s, s);
    }
    for (int64_t ch = 0; ch < c; ++ch) {
      float* p = out + ch * s * s;
      const float m = o_.mean[size_t(ch)], sd = o_.std[size_t(ch)];
      for (int64_t y = 0; y < s; ++y) {
        if (flip) std::reverse(p + y * s, p + (y + 1) * s);
        for (int64_t x = 0; x < s; ++x) p[y * s + x] = (p[y * s + x] - m) / sd;
      }
    }
    targets.push_back(labels_[size_t(n)]);
  }
  const int64_t b = int64_t(targets.size());
  KILN_CHECK(b > 0, root_, ": every image of a batch was unreadable (", indices.size(), " skipped)");
  Tensor x = make_tensor({b, c, s, s}, DType::f32, kCPU), y = make_tensor({b}, DType::i64, kCPU);
  std::copy(pixels.begin(), pixels.end(), x.data<float>());
  std::copy(targets.begin(), targets.end(), y.data<int64_t>());
  return {{"input", x}, {"target", y}};
}

}  // namespace kiln::io

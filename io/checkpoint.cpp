// Checkpoint writing and reading. Layout (all integers little-endian):
//   0  magic "KILNCKPT" | 8 u32 major | 12 u32 minor | 16 u64 manifest offset | 24 u64 manifest length
//   32 u32 manifest CRC32C | 36 u32 CRC32C of bytes 0..35 | 40..63 zero
//   64 blobs, each starting 64-byte aligned, zero padding between | manifest JSON | end of file
#include "io/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "io/atomic_file.h"
#include "io/json_parse.h"
#include "io/json_text.h"
#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace kiln::io {

static_assert(std::endian::native == std::endian::little, "checkpoint I/O assumes a little-endian host");

namespace {
using json = nlohmann::json;
constexpr uint64_t kHeaderBytes = 64, kAlign = 64;
constexpr uint64_t kMaxManifestBytes = uint64_t(1) << 32;
// The manifest Kiln writes nests about six levels (manifest, state, config, data_info, its lists);
// the limit leaves room for callers' own state and stops hostile nesting before it can crash.
constexpr int kMaxManifestDepth = 64;

struct CrcTable {
  uint32_t t[8][256];
  CrcTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};

template <typename T> void put(std::string& s, size_t at, T v) { std::memcpy(s.data() + at, &v, sizeof(T)); }
template <typename T> T get(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void pread_all(int fd, void* buf, size_t n, uint64_t offset, const std::string& path, const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    KILN_CHECK(r > 0, path, ": reading ", what, " at byte ", offset, " failed: ", r == 0 ? "unexpected end of file" : std::strerror(errno));
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
}

// The entries that hold bytes, by offset. An empty tensor takes no room, so it is left out of every check
// of the blobs' layout (overlaps, padding): the writer gives it the offset of the next blob.
std::vector<const CheckpointEntry*> blobs_by_offset(const std::vector<CheckpointEntry>& entries) {
  std::vector<const CheckpointEntry*> blobs;
  for (const auto& e : entries)
    if (e.nbytes) blobs.push_back(&e);
  std::sort(blobs.begin(), blobs.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  return blobs;
}
}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__SSE4_2__)
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) c = _mm_crc32_u64(c, get<uint64_t>(p));
  crc = uint32_t(c);
  for (; n > 0; --n, ++p) crc = _mm_crc32_u8(crc, *p);
#else
  static const CrcTable tab;
  for (; n >= 8; n -= 8, p += 8) {
    const uint64_t v = get<uint64_t>(p) ^ crc;
    crc = tab.t[7][v & 0xFF] ^ tab.t[6][(v >> 8) & 0xFF] ^ tab.t[5][(v >> 16) & 0xFF] ^ tab.t[4][(v >> 24) & 0xFF] ^
          tab.t[3][(v >> 32) & 0xFF] ^ tab.t[2][(v >> 40) & 0xFF] ^ tab.t[1][(v >> 48) & 0xFF] ^ tab.t[0][v >> 56];
  }
  for (; n > 0; --n, ++p) crc = (crc >> 8) ^ tab.t[0][(crc ^ *p) & 0xFF];
#endif
  return ~crc;
}

// ---- writing -------------------------------------------------------------------------------------

void save_checkpoint(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                     const std::string& state_json) {
  std::vector<std::pair<std::string, std::function<Tensor()>>> made;
  made.reserve(tensors.size());
  for (const auto& [name, t] : tensors) made.emplace_back(name, [&t = t] { return t; });
  save_checkpoint_lazy(path, made, state_json);
}

void save_checkpoint_lazy(const std::string& path,
                          const std::vector<std::pair<std::string, std::function<Tensor()>>>& tensors,
                          const std::string& state_json) {
  json state;
  try {
    state = json::parse(state_json);
  } catch (const std::exception& e) {
    KILN_FAIL(path, ": the checkpoint state is not valid JSON: ", e.what());
  }
  KILN_CHECK(state.is_object(), path, ": the checkpoint state must be a JSON object");
  std::set<std::string> names;
  for (const auto& [name, make] : tensors)
    KILN_CHECK(!name.empty() && names.insert(name).second, path, ": tensor name '", name, "' is empty or repeated");
  AtomicFile f(path);
  const std::string zeros(kAlign, '\0');
  f.write(zeros.data(), kHeaderBytes);  // the header, filled in at the end
  json entries = json::array();
  for (const auto& [name, make] : tensors) {
    if (f.size() % kAlign) f.write(zeros.data(), size_t(kAlign - f.size() % kAlign));
    const Tensor t = make();
    KILN_CHECK(t.defined(), path, ": tensor '", name, "' is undefined");
    Tensor c = t.detach();
    if (!c.device().is_cpu()) c = c.to(kCPU);
    c = c.contiguous();
    const uint64_t offset = f.size(), nbytes = c.nbytes();
    if (nbytes) f.write(c.raw_data(), size_t(nbytes));
    entries.push_back({{"name", name},
                       {"dtype", dtype_name(c.dtype())},
                       {"shape", std::vector<int64_t>(c.shape().begin(), c.shape().end())},
                       {"offset", offset},
                       {"nbytes", nbytes},
                       {"crc32c", nbytes ? crc32c(c.raw_data(), size_t(nbytes)) : crc32c(nullptr, 0)}});
  }
  const json manifest = {{"format", "kiln-checkpoint"},
                         {"version", {kCheckpointMajor, kCheckpointMinor}},
                         {"tensors", entries},
                         {"state", state}};
  const std::string text = io::dump_json(manifest);
  const uint64_t manifest_offset = f.size();
  f.write(text.data(), text.size());
  std::string header(kHeaderBytes, '\0');
  std::memcpy(header.data(), kCheckpointMagic, 8);
  put<uint32_t>(header, 8, kCheckpointMajor);
  put<uint32_t>(header, 12, kCheckpointMinor);
  put<uint64_t>(header, 16, manifest_offset);
  put<uint64_t>(header, 24, text.size());
  put<uint32_t>(header, 32, crc32c(text.data(), text.size()));
  put<uint32_t>(header, 36, crc32c(header.data(), 36));
  f.write_at(0, header.data(), header.size());
  f.commit();
}

// ---- reading -------------------------------------------------------------------------------------

CheckpointReader::CheckpointReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd_ >= 0, path, ": cannot open the checkpoint: ", std::strerror(errno));
  struct stat st{};
  KILN_CHECK(::fstat(fd_, &st) == 0, path, ": cannot read its size: ", std::strerror(errno));
  KILN_CHECK(!S_ISDIR(st.st_mode), path, ": is a directory, not a checkpoint file (name a step-*.kiln in it)");
  KILN_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  size_ = uint64_t(st.st_size);
  KILN_CHECK(size_ >= kHeaderBytes, path, ": ", size_, " bytes is too short for a checkpoint header (64 bytes); "
             "the file is truncated or not a Kiln checkpoint");
  unsigned char h[kHeaderBytes];
  pread_all(fd_, h, kHeaderBytes, 0, path, "the header");
  // A safetensors file is the likeliest other file given here (a run's model.safetensors): its first 8
  // bytes are its header's length, and the header a JSON object.
  const uint64_t st_header = get<uint64_t>(h);
  KILN_CHECK(std::memcmp(h, kCheckpointMagic, 8) == 0 || st_header > size_ - 8 || h[8] != '{', path,
             ": this is a safetensors file, not a Kiln checkpoint: load it with kiln.load (Python), or make a "
             "weights-only checkpoint of it with `kiln ckpt import ",
             path, " --model NAME --out FILE`");
  KILN_CHECK(std::memcmp(h, kCheckpointMagic, 8) == 0, path, ": not a Kiln checkpoint (the magic is not KILNCKPT)");
  KILN_CHECK(get<uint32_t>(h + 36) == crc32c(h, 36), path, ": the header is damaged (its checksum does not match)");
  major_ = get<uint32_t>(h + 8);
  minor_ = get<uint32_t>(h + 12);
  // Intact, in another format version: unsupported (its own error type), not damaged.
  if (major_ != kCheckpointMajor)
    throw UnsupportedCheckpointFormat(detail::str_cat(path, ": written in checkpoint format ", major_, ".", minor_,
                                                      " by ", major_ > kCheckpointMajor ? "a newer" : "an older",
                                                      " Kiln; this build reads format ", kCheckpointMajor, ".x"),
                                      __FILE__, __LINE__);
  manifest_offset_ = get<uint64_t>(h + 16);
  manifest_length_ = get<uint64_t>(h + 24);
  // Each bound is checked on its own, so no sum of two header fields can wrap around in a message
  // (a length of 2^64-1 once read "should span bytes 2185216..2185215").
  KILN_CHECK(manifest_offset_ >= kHeaderBytes, path, ": the header puts the manifest at byte ", manifest_offset_,
             ", inside the 64-byte header: the file is damaged");
  KILN_CHECK(manifest_length_ <= kMaxManifestBytes, path, ": the header gives the manifest ", manifest_length_,
             " bytes, more than the limit of ", kMaxManifestBytes, ": the file is damaged");
  KILN_CHECK(manifest_offset_ <= size_, path, ": truncated: the manifest should start at byte ", manifest_offset_,
             " but the file has ", size_, " bytes");
  KILN_CHECK(manifest_length_ <= size_ - manifest_offset_, path, ": truncated: the manifest should span bytes ",
             manifest_offset_, "..", manifest_offset_ + manifest_length_, " but the file has ", size_);
  KILN_CHECK(manifest_offset_ + manifest_length_ == size_, path, ": ", size_ - manifest_offset_ - manifest_length_,
             " unexpected bytes after the manifest");
  std::string text(size_t(manifest_length_), '\0');
  pread_all(fd_, text.data(), text.size(), manifest_offset_, path, "the manifest");
  KILN_CHECK(get<uint32_t>(h + 32) == crc32c(text.data(), text.size()), path,
             ": the manifest is damaged (its checksum does not match)");
  const json m = parse_json_bounded(
      text.data(), text.size(), kMaxManifestDepth,
      [&] {
        return detail::str_cat(path, ": the manifest nests JSON deeper than ", kMaxManifestDepth,
                               " levels (Kiln writes a few; the file is damaged or was not written by Kiln)");
      },
      path + ": the manifest is not valid JSON");
  // (m.value("format", "") would throw JSON's own type error at a format that is not a string)
  KILN_CHECK(m.is_object() && m.contains("format") && m["format"].is_string() &&
                 m["format"].get<std::string>() == "kiln-checkpoint" && m.contains("tensors") &&
                 m["tensors"].is_array(),
             path, ": the manifest lacks the kiln-checkpoint format tag or its tensor list");
  // The header's version decided above how to read the file; the manifest says it again, and a manifest
  // that says another (or something that is no version) is refused: the writer was wrong, or the file was
  // edited. A manifest without one is read by the header's.
  if (m.contains("version")) {
    const json& v = m["version"];
    KILN_CHECK(v.is_array() && v.size() == 2 && v[0].is_number_unsigned() && v[1].is_number_unsigned() &&
                   v[0].get<uint64_t>() == major_ && v[1].get<uint64_t>() == minor_,
               path, ": the manifest's version ", v.dump(), " is not the header's [", major_, ",", minor_,
               "]: the file was written or edited wrongly");
  }
  if (m.contains("state")) {
    KILN_CHECK(m["state"].is_object(), path, ": the manifest's state is not an object");
    state_ = m["state"].dump();
  } else {
    state_ = "{}";
  }
  std::set<std::string> seen;
  for (const auto& e : m["tensors"]) {
    CheckpointEntry c;
    try {
      c.name = e.at("name").get<std::string>();
      c.dtype = dtype_from_name(e.at("dtype").get<std::string>());
      if (!e.at("shape").is_array())  // a number or an object would be walked as if it were a list
        throw std::invalid_argument("tensor '" + c.name + "': shape " + e.at("shape").dump() +
                                    " is not a list of sizes");
      for (const auto& d : e.at("shape")) {
        // a size is a whole number in 0..2^63-1: 16.5 or 2^64-1 are refused, not read as 16 or -1
        if (!d.is_number_integer() ||
            (d.is_number_unsigned() ? d.get<uint64_t>() > uint64_t(INT64_MAX) : d.get<int64_t>() < 0))
          throw std::invalid_argument("tensor '" + c.name + "': shape " + e.at("shape").dump() + " holds " + d.dump() +
                                      ", which is not a whole number >= 0");
        c.shape.push_back(d.get<int64_t>());
      }
      // offset, nbytes and crc32c are JSON integers in range: get<uint64_t>() would read 64.7 as 64 and
      // get<uint32_t>() 2^32+5 as 5. -0 is 0, as in a shape and in safetensors.
      auto whole = [&](const char* field, uint64_t max) {
        const json& v = e.at(field);
        if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) || v.get<uint64_t>() > max)
          throw std::invalid_argument("tensor '" + c.name + "': \"" + field + "\" is " + v.dump() +
                                      ", which is not an integer in 0.." + std::to_string(max) +
                                      " (written without a fraction or exponent)");
        return v.get<uint64_t>();
      };
      c.offset = whole("offset", UINT64_MAX);
      c.nbytes = whole("nbytes", UINT64_MAX);
      c.crc = uint32_t(whole("crc32c", UINT32_MAX));
    } catch (const std::exception& ex) {
      KILN_FAIL(path, ": a manifest tensor entry is malformed (", ex.what(), ")");
    }
    KILN_CHECK(seen.insert(c.name).second, path, ": tensor '", c.name, "' appears twice");
    KILN_CHECK(c.shape.size() <= size_t(kMaxDims), path, ": tensor '", c.name, "' has ", c.shape.size(), " dims");
    uint64_t numel = 1;
    for (int64_t d : c.shape) {
      KILN_CHECK(d >= 0 && (d == 0 || numel <= (uint64_t(1) << 50) / uint64_t(d)), path, ": tensor '", c.name,
                 "' has a bad shape ", c.shape);
      numel *= uint64_t(d);
    }
    KILN_CHECK(numel * dtype_size(c.dtype) == c.nbytes, path, ": tensor '", c.name, "' holds ", c.nbytes,
               " bytes, its shape ", c.shape, " of ", c.dtype, " needs ", numel * dtype_size(c.dtype));
    KILN_CHECK(c.offset % kAlign == 0 && c.offset >= kHeaderBytes && c.offset <= manifest_offset_ &&
                   c.nbytes <= manifest_offset_ - c.offset,
               path, ": tensor '", c.name, "' lies at bytes ", c.offset, "..", c.offset + c.nbytes,
               ", outside the data area 64..", manifest_offset_, " or unaligned");
    entries_.push_back(std::move(c));
  }
  // An empty tensor may share its offset with a blob or lie inside one: it takes no bytes. Whether two
  // blobs overlap then depends on neither the manifest's order nor the sort's.
  const auto blobs = blobs_by_offset(entries_);
  for (size_t i = 1; i < blobs.size(); ++i)
    KILN_CHECK(blobs[i - 1]->offset + blobs[i - 1]->nbytes <= blobs[i]->offset, path, ": tensors '", blobs[i - 1]->name,
               "' and '", blobs[i]->name, "' overlap");
}

CheckpointReader::~CheckpointReader() {
  if (fd_ >= 0) ::close(fd_);
}

const CheckpointEntry* CheckpointReader::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

Tensor CheckpointReader::read(const std::string& name) const {
  const CheckpointEntry* e = find(name);
  KILN_CHECK(e, path_, ": no tensor '", name, "' in the checkpoint");
  Tensor t = make_tensor(e->shape, e->dtype, kCPU);
  if (e->nbytes) pread_all(fd_, t.raw_data(), size_t(e->nbytes), e->offset, path_, "tensor '" + name + "'");
  KILN_CHECK(crc32c(e->nbytes ? t.raw_data() : nullptr, size_t(e->nbytes)) == e->crc, path_, ": tensor '", name,
             "' is damaged (its checksum does not match)");
  if (e->dtype == DType::boolean) {
    const auto* b = static_cast<const uint8_t*>(t.raw_data());
    for (uint64_t i = 0; i < e->nbytes; ++i)
      KILN_CHECK(b[i] <= 1, path_, ": tensor '", name, "' is bool but holds the byte ", int(b[i]));
  }
  return t;
}

std::vector<std::string> CheckpointReader::verify() const {
  std::vector<std::string> problems;
  std::vector<unsigned char> buf;
  // Read in pieces: Kiln's gaps are under 64 bytes, but a hostile file's could be the whole disk.
  auto check_zero = [&](uint64_t from, uint64_t to) {
    for (uint64_t at = from; at < to;) {
      buf.resize(size_t(std::min<uint64_t>(to - at, uint64_t(1) << 20)));
      pread_all(fd_, buf.data(), buf.size(), at, path_, "padding");
      if (std::any_of(buf.begin(), buf.end(), [](unsigned char b) { return b != 0; })) {
        problems.push_back("bytes " + std::to_string(from) + ".." + std::to_string(to) +
                           " (padding) are not zero: the file is damaged");
        return;
      }
      at += buf.size();
    }
  };
  // Empty tensors are read (their checksum and entry checked) but take no room in the walk over the
  // blobs, whose gaps are the padding.
  for (const auto& e : entries_)
    if (!e.nbytes) try {
        (void)read(e.name);
      } catch (const Error& err) {
        problems.push_back(err.message());
      }
  uint64_t at = 40;  // the header's reserved bytes onwards
  for (const auto* e : blobs_by_offset(entries_)) {
    check_zero(at, e->offset);
    try {
      (void)read(e->name);
    } catch (const Error& err) {
      problems.push_back(err.message());
    }
    at = e->offset + e->nbytes;
  }
  check_zero(at, manifest_offset_);
  return problems;
}

}  // namespace kiln::io

// Safetensors reading and writing. A file is: u64 LE header length N, N bytes of JSON (padded with
// spaces), then the tensors' bytes, which must tile the rest of the file exactly.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "io/atomic_file.h"
#include "io/json_parse.h"
#include "io/json_text.h"

namespace kiln::io {

// Tensor bytes are stored little-endian and are used in place; a big-endian port would byte-swap.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests at most three levels: the root object, a tensor's object, its shape array.
constexpr int kMaxJsonDepth = 3;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeCode {
  const char* name;
  DType dtype;
};
constexpr DTypeCode kDTypes[] = {
    {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16}, {"F64", DType::f64}, {"I32", DType::i32},
    {"I64", DType::i64}, {"U8", DType::u8},   {"I8", DType::i8},     {"I16", DType::i16}, {"BOOL", DType::boolean}};
// Dtypes the format defines that Kiln has no tensor type for.
constexpr const char* kForeignDTypes[] = {"U16",     "U32",     "U64",     "C64",     "F8_E4M3",
                                          "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4"};

const char* st_dtype_name(DType t) {
  for (const auto& c : kDTypes)
    if (c.dtype == t) return c.name;
  return "?";
}

// A name or value as it appears in a message: quoted, control bytes escaped, long ones cut short.
std::string quote_name(const std::string& s) {
  constexpr size_t kMax = 160;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "'";
}

// A JSON value in a message, cut short.
std::string brief(const json& j) {
  std::string s = io::dump_json(j);
  if (s.size() > 80) s = s.substr(0, 80) + "...";
  return s;
}

std::string tensor_at(const std::string& what, const std::string& name) {
  return what + ": tensor " + quote_name(name) + ": ";
}

std::string sys_error() { return std::strerror(errno); }

// ---- reading: the header ---------------------------------------------------------------------------

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;  // in name order
  std::map<std::string, std::string> metadata;
};

// Checks the 8-byte length prefix against the file size; returns the header length N.
uint64_t header_length(const uint8_t* data, uint64_t size, const std::string& what) {
  KILN_CHECK(size >= 8, what, ": file is ", size,
             " bytes, too short for the 8-byte header length of a safetensors file (truncated?)");
  // A Kiln checkpoint is the likeliest other file to be given here (a run's step-N.kiln for its
  // model.safetensors); its magic read as a length would be a meaningless "header length 6075...".
  KILN_CHECK(std::memcmp(data, "KILNCKPT", 8) != 0, what,
             ": this is a Kiln checkpoint, not a safetensors file: export its weights with `kiln ckpt export "
             "CHECKPOINT --safetensors FILE` and give FILE");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  // So is a PyTorch checkpoint (torch.save's zip archive, or the pickle of its legacy format), which
  // Kiln cannot read (unpickling runs code): named with the conversion, not as a header length. Only
  // where its bytes are no valid length: a pickle's first two could be a real header's length.
  if (n > kMaxHeaderBytes || n > size - 8) {
    // A truncated safetensors file's length can start 0x80 0x02 too: its header starts with '{'.
    const bool zip = std::memcmp(data, "PK\x03\x04", 4) == 0,
               pickle = data[0] == 0x80 && data[1] >= 2 && data[1] <= 5 && (size <= 8 || data[8] != '{');
    KILN_CHECK(!zip && !pickle, what, ": this is a PyTorch checkpoint (torch.save's ", zip ? "zip archive" : "pickle",
               "), not a safetensors file: convert it in Python with safetensors.torch.save_file(model.state_dict(), "
               "\"model.safetensors\") (a saved state dict: save_file(torch.load(FILE), ...)) and give that file");
  }
  KILN_CHECK(n <= kMaxHeaderBytes, what, ": header length ", n, " exceeds the limit of ", kMaxHeaderBytes,
             " bytes (corrupt, or not a safetensors file)");
  KILN_CHECK(n <= size - 8, what, ": header length ", n, " runs past the end of the file (", size,
             " bytes, so at most ", size - 8, " header bytes; truncated?)");
  return n;
}

// A non-negative JSON integer, or nothing.
std::optional<uint64_t> as_u64(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return uint64_t(j.get<int64_t>());
  return std::nullopt;
}

// Parses the JSON, rejecting duplicate keys at any level (nlohmann would keep the last) and nesting
// deeper than a header can have (which also bounds the parser's memory on hostile input).
json parse_json(const char* p, size_t n, const std::string& what) {
  struct Frame {
    std::set<std::string> keys;
    std::string owner;     // the key this object is the value of ("" for the root)
    std::string last_key;  // the most recent key seen in this object
  };
  std::vector<Frame> frames;
  auto too_deep = [&] {
    return detail::str_cat(what, ": header nests JSON deeper than the ", kMaxJsonDepth,
                           " levels a safetensors header has",
                           frames.empty() ? std::string() : " (under " + quote_name(frames.back().last_key) + ")");
  };
  auto on_event = [&](json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        frames.push_back({{}, frames.empty() ? std::string() : frames.back().last_key, {}});
        break;
      case json::parse_event_t::object_end: frames.pop_back(); break;
      case json::parse_event_t::key: {
        Frame& f = frames.back();
        const std::string& k = parsed.get_ref<const std::string&>();
        if (!f.keys.insert(k).second) {
          if (frames.size() == 1) {
            KILN_CHECK(k != kMetadataKey, what, ": the header has \"__metadata__\" twice");
            KILN_FAIL(what, ": tensor ", quote_name(k), " appears twice in the header");
          }
          if (frames.size() == 2 && f.owner == kMetadataKey)
            KILN_FAIL(what, ": __metadata__: key ", quote_name(k), " appears twice");
          KILN_FAIL(tensor_at(what, frames.size() == 2 ? f.owner : frames[1].owner), "key ", quote_name(k),
                    " appears twice");
        }
        f.last_key = k;
        break;
      }
      default: break;
    }
  };
  return parse_json_bounded(p, n, kMaxJsonDepth, too_deep, what + ": header is not valid JSON", on_event);
}

Entry parse_entry(const std::string& name, const json& v, uint64_t data_size, const std::string& what) {
  const std::string at = tensor_at(what, name);
  KILN_CHECK(v.is_object(), at, "entry is a JSON ", v.type_name(),
             ", expected an object with \"dtype\", \"shape\" and \"data_offsets\"");
  for (const auto& [k, _] : v.items())
    KILN_CHECK(k == "dtype" || k == "shape" || k == "data_offsets", at, "unknown field ", quote_name(k),
               " (an entry has \"dtype\", \"shape\" and \"data_offsets\")");
  for (const char* k : {"dtype", "shape", "data_offsets"})
    KILN_CHECK(v.contains(k), at, "missing \"", k, "\"");
  Entry e;
  e.name = name;

  const json& dt = v["dtype"];
  KILN_CHECK(dt.is_string(), at, "\"dtype\" is a JSON ", dt.type_name(), " (", brief(dt), "), expected a string");
  const std::string& dts = dt.get_ref<const std::string&>();
  bool known = false;
  for (const auto& c : kDTypes)
    if (dts == c.name) {
      e.dtype = c.dtype;
      known = true;
    }
  if (!known) {
    const bool foreign = std::any_of(std::begin(kForeignDTypes), std::end(kForeignDTypes),
                                     [&](const char* f) { return dts == f; });
    KILN_FAIL(at, "dtype ", quote_name(dts),
              foreign ? " is a safetensors dtype that Kiln has no tensor type for" : " is not a safetensors dtype",
              " (Kiln reads F32 F16 BF16 F64 I32 I64 U8 I8 I16 BOOL)");
  }

  const json& sh = v["shape"];
  KILN_CHECK(sh.is_array(), at, "\"shape\" is a JSON ", sh.type_name(), " (", brief(sh), "), expected an array");
  KILN_CHECK(sh.size() <= size_t(kMaxDims), at, "shape ", brief(sh), " has ", sh.size(),
             " dims; Kiln tensors have at most ", kMaxDims);
  int64_t extent = 1;  // product of max(size, 1): bounds numel and every stride
  for (const json& d : sh) {
    KILN_CHECK(d.is_number_integer(), at, "shape ", brief(sh), " holds ", brief(d), ", which is not an integer");
    KILN_CHECK(d.is_number_unsigned() || d.get<int64_t>() >= 0, at, "shape ", brief(sh), " has a negative size");
    const uint64_t s = *as_u64(d);
    KILN_CHECK(s <= uint64_t(std::numeric_limits<int64_t>::max()) &&
                   !__builtin_mul_overflow(extent, std::max<int64_t>(int64_t(s), 1), &extent),
               at, "shape ", brief(sh), " has more elements than fit in 64 bits");
    e.shape.push_back(int64_t(s));
  }
  uint64_t need = 0;
  KILN_CHECK(!__builtin_mul_overflow(uint64_t(e.shape.numel()), uint64_t(dtype_size(e.dtype)), &need), at,
             "shape ", e.shape, " of ", dts, " needs more bytes than fit in 64 bits");

  const json& off = v["data_offsets"];
  KILN_CHECK(off.is_array() && off.size() == 2, at, "\"data_offsets\" is ", brief(off),
             ", expected an array [begin, end]");
  const auto b = as_u64(off[0]), en = as_u64(off[1]);
  KILN_CHECK(b && en, at, "data_offsets ", brief(off), " must be two non-negative integers");
  e.begin = *b;
  e.end = *en;
  KILN_CHECK(e.begin <= e.end, at, "data_offsets [", e.begin, ", ", e.end, "] end before they begin");
  KILN_CHECK(e.end <= data_size, at, "data_offsets [", e.begin, ", ", e.end, "] run past the end of the data (",
             data_size, " bytes follow the header; truncated?)");
  KILN_CHECK(e.end - e.begin == need, at, "data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
             " bytes but shape ", e.shape, " of ", dts, " needs ", need);
  return e;
}

// Validates the header bytes against `data_size`, the bytes that follow it.
Header parse_header(const char* p, size_t n, uint64_t data_size, const std::string& what) {
  KILN_CHECK(n > 0, what, ": header is empty (length 0), expected a JSON object");
  KILN_CHECK(p[0] == '{', what, ": header must be a JSON object starting with '{', but it starts with ",
             quote_name(std::string(1, p[0])));
  // nlohmann's lexer takes a NUL byte for the end of its input, which would hide whatever follows it.
  if (const void* nul = std::memchr(p, '\0', n))
    KILN_FAIL(what, ": header has a NUL byte at offset ", static_cast<const char*>(nul) - p,
              " of its ", n, " (JSON may not contain one; padding is spaces)");
  const json root = parse_json(p, n, what);
  KILN_CHECK(root.is_object(), what, ": header is a JSON ", root.type_name(), ", expected an object");

  Header h;
  for (const auto& [name, v] : root.items()) {
    if (name == kMetadataKey) {
      KILN_CHECK(v.is_object(), what, ": \"__metadata__\" is a JSON ", v.type_name(),
                 ", expected an object of strings");
      for (const auto& [k, s] : v.items()) {
        KILN_CHECK(s.is_string(), what, ": __metadata__: value of ", quote_name(k), " is a JSON ", s.type_name(), " (",
                   brief(s), "), expected a string");
        h.metadata.emplace(k, s.get<std::string>());
      }
      continue;
    }
    h.entries.push_back(parse_entry(name, v, data_size, what));
  }

  // Sorted by offset, the tensors must tile [0, data_size) exactly: no gaps, no overlaps.
  std::vector<const Entry*> order;
  for (const Entry& e : h.entries) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
    KILN_CHECK(e->begin <= covered, tensor_at(what, e->name), "data_offsets [", e->begin, ", ", e->end,
               "] leave bytes [", covered, ", ", e->begin, ") that belong to no tensor (a gap",
               prev ? " after tensor " + quote_name(prev->name) : std::string(" at the start of the data"), ")");
    KILN_CHECK(e->begin == covered, tensor_at(what, e->name), "data_offsets [", e->begin, ", ", e->end,
               "] overlap tensor ", quote_name(prev->name), " at [", prev->begin, ", ", prev->end, "]");
    covered = e->end;
    prev = e;
  }
  KILN_CHECK(covered == data_size, what, ": ", data_size - covered, " trailing bytes after the last tensor",
             prev ? " " + quote_name(prev->name) : std::string(), " (the tensors end at byte ", covered, " of ",
             data_size, " data bytes)");
  return h;
}

// ---- reading: the tensors ----------------------------------------------------------------------------

// A bool byte other than 0 or 1 is not a bool; reading it as one would be undefined.
void check_bools(const uint8_t* p, const Entry& e, const std::string& what) {
  if (e.dtype != DType::boolean) return;
  for (uint64_t i = 0; i < e.end - e.begin; ++i)
    KILN_CHECK(p[i] <= 1, tensor_at(what, e.name), "BOOL element ", i, " is byte ", int(p[i]),
               ", expected 0 or 1");
}

Tensor copy_tensor(const uint8_t* p, const Entry& e) {
  Tensor t = make_tensor(e.shape, e.dtype, kCPU);
  if (e.end > e.begin) std::memcpy(t.raw_data(), p, e.end - e.begin);
  return t;
}

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  Mapping(void* a, size_t n) : addr(a), size(n) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(addr, size); }
};

// A tensor over mapped bytes; its storage holds the mapping.
Tensor view_tensor(uint8_t* p, const Entry& e, const std::shared_ptr<Mapping>& map) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(p, size_t(e.end - e.begin), kCPU, [map](void*) {});
  impl->shape = e.shape;
  impl->strides = contiguous_strides(e.shape);
  impl->dtype = e.dtype;
  return Tensor(std::move(impl));
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads exactly n bytes at `offset`.
void pread_all(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t(1) << 30), off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    KILN_CHECK(r >= 0, path, ": read failed at byte ", offset, ": ", sys_error());
    KILN_CHECK(r > 0, path, ": file ended at byte ", offset, " while reading (did it shrink during the load?)");
    p += r;
    n -= size_t(r);
    offset += uint64_t(r);
  }
}

SafetensorsFile load_mapped(int fd, uint64_t size, const std::string& path) {
  if (size < 8) header_length(nullptr, size, path);  // throws: too short to map usefully
  void* addr = ::mmap(nullptr, size_t(size), PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  KILN_CHECK(addr != MAP_FAILED, path, ": cannot map ", size, " bytes: ", sys_error());
  auto map = std::make_shared<Mapping>(addr, size_t(size));
  auto* base = static_cast<uint8_t*>(addr);
  const uint64_t n = header_length(base, size, path);
  const Header h = parse_header(reinterpret_cast<const char*>(base + 8), size_t(n), size - 8 - n, path);
  uint8_t* data = base + 8 + n;
  SafetensorsFile out;
  out.metadata = h.metadata;
  for (const Entry& e : h.entries) {
    uint8_t* p = data + e.begin;
    check_bools(p, e, path);
    const bool aligned = reinterpret_cast<uintptr_t>(p) % dtype_size(e.dtype) == 0;
    out.tensors.emplace(e.name, aligned && e.end > e.begin ? view_tensor(p, e, map) : copy_tensor(p, e));
  }
  return out;
}

SafetensorsFile load_copied(int fd, uint64_t size, const std::string& path) {
  uint8_t len[9] = {};  // the length, and the header's first byte ('{') that header_length may look at
  if (size >= 9)
    pread_all(fd, len, 9, 0, path);
  else if (size >= 8)
    pread_all(fd, len, 8, 0, path);
  const uint64_t n = header_length(len, size, path);
  std::string header(size_t(n), '\0');
  pread_all(fd, header.data(), size_t(n), 8, path);
  const Header h = parse_header(header.data(), header.size(), size - 8 - n, path);
  SafetensorsFile out;
  out.metadata = h.metadata;
  for (const Entry& e : h.entries) {
    Tensor t = make_tensor(e.shape, e.dtype, kCPU);
    if (e.end > e.begin) {
      pread_all(fd, t.raw_data(), size_t(e.end - e.begin), 8 + n + e.begin, path);
      check_bools(static_cast<const uint8_t*>(t.raw_data()), e, path);
    }
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

// ---- writing -------------------------------------------------------------------------------------

bool valid_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

}  // namespace

// ---- the API -------------------------------------------------------------------------------------

SafetensorsFile parse_safetensors(const uint8_t* data, size_t size, const std::string& what) {
  KILN_CHECK(data || size == 0, what, ": no data (null pointer with size ", size, ")");
  const uint64_t n = header_length(data, size, what);
  const Header h = parse_header(reinterpret_cast<const char*>(data + 8), size_t(n), size - 8 - n, what);
  const uint8_t* bytes = data + 8 + n;
  SafetensorsFile out;
  out.metadata = h.metadata;
  for (const Entry& e : h.entries) {
    check_bools(bytes + e.begin, e, what);
    out.tensors.emplace(e.name, copy_tensor(bytes + e.begin, e));
  }
  return out;
}

SafetensorsFile load_safetensors(const std::string& path, bool mmap) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  KILN_CHECK(fd.fd >= 0, path, ": cannot open for reading: ", sys_error());
  struct stat st {};
  KILN_CHECK(::fstat(fd.fd, &st) == 0, path, ": cannot stat: ", sys_error());
  KILN_CHECK(S_ISREG(st.st_mode), path, ": not a regular file");
  const auto size = uint64_t(st.st_size);
  return mmap ? load_mapped(fd.fd, size, path) : load_copied(fd.fd, size, path);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  KILN_CHECK(!path.empty(), "save_safetensors: the path is empty");

  // Everything that can be wrong with the input is found before a file is created.
  json header = json::object();
  if (!metadata.empty()) {
    json m = json::object();
    for (const auto& [k, v] : metadata) {
      KILN_CHECK(valid_utf8(k), path, ": __metadata__ key ", quote_name(k), " is not valid UTF-8");
      KILN_CHECK(valid_utf8(v), path, ": __metadata__ value of ", quote_name(k), " is not valid UTF-8");
      m[k] = v;
    }
    header[kMetadataKey] = std::move(m);
  }
  std::vector<Tensor> blobs;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(!name.empty(), path, ": a tensor name is empty (every tensor needs a name to be loaded by)");
    KILN_CHECK(name != kMetadataKey, path, ": a tensor cannot be named \"__metadata__\" (the format reserves it)");
    KILN_CHECK(valid_utf8(name), path, ": tensor name ", quote_name(name), " is not valid UTF-8");
    KILN_CHECK(t.defined(), tensor_at(path, name), "the tensor is undefined");
    Tensor c = t.detach();
    if (!c.device().is_cpu()) c = c.to(kCPU);
    c = c.contiguous();
    const uint64_t nbytes = c.nbytes();
    header[name] = {{"dtype", st_dtype_name(c.dtype())},
                    {"shape", std::vector<int64_t>(c.shape().begin(), c.shape().end())},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    blobs.push_back(std::move(c));
  }
  std::string text = io::dump_json(header);
  text.resize((text.size() + 7) / 8 * 8, ' ');  // so the data starts 8-byte aligned
  KILN_CHECK(text.size() <= kMaxHeaderBytes, path, ": the header would be ", text.size(),
             " bytes, over the format's limit of ", kMaxHeaderBytes, " (too many tensors or too much metadata)");
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[size_t(i)] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);

  AtomicFile f(path);
  f.write(prefix.data(), prefix.size());
  f.write(text.data(), text.size());
  for (const Tensor& c : blobs)
    if (c.nbytes() > 0) f.write(c.raw_data(), c.nbytes());
  f.commit();
}

}  // namespace kiln::io

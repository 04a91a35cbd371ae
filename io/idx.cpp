// IDX parsing. The header fixes the data size, so a file is accepted only when its length is exactly
// header + product(dims) * element size.
#include "io/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

namespace kiln::io {
namespace {

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

struct IdxType {
  uint8_t code;
  const char* name;
  size_t size;
  DType dtype;
};
constexpr IdxType kTypes[] = {{0x08, "u8", 1, DType::u8},   {0x09, "i8", 1, DType::i32},   {0x0B, "i16", 2, DType::i32},
                              {0x0C, "i32", 4, DType::i32}, {0x0D, "f32", 4, DType::f32}, {0x0E, "f64", 8, DType::f64}};

}  // namespace

std::string read_maybe_gzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // zlib reads plain files through the same calls
  KILN_CHECK(f != nullptr, path, ": cannot open (", std::strerror(errno), ")");
  std::unique_ptr<gzFile_s, int (*)(gzFile)> guard(f, gzclose);
  std::string out;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int err = 0;
      const char* msg = gzerror(f, &err);
      // A file that starts with gzip's magic but whose data is not a deflate stream.
      KILN_CHECK(err != Z_DATA_ERROR, path, ": not a valid gzip file (", msg, ")");
      KILN_FAIL(path, ": read failed: ", err == Z_ERRNO ? std::strerror(errno) : msg);
    }
    if (n == 0) break;
    out.append(buf.data(), size_t(n));
  }
  // A gzip stream cut short reads as a short file; zlib reports it only through gzerror.
  int err = 0;
  const char* msg = gzerror(f, &err);
  KILN_CHECK(err == Z_OK || err == Z_STREAM_END, path, ": damaged gzip data (", msg, ")");
  return out;
}

Tensor parse_idx(const uint8_t* data, size_t size, const std::string& what, int want_rank,
                 const std::string& expected) {
  KILN_CHECK(size >= 4, what, ": ", size, " bytes is too short for an IDX header (4 bytes of magic)");
  KILN_CHECK(data[0] == 0 && data[1] == 0, what, ": not an IDX file (magic starts ", int(data[0]), " ", int(data[1]),
             ", expected 0 0)");
  const IdxType* type = nullptr;
  for (const auto& t : kTypes)
    if (t.code == data[2]) type = &t;
  KILN_CHECK(type, what, ": unknown IDX element type 0x", std::hex, int(data[2]),
             " (expected 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32 or 0x0E f64)");
  const int rank = data[3];
  KILN_CHECK(want_rank <= 0 || rank == want_rank, what, ": IDX rank ", rank, ", expected ", expected);
  KILN_CHECK(rank >= 1 && rank <= kMaxDims, what, ": IDX rank ", rank, " (Kiln reads 1 to ", kMaxDims, " dims)");
  const size_t header = 4 + 4 * size_t(rank);
  KILN_CHECK(size >= header, what, ": truncated header: ", size, " bytes, the ", rank, " dims need ", header);
  Shape shape;
  uint64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    const uint32_t n = be32(data + 4 + 4 * d);
    shape.push_back(n);
    KILN_CHECK(n == 0 || count <= (uint64_t(1) << 40) / n, what, ": dims ", shape, "... hold too many elements");
    count *= n;
  }
  const uint64_t want = header + count * type->size;
  KILN_CHECK(size >= want, what, ": truncated: ", size, " bytes, but dims ", shape, " of ", type->name, " need ", want);
  KILN_CHECK(size == want, what, ": ", size - want, " unexpected bytes after the data of dims ", shape);
  Tensor t = make_tensor(shape, type->dtype, kCPU);
  const uint8_t* src = data + header;
  switch (type->code) {
    case 0x08:
      if (count > 0) std::memcpy(t.data<uint8_t>(), src, count);  // an empty set's tensor has no memory (null)
      break;
    case 0x09:
      for (uint64_t i = 0; i < count; ++i) t.data<int32_t>()[i] = static_cast<int8_t>(src[i]);
      break;
    case 0x0B:
      for (uint64_t i = 0; i < count; ++i)
        t.data<int32_t>()[i] = static_cast<int16_t>(uint16_t(src[2 * i]) << 8 | src[2 * i + 1]);
      break;
    case 0x0C:
      for (uint64_t i = 0; i < count; ++i) t.data<int32_t>()[i] = static_cast<int32_t>(be32(src + 4 * i));
      break;
    case 0x0D:
      for (uint64_t i = 0; i < count; ++i) {
        const uint32_t u = be32(src + 4 * i);
        std::memcpy(t.data<float>() + i, &u, 4);
      }
      break;
    case 0x0E:
      for (uint64_t i = 0; i < count; ++i) {
        const uint64_t u = uint64_t(be32(src + 8 * i)) << 32 | be32(src + 8 * i + 4);
        std::memcpy(t.data<double>() + i, &u, 8);
      }
      break;
  }
  return t;
}

Tensor load_idx(const std::string& path, int rank, const std::string& expected) {
  const std::string bytes = read_maybe_gzip(path);
  return parse_idx(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path, rank, expected);
}

}  // namespace kiln::io

// Tests for safetensors import/export: round trips of every dtype and shape, a file built byte by
// byte, every validation rule (each error names the source and the tensor), bit flips, and I/O errors.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <csignal>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kiln.h"
#include "test_util.h"

using namespace kiln;
using kiln::io::load_safetensors;
using kiln::io::parse_safetensors;
using kiln::io::save_safetensors;
using kiln::io::SafetensorsFile;
using kiln::testing::contains;

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

const char* const kWhat = "model.safetensors";

// A fresh directory under the system temp directory, removed with everything in it.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("kiln_safetensors_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  // Names of everything in the directory (to spot leftover temporary files).
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) out.push_back(e.path().filename().string());
    return out;
  }
};

Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// The kiln::Error message (without the source location) that f throws, or a marker.
template <typename F> std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return std::string("NOT A kiln::Error: ") + e.what();
  }
  return "NO ERROR";
}

// A file: u64 LE header length, the header (space-padded to a multiple of 8 when `pad`), the data.
Bytes st_bytes(const std::string& header, const Bytes& data = {}, bool pad = true) {
  std::string h = header;
  while (pad && h.size() % 8 != 0) h += ' ';
  Bytes b;
  const uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) b.push_back(uint8_t(n >> (8 * i)));
  b.insert(b.end(), h.begin(), h.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

// One header entry: "name":{"dtype":..,"shape":..,"data_offsets":[b,e]}.
std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t b,
                  uint64_t e) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(b) + "," + std::to_string(e) + "]}";
}

// A header object of the given entries.
std::string obj(std::initializer_list<std::string> entries) {
  std::string s = "{";
  for (const std::string& e : entries) {
    if (s.size() > 1) s += ",";
    s += e;
  }
  s += "}";
  return s;
}

std::string parse_message(const Bytes& b) {
  return message_of([&] { parse_safetensors(b.data(), b.size(), kWhat); });
}

// Parsing `b` throws a kiln::Error that names the source and contains every one of `parts`.
void expect_error(const Bytes& b, std::initializer_list<std::string> parts) {
  const std::string m = parse_message(b);
  INFO("message: ", m);
  CHECK(contains(m, kWhat));
  for (const std::string& p : parts) CHECK(contains(m, p));
}

template <typename T> Tensor tensor_of(const std::vector<T>& v, const Shape& shape, DType dt) {
  Tensor t = make_tensor(shape, dt, kCPU);
  REQUIRE(t.nbytes() == v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(t.raw_data(), v.data(), t.nbytes());
  return t;
}

Bytes raw_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.raw_data());
  return p ? Bytes(p, p + c.nbytes()) : Bytes();
}

void check_same(const std::map<std::string, Tensor>& want, const SafetensorsFile& got) {
  REQUIRE(got.tensors.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO("tensor ", name);
    REQUIRE(got.tensors.count(name) == 1);
    const Tensor& g = got.tensors.at(name);
    CHECK(g.dtype() == t.dtype());
    CHECK(g.shape() == t.shape());
    CHECK(g.device().is_cpu());
    // (Kiln's is_contiguous() says false for some 0-element shapes such as [2,0,3], even fresh ones.)
    if (g.numel() > 0) CHECK(g.is_contiguous());
    CHECK(g.strides() == contiguous_strides(g.shape()));
    CHECK(raw_bytes(g) == raw_bytes(t));
  }
}

// Tensors of every dtype, with the bit patterns that a value conversion would lose.
std::map<std::string, Tensor> every_dtype() {
  std::map<std::string, Tensor> m;
  m["f32"] = tensor_of<uint32_t>({0x00000000u, 0x80000000u, 0x00000001u, 0x3f800000u, 0x7f7fffffu, 0x7f800000u,
                                  0xff800000u, 0x7fc00001u, 0xffbfffffu, 0x12345678u, 0xc0490fdbu, 0x007fffffu},
                                 {3, 4}, DType::f32);
  m["f16"] = tensor_of<uint16_t>({0x0000, 0x8000, 0x0001, 0x03ff, 0x3c00, 0x7bff, 0x7c00, 0xfc00, 0x7e01, 0xfd55,
                                  0x1234, 0xabcd},
                                 {3, 4}, DType::f16);
  m["bf16"] = tensor_of<uint16_t>({0x0000, 0x8000, 0x0001, 0x3f80, 0x7f7f, 0x7f80, 0xff80, 0x7fc1, 0xffff,
                                   0x4049, 0xbeef, 0x0080},
                                  {2, 6}, DType::bf16);
  m["f64"] = tensor_of<double>({0.0, -0.0, 1.0, -2.5, 1e300, -1e-300, 5e-324,
                                std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                                3.141592653589793, 1.0 / 3.0, -7.0},
                               {12}, DType::f64);
  m["i32"] = tensor_of<int32_t>({0, 1, -1, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                                 123456789, -42, 7, 8, 9, 10, 11},
                                {2, 2, 3}, DType::i32);
  m["i64"] = tensor_of<int64_t>({0, -1, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                                 0x0102030405060708LL, -0x0102030405060708LL},
                                {6, 1}, DType::i64);
  std::vector<uint8_t> u8(256);
  for (size_t i = 0; i < u8.size(); ++i) u8[i] = uint8_t(255 - i);
  m["u8"] = tensor_of<uint8_t>(u8, {16, 16}, DType::u8);
  m["bool"] = tensor_of<uint8_t>({1, 0, 0, 1, 1, 1, 0}, {7}, DType::boolean);
  return m;
}

// A small valid file with several dtypes, metadata and an empty tensor.
Bytes sample_file() {
  TempDir dir;
  std::map<std::string, Tensor> m;
  m["layer.0.weight"] = tensor_of<float>({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  m["layer.0.bias"] = tensor_of<uint16_t>({0x3c00, 0xc000}, {2}, DType::f16);
  m["mask"] = tensor_of<uint8_t>({1, 0, 1}, {3}, DType::boolean);
  m["empty"] = tensor_of<int64_t>({}, {0, 4}, DType::i64);
  m["step"] = tensor_of<int64_t>({42}, {}, DType::i64);
  save_safetensors(dir.file("s.safetensors"), m, {{"format", "pt"}, {"note", "a \"quoted\" \\ value"}});
  return read_bytes(dir.file("s.safetensors"));
}

uint64_t header_len(const Bytes& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[size_t(i)];
  return n;
}

}  // namespace

// ---- round trips ------------------------------------------------------------------------------------

TEST_CASE("safetensors: every dtype round trips bit for bit, mapped, copied and from memory") {
  TempDir dir;
  const auto want = every_dtype();
  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, want);
  check_same(want, load_safetensors(path, true));
  check_same(want, load_safetensors(path, false));
  const Bytes b = read_bytes(path);
  check_same(want, parse_safetensors(b.data(), b.size(), path));
  CHECK(load_safetensors(path).metadata.empty());
  // One file per dtype too, so each tensor is alone and at offset 0.
  for (const auto& [name, t] : want) {
    const std::string p = dir.file(name + ".safetensors");
    save_safetensors(p, {{name, t}});
    const SafetensorsFile mapped = load_safetensors(p, true);
    check_same({{name, t}}, mapped);
    check_same({{name, t}}, load_safetensors(p, false));
    CHECK(mapped.tensors.at(name).storage()->allocator == nullptr);  // offset 0: a view of the mapping
  }
  // The loaded values read back as numbers too.
  const SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.at("i64").to_vector()[3] == double(std::numeric_limits<int64_t>::max()));
  CHECK(f.tensors.at("bool").to_vector() == std::vector<double>{1, 0, 0, 1, 1, 1, 0});
  CHECK(f.tensors.at("f16").to_vector()[4] == 1.0);
}

TEST_CASE("safetensors: 0-dim and 0-element tensors, and a file with no tensors") {
  TempDir dir;
  std::map<std::string, Tensor> want;
  want["scalar_f64"] = scalar_tensor(3.5, TensorOptions(DType::f64));
  want["scalar_bool"] = tensor_of<uint8_t>({1}, {}, DType::boolean);
  want["scalar_bf16"] = tensor_of<uint16_t>({0x3f80}, {}, DType::bf16);
  want["empty_f32"] = tensor_of<float>({}, {0}, DType::f32);
  want["empty_3d"] = tensor_of<uint16_t>({}, {2, 0, 3}, DType::bf16);
  want["empty_bool"] = tensor_of<uint8_t>({}, {0}, DType::boolean);
  const std::string path = dir.file("z.safetensors");
  save_safetensors(path, want);
  for (bool mm : {true, false}) {
    const SafetensorsFile f = load_safetensors(path, mm);
    check_same(want, f);
    CHECK(f.tensors.at("scalar_f64").dim() == 0);
    CHECK(f.tensors.at("scalar_f64").item<double>() == 3.5);
    CHECK(f.tensors.at("empty_3d").numel() == 0);
  }

  // Only empty tensors: the data section is empty.
  const std::string p2 = dir.file("only_empty.safetensors");
  save_safetensors(p2, {{"a", tensor_of<float>({}, {0, 5}, DType::f32)}, {"b", tensor_of<int32_t>({}, {0}, DType::i32)}});
  CHECK((read_bytes(p2).size() - 8) == header_len(read_bytes(p2)));
  check_same({{"a", tensor_of<float>({}, {0, 5}, DType::f32)}, {"b", tensor_of<int32_t>({}, {0}, DType::i32)}},
             load_safetensors(p2));

  // No tensors at all, with and without metadata.
  const std::string p3 = dir.file("none.safetensors");
  save_safetensors(p3, {});
  CHECK(read_bytes(p3).size() == 16);  // "{}" padded to 8
  for (bool mm : {true, false}) CHECK(load_safetensors(p3, mm).tensors.empty());
  save_safetensors(p3, {}, {{"only", "metadata"}});
  CHECK(load_safetensors(p3).metadata == std::map<std::string, std::string>{{"only", "metadata"}});
}

TEST_CASE("safetensors: metadata round trips") {
  TempDir dir;
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"empty", ""}, {"quotes \" and \\ backslash", "tab\there\nnewline"},
      {"unicode \xc3\xa9\xe2\x82\xac", "\xf0\x9f\x94\xa5 kiln"}, {"", "empty key"}};
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"w", ones({2, 2})}}, meta);
  CHECK(load_safetensors(path, true).metadata == meta);
  CHECK(load_safetensors(path, false).metadata == meta);
}

TEST_CASE("safetensors: non-contiguous inputs are written contiguously") {
  TempDir dir;
  const Tensor base = arange(0, 24, 1, TensorOptions(DType::f32)).reshape({4, 6});
  std::map<std::string, Tensor> in;
  in["transposed"] = base.t();
  in["strided"] = base.slice(1, 0, 6, 2);
  in["expanded"] = arange(0, 3, 1, TensorOptions(DType::i64)).reshape({1, 3}).expand({4, 3});
  in["permuted"] = arange(0, 24, 1, TensorOptions(DType::f64)).reshape({2, 3, 4}).permute({2, 0, 1});
  in["selected"] = base.select(1, 2);
  in["half_t"] = base.to(DType::f16).t();
  in["offset_view"] = base.narrow(0, 1, 2);  // contiguous but starts inside its storage
  for (const auto& [name, t] : in)
    if (name != "offset_view") REQUIRE_FALSE(t.is_contiguous());
  const std::string path = dir.file("nc.safetensors");
  save_safetensors(path, in);
  for (bool mm : {true, false}) {
    const SafetensorsFile f = load_safetensors(path, mm);
    for (const auto& [name, t] : in) {
      INFO("tensor ", name);
      const Tensor& g = f.tensors.at(name);
      CHECK(g.shape() == t.shape());
      CHECK(g.dtype() == t.dtype());
      CHECK(g.is_contiguous());
      CHECK(g.to_vector() == t.to_vector());
    }
  }
  // The file holds exactly the contiguous bytes, nothing more.
  const Bytes b = read_bytes(path);
  size_t total = 0;
  for (const auto& [name, t] : in) total += t.nbytes();
  CHECK(b.size() == 8 + header_len(b) + total);
}

TEST_CASE("safetensors: mapped loads are zero-copy, copy-on-write views that outlive the file") {
  TempDir dir;
  const auto want = every_dtype();
  const std::string path = dir.file("v.safetensors");
  save_safetensors(path, want);
  const Bytes before = read_bytes(path);
  {
    SafetensorsFile mapped = load_safetensors(path, true);
    const SafetensorsFile copied = load_safetensors(path, false);
    const nlohmann::json header =
        nlohmann::json::parse(before.begin() + 8, before.begin() + 8 + long(header_len(before)));
    int views = 0;
    for (const auto& [name, t] : mapped.tensors) {
      INFO("tensor ", name);
      // A view exactly when the tensor's place in the file suits its element size.
      const uint64_t at = 8 + header_len(before) + header[name]["data_offsets"][0].get<uint64_t>();
      const bool aligned = at % t.element_size() == 0;
      CHECK((t.storage()->allocator == nullptr) == aligned);
      views += aligned;
      CHECK(copied.tensors.at(name).storage()->allocator != nullptr);
      CHECK(raw_bytes(t) == raw_bytes(copied.tensors.at(name)));
    }
    CHECK(views >= 2);
    // Writing to a view changes the tensor, never the file.
    Tensor& view = mapped.tensors.at("bf16");  // at offset 0, so mapped
    REQUIRE(view.storage()->allocator == nullptr);
    view.fill_(7.0);
    CHECK(view.to_vector()[0] == 7.0);
    CHECK(read_bytes(path) == before);
    // The mapping lives as long as a tensor does, even after the file is gone.
    Tensor keep = mapped.tensors.at("u8");
    mapped = SafetensorsFile{};
    fs::remove(path);
    CHECK(raw_bytes(keep) == raw_bytes(want.at("u8")));
  }
}

TEST_CASE("safetensors: a default load reads into memory, so the file may be rewritten while its tensors live") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  const Tensor a = arange(0, 100000, 1, TensorOptions(DType::f32));
  save_safetensors(path, {{"a", a}});
  const SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.at("a").storage()->allocator != nullptr);  // not a view of a mapping
  // Rewritten in place and truncated (a mapped tensor would now read changed bytes or die of SIGBUS).
  {
    std::FILE* out = std::fopen(path.c_str(), "r+b");
    REQUIRE(out != nullptr);
    const std::vector<char> junk(4096, 'x');
    std::fwrite(junk.data(), 1, junk.size(), out);
    std::fclose(out);
  }
  fs::resize_file(path, 10);
  CHECK(raw_bytes(f.tensors.at("a")) == raw_bytes(a));
}

TEST_CASE("safetensors: tensors at offsets not aligned to their element size are copied") {
  TempDir dir;
  std::map<std::string, Tensor> want;
  want["a"] = tensor_of<uint8_t>({1, 2, 3}, {3}, DType::u8);              // [0, 3)
  want["b"] = tensor_of<float>({1.5f, -2.0f}, {2}, DType::f32);            // [3, 11): misaligned
  want["c"] = tensor_of<int64_t>({-5, 6}, {2}, DType::i64);                // [11, 27): misaligned
  const std::string path = dir.file("u.safetensors");
  save_safetensors(path, want);
  const SafetensorsFile f = load_safetensors(path, true);
  check_same(want, f);
  for (const char* n : {"b", "c"}) {
    const Tensor& t = f.tensors.at(n);
    CHECK(t.storage()->allocator != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(t.raw_data()) % t.element_size() == 0);
  }
  CHECK(f.tensors.at("c").to_vector() == std::vector<double>{-5, 6});
}

// ---- the format, independent of the writer ---------------------------------------------------------

TEST_CASE("safetensors: a file built byte by byte reads as the spec says") {
  // Tensor "b" comes first in the data although "a" sorts first: offsets, not order, place tensors.
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
      "\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"c\":{\"dtype\":\"BF16\",\"shape\":[1,2],\"data_offsets\":[16,20]},"
      "\"d\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[20,23]}}";
  std::string padded = header;
  while ((8 + padded.size()) % 8 != 0) padded += ' ';
  const uint64_t n = padded.size();
  Bytes file;
  // u64 little-endian header length: least significant byte first.
  file.push_back(uint8_t(n & 0xff));
  file.push_back(uint8_t((n >> 8) & 0xff));
  for (int i = 2; i < 8; ++i) file.push_back(0);
  for (char ch : padded) file.push_back(uint8_t(ch));
  const Bytes data = {
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // b: i64 0x0102030405060708
      0x00, 0x00, 0x80, 0x3f,                          // a[0]: f32 1.0
      0x00, 0x00, 0x20, 0xc0,                          // a[1]: f32 -2.5
      0x80, 0x3f,                                      // c[0]: bf16 1.0
      0x00, 0xc0,                                      // c[1]: bf16 -2.0
      0x01, 0x00, 0x01,                                // d: true false true
  };
  file.insert(file.end(), data.begin(), data.end());
  REQUIRE(n < 256 * 256);

  auto check = [](const SafetensorsFile& f) {
    CHECK(f.metadata == std::map<std::string, std::string>{{"format", "pt"}});
    REQUIRE(f.tensors.size() == 4);
    CHECK(f.tensors.at("a").shape() == Shape{2});
    CHECK(f.tensors.at("a").to_vector() == std::vector<double>{1.0, -2.5});
    CHECK(f.tensors.at("b").dim() == 0);
    CHECK(f.tensors.at("b").dtype() == DType::i64);
    CHECK(f.tensors.at("b").data<int64_t>()[0] == 0x0102030405060708LL);
    CHECK(f.tensors.at("c").shape() == Shape{1, 2});
    CHECK(f.tensors.at("c").to_vector() == std::vector<double>{1.0, -2.0});
    CHECK(f.tensors.at("d").dtype() == DType::boolean);
    CHECK(f.tensors.at("d").to_vector() == std::vector<double>{1, 0, 1});
  };
  check(parse_safetensors(file.data(), file.size(), "hand-built"));
  TempDir dir;
  write_bytes(dir.file("h.safetensors"), file);
  check(load_safetensors(dir.file("h.safetensors"), true));
  check(load_safetensors(dir.file("h.safetensors"), false));
  // Padding is optional for a reader: the same header unpadded also reads.
  check(parse_safetensors(st_bytes(header, data, false).data(), st_bytes(header, data, false).size(), "unpadded"));
}

TEST_CASE("safetensors: the writer's bytes follow the spec") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  save_safetensors(path,
                   {{"y", tensor_of<uint8_t>({7, 9}, {2}, DType::u8)},
                    {"x", tensor_of<float>({1.0f, 2.0f, -2.5f}, {3}, DType::f32)},
                    {"z", tensor_of<uint16_t>({0x3c00}, {1, 1}, DType::f16)}},
                   {{"k", "v"}});
  const Bytes b = read_bytes(path);
  REQUIRE(b.size() >= 8);
  const uint64_t n = uint64_t(b[0]) | uint64_t(b[1]) << 8 | uint64_t(b[2]) << 16 | uint64_t(b[3]) << 24 |
                     uint64_t(b[4]) << 32 | uint64_t(b[5]) << 40 | uint64_t(b[6]) << 48 | uint64_t(b[7]) << 56;
  CHECK((8 + n) % 8 == 0);
  REQUIRE(b.size() == 8 + n + 12 + 2 + 2);
  const std::string text(b.begin() + 8, b.begin() + 8 + long(n));
  CHECK(text.front() == '{');
  const size_t close = text.find_last_of('}');
  REQUIRE(close != std::string::npos);
  CHECK(text.find_first_not_of(' ', close + 1) == std::string::npos);  // padded with spaces only
  CHECK(n - (close + 1) < 8);
  const nlohmann::json j = nlohmann::json::parse(text);
  CHECK(j["__metadata__"] == nlohmann::json{{"k", "v"}});
  // Name order: x, y, z.
  CHECK(j["x"]["dtype"] == "F32");
  CHECK(j["x"]["shape"] == nlohmann::json::array({3}));
  CHECK(j["x"]["data_offsets"] == nlohmann::json::array({0, 12}));
  CHECK(j["y"]["dtype"] == "U8");
  CHECK(j["y"]["data_offsets"] == nlohmann::json::array({12, 14}));
  CHECK(j["z"]["dtype"] == "F16");
  CHECK(j["z"]["shape"] == nlohmann::json::array({1, 1}));
  CHECK(j["z"]["data_offsets"] == nlohmann::json::array({14, 16}));
  const Bytes data(b.begin() + 8 + long(n), b.end());
  CHECK(data == Bytes{0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x20, 0xc0, 7, 9, 0x00, 0x3c});
  CHECK(j.size() == 4);

  // Saving over an existing file replaces it and leaves no temporary file behind.
  save_safetensors(path, {{"only", ones({1})}});
  CHECK(load_safetensors(path).tensors.size() == 1);
  CHECK(dir.listing() == std::vector<std::string>{"w.safetensors"});
}

// ---- validation --------------------------------------------------------------------------------------

TEST_CASE("safetensors: truncated files are rejected at every length") {
  const Bytes full = sample_file();
  const uint64_t n = header_len(full);
  REQUIRE(parse_message(full) == "NO ERROR");
  for (size_t cut = 0; cut < full.size(); ++cut) {
    const Bytes b(full.begin(), full.begin() + long(cut));
    const std::string m = parse_message(b);
    INFO("cut at ", cut, ": ", m);
    CHECK(contains(m, kWhat));
    CHECK_FALSE(contains(m, "NOT A kiln::Error"));
    CHECK_FALSE(contains(m, "NO ERROR"));
    if (cut < 8) CHECK(contains(m, "too short"));
    else if (cut < 8 + n) CHECK(contains(m, "runs past the end of the file"));
    else CHECK((contains(m, "tensor '") && contains(m, "run past the end of the data")));
  }
  // From disk too, both ways, at a few lengths.
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  for (size_t cut : {size_t(0), size_t(3), size_t(8), size_t(8 + n / 2), size_t(8 + n), full.size() - 1}) {
    write_bytes(path, Bytes(full.begin(), full.begin() + long(cut)));
    for (bool mm : {true, false}) {
      const std::string m = message_of([&] { load_safetensors(path, mm); });
      INFO("cut at ", cut, " mmap ", mm, ": ", m);
      CHECK(contains(m, path));
      CHECK_FALSE(contains(m, "NO ERROR"));
    }
  }
}

// A header of 640 bytes (0x280) starts the file 0x80 0x02, as a pickle does: cut short, the file was
// said to be a PyTorch checkpoint. The '{' after the length says it is a safetensors file.
TEST_CASE("safetensors: a truncated file whose header length reads as a pickle's start is said truncated") {
  std::string h = obj({entry("w", "F32", "[1]", 0, 4)});
  h.resize(0x280, ' ');
  Bytes b = st_bytes(h, {0, 0, 0, 0});
  REQUIRE(b[0] == 0x80);
  REQUIRE(b[1] == 0x02);
  REQUIRE(parse_message(b) == "NO ERROR");
  b.resize(100);
  const std::string m = parse_message(b);
  INFO("message: ", m);
  CHECK(contains(m, "header length 640 runs past the end of the file (100 bytes"));
  CHECK_FALSE(contains(m, "PyTorch"));
}

TEST_CASE("safetensors: header length bounds") {
  const std::string h = obj({entry("w", "F32", "[1]", 0, 4)});
  const Bytes good = st_bytes(h, {0, 0, 0, 0});
  REQUIRE(parse_message(good) == "NO ERROR");
  auto with_length = [&](uint64_t n) {
    Bytes b = good;
    for (int i = 0; i < 8; ++i) b[size_t(i)] = uint8_t(n >> (8 * i));
    return b;
  };
  expect_error(with_length(100'000'001), {"header length 100000001", "exceeds the limit of 100000000"});
  expect_error(with_length(~uint64_t(0)), {"header length 18446744073709551615", "exceeds"});
  expect_error(with_length(good.size() - 8 + 1), {"runs past the end of the file"});
  expect_error(with_length(uint64_t(1) << 32), {"exceeds"});
  // A length that stops short of the JSON: the header is cut and does not parse.
  expect_error(with_length(8), {"not valid JSON"});
  // A length that swallows data bytes as header: trailing garbage in the JSON.
  expect_error(with_length(header_len(good) + 4), {"NUL byte at offset"});
  expect_error(st_bytes(""), {"header is empty"});
}

TEST_CASE("safetensors: the header must be a JSON object") {
  expect_error(st_bytes("[1,2]"), {"JSON object", "'['"});
  expect_error(st_bytes("\"a string\""), {"JSON object"});
  expect_error(st_bytes("12"), {"JSON object"});
  expect_error(st_bytes("null"), {"JSON object"});
  expect_error(st_bytes(" {}"), {"JSON object"});
  expect_error(st_bytes("{"), {"not valid JSON"});
  expect_error(st_bytes("{\"a\":"), {"not valid JSON"});
  expect_error(st_bytes("{}x"), {"not valid JSON"});
  expect_error(st_bytes("{} // comment"), {"not valid JSON"});
  expect_error(st_bytes("{'a': 1}"), {"not valid JSON"});
  expect_error(st_bytes(std::string("{}\0\0\0\0\0\0", 8), {}, false), {"NUL byte at offset 2"});
  expect_error(st_bytes(std::string("{}\0junk!", 8), {}, false), {"NUL byte at offset 2"});
  expect_error(st_bytes("{\"\xff\xfe\":1}"), {"not valid JSON"});  // not UTF-8
  expect_error(st_bytes("{\"__metadata__\":{\"k\":{\"x\":{}}}}"), {"deeper than"});
  expect_error(st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[[[1]]],\"data_offsets\":[0,4]}}", {0, 0, 0, 0}),
               {"deeper than"});
  // Empty object, with padding: a valid file with nothing in it.
  CHECK(parse_message(st_bytes("{}")) == "NO ERROR");
}

TEST_CASE("safetensors: entries must be well-typed objects") {
  expect_error(st_bytes("{\"w\":3}"), {"tensor 'w'", "entry is a JSON number"});
  expect_error(st_bytes("{\"w\":[1,2]}"), {"tensor 'w'", "entry is a JSON array"});
  expect_error(st_bytes("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", {0, 0, 0, 0}),
               {"tensor 'w'", "missing \"dtype\""});
  expect_error(st_bytes("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", {0, 0, 0, 0}),
               {"tensor 'w'", "missing \"shape\""});
  expect_error(st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", {0, 0, 0, 0}),
               {"tensor 'w'", "missing \"data_offsets\""});
  expect_error(st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", {0, 0, 0, 0}),
               {"tensor 'w'", "unknown field 'extra'"});
  expect_error(st_bytes("{\"__metadata__\":\"pt\"}"), {"__metadata__", "JSON string", "expected an object"});
  expect_error(st_bytes("{\"__metadata__\":{\"format\":1}}"), {"__metadata__", "'format'", "expected a string"});
  expect_error(st_bytes("{\"__metadata__\":{\"format\":null}}"), {"'format'", "JSON null"});
}

TEST_CASE("safetensors: dtypes") {
  auto file = [](const std::string& dtype) {
    return st_bytes(obj({entry("fc.weight", dtype, "[2]", 0, 2)}), {0, 0});
  };
  for (const char* foreign : {"U16", "F8_E4M3", "F8_E5M2", "U32", "U64", "C64"}) {
    INFO(foreign);
    expect_error(file(foreign), {"tensor 'fc.weight'", std::string("'") + foreign + "'", "Kiln has no tensor type",
                                 "F32 F16 BF16 F64 I32 I64 U8 I8 I16 BOOL"});
  }
  expect_error(file("XYZ"), {"tensor 'fc.weight'", "'XYZ'", "not a safetensors dtype"});
  expect_error(file("f32"), {"tensor 'fc.weight'", "'f32'", "not a safetensors dtype"});
  expect_error(file(""), {"tensor 'fc.weight'", "not a safetensors dtype"});
  expect_error(st_bytes("{\"fc.weight\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", {0, 0, 0, 0}),
               {"tensor 'fc.weight'", "\"dtype\" is a JSON number", "expected a string"});
  // Each supported dtype's element size is what the offsets are checked against.
  const std::map<std::string, uint64_t> sizes = {{"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I32", 4},
                                                 {"I64", 8}, {"U8", 1},  {"I8", 1},   {"I16", 2}, {"BOOL", 1}};
  for (const auto& [dt, sz] : sizes) {
    INFO(dt);
    CHECK(parse_message(st_bytes(obj({entry("t", dt, "[3]", 0, 3 * sz)}), Bytes(3 * sz, 0))) == "NO ERROR");
    expect_error(st_bytes(obj({entry("t", dt, "[3]", 0, 3 * sz + 1)}), Bytes(3 * sz + 1, 0)),
                 {"tensor 't'", "needs " + std::to_string(3 * sz)});
  }
}

TEST_CASE("safetensors: shapes") {
  auto file = [](const std::string& shape, uint64_t end = 4) {
    return st_bytes("{\"w\":{\"dtype\":\"F32\",\"shape\":" + shape + ",\"data_offsets\":[0," + std::to_string(end) +
                        "]}}",
                    Bytes(end, 0));
  };
  expect_error(file("[-1]"), {"tensor 'w'", "shape [-1]", "negative"});
  expect_error(file("[2,-3]"), {"tensor 'w'", "negative"});
  expect_error(file("[2.5]"), {"tensor 'w'", "not an integer"});
  expect_error(file("[1.0]"), {"tensor 'w'", "not an integer"});
  expect_error(file("[\"1\"]"), {"tensor 'w'", "not an integer"});
  expect_error(file("[null]"), {"tensor 'w'", "not an integer"});
  expect_error(file("[1e30]"), {"tensor 'w'", "not an integer"});
  expect_error(file("1"), {"tensor 'w'", "\"shape\" is a JSON number"});
  expect_error(file("{}"), {"tensor 'w'", "\"shape\" is a JSON object"});
  expect_error(file("[1,1,1,1,1,1,1,1,1]"), {"tensor 'w'", "9 dims", "at most 8"});
  expect_error(file("[4294967296,4294967296]"), {"tensor 'w'", "more elements than fit in 64 bits"});
  expect_error(file("[9223372036854775808]"), {"tensor 'w'", "more elements than fit in 64 bits"});
  expect_error(file("[18446744073709551615]"), {"tensor 'w'", "more elements than fit in 64 bits"});
  expect_error(file("[4294967296,4294967296,0]", 0), {"tensor 'w'", "more elements than fit in 64 bits"});
  expect_error(file("[4611686018427387904]"), {"tensor 'w'", "needs more bytes than fit in 64 bits"});
  // Huge but empty shapes are fine.
  CHECK(parse_message(file("[0,4611686018427387904]", 0)) == "NO ERROR");
  CHECK(parse_message(file("[1,1,1,1,1,1,1,4]", 16)) == "NO ERROR");
}

TEST_CASE("safetensors: data offsets") {
  // The example from the brief, word for word.
  expect_error(st_bytes(obj({entry("fc.weight", "F32", "[5,4]", 0, 100)}), Bytes(100, 0)),
               {"model.safetensors: tensor 'fc.weight': data_offsets [0, 100] hold 100 bytes but shape [5,4] of F32 "
                "needs 80"});
  expect_error(st_bytes(obj({entry("w", "F32", "[2]", 0, 4)}), Bytes(4, 0)), {"tensor 'w'", "needs 8"});
  expect_error(st_bytes(obj({entry("w", "F32", "[10]", 0, 40)}), Bytes(16, 0)),
               {"tensor 'w'", "[0, 40]", "run past the end of the data (16 bytes"});
  expect_error(st_bytes(obj({entry("w", "F32", "[0]", 8, 0)}), Bytes(8, 0)),
               {"tensor 'w'", "[8, 0]", "end before they begin"});
  auto offsets = [](const std::string& off) {
    return st_bytes("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":" + off + "}}", Bytes(4, 0));
  };
  expect_error(offsets("[0]"), {"tensor 'w'", "expected an array [begin, end]"});
  expect_error(offsets("[0,4,8]"), {"tensor 'w'", "expected an array [begin, end]"});
  expect_error(offsets("4"), {"tensor 'w'", "expected an array [begin, end]"});
  expect_error(offsets("[-4,0]"), {"tensor 'w'", "two non-negative integers"});
  expect_error(offsets("[0,4.0]"), {"tensor 'w'", "two non-negative integers"});
  expect_error(offsets("[\"0\",\"4\"]"), {"tensor 'w'", "two non-negative integers"});
  expect_error(offsets("[0,18446744073709551615]"), {"tensor 'w'", "run past the end"});
  expect_error(offsets("[0,18446744073709551616]"), {"tensor 'w'", "two non-negative integers"});

  // Overlaps: partial, identical, an empty tensor inside another.
  expect_error(st_bytes(obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 4, 12)}),
                        Bytes(12, 0)),
               {"tensor 'b'", "[4, 12]", "overlap tensor 'a' at [0, 8]"});
  expect_error(st_bytes(obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 0, 8)}),
                        Bytes(8, 0)),
               {"tensor 'b'", "overlap tensor 'a'"});
  expect_error(st_bytes(obj({entry("a", "F32", "[2]", 0, 8), entry("e", "F32", "[0]", 4, 4)}),
                        Bytes(8, 0)),
               {"tensor 'e'", "overlap tensor 'a'"});
  // Gaps: at the start, between tensors.
  expect_error(st_bytes(obj({entry("a", "F32", "[2]", 4, 12)}), Bytes(12, 0)),
               {"tensor 'a'", "bytes [0, 4)", "belong to no tensor", "start of the data"});
  expect_error(st_bytes(obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 12, 20)}),
                        Bytes(20, 0)),
               {"tensor 'b'", "bytes [8, 12)", "belong to no tensor", "after tensor 'a'"});
  // Trailing bytes after the last tensor.
  expect_error(st_bytes(obj({entry("a", "F32", "[2]", 0, 8)}), Bytes(12, 0)),
               {"4 trailing bytes after the last tensor 'a'"});
  expect_error(st_bytes("{}", Bytes(3, 0)), {"3 trailing bytes"});
  // Adjacent and empty tensors in any name order tile fine.
  CHECK(parse_message(st_bytes(obj({entry("z", "F32", "[2]", 0, 8), entry("e", "F32", "[0]", 8, 8),
                                   entry("a", "F32", "[0]", 0, 0), entry("m", "U8", "[1]", 8, 9)}),
                               Bytes(9, 0))) == "NO ERROR");
}

TEST_CASE("safetensors: duplicate names and keys") {
  const std::string a = entry("w", "F32", "[1]", 0, 4);
  expect_error(st_bytes(obj({a, a}), Bytes(4, 0)), {"tensor 'w' appears twice"});
  expect_error(st_bytes(obj({a, entry("w", "F32", "[1]", 4, 8)}), Bytes(8, 0)),
               {"tensor 'w' appears twice"});
  expect_error(st_bytes("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                        Bytes(4, 0)),
               {"tensor 'w'", "key 'dtype' appears twice"});
  expect_error(st_bytes("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}"), {"__metadata__", "key 'k' appears twice"});
  expect_error(st_bytes("{\"__metadata__\":{},\"__metadata__\":{}}"), {"\"__metadata__\" twice"});
}

TEST_CASE("safetensors: bool bytes other than 0 and 1 are rejected") {
  const Bytes b = st_bytes(obj({entry("mask", "BOOL", "[4]", 0, 4)}), {1, 0, 2, 1});
  expect_error(b, {"tensor 'mask'", "BOOL element 2 is byte 2"});
  TempDir dir;
  write_bytes(dir.file("b.safetensors"), b);
  for (bool mm : {true, false}) {
    const std::string m = message_of([&] { load_safetensors(dir.file("b.safetensors"), mm); });
    CHECK(contains(m, dir.file("b.safetensors")));
    CHECK(contains(m, "tensor 'mask'"));
  }
}

TEST_CASE("safetensors: names in messages are quoted and cut short") {
  const std::string long_name(1000, 'n');
  const std::string m = parse_message(st_bytes(obj({entry(long_name, "U16", "[1]", 0, 2)}), {0}));
  CHECK(contains(m, "'nnnn"));
  CHECK(contains(m, "...'"));
  CHECK(m.size() < 500);
  const std::string m2 = parse_message(st_bytes(obj({entry("a\\u0001b", "U16", "[1]", 0, 2)}), {0}));
  CHECK(contains(m2, "'a\\x01b'"));
}

TEST_CASE("safetensors: single-bit flips in the header never crash") {
  const Bytes good = sample_file();
  const uint64_t n = header_len(good);
  const size_t data_size = good.size() - 8 - size_t(n);
  int loaded = 0, rejected = 0;
  for (size_t byte = 0; byte < 8 + n; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      Bytes b = good;
      b[byte] ^= uint8_t(1u << bit);
      try {
        const SafetensorsFile f = parse_safetensors(b.data(), b.size(), kWhat);
        // What loads is consistent: the tensors account for every data byte.
        size_t total = 0;
        for (const auto& [name, t] : f.tensors) {
          REQUIRE(t.defined());
          total += t.nbytes();
        }
        CHECK(total == data_size);
        ++loaded;
      } catch (const Error& e) {
        if (!contains(e.message(), kWhat)) FAIL_CHECK("byte ", byte, " bit ", bit, ": ", e.message());
        ++rejected;
      } catch (const std::exception& e) {
        FAIL_CHECK("byte ", byte, " bit ", bit, ": not a kiln::Error: ", e.what());
      }
    }
  }
  MESSAGE("bit flips: ", loaded, " loaded, ", rejected, " rejected");
  CHECK(rejected > 0);
  CHECK(loaded > 0);  // e.g. flips inside the padding or metadata values

  // Through the file paths too, one bit per byte.
  TempDir dir;
  const std::string path = dir.file("f.safetensors");
  for (size_t byte = 0; byte < 8 + n; byte += 3) {
    Bytes b = good;
    b[byte] ^= 0x04;
    write_bytes(path, b);
    for (bool mm : {true, false}) {
      const std::string m = message_of([&] { load_safetensors(path, mm); });
      CHECK_FALSE(contains(m, "NOT A kiln::Error"));
      if (m != "NO ERROR") CHECK(contains(m, path));
    }
  }
}

// ---- I/O errors --------------------------------------------------------------------------------------

TEST_CASE("safetensors: load errors name the path") {
  TempDir dir;
  const std::string missing = dir.file("missing.safetensors");
  for (bool mm : {true, false}) {
    std::string m = message_of([&] { load_safetensors(missing, mm); });
    CHECK(contains(m, missing));
    CHECK(contains(m, "cannot open"));
    m = message_of([&] { load_safetensors(dir.path.string(), mm); });
    CHECK(contains(m, dir.path.string()));
    CHECK(contains(m, "not a regular file"));
    write_bytes(dir.file("empty"), {});
    m = message_of([&] { load_safetensors(dir.file("empty"), mm); });
    CHECK(contains(m, dir.file("empty")));
    CHECK(contains(m, "0 bytes, too short"));
  }
}

TEST_CASE("safetensors: save errors name the path and leave no temporary file") {
  TempDir dir;
  const std::map<std::string, Tensor> t = {{"w", ones({4})}};

  const std::string no_dir = dir.file("no_such_dir") + "/x.safetensors";
  std::string m = message_of([&] { save_safetensors(no_dir, t); });
  CHECK(contains(m, no_dir));
  CHECK(contains(m, "cannot create the temporary file"));

  write_bytes(dir.file("plain"), {1, 2, 3});
  const std::string under_file = dir.file("plain") + "/x.safetensors";
  m = message_of([&] { save_safetensors(under_file, t); });
  CHECK(contains(m, under_file));

  // The target is a directory: the rename fails, the temporary file goes.
  fs::create_directories(dir.path / "adir");
  m = message_of([&] { save_safetensors(dir.file("adir"), t); });
  CHECK(contains(m, dir.file("adir")));
  CHECK(contains(m, "cannot rename"));
  for (const std::string& name : dir.listing()) CHECK_FALSE(contains(name, ".tmp."));

  // Bad input is found before any file is created.
  m = message_of([&] { save_safetensors(dir.file("r.safetensors"), {{"__metadata__", ones({1})}}); });
  CHECK(contains(m, "r.safetensors"));
  CHECK(contains(m, "reserves"));
  m = message_of([&] { save_safetensors(dir.file("r.safetensors"), {{"w", Tensor()}}); });
  CHECK(contains(m, "tensor 'w'"));
  CHECK(contains(m, "undefined"));
  m = message_of([&] { save_safetensors(dir.file("r.safetensors"), {{"bad\xff", ones({1})}}); });
  CHECK(contains(m, "not valid UTF-8"));
  m = message_of([&] { save_safetensors(dir.file("r.safetensors"), {{"", ones({1})}}); });  // as save_checkpoint
  CHECK(contains(m, "r.safetensors"));
  CHECK(contains(m, "tensor name is empty"));
  m = message_of([&] { save_safetensors(dir.file("r.safetensors"), t, {{"k", "\xc3"}}); });
  CHECK(contains(m, "'k'"));
  CHECK(contains(m, "not valid UTF-8"));
  CHECK_FALSE(fs::exists(dir.path / "r.safetensors"));
  CHECK(contains(message_of([&] { save_safetensors("", t); }), "empty"));
}

TEST_CASE("safetensors: a full disk fails cleanly and keeps the old file") {
  // A file-size limit makes write() fail part way, as a full disk would (EFBIG instead of ENOSPC).
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  save_safetensors(path, {{"old", ones({3})}});
  struct rlimit old_limit {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old_limit;
  small.rlim_cur = 64 * 1024;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  const std::string m = message_of([&] { save_safetensors(path, {{"new", zeros({1 << 18})}}); });
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  CHECK(contains(m, path));
  CHECK(contains(m, "writing"));
  CHECK(dir.listing() == std::vector<std::string>{"big.safetensors"});
  const SafetensorsFile f = load_safetensors(path);
  CHECK(f.tensors.count("old") == 1);
  CHECK(f.tensors.count("new") == 0);
}

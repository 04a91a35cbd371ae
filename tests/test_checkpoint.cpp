// Checkpoints: round trips of every dtype, truncation and bit flips always detected, a writer killed
// mid-write never breaks `latest`, a full disk loses nothing, model mismatches are listed, and
// `kiln train` resumes bit for bit after SIGKILL at several points and saves on SIGTERM.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>
#include <tuple>

#include "io/atomic_file.h"
#include "io/checkpoint.h"
#include "io/run_checkpoint.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "kiln.h"
#include "models/resnet.h"
#include "test_util.h"
#include "tools/train.h"

using namespace kiln;
using kiln::testing::contains;
using kiln::testing::error_of;
using kiln::testing::read_text;
using kiln::testing::run_kiln;
using kiln::testing::TempDir;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
std::vector<std::pair<std::string, Tensor>> sample_tensors() {
  std::vector<std::pair<std::string, Tensor>> t;
  const DType all[] = {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i32, DType::i64, DType::u8, DType::boolean};
  for (DType d : all) t.emplace_back(std::string("t.") + dtype_name(d), randn({3, 5}).mul_(3.0).to(d));
  t.emplace_back("empty", zeros({0, 4}));
  t.emplace_back("scalar", scalar_tensor(2.5, DType::f64));
  t.emplace_back("strided", randn({6, 4}).t());
  return t;
}
std::string bytes_of(const std::string& p) { return read_text(p); }
void write_bytes(const std::string& p, const std::string& b) { std::ofstream(p, std::ios::binary | std::ios::trunc) << b; }

// Whether opening and verifying `path` reports a problem.
bool damaged(const std::string& path) {
  try {
    io::CheckpointReader r(path);
    return !r.verify().empty();
  } catch (const Error&) {
    return true;
  }
}

// `file`'s bytes with the manifest replaced by `manifest`, the header's offsets and both checksums
// rewritten: what a hand-edited (or hostile) checkpoint that is not damaged looks like.
std::string with_manifest(const std::string& file, const std::string& manifest) {
  std::string b = bytes_of(file);
  uint64_t offset = 0;
  std::memcpy(&offset, b.data() + 16, 8);
  b.resize(size_t(offset));
  const uint64_t len = manifest.size();
  const uint32_t crc = io::crc32c(manifest.data(), manifest.size());
  std::memcpy(b.data() + 24, &len, 8);
  std::memcpy(b.data() + 32, &crc, 4);
  const uint32_t hcrc = io::crc32c(b.data(), 36);
  std::memcpy(b.data() + 36, &hcrc, 4);
  return b + manifest;
}
json manifest_of(const std::string& file) {
  const std::string b = bytes_of(file);
  uint64_t offset = 0, len = 0;
  std::memcpy(&offset, b.data() + 16, 8);
  std::memcpy(&len, b.data() + 24, 8);
  return json::parse(b.substr(size_t(offset), size_t(len)));
}
}  // namespace

TEST_CASE("checkpoint: every dtype, empty and 0-dim tensors and the state round-trip exactly") {
  TempDir d("kiln_ckpt");
  const auto tensors = sample_tensors();
  io::save_checkpoint(d / "a.kiln", tensors, R"({"step": 7, "note": "hi"})");
  io::CheckpointReader r(d / "a.kiln");
  CHECK(r.major() == io::kCheckpointMajor);
  CHECK(json::parse(r.state_json())["step"] == 7);
  REQUIRE(r.entries().size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    const Tensor back = r.read(name);
    CHECK(back.dtype() == t.dtype());
    CHECK(back.shape() == t.shape());
    CHECK(back.to_vector() == t.to_vector());
    CHECK(r.find(name)->offset % 64 == 0);
  }
  CHECK(r.verify().empty());
  CHECK(io::crc32c("123456789", 9) == 0xE3069283u);  // the standard check value of CRC-32C
  CHECK(contains(error_of([&] { io::save_checkpoint(d / "b.kiln", {{"x", ones({1})}, {"x", ones({1})}}, "{}"); }),
                 "'x' is empty or repeated"));
  CHECK(contains(error_of([&] { io::save_checkpoint(d / "b.kiln", {}, "[1]"); }), "must be a JSON object"));
  CHECK(!fs::exists(d / "b.kiln"));
}

TEST_CASE("checkpoint: truncation at any length and a flipped bit anywhere are detected") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "a.kiln", sample_tensors(), R"({"step": 1})");
  const std::string good = bytes_of(d / "a.kiln");
  const std::string p = d / "x.kiln";
  int cut_missed = 0, flip_missed = 0, checked = 0;
  for (size_t cut = 0; cut < good.size(); cut += 1 + cut / 16) {
    write_bytes(p, good.substr(0, cut));
    cut_missed += !damaged(p);
  }
  for (size_t pos = 0; pos < good.size(); pos += 1 + (pos % 7)) {
    std::string b = good;
    b[pos] = char(b[pos] ^ (1 << (pos % 8)));
    write_bytes(p, b);
    flip_missed += !damaged(p);
    ++checked;
  }
  CHECK(cut_missed == 0);
  CHECK(flip_missed == 0);
  CHECK(checked > 200);
  write_bytes(p, good + "x");
  CHECK(contains(error_of([&] { io::CheckpointReader r(p); }), "1 unexpected bytes after the manifest"));
  // A newer major version (with a valid header checksum) is refused by name.
  std::string newer = good;
  const uint32_t two = 2;
  std::memcpy(newer.data() + 8, &two, 4);
  const uint32_t crc = io::crc32c(newer.data(), 36);
  std::memcpy(newer.data() + 36, &crc, 4);
  write_bytes(p, newer);
  CHECK(contains(error_of([&] { io::CheckpointReader r(p); }), "newer Kiln"));
  write_bytes(p, std::string(100, 'z'));
  CHECK(contains(error_of([&] { io::CheckpointReader r(p); }), "not a Kiln checkpoint"));
}

TEST_CASE("checkpoint: a header whose manifest offset or length is huge is named truly, without wrapping") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "a.kiln", sample_tensors(), R"({"step": 1})");
  const std::string good = bytes_of(d / "a.kiln");
  // The header with `offset` and `length` for the manifest and a valid checksum: only the span is wrong.
  auto with_span = [&](uint64_t offset, uint64_t length) {
    std::string b = good;
    std::memcpy(b.data() + 16, &offset, 8);
    std::memcpy(b.data() + 24, &length, 8);
    const uint32_t crc = io::crc32c(b.data(), 36);
    std::memcpy(b.data() + 36, &crc, 4);
    write_bytes(d / "x.kiln", b);
    return error_of([&] { io::CheckpointReader r(d / "x.kiln"); });
  };
  uint64_t offset = 0;
  std::memcpy(&offset, good.data() + 16, 8);
  std::string e = with_span(offset, ~uint64_t(0));
  CHECK_MESSAGE(contains(e, "the header gives the manifest 18446744073709551615 bytes, more than the limit"), e);
  e = with_span(~uint64_t(0) - 63, 100);
  CHECK_MESSAGE(contains(e, "the manifest should start at byte 18446744073709551552 but the file has " +
                                std::to_string(good.size()) + " bytes"),
                e);
  e = with_span(offset, 1u << 20);
  CHECK_MESSAGE(contains(e, "should span bytes " + std::to_string(offset) + ".." + std::to_string(offset + (1u << 20))),
                e);
  e = with_span(8, 100);
  CHECK_MESSAGE(contains(e, "inside the 64-byte header"), e);
  // `ckpt verify` reports the same.
  with_span(offset, ~uint64_t(0));
  const auto r = run_kiln("ckpt verify " + d / "x.kiln", d.p.string());
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.output, "18446744073709551615 bytes, more than the limit"), r.output);
}

TEST_CASE("checkpoint: a manifest nested 100000 levels deep is an error, not a crash") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "a.kiln", {{"w", ones({4})}}, R"({"x": 0})");
  std::string text = manifest_of(d / "a.kiln").dump();
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const size_t at = text.find("\"x\":0");
  REQUIRE(at != std::string::npos);
  text.replace(at, 5, "\"x\":" + deep);
  write_bytes(d / "deep.kiln", with_manifest(d / "a.kiln", text));
  CHECK(contains(error_of([&] { io::CheckpointReader r(d / "deep.kiln"); }),
                 "deep.kiln: the manifest nests JSON deeper than 64 levels"));
  for (const char* cmd : {"ckpt verify ", "ckpt inspect "}) {
    const auto r = run_kiln(cmd + d / "deep.kiln", d.p.string());
    CHECK_MESSAGE(r.code == 1, cmd, " -> ", r.code, " ", r.output);
    CHECK_MESSAGE(contains(r.output, "deeper than 64 levels"), r.output);
  }
  // The state Kiln writes itself is well inside the limit.
  CHECK(io::CheckpointReader(d / "a.kiln").state_json() == R"({"x":0})");
}

TEST_CASE("checkpoint: a shape size that is not a whole number >= 0 is refused, not rounded or wrapped") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "a.kiln", {{"w", ones({16})}}, "{}");
  for (const char* size : {"16.5", "18446744073709551615", "-16", "\"16\""}) {
    json m = manifest_of(d / "a.kiln");
    m["tensors"][0]["shape"] = json::parse(std::string("[") + size + "]");
    write_bytes(d / "b.kiln", with_manifest(d / "a.kiln", m.dump()));
    const std::string e = error_of([&] { io::CheckpointReader r(d / "b.kiln"); });
    CHECK_MESSAGE(contains(e, "b.kiln: a manifest tensor entry is malformed"), size, ": ", e);
    CHECK_MESSAGE(contains(e, std::string("holds ") + size + ", which is not a whole number >= 0"), size, ": ", e);
  }
}

TEST_CASE("checkpoint: offset, nbytes and crc32c that are not integers in range are refused, not truncated") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "a.kiln", {{"w", ones({16})}}, "{}");
  const json good = manifest_of(d / "a.kiln");
  const std::string crc = std::to_string(good["tensors"][0]["crc32c"].get<uint64_t>());
  const std::tuple<const char*, std::string, const char*> bad[] = {
      {"offset", "64.7", "0..18446744073709551615"},
      {"offset", "64.0", "0..18446744073709551615"},
      {"offset", "-64", "0..18446744073709551615"},
      {"offset", "\"64\"", "0..18446744073709551615"},
      {"nbytes", "64.9", "0..18446744073709551615"},
      {"nbytes", "6.4e1", "0..18446744073709551615"},
      {"crc32c", crc + ".5", "0..4294967295"},
      {"crc32c", std::to_string(good["tensors"][0]["crc32c"].get<uint64_t>() + (uint64_t(1) << 32)), "0..4294967295"}};
  for (const auto& b : bad) {
    const std::string field = std::get<0>(b), value = std::get<1>(b), range = std::get<2>(b);
    json m = good;
    m["tensors"][0][field] = json::parse(value);
    write_bytes(d / "b.kiln", with_manifest(d / "a.kiln", m.dump()));
    const std::string e = error_of([&] { io::CheckpointReader r(d / "b.kiln"); });
    CHECK_MESSAGE(contains(e, "b.kiln: a manifest tensor entry is malformed (tensor 'w': \"" + field + "\" is " +
                                  m["tensors"][0][field].dump() + ", which is not an integer in " + range),
                  field, "=", value, ": ", e);
  }
  // The same entry with its own integers reads back.
  write_bytes(d / "b.kiln", with_manifest(d / "a.kiln", good.dump()));
  CHECK(io::CheckpointReader(d / "b.kiln").read("w").to_vector() == ones({16}).to_vector());
  // A shape is a list: a number or an object was walked as one ([3]).
  for (const char* shape : {"16", "{\"x\": 16}", "\"16\""}) {
    json m = good;
    m["tensors"][0]["shape"] = json::parse(shape);
    write_bytes(d / "b.kiln", with_manifest(d / "a.kiln", m.dump()));
    const std::string e = error_of([&] { io::CheckpointReader r(d / "b.kiln"); });
    CHECK_MESSAGE(contains(e, "(tensor 'w': shape " + m["tensors"][0]["shape"].dump() + " is not a list of sizes"),
                  shape, ": ", e);
  }
  // -0 is 0 (JSON reads it as a signed integer), as in a shape: an empty tensor's nbytes and crc32c.
  io::save_checkpoint(d / "e.kiln", {{"e", zeros({0})}}, "{}");
  json m = manifest_of(d / "e.kiln");
  REQUIRE(m["tensors"][0]["crc32c"] == 0);
  const std::string text = std::regex_replace(m.dump(), std::regex(R"re("(nbytes|crc32c)":0)re"), R"re("$1":-0)re");
  REQUIRE(text != m.dump());
  write_bytes(d / "b.kiln", with_manifest(d / "e.kiln", text));
  CHECK(error_of([&] { (void)io::CheckpointReader(d / "b.kiln").read("e"); }) == "NO ERROR");
}

TEST_CASE("checkpoint: verify walks a padding gap of megabytes in pieces and finds a byte anywhere in it") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "a.kiln", {{"w", ones({16})}}, "{}");
  json m = manifest_of(d / "a.kiln");
  const std::string a = bytes_of(d / "a.kiln");
  const uint64_t blob = m["tensors"][0]["offset"].get<uint64_t>(), at = (uint64_t(3) << 20) + 64;
  // The same blob moved 3 MiB on, the gap zeros (a hostile file's could be far larger: read in pieces).
  std::string b = a.substr(0, 64) + std::string(size_t(at - 64), '\0') + a.substr(size_t(blob), 64);
  const uint64_t manifest_at = b.size();
  std::memcpy(b.data() + 16, &manifest_at, 8);
  m["tensors"][0]["offset"] = at;
  write_bytes(d / "big.kiln", b);
  write_bytes(d / "big.kiln", with_manifest(d / "big.kiln", m.dump()));
  CHECK(io::CheckpointReader(d / "big.kiln").verify().empty());
  for (const uint64_t bad : {uint64_t(100), (uint64_t(1) << 20) + 3, (uint64_t(2) << 20) + 77, at - 1}) {
    std::string c = bytes_of(d / "big.kiln");
    c[size_t(bad)] = 1;
    write_bytes(d / "bad.kiln", c);
    const auto problems = io::CheckpointReader(d / "bad.kiln").verify();
    REQUIRE_MESSAGE(problems.size() == 1, bad);
    CHECK_MESSAGE(contains(problems[0], "bytes 40.." + std::to_string(at) + " (padding) are not zero"), bad, ": ",
                  problems[0]);
  }
}

TEST_CASE("checkpoint: empty tensors take no room: any number, in any place and manifest order, read back") {
  TempDir d("kiln_ckpt");
  // The writer gives an empty tensor the offset of the next blob (or the manifest's): files of this layout
  // by every Kiln version read back. More than 16 entries made std::sort order equal offsets otherwise.
  const std::pair<const char*, std::function<bool(int, int)>> patterns[] = {
      {"every other", [](int i, int) { return i % 2 == 0; }},     {"odd ones", [](int i, int) { return i % 2 == 1; }},
      {"every third", [](int i, int) { return i % 3 == 0; }},     {"the first ten", [](int i, int) { return i < 10; }},
      {"the last ten", [](int i, int n) { return i >= n - 10; }}, {"all", [](int, int) { return true; }},
      {"all but one", [](int i, int) { return i != 7; }}};
  for (const auto& pattern : patterns) {
    const std::string what = pattern.first;
    const auto& empty = pattern.second;
    for (int n : {17, 33}) {
      std::vector<std::pair<std::string, Tensor>> t;
      for (int i = 0; i < n; ++i) {
        char name[16];
        std::snprintf(name, sizeof name, "t%04d", i);
        t.emplace_back(name, empty(i, n) ? zeros({0, i % 3}) : full({3}, double(i), i % 2 ? DType::f32 : DType::u8));
      }
      const std::string p = d / "e.kiln";
      io::save_checkpoint(p, t, "{}");
      std::string e = error_of([&] {
        io::CheckpointReader r(p);
        for (const auto& named : t)
          CHECK_MESSAGE(r.read(named.first).to_vector() == named.second.to_vector(), what, " ", named.first);
        const auto problems = r.verify();
        CHECK_MESSAGE(problems.empty(), what, " n=", n, ": ", problems.empty() ? "" : problems[0]);
      });
      CHECK_MESSAGE(e == "NO ERROR", what, " n=", n, ": ", e);
      // The same file with its manifest's entries reversed and rotated: the order does not matter.
      for (int turn : {0, 1, 5}) {
        json m = manifest_of(p);
        auto& list = m["tensors"];
        std::reverse(list.begin(), list.end());
        std::rotate(list.begin(), list.begin() + turn, list.end());
        write_bytes(d / "r.kiln", with_manifest(p, m.dump()));
        e = error_of([&] { CHECK(io::CheckpointReader(d / "r.kiln").verify().empty()); });
        CHECK_MESSAGE(e == "NO ERROR", what, " n=", n, " reordered ", turn, ": ", e);
      }
    }
  }
  const auto r = run_kiln("ckpt verify " + d / "r.kiln", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "OK (33 tensors"), r.output);

  // By hand: an empty tensor at an aligned offset inside a blob, or at the manifest's, takes no room and is
  // read; an empty one unaligned or past the data area is still refused, and so are two blobs that
  // overlap, with empties at their offsets in any order.
  io::save_checkpoint(d / "a.kiln", {{"a", ones({40})}, {"b", ones({3})}, {"z", zeros({0})}, {"y", zeros({2, 0})}},
                      "{}");
  json m = manifest_of(d / "a.kiln");
  REQUIRE(m["tensors"][0]["offset"] == 64);
  m["tensors"][2]["offset"] = 128;  // inside a's 160 bytes
  write_bytes(d / "h.kiln", with_manifest(d / "a.kiln", m.dump()));
  {
    io::CheckpointReader h(d / "h.kiln");
    CHECK(h.verify().empty());
    CHECK(h.read("z").shape() == Shape{0});
  }
  m["tensors"][2]["offset"] = 130;
  write_bytes(d / "h.kiln", with_manifest(d / "a.kiln", m.dump()));
  CHECK(contains(error_of([&] { io::CheckpointReader h(d / "h.kiln"); }), "tensor 'z' lies at bytes 130..130"));
  for (int order = 0; order < 4; ++order) {
    json o = manifest_of(d / "a.kiln");
    o["tensors"][1]["offset"] = 128;  // b inside a
    o["tensors"][2]["offset"] = 64;
    o["tensors"][3]["offset"] = 128;
    auto& list = o["tensors"];
    std::rotate(list.begin(), list.begin() + order, list.end());
    write_bytes(d / "h.kiln", with_manifest(d / "a.kiln", o.dump()));
    const std::string e = error_of([&] { io::CheckpointReader h(d / "h.kiln"); });
    CHECK_MESSAGE(contains(e, "h.kiln: tensors 'a' and 'b' overlap"), order, ": ", e);
  }
}

TEST_CASE("checkpoint: the manifest's version must be the header's; state may be absent; format and bools checked") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "a.kiln", {{"m", ones({3}).to(DType::boolean)}}, R"({"k": 1})");
  const json good = manifest_of(d / "a.kiln");
  CHECK(good["version"] == json::array({io::kCheckpointMajor, io::kCheckpointMinor}));
  auto open_with = [&](const json& m) {
    write_bytes(d / "b.kiln", with_manifest(d / "a.kiln", m.dump()));
    return error_of([&] { io::CheckpointReader r(d / "b.kiln"); });
  };
  for (const char* v : {"[2, 0]", "[1, 1]", "[0, 0]", "[1]", "\"1.0\"", "[1, 0.5]", "[1, 0, 0]", "null"}) {
    json m = good;
    m["version"] = json::parse(v);
    const std::string e = open_with(m);
    CHECK_MESSAGE(contains(e, "b.kiln: the manifest's version " + m["version"].dump() + " is not the header's [1,0]"),
                  v, ": ", e);
  }
  // Without a version (the header's rules) or a state (read as {}), the file reads.
  json m = good;
  m.erase("version");
  m.erase("state");
  CHECK(open_with(m) == "NO ERROR");
  {
    io::CheckpointReader r(d / "b.kiln");
    CHECK(r.state_json() == "{}");
    CHECK(r.read("m").to_vector() == std::vector<double>{1, 1, 1});
  }
  m = good;
  m["format"] = "kiln-ckpt";
  CHECK(contains(open_with(m), "lacks the kiln-checkpoint format tag"));
  // A format that is no string is refused alike (it threw JSON's own type error, which no caller catches).
  for (const char* f : {"1", "null", "[\"kiln-checkpoint\"]", "{}"}) {
    m = good;
    m["format"] = json::parse(f);
    const std::string e = open_with(m);
    CHECK_MESSAGE(contains(e, "b.kiln: the manifest lacks the kiln-checkpoint format tag"), f, ": ", e);
  }
  // A bool blob of a byte other than 0 and 1 (its checksum right) is refused when read.
  std::string b = bytes_of(d / "a.kiln");
  b[65] = 2;
  m = good;
  m["tensors"][0]["crc32c"] = io::crc32c(b.data() + 64, 3);
  write_bytes(d / "c.kiln", b);
  write_bytes(d / "c.kiln", with_manifest(d / "c.kiln", m.dump()));
  io::CheckpointReader r(d / "c.kiln");
  CHECK(contains(error_of([&] { (void)r.read("m"); }), "tensor 'm' is bool but holds the byte 2"));
}

TEST_CASE("checkpoint: a writer killed mid-write leaves `latest` pointing at a complete checkpoint") {
  TempDir d("kiln_ckpt");
  const std::string dir = d.p.string();
  const Tensor big = randn({4 << 20});  // 16 MiB: the kill lands inside the write
  io::save_checkpoint(dir + "/step-000000001.kiln", {{"w", big}}, R"({"step": 1})");
  io::write_file_atomic(dir + "/latest", "step-000000001.kiln\n");
  for (int trial = 0; trial < 6; ++trial) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (int s = 2;; ++s) {
        char name[64];
        std::snprintf(name, sizeof name, "step-%09d.kiln", s);
        io::save_checkpoint(dir + "/" + name, {{"w", big}}, "{\"step\": " + std::to_string(s) + "}");
        io::write_file_atomic(dir + "/latest", std::string(name) + "\n");
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5 + 17 * trial));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::string latest = io::find_latest_checkpoint(dir);
    REQUIRE(!latest.empty());
    io::CheckpointReader r(latest);
    CHECK(r.verify().empty());
    CHECK(r.read("w").to_vector() == big.to_vector());
  }
  io::prune_checkpoints(dir, 2);  // also clears the killed writers' temporary files
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
    files += e.path().extension() == ".kiln";
  }
  CHECK(files <= 2);
}

TEST_CASE("checkpoint: out of space while saving: a clear error, no temporary file, the old file intact") {
  TempDir d("kiln_ckpt");
  io::save_checkpoint(d / "c.kiln", {{"w", ones({8})}}, "{}");
  const std::string before = bytes_of(d / "c.kiln");
  struct rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG, like a full disk
  struct rlimit lim = old;
  lim.rlim_cur = 1 << 20;
  ::setrlimit(RLIMIT_FSIZE, &lim);
  const std::string err = error_of([&] { io::save_checkpoint(d / "c.kiln", {{"w", ones({1 << 20})}}, "{}"); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  CHECK(contains(err, "c.kiln: writing"));
  CHECK(contains(err, "File too large"));
  CHECK(bytes_of(d / "c.kiln") == before);
  for (const auto& e : fs::directory_iterator(d.p)) CHECK(e.path().filename() == "c.kiln");
}

TEST_CASE("checkpoint: loading into another model lists every missing, unexpected and mis-shaped name") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  io::RunState run;
  run.step = 3;
  const std::string path = io::save_run_checkpoint(d.p.string(), *a, opt, run, {{"model", "resnet20"}});
  auto b = models::make_resnet({"resnet32", 10, 1});
  const std::string e = error_of([&] { io::load_run_checkpoint(path, *b, nullptr); });
  CHECK(contains(e, path + " does not match the model"));
  // resnet32 has 3 x 2 more blocks: their 72 tensors, the first 10 named and a count.
  CHECK_MESSAGE(contains(e, "missing (72): layer1.3.bn1.bias [16], "), e);
  CHECK_MESSAGE(contains(e, ", ... and 62 more"), e);
  CHECK_MESSAGE(!contains(e, "layer3.7"), e);
  auto c = models::make_resnet({"resnet20", 7, 1});
  CHECK(contains(error_of([&] { io::load_run_checkpoint(path, *c, nullptr); }), "shape of fc.weight: checkpoint [10,64], model [7,64]"));
  auto same = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt2(optim::decay_groups(same->named_parameters(), 0.1, 0), {0.9, 0, false});
  const io::LoadedRun lr = io::load_run_checkpoint(path, *same, &opt2);
  CHECK(lr.run.step == 3);
  CHECK(same->state_dict().at("conv1.weight").to_vector() == a->state_dict().at("conv1.weight").to_vector());
}

TEST_CASE("checkpoint: RMSprop and Adagrad runs resume from a run checkpoint bit for bit") {
  for (const char* which : {"rmsprop", "adagrad"}) {
    CAPTURE(which);
    TempDir d("kiln_ckpt_opt");
    // `fresh`: made with other hyper-parameters and lrs, which the checkpoint's replace (as torch's load)
    auto make = [&which](nn::Linear& m, bool fresh) -> std::unique_ptr<optim::Optimizer> {
      std::vector<optim::ParamGroup> groups = {{{m.weight}, fresh ? 0.5 : 0.02, 0.01}, {{m.bias}, 0.05, 0.0}};
      if (std::string(which) == "rmsprop")
        return std::make_unique<optim::RMSprop>(
            groups, fresh ? optim::RmspropOptions{} : optim::RmspropOptions{0.95, 1e-8, 0.5, true});
      return std::make_unique<optim::Adagrad>(groups,
                                              fresh ? optim::AdagradOptions{} : optim::AdagradOptions{0.1, 1e-10, 0.2});
    };
    manual_seed(4);
    nn::Linear a(6, 3), b(6, 3);
    auto opt_a = make(a, false);
    const Tensor x = randn({8, 6});
    auto train = [&x](nn::Linear& m, optim::Optimizer& o, int steps) {
      for (int s = 0; s < steps; ++s) {
        o.zero_grad();
        sum(m(x * double(s + 1)) * m(x)).backward();
        o.step();
      }
    };
    train(a, *opt_a, 3);
    io::RunState run;
    run.step = 3;
    const std::string path = io::save_run_checkpoint(d.p.string(), a, *opt_a, run, {{"optimizer", which}});
    auto opt_b = make(b, true);  // b's own initial weights and options, replaced by the checkpoint's
    CHECK(io::load_run_checkpoint(path, b, opt_b.get()).run.step == 3);
    CHECK(opt_b->steps(0, 0) == 3);
    train(a, *opt_a, 4);
    train(b, *opt_b, 4);
    CHECK(a.weight.to_vector() == b.weight.to_vector());
    CHECK(a.bias.to_vector() == b.bias.to_vector());
    // the other optimizer's checkpoint is refused, naming both
    nn::Linear c(6, 3);
    optim::SGD sgd({{c.parameters(), 0.1, 0.0}}, {0.9});
    CHECK(contains(error_of([&] { io::load_run_checkpoint(path, c, &sgd); }),
                   std::string("saved with optimizer ") + which));
  }
}

namespace {
std::vector<std::pair<int64_t, double>> step_losses(const std::string& path) {
  std::vector<std::pair<int64_t, double>> out;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) {
      const json j = json::parse(line);
      if (j.contains("loss")) out.emplace_back(j["step"].get<int64_t>(), j["loss"].get<double>());
    }
  return out;
}
size_t lines_in(const std::string& path) {
  std::istringstream in(read_text(path));
  return size_t(std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
}
}  // namespace

TEST_CASE("train: SIGKILL at several steps, then --resume auto: the same losses and weights, bit for bit") {
  TempDir d("kiln_resume");
  const std::string args = "train --limit-train 384 --limit-eval 100 --batch 32 --epochs 2 --log-every 1 --save-every 5 "
                           "--threads 2 --progress lines";
  auto ref = run_kiln(args + " --out " + d / "ref", d.p.string());
  REQUIRE_MESSAGE(ref.code == 0, ref.output);
  const auto want = step_losses(d / "ref/metrics.jsonl");
  REQUIRE(want.size() == 24);
  const std::string want_weights = read_text(d / "ref/model.safetensors");
  for (size_t kill_after : {7u, 13u, 19u}) {  // after the saves at steps 5, 10 and 15
    const std::string out = d / ("run" + std::to_string(kill_after));
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const std::string log = out + ".log";
      ::execl("/bin/sh", "sh", "-c", (std::string(KILN_BINARY) + " " + args + " --out " + out + " > " + log + " 2>&1").c_str(),
              (char*)nullptr);
      ::_exit(127);
    }
    // Kill the whole process group member running kiln once it has logged `kill_after` steps.
    for (int waited = 0; waited < 6000; ++waited) {
      if (fs::exists(out + "/metrics.jsonl") && lines_in(out + "/metrics.jsonl") >= kill_after) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::system(("pkill -9 -f -- '--out " + out + "( |$)'").c_str());
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK_MESSAGE(!fs::exists(out + "/model.safetensors"), "the run finished before it was killed at ", kill_after);
    const auto r = run_kiln(args + " --out " + out + " --resume auto", d.p.string());
    REQUIRE_MESSAGE(r.code == 0, r.output);
    CHECK(contains(r.output, "resumed at step"));
    CHECK(step_losses(out + "/metrics.jsonl") == want);
    CHECK(read_text(out + "/model.safetensors") == want_weights);
  }
}

TEST_CASE("train: SIGTERM saves and exits 0; ckpt verify, export and import") {
  TempDir d("kiln_resume");
  const std::string out = d / "run";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl(KILN_BINARY, KILN_BINARY, "train", "--limit-train", "2048", "--batch", "32", "--epochs", "3", "--log-every", "1",
            "--threads", "2", "--progress", "lines", "--out", out.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  for (int waited = 0; waited < 6000; ++waited) {
    if (fs::exists(out + "/metrics.jsonl") && lines_in(out + "/metrics.jsonl") >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const std::string latest = io::find_latest_checkpoint(out + "/checkpoints");
  REQUIRE(!latest.empty());
  auto r = run_kiln("ckpt verify " + latest, d.p.string());
  CHECK(r.code == 0);
  CHECK(contains(r.output, "OK"));
  std::string b = read_text(latest);
  b[b.size() / 2] = char(b[b.size() / 2] ^ 4);
  write_bytes(d / "bad.kiln", b);
  r = run_kiln("ckpt verify " + d / "bad.kiln", d.p.string());
  CHECK(r.code == 1);
  CHECK_MESSAGE(contains(r.output, "DAMAGED"), r.output);
  r = run_kiln("ckpt inspect " + latest, d.p.string());
  CHECK(r.code == 0);
  CHECK(contains(r.output, "kind: training"));
  r = run_kiln("ckpt export " + latest + " --safetensors " + d / "w.safetensors", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("ckpt import " + d / "w.safetensors" + " --model resnet20 --set in_channels=1 --out " + d / "imp.kiln", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 2 --threads 1 --resume " + d / "imp.kiln" +
                   " --out " + d / "from_import",
               d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  // A resume with another configuration is refused, naming the difference.
  r = run_kiln("train --limit-train 2048 --batch 64 --epochs 3 --threads 2 --resume auto --out " + out, d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "batch: checkpoint 32, now 64"), r.output);
}

TEST_CASE("train: a checkpoint whose config holds flags the run does not use (an older Kiln kept them) resumes") {
  // Before flags a run does not use were refused, `kiln train --model resnet20 --seq-len 64` ran and saved
  // seq_len 64; such a flag can no longer be given, so a resume must not compare it.
  TempDir d("kiln_resume_unused");
  const std::string args = "train --limit-train 64 --limit-eval 32 --batch 32 --max-steps 2 --threads 1 --save-every 1";
  auto r = run_kiln(args + " --out " + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string first = d / "run/checkpoints/step-000000001.kiln";
  json m = manifest_of(first);
  m["state"]["config"]["seq_len"] = 64;
  m["state"]["config"]["mask_prob"] = 0.5;
  m["state"]["config"]["loss_scale_window"] = 4;
  write_bytes(d / "older.kiln", with_manifest(first, m.dump()));
  r = run_kiln(args + " --resume " + d / "older.kiln" + " --out " + d / "resumed", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 1"), r.output);
  // A flag the run uses still has to match.
  m["state"]["config"]["lr"] = 0.5;
  write_bytes(d / "other.kiln", with_manifest(first, m.dump()));
  r = run_kiln(args + " --resume " + d / "other.kiln" + " --out " + d / "other", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "lr: checkpoint 0.5, now 0.1"), r.output);
  CHECK_MESSAGE(!contains(r.output, "seq_len"), r.output);
}

TEST_CASE("checkpoint: a tensor stored with an integer dtype for a float parameter (or the reverse) is refused") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  const std::string path = io::save_run_checkpoint(d.p.string(), *a, opt, {}, {{"model", "resnet20"}});
  // The manifest relabels fc.weight (same bytes) as i32, and a batch-norm counter as f64.
  json m = manifest_of(path);
  for (auto& e : m["tensors"]) {
    if (e["name"] == "model/fc.weight") e["dtype"] = "i32";
    if (e["name"] == "model/bn1.num_batches_tracked") e["dtype"] = "f64";
  }
  write_bytes(d / "relabelled.kiln", with_manifest(path, m.dump()));
  auto b = models::make_resnet({"resnet20", 10, 1});
  const std::string e = error_of([&] { io::load_run_checkpoint(d / "relabelled.kiln", *b, nullptr); });
  CHECK_MESSAGE(contains(e, "relabelled.kiln does not match the model"), e);
  CHECK_MESSAGE(contains(e, "dtype of fc.weight: stored i32, model f32"), e);
  CHECK_MESSAGE(contains(e, "dtype of bn1.num_batches_tracked: stored f64, model i64"), e);

  // The same in safetensors, through `kiln ckpt import` and `kiln forward`; a float of another width loads.
  nn::StateDict sd = a->state_dict();
  io::save_safetensors(d / "f64.st", [&] {
    std::map<std::string, Tensor> w(sd.begin(), sd.end());
    w["fc.weight"] = w["fc.weight"].to(DType::f64);
    return w;
  }());
  auto r = run_kiln("ckpt import " + d / "f64.st" + " --model resnet20 --set in_channels=1 --out " + d / "f64.kiln",
                    d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  std::map<std::string, Tensor> w(sd.begin(), sd.end());
  w["fc.weight"] = zeros(w["fc.weight"].shape(), TensorOptions(DType::i32));
  io::save_safetensors(d / "i32.st", w);
  r = run_kiln("ckpt import " + d / "i32.st" + " --model resnet20 --set in_channels=1 --out " + d / "i32.kiln",
               d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, d / "i32.st" + " does not match the model:"), r.output);
  CHECK_MESSAGE(contains(r.output, "dtype of fc.weight: stored i32, model f32"), r.output);
  CHECK(!fs::exists(d / "i32.kiln"));
  io::save_safetensors(d / "x.st", {{"input", randn({1, 1, 8, 8})}});
  r = run_kiln("forward --model resnet20 --set in_channels=1 --weights " + d / "i32.st" + " --inputs " + d / "x.st" +
                   " --out " + d / "y.st",
               d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, "dtype of fc.weight: stored i32, model f32"), r.output);
}

TEST_CASE(
    "checkpoint: a training checkpoint without optimizer state or with impossible counters is refused, naming the "
    "file") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  a->train();
  sum((*a)(randn({2, 1, 8, 8}))).backward();
  opt.step();
  io::RunState run;
  run.step = 1;
  const std::string path = io::save_run_checkpoint(d.p.string(), *a, opt, run, {{"model", "resnet20"}});
  auto load = [&](const json& m) {
    write_bytes(d / "edited.kiln", with_manifest(path, m.dump()));
    auto b = models::make_resnet({"resnet20", 10, 1});
    optim::SGD opt_b(optim::decay_groups(b->named_parameters(), 0.1, 0), {0.9, 0, false});
    return error_of([&] { io::load_run_checkpoint(d / "edited.kiln", *b, &opt_b); });
  };
  const json good = manifest_of(path);
  CHECK(load(good) == "NO ERROR");
  json m = good;
  json kept = json::array();
  for (const auto& e : m["tensors"])
    if (e["name"].get<std::string>().rfind("optim/", 0) != 0) kept.push_back(e);
  m["tensors"] = kept;
  std::string e = load(m);
  CHECK_MESSAGE(contains(e, "edited.kiln: a training checkpoint after 1 sgd steps without the optimizer's state"), e);
  // Without momentum SGD keeps no state: nothing is missing.
  {
    auto b = models::make_resnet({"resnet20", 10, 1});
    optim::SGD plain(optim::decay_groups(b->named_parameters(), 0.1, 0), {});
    sum((*b)(randn({2, 1, 8, 8}))).backward();
    plain.step();
    TempDir e2("kiln_ckpt");
    const std::string p2 = io::save_run_checkpoint(e2.p.string(), *b, plain, run, {{"model", "resnet20"}});
    optim::SGD plain2(optim::decay_groups(b->named_parameters(), 0.1, 0), {});
    CHECK(error_of([&] { io::load_run_checkpoint(p2, *b, &plain2); }) == "NO ERROR");
  }
  m = good;
  m["state"]["run"]["step"] = -5;
  e = load(m);
  CHECK_MESSAGE(contains(e, "edited.kiln: state.run.step is -5"), e);
  m = good;
  m["state"]["run"]["scaler"]["scale"] = -1.0;
  e = load(m);
  CHECK_MESSAGE(contains(e, "edited.kiln: state.run.scaler.scale is -1"), e);
}

TEST_CASE("train: --resume refuses a checkpoint whose position is past what the run's flags reach") {
  TempDir d("kiln_resume");
  const std::string args =
      "train --limit-train 64 --limit-eval 32 --batch 8 --max-steps 3 --save-every 2 --threads 1 "
      "--progress lines --out ";
  auto r = run_kiln(args + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string ckpt = d / "run/checkpoints/step-000000002.kiln";
  REQUIRE(fs::exists(ckpt));
  for (const auto& [field, value, says] :
       {std::tuple<const char*, int64_t, const char*>{"epoch", 1000000000000000000,
                                                      "state.run.epoch is 1000000000000000000, past the 1 epochs"},
        {"step", 5000, "state.run.step is 5000, past the 3 steps"},
        {"batch", 1000000000000, "state.run.batch is 1000000000000, past the 8 micro-batches"},
        {"step", -5, "state.run.step is -5"}}) {
    json m = manifest_of(ckpt);
    m["state"]["run"][field] = value;
    write_bytes(d / "edited.kiln", with_manifest(ckpt, m.dump()));
    r = run_kiln(args + d / ("again_" + std::string(field)) + " --resume " + d / "edited.kiln", d.p.string());
    CHECK_MESSAGE(r.code == 2, field, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, "edited.kiln: " + std::string(says)), r.output);
  }
}

// A checkpoint whose epochs are of another length than the same flags and data make now (written
// before the epoch rule became floor(n / (ranks x accum x batch))): refused naming both lengths and
// the rule. Before, one saved at an epoch's last step read as "damaged or was edited", any other
// went on with another total_steps and step size.
TEST_CASE("train: --resume refuses a checkpoint whose steps per epoch another rule made, naming both") {
  TempDir d("kiln_resume");
  const std::string args =
      "train --limit-train 64 --limit-eval 32 --batch 8 --max-steps 3 --save-every 2 --threads 1 "
      "--progress lines --out ";
  auto r = run_kiln(args + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string ckpt = d / "run/checkpoints/step-000000002.kiln";
  REQUIRE(fs::exists(ckpt));
  json m = manifest_of(ckpt);
  REQUIRE(m["state"]["config"]["steps_per_epoch"] == 8);
  for (const int64_t spe : {9, 2}) {  // longer and shorter epochs than this build makes
    m["state"]["config"]["steps_per_epoch"] = spe;
    write_bytes(d / "old.kiln", with_manifest(ckpt, m.dump()));
    r = run_kiln(args + d / ("again" + std::to_string(spe)) + " --resume " + d / "old.kiln", d.p.string());
    CHECK_MESSAGE(r.code == 2, spe, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, "old.kiln: this checkpoint's epochs are " + std::to_string(spe) +
                                         " steps, this build makes 8: the rule for a sample count that is no "
                                         "multiple of ranks x --accum-steps x --batch (here 1 x 1 x 8) changed"),
                  r.output);
    CHECK_MESSAGE(!contains(r.output, "damaged or was edited"), r.output);
  }
}

TEST_CASE("train: --resume auto passes over damaged checkpoints to the newest intact one and says so") {
  TempDir d("kiln_resume");
  const std::string args =
      "train --limit-train 64 --limit-eval 32 --batch 8 --max-steps 6 --save-every 2 --threads 1 "
      "--progress lines --out ";
  auto r = run_kiln(args + d / "run", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string good6 = bytes_of(d / "run/checkpoints/step-000000006.kiln");
  // A copy of the run whose step-6 is `damaged` (with or without `latest`), resumed with `resume`.
  auto resume = [&](const std::string& tag, const std::string& damaged, bool keep_latest, const std::string& how) {
    const std::string out = d / tag;
    fs::copy(d / "run", out, fs::copy_options::recursive);
    write_bytes(out + "/checkpoints/step-000000006.kiln", damaged);
    if (!keep_latest) fs::remove(out + "/checkpoints/latest");
    return run_kiln(args + out + " --resume " + how, d.p.string());
  };
  std::string flipped = good6;
  flipped[200] = char(flipped[200] ^ 1);  // in the first tensor's blob: only its CRC can tell
  for (const auto& [tag, damaged, keep_latest, says] :
       {std::tuple<std::string, std::string, bool, std::string>{"latest_truncated", good6.substr(0, good6.size() / 2),
                                                                true, "truncated"},
        {"latest_flipped", flipped, true, "checksum does not match"},
        {"none_truncated", good6.substr(0, good6.size() / 2), false, "truncated"},
        {"none_empty", "", false, "0 bytes is too short"},
        {"none_flipped", flipped, false, "checksum does not match"}}) {
    r = resume(tag, damaged, keep_latest, "auto");
    CHECK_MESSAGE(r.code == 0, tag, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, "warning: --resume auto: skipped damaged checkpoint " + d / tag +
                                         "/checkpoints/step-000000006.kiln: "),
                  tag, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, says), tag, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, "resumed at step 4 from " + d / tag + "/checkpoints/step-000000004.kiln"), tag,
                  " -> ", r.output);
  }
  // Named explicitly, a damaged checkpoint is refused, not replaced by another.
  r = resume("explicit", flipped, true, d / "explicit/checkpoints/step-000000006.kiln");
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "checksum does not match"), r.output);
  // None intact: an error that lists each one.
  fs::copy(d / "run", d / "all", fs::copy_options::recursive);
  for (const char* n : {"step-000000002.kiln", "step-000000004.kiln", "step-000000006.kiln"})
    write_bytes(d / "all/checkpoints/" + n, flipped);
  r = run_kiln(args + d / "all" + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "--resume auto: no intact checkpoint in " + d / "all/checkpoints"), r.output);
  for (const char* n : {"step-000000002.kiln", "step-000000004.kiln", "step-000000006.kiln"})
    CHECK_MESSAGE(contains(r.output, d / "all/checkpoints/" + n + ": "), r.output);
}

TEST_CASE("checkpoint: ckpt export, import and consolidate refuse an existing output unless --overwrite") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  io::RunState run;
  run.step = 4;
  const std::string ck = io::save_run_checkpoint(d / "run", *a, opt, run, {{"model", "resnet20"}});
  io::save_safetensors(d / "w.st", a->state_dict());
  const std::string w = d / "w.st", ck_bytes = bytes_of(ck), w_bytes = bytes_of(w);
  const std::string import = "ckpt import " + w + " --model resnet20 --set in_channels=1 --out " + ck;
  auto r = run_kiln(import, d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--out " + ck + " already exists: add --overwrite to replace it"), r.output);
  CHECK(bytes_of(ck) == ck_bytes);  // the training checkpoint is untouched
  r = run_kiln("ckpt export " + ck + " --safetensors " + w, d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--safetensors " + w + " already exists: add --overwrite"), r.output);
  CHECK(bytes_of(w) == w_bytes);
  r = run_kiln("ckpt consolidate " + ck + " --out " + d / "new.kiln --safetensors " + w, d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--safetensors " + w + " already exists"), r.output);
  // Asked for, it is replaced.
  r = run_kiln("ckpt export " + ck + " --safetensors " + w + " --overwrite", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  r = run_kiln(import + " --overwrite", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(contains(bytes_of(ck), "\"kind\":\"weights\""));
}

TEST_CASE("checkpoint: kiln train's and ckpt export's safetensors say format pt, which transformers 4.x requires") {
  // transformers 4.x's from_pretrained refuses a safetensors file whose metadata "format" is not pt,
  // tf, flax or mlx; Kiln's files are torch's names, dtypes and layout.
  TempDir d("kiln_ckpt_format");
  auto r = run_kiln(
      "train --limit-train 64 --limit-eval 32 --batch 32 --max-steps 1 --threads 1 --save-every 1 --out " + d / "run",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const io::SafetensorsFile trained = io::load_safetensors(d / "run/model.safetensors");
  CHECK(trained.metadata.at("format") == "pt");
  CHECK(trained.metadata.at("writer") == "kiln");
  CHECK(trained.metadata.at("model") == "resnet20");  // kiln eval's keys stay
  r = run_kiln("ckpt export " + io::find_latest_checkpoint(d / "run/checkpoints") + " --safetensors " + d / "w.st",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const io::SafetensorsFile exported = io::load_safetensors(d / "w.st");
  CHECK(exported.metadata.at("format") == "pt");
  CHECK(exported.metadata.at("model") == "resnet20");
  // A file written before (format kiln) still loads: no reader looks at the key.
  io::save_safetensors(d / "old.st", trained.tensors,
                       {{"format", "kiln"}, {"model", "resnet20"}, {"task", "classify"}});
  r = run_kiln("eval --limit-eval 32 --threads 1 --weights " + d / "old.st", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
}

TEST_CASE("checkpoint: a Kiln checkpoint given where safetensors are expected is named as one") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  const std::string ck = io::save_run_checkpoint(d.p.string(), *a, opt, {}, {{"model", "resnet20"}});
  const std::string says = ck +
                           ": this is a Kiln checkpoint, not a safetensors file: export its weights with "
                           "`kiln ckpt export";
  for (const std::string& args :
       {"eval --model resnet20 --weights " + ck, "ckpt import " + ck + " --model resnet20 --out " + d / "i.kiln"}) {
    const auto r = run_kiln(args, d.p.string());
    CHECK(r.code != 0);
    CHECK_MESSAGE(contains(r.output, says), args, " -> ", r.output);
    CHECK_MESSAGE(!contains(r.output, "header length"), r.output);
  }
}

// torch.save's file (a zip archive, "PK\x03\x04"; the legacy format a pickle) read as safetensors
// said "header length 578712552184433488 exceeds the limit".
TEST_CASE("checkpoint: a PyTorch checkpoint given where safetensors are expected is named as one") {
  TempDir d("kiln_ckpt");
  const std::string zip = d / "model.pt", pickle = d / "legacy.pt";
  // The first bytes of each, as torch 2.x writes them (a zip's local file header; pickle protocol 2's
  // PROTO opcode, then the legacy format's magic number as a LONG1).
  const auto write = [](const std::string& path, std::vector<unsigned char> bytes) {
    bytes.resize(64, 0);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  };
  write(zip, {'P', 'K', 3, 4, 0, 0, 8, 8, 0, 0, 'a', 'r', 'c', 'h', 'i', 'v', 'e'});
  write(pickle, {0x80, 2, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8});
  io::save_safetensors(d / "x.st", {{"input", zeros({1, 1, 28, 28})}});
  for (const auto& [file, kind] : {std::pair{zip, "zip archive"}, std::pair{pickle, "pickle"}})
    for (const std::string& args :
         {"eval --model resnet20 --weights " + file, "ckpt import " + file + " --model resnet20 --out " + d / "i.kiln",
          "forward --model resnet20 --set in_channels=1 --weights " + file + " --inputs " + d / "x.st" + " --out " +
              d / "y.st"}) {
      const auto r = run_kiln(args, d.p.string());
      CHECK(r.code != 0);
      CHECK_MESSAGE(contains(r.output, file + ": this is a PyTorch checkpoint (torch.save's " + kind +
                                           "), not a safetensors file: convert it in Python with "
                                           "safetensors.torch.save_file(model.state_dict(), "),
                    args, " -> ", r.output);
      CHECK_MESSAGE(!contains(r.output, "header length"), r.output);
    }
}

TEST_CASE(
    "checkpoint: no command writes its output over its input (export, import, consolidate, forward, eval, vocab)") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  const std::string ck = io::save_run_checkpoint(d.p.string(), *a, opt, {}, {{"model", "resnet20"}});
  io::save_safetensors(d / "w.st", a->state_dict());
  io::save_safetensors(d / "x.st", {{"input", randn({1, 1, 8, 8})}});
  std::ofstream(d / "t.txt") << "the quick brown fox jumps over the lazy dog\n";
  fs::create_symlink(ck, d / "link.kiln");
  const std::string w = d / "w.st", t = d / "t.txt";
  const std::pair<std::string, std::string> cases[] = {
      {"ckpt export " + ck + " --safetensors " + ck, "--safetensors " + ck + " is the input itself"},
      {"ckpt export " + ck + " --safetensors " + d / "link.kiln", " is the input " + ck + " itself"},
      {"ckpt import " + w + " --model resnet20 --set in_channels=1 --out " + w, "--out " + w + " is the input itself"},
      {"ckpt consolidate " + ck + " --out " + d / "link.kiln", " is the input " + ck + " itself"},
      {"forward --model resnet20 --set in_channels=1 --weights " + w + " --inputs " + d / "x.st" + " --out " + w,
       "--out " + w + " is the input itself"},
      {"eval --model resnet20 --weights " + w + " --out " + w, "--out " + w + " is the input itself"},
      {"vocab --text " + t + " --out " + t, "--out " + t + " is the input itself"},
      // t.txt found in the directory: refused as an existing file (with --overwrite it is skipped as
      // text, test_cli_tools.cpp)
      {"vocab --text " + d.p.string() + " --out " + t, "--out " + t + " already exists: add --overwrite"},
  };
  const std::string ck_bytes = bytes_of(ck), w_bytes = bytes_of(w), t_bytes = bytes_of(t);
  for (const auto& [args, says] : cases) {
    const auto r = run_kiln(args, d.p.string());
    CHECK_MESSAGE(r.code == 2, args, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, says), args, " -> ", r.output);
  }
  CHECK(bytes_of(ck) == ck_bytes);
  CHECK(bytes_of(w) == w_bytes);
  CHECK(bytes_of(t) == t_bytes);
}

TEST_CASE(
    "train: a fresh run into an --out that holds a run is refused; --resume continues it, --overwrite replaces it") {
  TempDir d("kiln_resume");
  const std::string args =
      "train --limit-train 64 --limit-eval 32 --batch 8 --max-steps 3 --save-every 2 --threads 1 "
      "--progress lines --out " +
      d / "run";
  auto r = run_kiln(args, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string metrics = read_text(d / "run/metrics.jsonl"), weights = read_text(d / "run/model.safetensors");
  const std::string ckpt = read_text(d / "run/checkpoints/step-000000002.kiln");
  r = run_kiln(args + " --seed 5", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(
      contains(r.output, "--out " + d / "run" +
                             " already holds a run (checkpoints/ (2 checkpoints), metrics.jsonl, "
                             "model.safetensors, summary.json): continue it with --resume auto, or add --overwrite"),
      r.output);
  CHECK(read_text(d / "run/metrics.jsonl") == metrics);
  CHECK(read_text(d / "run/model.safetensors") == weights);
  CHECK(read_text(d / "run/checkpoints/step-000000002.kiln") == ckpt);
  // A folder with nothing of a run in it (an empty metrics file of a run that failed at once) is fine.
  fs::create_directories(d / "empty/checkpoints");
  std::ofstream(d / "empty/metrics.jsonl").flush();
  CHECK(tools::run_in_folder(d / "empty").empty());
  // --overwrite starts over, the old checkpoints gone with the old run.
  r = run_kiln(args + " --max-steps 1 --overwrite", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(!fs::exists(d / "run/checkpoints/step-000000002.kiln"));
  CHECK(step_losses(d / "run/metrics.jsonl").size() == 1);
  // --resume auto with no checkpoint to continue from would start over too: refused the same way, and the
  // message does not suggest it.
  fs::remove_all(d / "run/checkpoints");
  const std::string kept = read_text(d / "run/metrics.jsonl");
  r = run_kiln(args + " --resume auto", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "but no checkpoint to continue from: add --overwrite"), r.output);
  CHECK(read_text(d / "run/metrics.jsonl") == kept);
}

TEST_CASE(
    "checkpoint: messages name the file and the field: state types, a missing file, weight mismatches, empty data") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {});
  io::RunState run;
  run.step = 2;
  const std::string path = io::save_run_checkpoint(d.p.string(), *a, opt, run, {{"model", "resnet20"}});
  const json good = manifest_of(path);
  auto load = [&](const std::function<void(json&)>& edit) {
    json m = good;
    edit(m["state"]);
    write_bytes(d / "edited.kiln", with_manifest(path, m.dump()));
    auto b = models::make_resnet({"resnet20", 10, 1});
    optim::SGD opt_b(optim::decay_groups(b->named_parameters(), 0.1, 0), {});
    return error_of([&] { io::load_run_checkpoint(d / "edited.kiln", *b, &opt_b); });
  };
  const std::pair<std::function<void(json&)>, std::string> cases[] = {
      {[](json& s) { s["kind"] = 3; }, "edited.kiln: state.kind is 3, expected"},
      {[](json& s) { s.erase("run"); }, "edited.kiln: state.run is missing"},
      {[](json& s) { s["config"] = "x"; }, "edited.kiln: state.config is \"x\", expected an object"},
      {[](json& s) { s["rng"] = "x"; }, "edited.kiln: state.rng is \"x\", expected an object"},
      {[](json& s) { s["run"]["step"] = "3"; }, "edited.kiln: state.run.step is \"3\", expected an integer"},
      {[](json& s) { s["run"]["step"] = 1e300; }, "edited.kiln: state.run.step is 1e+300, expected an integer"},
      {[](json& s) { s["run"]["window"] = json::array(); }, "edited.kiln: state.run.window is [], expected an array"},
      {[](json& s) { s.erase("optimizer"); }, "edited.kiln: state.optimizer is missing"},
  };
  for (const auto& [edit, says] : cases) {
    const std::string e = load(edit);
    CHECK_MESSAGE(contains(e, says), e);
    CHECK_MESSAGE(!contains(e, "json.exception"), e);
  }
  // A missing file is not a damaged one.
  auto r = run_kiln("ckpt verify " + d / "nope.kiln", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, d / "nope.kiln" + " does not exist"), r.output);
  CHECK_MESSAGE(!contains(r.output, "DAMAGED"), r.output);
  // Weights for another model: the file named, the list cut short.
  io::save_safetensors(d / "w.st", a->state_dict());
  r = run_kiln("ckpt import " + d / "w.st" + " --model resnet56 --set in_channels=1 --out " + d / "i.kiln",
               d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, d / "w.st" + " does not match the model:\n  missing (216): "), r.output);
  CHECK_MESSAGE(contains(r.output, ", ... and 206 more"), r.output);
  CHECK_MESSAGE(!contains(r.output, "layer3.8"), r.output);
  // An empty --resume is not a fresh start.
  r = run_kiln("train --resume '' --out " + d / "run", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--resume: an empty path"), r.output);
  // An IDX data set of no samples names its file.
  fs::create_directories(d / "idx");
  for (const char* split : {"train", "t10k"}) {
    std::ofstream(d / (std::string("idx/") + split + "-images-idx3-ubyte"), std::ios::binary)
        << std::string("\0\0\x08\x03\0\0\0\0\0\0\0\x1c\0\0\0\x1c", 16);
    std::ofstream(d / (std::string("idx/") + split + "-labels-idx1-ubyte"), std::ios::binary)
        << std::string("\0\0\x08\x01\0\0\0\0", 8);
  }
  r = run_kiln("train --data mnist --data-dir " + d / "idx" + " --threads 1 --out " + d / "run", d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, d / "idx/train-images-idx3-ubyte" + ": holds no images"), r.output);
}

TEST_CASE("train: --memory-cap too small for the run is named") {
  TempDir d("kiln_cap");
  const auto r = run_kiln(
      "train --limit-train 64 --limit-eval 32 --batch 8 --threads 1 --device cpu --memory-cap 1KiB --out " + d / "run",
      d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, "--memory-cap 1KiB is too small for this run: CPU memory cap reached"), r.output);
  CHECK_MESSAGE(contains(r.output, "passes the cap of 1.0 KiB"), r.output);  // not "0.0 MiB"
}

TEST_CASE("checkpoint: f32 weights load into an f16 or bf16 model and back") {
  TempDir d("kiln_ckpt");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {});
  const std::string path = io::save_run_checkpoint(d.p.string(), *a, opt, {}, {{"model", "resnet20"}});
  for (DType low : {DType::f16, DType::bf16}) {
    auto b = models::make_resnet({"resnet20", 10, 1});
    b->to(low);
    io::load_run_checkpoint(path, *b, nullptr);
    const Tensor w = b->state_dict().at("layer2.0.conv1.weight");
    CHECK(w.dtype() == low);
    CHECK(allclose(w.to(DType::f32), a->state_dict().at("layer2.0.conv1.weight"), low == DType::f16 ? 1e-3 : 1e-2, 1e-4));
    // And back: an f32 model from the low-precision model's checkpoint holds the rounded values exactly.
    optim::SGD opt_b(optim::decay_groups(b->named_parameters(), 0.1, 0), {});
    TempDir e("kiln_ckpt");
    const std::string low_path = io::save_run_checkpoint(e.p.string(), *b, opt_b, {}, {{"model", "resnet20"}});
    auto c = models::make_resnet({"resnet20", 10, 1});
    io::load_run_checkpoint(low_path, *c, nullptr);
    CHECK(c->state_dict().at("layer2.0.conv1.weight").to_vector() == w.to(DType::f32).to_vector());
  }
}

TEST_CASE("train: --mirror copies every checkpoint; a mirror that cannot be written is never fatal") {
  TempDir d("kiln_mirror");
  const std::string args = "train --limit-train 256 --limit-eval 64 --batch 32 --epochs 2 --threads 2 --progress lines";
  auto r = run_kiln(args + " --out " + d / "run" + " --mirror " + d / "mirror", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(read_text(d / "mirror/latest") == read_text(d / "run/checkpoints/latest"));
  const std::string name = read_text(d / "mirror/latest").substr(0, 19);
  CHECK(read_text(d / ("mirror/" + name)) == read_text(d / ("run/checkpoints/" + name)));
  std::ofstream(d / "blocker") << "a file where the mirror directory should go";
  r = run_kiln(args + " --out " + d / "run2" + " --mirror " + d / "blocker/sub", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "mirror: copying"));
  // Its owner file not written is said at the start, not passed over in silence.
  CHECK_MESSAGE(contains(r.output, "warning: --mirror " + d / "blocker/sub" + ": cannot write " +
                                       d / "blocker/sub/kiln-mirror.json (Not a directory)"),
                r.output);
  CHECK(fs::exists(d / "run2/model.safetensors"));
}

TEST_CASE("train: a checkpoint that cannot be written (file-size limit, like a full disk) is reported; training goes on") {
  TempDir d("kiln_full");
  // 3000 blocks of 512 bytes (1.5 MB) per file: metrics and the final weights (1.1 MB) fit, a training checkpoint (2.2
  // MB) does not.
  // --save-every 4: the step-8 checkpoint is due at the step and at the end of the epoch.
  const std::string cmd = "sh -c 'ulimit -f 3000; exec " + std::string(KILN_BINARY) +
                          " train --limit-train 256 --limit-eval 64 --batch 32 --epochs 1 --threads 2 --progress lines "
                          "--save-every 4 --out " +
                          d / "run" + "' > " + d / "log.txt" + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string log = read_text(d / "log.txt");
  CHECK_MESSAGE(WIFEXITED(rc), log);
  // The run's results are written: exit 0, and the failed checkpoints said in the last line and
  // summary.json, for a script to tell.
  CHECK_MESSAGE(WEXITSTATUS(rc) == 0, log);
  CHECK(contains(log, "checkpoint at step 4 failed"));
  CHECK(contains(log, "checkpoint at step 8 failed"));
  CHECK(contains(log, "File too large"));
  // The step that failed is not tried again at the end of the epoch, right after.
  size_t tries = 0;
  for (size_t at = log.find("checkpoint at step 8 failed"); at != std::string::npos;
       at = log.find("checkpoint at step 8 failed", at + 1))
    ++tries;
  CHECK_MESSAGE(tries == 1, log);
  CHECK_MESSAGE(contains(log, "warning: checkpoints failed since step 4: this run has no checkpoint to continue from"),
                log);
  const auto summary = nlohmann::json::parse(read_text(d / "run/summary.json"));
  CHECK(summary["checkpoints_failed_since"] == 4);
  CHECK(summary["last_checkpoint"] == "");
  CHECK(fs::exists(d / "run/model.safetensors"));
  for (const auto& e : fs::directory_iterator(d / "run/checkpoints"))
    CHECK_MESSAGE(e.path().filename().string().find(".tmp.") == std::string::npos, e.path());
}

TEST_CASE("train: --zero 1 with one rank says it splits nothing") {
  TempDir d("kiln_zero1");
  const auto r = run_kiln(
      "train --limit-train 16 --limit-eval 8 --batch 8 --max-steps 1 --threads 1 --device cpu "
      "--zero 1 --out " +
          d / "run",
      d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "note: --zero 1 with one rank keeps the whole optimizer state on it"), r.output);
}

// --betas and --eps came after checkpoints were first written: a config without them ran with the
// optimizer's constants then (AdamW 0.9,0.999 and 1e-8; LAMB's eps 1e-6), and resumes as them.
TEST_CASE("checkpoint: a resume compares the Adam betas and eps; a checkpoint without them ran the old defaults") {
  const json adamw = {{"optimizer", "adamw"}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}};
  const json lamb = {{"optimizer", "lamb"}, {"betas", {0.9, 0.999}}, {"eps", 1e-6}};
  CHECK(io::config_differences({{"optimizer", "adamw"}}, adamw).empty());
  CHECK(io::config_differences({{"optimizer", "lamb"}}, lamb).empty());
  // LAMB's old eps is not AdamW's.
  json lamb8 = lamb;
  lamb8["eps"] = 1e-8;
  auto d = io::config_differences({{"optimizer", "lamb"}}, lamb8);
  REQUIRE(d.size() == 1);
  CHECK(d[0] == "eps: checkpoint 1e-06, now 1e-08");
  json other = adamw;
  other["betas"] = {0.9, 0.98};
  d = io::config_differences(adamw, other);
  REQUIRE(d.size() == 1);
  CHECK(d[0] == "betas: checkpoint [0.9,0.999], now [0.9,0.98]");
  d = io::config_differences({{"optimizer", "adamw"}}, other);
  REQUIRE(d.size() == 1);
  CHECK(d[0] == "betas: checkpoint [0.9,0.999], now [0.9,0.98]");
}

TEST_CASE("checkpoint: a resume compares what the flags made of the data (label order, classes, sizes)") {
  const json saved = {{"batch", 32},
                      {"data_info", {{"name", "tsv"}, {"labels", {"0", "1", "10", "2"}}, {"train_samples", 40}}}};
  json now = saved;
  CHECK(io::config_differences(saved, now).empty());
  // Integer labels read in another order (a newer version's rule) would permute the classifier's ids.
  now["data_info"]["labels"] = {"0", "1", "2", "10"};
  now["data_info"]["train_samples"] = 41;
  const auto d = io::config_differences(saved, now);
  REQUIRE(d.size() == 2);
  CHECK(d[0] ==
        "data labels: checkpoint [\"0\",\"1\",\"10\",\"2\"], now [\"0\",\"1\",\"2\",\"10\"] (first "
        "difference at entry 2: checkpoint \"10\", now \"2\"; 4 and 4 entries)");
  CHECK(d[1] == "data train_samples: checkpoint 40, now 41");
  // A checkpoint of an older version without these keys, or without data_info, is not compared on them.
  CHECK(io::config_differences({{"batch", 32}, {"data_info", {{"name", "tsv"}}}}, now).empty());
  CHECK(io::config_differences({{"batch", 32}}, now).empty());
  // A long value is cut in the message.
  json many = saved;
  many["data_info"]["classes"] = std::vector<std::string>(100, "a-class-name");
  json other = many;
  other["data_info"]["classes"][99] = "another";
  const auto cut = io::config_differences(many, other);
  REQUIRE(cut.size() == 1);
  CHECK(contains(cut[0], " characters)"));
  CHECK(contains(cut[0], "first difference at entry 99: checkpoint \"a-class-name\", now \"another\""));
  CHECK(cut[0].size() < 500);
}

// The data's paths are not compared where the checkpoint records what the files hold: the same
// contents under other paths resume. A checkpoint written before data_info.contents existed (the
// paths only) is compared by its paths, normalised: ./x, x and its absolute path are one.
TEST_CASE("checkpoint: a resume compares the data files' contents, not their paths") {
  const std::string here = std::filesystem::current_path().string();
  const json old = {{"text", {"txt"}},
                    {"vocab", "vocab.txt"},
                    {"data_dir", "data"},
                    {"data_info", {{"files", {"txt"}}, {"vocab_fingerprint", "00ff"}, {"train_samples", 40}}}};
  json now = {{"text", {here + "/txt"}},
              {"vocab", "./vocab.txt"},
              {"data_dir", here + "/./data/"},
              {"data_info",
               {{"files", {here + "/txt"}},
                {"contents", {"--text[0]: 12 bytes, crc32c 0000abcd"}},
                {"vocab_fingerprint", "00ff"},
                {"train_samples", 40}}}};
  CHECK(io::config_differences(old, now).empty());
  {
    json elsewhere = now;
    elsewhere["text"] = {"/abs/elsewhere/txt"};
    elsewhere["data_dir"] = "/usr/share/data";
    const auto d = io::config_differences(old, elsewhere);
    REQUIRE(d.size() == 2);
    CHECK(d[0] ==
          "data_dir: checkpoint \"data\", now \"/usr/share/data\" (the checkpoint records no data contents, "
          "so its paths are compared)");
    CHECK(contains(d[1], "text: checkpoint [\"txt\"], now [\"/abs/elsewhere/txt\"]"));
  }
  // With the contents recorded, other paths (data_dir included) holding the same bytes resume.
  {
    json saved = now;
    saved["text"] = {"txt"};
    saved["data_dir"] = "/somewhere/else";
    saved["data_info"]["files"] = {"txt"};
    CHECK(io::config_differences(saved, now).empty());
  }
  json saved = now;
  saved["data_info"]["files"] = {"txt"};
  CHECK(io::config_differences(saved, now).empty());
  now["data_info"]["contents"] = {"--text[0]: 13 bytes, crc32c 0000abce"};
  now["data_info"]["vocab_fingerprint"] = "0100";
  const auto d = io::config_differences(saved, now);
  REQUIRE(d.size() == 2);
  CHECK(contains(d[0], "data contents: checkpoint [\"--text[0]: 12 bytes, crc32c 0000abcd\"]"));
  CHECK(contains(d[1], "data vocab_fingerprint: checkpoint \"00ff\", now \"0100\""));
}

// The weights kiln ckpt export (and consolidate --safetensors) take out of a checkpoint carry what the
// run's model.safetensors carries (seq_len, case, vocabulary), so kiln eval reads the same text the
// same way: written with only the model's name, eval took --seq-len 128 and any vocabulary.
TEST_CASE("checkpoint: ckpt export and consolidate write the run's metadata: evaluated as model.safetensors is") {
  TempDir d("kiln_ckpt_meta");
  const std::string text = " --text " + kiln::testing::kFortunes + "/computers";
  auto r = run_kiln("vocab" + text + " --size 1000 --out " + d / "vocab.txt", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("vocab" + text + " --size 500 --out " + d / "other.txt", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("train --model bert-tiny" + text + " --vocab " + d / "vocab.txt" +
                   " --seq-len 32 --max-steps 2 --save-every 2 --batch 8 --limit-eval 32 --threads 1 --progress lines "
                   "--zero 1 --out " +
                   d / "run",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("ckpt export " + d / "run/checkpoints/step-000000002.kiln --safetensors " + d / "exp.safetensors",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("ckpt consolidate " + d / "run/checkpoints/step-000000002.kiln --out " + d / "whole.kiln" +
                   " --safetensors " + d / "con.safetensors",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::map<std::string, std::string> trained = io::load_safetensors(d / "run/model.safetensors").metadata;
  CHECK(trained.at("seq_len") == "32");
  CHECK(io::load_safetensors(d / "exp.safetensors").metadata == trained);
  CHECK(io::load_safetensors(d / "con.safetensors").metadata == trained);
  const std::string eval = "eval --model bert-tiny" + text + " --limit-eval 32 --threads 1 --vocab ";
  for (const std::string w : {"run/model.safetensors", "exp.safetensors", "con.safetensors"}) {
    CAPTURE(w);
    r = run_kiln(eval + d / "vocab.txt --weights " + d / w + " --out " + d / (w.substr(0, 3) + ".json"), d.p.string());
    REQUIRE_MESSAGE(r.code == 0, r.output);
    r = run_kiln(eval + d / "other.txt --weights " + d / w, d.p.string());
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.output, "is not the vocabulary " + d / w + " was trained with"), r.output);
  }
  const json a = json::parse(read_text(d / "run.json")), b = json::parse(read_text(d / "exp.json"));
  CHECK(a["data"]["seq_len"] == 32);
  CHECK(b["data"]["seq_len"] == 32);
  CHECK(a["test_loss"] == b["test_loss"]);
  CHECK(a["test_mlm_accuracy"] == b["test_mlm_accuracy"]);
  CHECK(json::parse(read_text(d / "con.json"))["test_loss"] == a["test_loss"]);
}

// consolidate's two outputs are two files: --out F --safetensors F wrote the checkpoint, then the
// weights over it, and exited 0 (output_is_input cannot tell: an output that does not exist yet is
// no input). Refused however the one path is spelled, and named as two outputs when F exists.
TEST_CASE("checkpoint: ckpt consolidate refuses --out and --safetensors naming one file") {
  TempDir d("kiln_ckpt_two");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  const std::string ck = io::save_run_checkpoint(d / "run", *a, opt, {}, {{"model", "resnet20"}});
  const std::string f = d / "f.kiln";
  const std::string says = "--out " + f + " and --safetensors ";
  for (const std::string& other : {f, (d.p / "." / "f.kiln").string(), (d.p / "run" / ".." / "f.kiln").string()}) {
    CAPTURE(other);
    const auto r = run_kiln("ckpt consolidate " + ck + " --out " + f + " --safetensors " + other, d.p.string());
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.output, says + other + " name the same file"), r.output);
    CHECK(!fs::exists(f));
  }
  // Existing, with --overwrite: named as the two outputs, not as "the input"; a link to it counts too.
  write_bytes(f, "earlier");
  fs::create_symlink(f, d / "link.safetensors");
  for (const std::string& other : {f, d / "link.safetensors"}) {
    CAPTURE(other);
    const auto r =
        run_kiln("ckpt consolidate " + ck + " --out " + f + " --safetensors " + other + " --overwrite", d.p.string());
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.output, says + other + " name the same file"), r.output);
    CHECK_MESSAGE(!contains(r.output, "is the input"), r.output);
    CHECK(bytes_of(f) == "earlier");
  }
}

// A --zero 1 checkpoint leaves out each optimizer group's size (its rank's views are not the
// parameters); the consolidated one holds them, as an unsharded run's does, so its resume checks
// the groups (engine/optim.cpp, Optimizer::load_state).
TEST_CASE("checkpoint: ckpt consolidate writes each optimizer group's size (group<g>.params)") {
  TempDir d("kiln_ckpt_groups");
  const std::string args =
      "train --limit-train 16 --limit-eval 8 --batch 8 --max-steps 1 --save-every 1 --threads 1 --device cpu "
      "--progress lines";
  auto r = run_kiln(args + " --out " + d / "plain", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln(args + " --zero 1 --out " + d / "zero", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("ckpt consolidate " + d / "zero/checkpoints/step-000000001.kiln --out " + d / "whole.kiln",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto sizes = [](const std::string& path) {
    const json s = json::parse(io::CheckpointReader(path).state_json())["optimizer"]["scalars"];
    std::map<std::string, double> out;
    for (const auto& [k, v] : s.items())
      if (k.size() > 7 && k.compare(k.size() - 7, 7, ".params") == 0) out[k] = v.get<double>();
    return out;
  };
  const auto plain = sizes(d / "plain/checkpoints/step-000000001.kiln");
  REQUIRE(plain.size() == 2);  // ResNet: weights with decay, and biases and norms without
  CHECK(sizes(d / "zero/checkpoints/step-000000001.kiln").empty());
  CHECK(sizes(d / "whole.kiln") == plain);
  r = run_kiln(args + " --resume " + d / "whole.kiln" + " --out " + d / "res", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 1"), r.output);
}

// What is wrong is said as it is: a directory is no damaged checkpoint, another format version is
// unsupported, a weights-only checkpoint has no optimizer state, another model's weights are that
// model's, and a safetensors file is one.
TEST_CASE("checkpoint: messages for a directory, another format version, weights only, another model, safetensors") {
  TempDir d("kiln_ckpt_msgs");
  auto a = models::make_resnet({"resnet20", 10, 1});
  optim::SGD opt(optim::decay_groups(a->named_parameters(), 0.1, 0), {0.9, 0, false});
  const std::string ck = io::save_run_checkpoint(d / "run", *a, opt, {}, {{"model", "resnet20"}});
  auto r = run_kiln("ckpt verify " + d / "run", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, d / "run" + " is a directory, not a checkpoint file"), r.output);
  CHECK_MESSAGE(!contains(r.output, "DAMAGED"), r.output);
  // Another major version, its header intact: unsupported (exit 1 all the same), newer or older.
  const std::string good = bytes_of(ck);
  for (const auto& version : {std::pair<uint32_t, std::string>{2, "a newer"}, {0, "an older"}}) {
    const uint32_t major = version.first;
    const std::string& which = version.second;
    CAPTURE(major);
    std::string b = good;
    std::memcpy(b.data() + 8, &major, 4);
    const uint32_t crc = io::crc32c(b.data(), 36);
    std::memcpy(b.data() + 36, &crc, 4);
    write_bytes(d / "v.kiln", b);
    r = run_kiln("ckpt verify " + d / "v.kiln", d.p.string());
    CHECK(r.code == 1);
    CHECK_MESSAGE(contains(r.output, d / "v.kiln" + ": UNSUPPORTED"), r.output);
    CHECK_MESSAGE(contains(r.output, "written in checkpoint format " + std::to_string(major) + ".0 by " + which +
                                         " Kiln; this build reads format 1.x"),
                  r.output);
    CHECK_MESSAGE(!contains(r.output, "DAMAGED"), r.output);
  }
  // A weights-only checkpoint (kiln ckpt import's) has no optimizer state to consolidate.
  auto b = models::make_resnet({"resnet32", 10, 1});
  std::vector<std::pair<std::string, Tensor>> weights;
  for (const auto& [n, t] : b->state_dict()) weights.emplace_back("model/" + n, t);
  io::save_checkpoint(d / "w.kiln", weights, R"({"kind": "weights", "config": {"model": "resnet32", "set": []}})");
  r = run_kiln("ckpt consolidate " + d / "w.kiln --out " + d / "c.kiln", d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, d / "w.kiln" + ": holds weights only, no optimizer state"), r.output);
  CHECK_MESSAGE(!contains(r.output, "whole already"), r.output);
  // Another model's weights: said first, before the lists of tensors.
  r = run_kiln("train --limit-train 16 --limit-eval 8 --batch 8 --max-steps 1 --threads 1 --resume " + d / "w.kiln" +
                   " --out " + d / "res",
               d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, d / "w.kiln" + " holds resnet32 weights, not resnet20: they do not match:\n"),
                r.output);
  // A safetensors file where a checkpoint is read (kiln.load_checkpoint, --resume) says where it goes.
  io::save_safetensors(d / "m.safetensors", a->state_dict());
  const std::string e = error_of([&] { io::CheckpointReader rd(d / "m.safetensors"); });
  CHECK_MESSAGE(contains(e, d / "m.safetensors" + ": this is a safetensors file, not a Kiln checkpoint: load it "
                                                  "with kiln.load (Python), or make a weights-only checkpoint of it "
                                                  "with `kiln ckpt import"),
                e);
}

TEST_CASE("names_with_shapes lists names with their shapes, cut after 10 with a count") {
  nn::StateDict few{{"a", zeros({3, 4})}, {"b", zeros({5})}};
  CHECK(io::names_with_shapes(few) == "a [3,4], b [5]");
  nn::StateDict many;
  for (int i = 0; i < 12; ++i) many[std::string(1, char('a' + i))] = zeros({2});
  const std::string s = io::names_with_shapes(many);
  CHECK(contains(s, "j [2], ... and 2 more"));
  CHECK_FALSE(contains(s, "k [2]"));
}

// TensorBoard event encoding (io/tensorboard.h): CRC-32C's check value, the masked form, and an
// event's bytes worked out by hand from the protobuf wire format. tests/python/test_tensorboard.py
// reads real runs' files back with the tensorboard package.
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <csignal>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/tensorboard.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::TempDir;

TEST_CASE("tensorboard: CRC-32C and its mask") {
  CHECK(io::crc32c("123456789", 9) == 0xE3069283u);  // the Castagnoli CRC's check value
  const uint32_t c = 0xE3069283u;
  CHECK(io::tb::masked_crc32c("123456789", 9) == uint32_t(((c >> 15) | (c << 17)) + 0xa282ead8u));
}

TEST_CASE("tensorboard: a scalar event, byte by byte") {
  const std::string e = io::tb::scalars_event(0.5, 300, {{"a", 1.0f}});
  std::string want;
  want += '\x09';  // field 1 (wall_time), wire type 1 (fixed64)
  double w = 0.5;
  want.append(reinterpret_cast<const char*>(&w), 8);
  want += "\x10\xac\x02";  // field 2 (step), varint 300
  // field 5 (summary), length 10: field 1 (value), length 8: tag "a" (3 bytes), simple_value 1.0f (5)
  want +=
      "\x2a\x0a\x0a\x08\x0a\x01"
      "a"
      "\x15";
  float one = 1.0f;
  want.append(reinterpret_cast<const char*>(&one), 4);
  CHECK(e == want);
  const std::string r = io::tb::record(e);
  REQUIRE(r.size() == 8 + 4 + e.size() + 4);
  uint64_t len = 0;
  std::memcpy(&len, r.data(), 8);
  CHECK(len == e.size());
  uint32_t crc = 0;
  std::memcpy(&crc, r.data() + 12 + e.size(), 4);
  CHECK(crc == io::tb::masked_crc32c(e.data(), e.size()));
  // A restart: field 7 (session_log) holding status START (field 1 = 1).
  const std::string s = io::tb::session_start_event(0.0, 4);
  CHECK(s.substr(s.size() - 4) == std::string("\x3a\x02\x08\x01", 4));
}

TEST_CASE("tensorboard: the writer's file, and an unwritable folder named in the error") {
  TempDir d("kiln_tb");
  std::string path;
  {
    io::EventWriter w(d.p.string());
    w.scalars(1, {{"train/loss", 2.5f}});
    path = w.path();
    CHECK(w.ok());
  }
  CHECK(path.find("tfevents") != std::string::npos);
  // the pid zero-padded to 10 digits, so two files of one second sort by it
  char pid[32];
  std::snprintf(pid, sizeof pid, ".%010d.kiln", int(::getpid()));
  CHECK_MESSAGE(path.size() > 16, path);
  CHECK_MESSAGE(path.compare(path.size() - std::strlen(pid), std::strlen(pid), pid) == 0, path);
  CHECK(std::filesystem::file_size(path) > 40);
  io::EventWriter::remove_old(d.p.string());
  CHECK(!std::filesystem::exists(path));
  CHECK_THROWS_WITH_AS(io::EventWriter((d.p / "missing" / "dir").string()), doctest::Contains("missing/dir"), Error);
}

TEST_CASE("tensorboard: a write that fails (a full disk) leaves whole records, is said once, and later events go on") {
  TempDir d("kiln_tb");
  // A file-size limit, with SIGXFSZ ignored: a write past it is cut short, then fails with EFBIG, as
  // on a full disk (restored before the checks, for the rest of the tests).
  struct rlimit was {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &was) == 0);
  void (*old_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);
  io::EventWriter w(d.p.string());
  const std::vector<std::pair<std::string, float>> v = {{"train/loss", 2.5f}, {"train/lr", 0.1f}};
  w.scalars(1, v);
  const auto size1 = std::filesystem::file_size(w.path());
  std::vector<std::string> said;
  {
    struct rlimit cap = was;
    cap.rlim_cur = rlim_t(size1 + 30);  // room for part of the next record only
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &cap) == 0);
    w.scalars(2, v);
    const bool failed = !w.ok();
    for (const auto& n : w.take_notices()) said.push_back(n);
    w.scalars(3, v);
    for (const auto& n : w.take_notices()) said.push_back(n);
    ::setrlimit(RLIMIT_FSIZE, &was);
    CHECK(failed);
  }
  std::signal(SIGXFSZ, old_handler);
  CHECK(std::filesystem::file_size(w.path()) == size1);  // the cut-off part of step 2's record is gone
  REQUIRE(said.size() == 1);
  CHECK_MESSAGE(said[0] == "warning: " + w.path() +
                               ": cannot write the TensorBoard events of step 2 (File too large); "
                               "training goes on, and each later event tries again",
                said[0]);
  w.scalars(4, v);
  CHECK(w.ok());
  const auto again = w.take_notices();
  REQUIRE(again.size() == 1);
  CHECK(again[0] == w.path() + ": writing again at step 4 (the events since step 2 are missing)");
  CHECK(w.take_notices().empty());
  // Every record whole: its length, the length's CRC, the event, the event's CRC, to the file's end.
  std::ifstream f(w.path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t at = 0, records = 0;
  while (at + 12 <= bytes.size()) {
    uint64_t len = 0;
    std::memcpy(&len, bytes.data() + at, 8);
    uint32_t len_crc = 0;
    std::memcpy(&len_crc, bytes.data() + at + 8, 4);
    REQUIRE(len_crc == io::tb::masked_crc32c(bytes.data() + at, 8));
    REQUIRE(at + 12 + len + 4 <= bytes.size());
    uint32_t crc = 0;
    std::memcpy(&crc, bytes.data() + at + 12 + len, 4);
    CHECK(crc == io::tb::masked_crc32c(bytes.data() + at + 12, len));
    at += 12 + len + 4;
    ++records;
  }
  CHECK(at == bytes.size());
  CHECK(records == 3);  // the file version, steps 1 and 4
}

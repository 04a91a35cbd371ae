// TensorBoard event files: the encoders and the writer (io/tensorboard.h has the format).
#include "io/tensorboard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/checkpoint.h"

namespace kiln::io {
namespace tb {
namespace {

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(uint8_t(v)));
}
void key(std::string& out, int field, int wire) { varint(out, uint64_t(field) << 3 | uint64_t(wire)); }
template <typename T> void little(std::string& out, T v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // x86-64 and AArch64 are little endian, as the format
  out.append(reinterpret_cast<const char*>(b), sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& s) {
  key(out, field, 2);
  varint(out, s.size());
  out += s;
}
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  key(e, 1, 1);  // wall_time: fixed64
  little(e, wall_time);
  if (step != 0) {
    key(e, 2, 0);  // step: varint (proto3 leaves zero out)
    varint(e, uint64_t(step));
  }
  return e;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string record(const std::string& data) {
  std::string r, len;
  little(len, uint64_t(data.size()));
  r += len;
  little(r, masked_crc32c(len.data(), len.size()));
  r += data;
  little(r, masked_crc32c(data.data(), data.size()));
  return r;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  bytes_field(e, 3, "brain.Event:2");
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);
    key(value, 2, 5);  // simple_value: fixed32
    little(value, v);
    bytes_field(summary, 1, value);
  }
  std::string e = event_head(wall_time, step);
  bytes_field(e, 5, summary);
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  key(log, 1, 0);
  varint(log, 1);  // SessionLog.START
  std::string e = event_head(wall_time, step);
  bytes_field(e, 7, log);
  return e;
}

}  // namespace tb

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

EventWriter::EventWriter(const std::string& dir) {
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  char name[512];
  // TensorBoard reads a folder's files in name order: two of the same second sort by pid, which is
  // zero-padded so that pid 999's file sorts before pid 1000's.
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%010d.kiln", (long long)std::time(nullptr), host,
                int(::getpid()));
  path_ = (std::filesystem::path(dir) / name).string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  KILN_CHECK(fd_ >= 0, path_, ": cannot create the TensorBoard event file: ", std::strerror(errno));
  write(std::string(), 0);  // the file version event alone
}

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {
bool is_kiln_event_file(const std::string& n) {
  return n.rfind("events.out.tfevents.", 0) == 0 && n.size() > 5 && n.compare(n.size() - 5, 5, ".kiln") == 0;
}
}  // namespace

void EventWriter::remove_old(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (is_kiln_event_file(e.path().filename().string())) std::filesystem::remove(e.path(), ec);
}

bool EventWriter::any_old(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (is_kiln_event_file(e.path().filename().string())) return true;
  return false;
}

void EventWriter::restart(int64_t step) { write(tb::session_start_event(now_seconds(), step), step); }

void EventWriter::scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  if (!values.empty()) write(tb::scalars_event(now_seconds(), step, values), step);
}

std::vector<std::string> EventWriter::take_notices() {
  std::vector<std::string> n;
  n.swap(notices_);
  return n;
}

// One record in one write(2) on an O_APPEND descriptor (looped if short), as metrics.jsonl's lines: a
// write that fails (a full disk) cuts its part of a record off at once (ftruncate to the size before
// it), so the file holds whole records only, and each later event tries again. The file version event
// goes first, with the first event whose write succeeds if its own failed.
void EventWriter::write(const std::string& event, int64_t step) {
  std::string r;
  if (version_pending_) r = tb::record(tb::file_version_event(now_seconds()));
  if (!event.empty()) r += tb::record(event);
  const int err = append_whole(fd_, r);
  if (err == 0) {
    if (!ok_)
      notices_.push_back(path_ + ": writing again at step " + std::to_string(step) + " (the events since step " +
                         std::to_string(failed_at_) + " are missing)");
    version_pending_ = false;
    ok_ = true;
    return;
  }
  if (ok_) {
    error_ = path_ + ": cannot write the TensorBoard events of step " + std::to_string(step) + " (" +
             std::strerror(err) + "); training goes on, and each later event tries again";
    notices_.push_back("warning: " + error_);
    failed_at_ = step;
  }
  ok_ = false;
}

}  // namespace kiln::io

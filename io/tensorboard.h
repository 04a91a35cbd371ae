// TensorBoard event files for scalars, written by hand (no protobuf dependency): a file is a
// sequence of TFRecord records, each an Event message.
//   TFRecord framing (tensorflow/core/lib/io/record_writer.cc): uint64 length (little endian),
//   uint32 masked CRC32C of those 8 bytes, the data, uint32 masked CRC32C of the data; masked(c) =
//   ((c >> 15) | (c << 17)) + 0xa282ead8.
//   Event (tensorboard/compat/proto/event.proto): wall_time = 1 (double), step = 2 (int64),
//   file_version = 3 (string, "brain.Event:2"), summary = 5 (Summary), session_log = 7 (SessionLog:
//   status = 1, START = 1).
//   Summary (summary.proto): value = 1 (repeated Value: tag = 1, simple_value = 2 (float)).
// A restarted run writes SessionLog.START at the first step it will log: TensorBoard then drops the
// earlier files' events from that step on (the ones logged after the checkpoint it resumed from), so
// the curves neither repeat nor go back in steps.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace kiln::io {

namespace tb {
uint32_t masked_crc32c(const void* data, size_t n);
std::string record(const std::string& data);  // one TFRecord around `data`
std::string file_version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);
std::string session_start_event(double wall_time, int64_t step);
}  // namespace tb

class EventWriter {
 public:
  // A new event file in `dir` (events.out.tfevents.<seconds>.<host>.<pid, zero-padded>.kiln) opened with its
  // file_version event; an error names the file when it cannot be created.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // Removes the event files an earlier run wrote in `dir` (Kiln's own, *.kiln), for a run that
  // starts over there.
  static void remove_old(const std::string& dir);
  // Whether `dir` holds such files (a resumed run that writes none leaves them as they are).
  static bool any_old(const std::string& dir);

  void restart(int64_t step);  // SessionLog.START at `step`: earlier files' events at steps >= it are dropped
  void scalars(int64_t step, const std::vector<std::pair<std::string, float>>& values);
  const std::string& path() const { return path_; }
  // False while writes fail (a full disk): a failed write leaves no part of its record in the file,
  // and each later event tries again; error() says why.
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  // What the caller says, once each, since it last asked: "warning: FILE: cannot write the TensorBoard
  // events of step N (why); ..." at the first failed write, "FILE: writing again at step M (the events
  // since step N are missing)" at the first good one after.
  std::vector<std::string> take_notices();

 private:
  void write(const std::string& event, int64_t step);
  std::string path_, error_;
  std::vector<std::string> notices_;
  int fd_ = -1;
  bool ok_ = true;
  bool version_pending_ = true;  // the file version event is not written yet: it goes before the next event
  int64_t failed_at_ = 0;
};

}  // namespace kiln::io

// `kiln train` against what happens around a run: signals (ignored ones stay ignored, a stop is
// recorded), a stdout pipe closed early, a disk full for a moment under metrics.jsonl, --out moved
// away mid-run, and temporary files a killed run left behind.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

using kiln::testing::contains;
using kiln::testing::kFortunes;
using kiln::testing::read_text;
using kiln::testing::run_kiln;
using kiln::testing::step_lines;
using kiln::testing::TempDir;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {
// A short ResNet-20 run on Fashion-MNIST's first samples, one thread, a line per step; the caller
// adds --max-steps and --out.
const std::string kTiny =
    "train --model resnet20 --limit-train 256 --limit-eval 32 --batch 32 --log-every 1 --threads 1 --workers 0 "
    "--progress lines --no-tensorboard";

// `kiln ARGS` started in the background through sh (so ARGS is shell syntax, and `prefix` may set
// the shell up before it execs kiln), its output into `log`.
pid_t start_kiln(const std::string& args, const std::string& log, const std::string& prefix = "") {
  const std::string cmd = prefix + "exec " + KILN_BINARY + " " + args + " > " + log + " 2>&1 < /dev/null";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  return pid;
}

// Polls until `done` holds (true) or the process ends or a minute passes (false).
bool wait_for(pid_t pid, const std::function<bool()>& done) {
  for (int i = 0; i < 6000; ++i) {
    if (done()) return true;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      // Ended: put the status back for finish() by leaving a marker. Simplest: report and stop.
      FAIL("kiln train ended before the test could act: status ", status);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The exit code (-signal when killed by one).
int finish(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1000;
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::vector<json> lines_of(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) {
    CHECK_MESSAGE(!line.empty(), path, ": an empty line");
    if (!line.empty()) out.push_back(json::parse(line));  // throws on a cut line
  }
  return out;
}

bool has_step_lines(const std::string& metrics, size_t n) {
  std::ifstream in(metrics);
  size_t lines = 0;
  for (std::string line; std::getline(in, line);) lines += line.find("\"loss\"") != std::string::npos;
  return lines >= n;
}
}  // namespace

TEST_CASE("train: a stop signal ignored on entry (nohup, a script's & job) stays ignored") {
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt";
  const pid_t pid = start_kiln(kTiny + " --max-steps 6 --out " + out, log, "trap '' HUP INT; ");
  REQUIRE(wait_for(pid, [&] { return has_step_lines(out + "/metrics.jsonl", 1); }));
  ::kill(pid, SIGHUP);
  ::kill(pid, SIGINT);
  const int rc = finish(pid);
  const std::string output = read_text(log);
  CHECK_MESSAGE(rc == 0, output);
  CHECK_MESSAGE(!contains(output, "caught SIG"), output);
  CHECK_MESSAGE(!contains(output, "second interrupt"), output);
  const json summary = json::parse(read_text(out + "/summary.json"));
  CHECK(summary["steps"] == 6);  // ran to its end
  CHECK(!summary.contains("stopped"));
}

TEST_CASE("train: stdout closed before the first line does not kill the run with SIGPIPE") {
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt";
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);  // nobody reads: the first write raises SIGPIPE
    ::dup2(p[1], STDOUT_FILENO);
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(err, STDERR_FILENO);
    const std::string cmd = std::string("exec ") + KILN_BINARY + " " + kTiny + " --max-steps 2 --out " + out;
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  ::close(p[0]);
  ::close(p[1]);
  const int rc = finish(pid);
  CHECK_MESSAGE(rc == 0, "exit ", rc, ": ", read_text(log));
  CHECK(fs::exists(out + "/summary.json"));
}

TEST_CASE("train: a metrics line that cannot be written is reported once, and later lines are written again") {
  if (!fs::exists("/dev/full")) return;  // a container without it: nothing to fill
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt", metrics = out + "/metrics.jsonl";
  fs::create_directories(out);
  fs::create_symlink("/dev/full", metrics);  // every write: ENOSPC, as on a full disk
  const pid_t pid = start_kiln(kTiny + " --max-steps 8 --out " + out, log);
  // The disk has room again once the warning is out (or, without one, by step 3: before the run reads
  // its metrics back for report.html).
  REQUIRE(wait_for(pid, [&] {
    const std::string o = read_text(log);
    return contains(o, "cannot write") || contains(o, "step 3/");
  }));
  fs::remove(metrics);
  const int rc = finish(pid);
  const std::string output = read_text(log);
  CHECK_MESSAGE(rc == 0, output);
  CHECK_MESSAGE(count(output, "cannot write") == 1, output);
  CHECK_MESSAGE(contains(output, metrics + ": cannot write the metrics line of step 1 (No space left on device)"),
                output);
  CHECK_MESSAGE(contains(output, metrics + ": writing again at step"), output);
  REQUIRE(fs::is_regular_file(metrics));
  const std::vector<json> lines = lines_of(metrics);
  REQUIRE(lines.size() >= 2);
  CHECK(lines[lines.size() - 2]["step"] == 8);  // the last step's line, then the evaluation's
  CHECK(lines.back().contains("eval_loss"));
}

TEST_CASE("train: a cut metrics line is dropped before the next one is written") {
  // The part of a line a failed write leaves: the first write after it starts a fresh line.
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt", metrics = out + "/metrics.jsonl";
  if (!fs::exists("/dev/full")) return;
  fs::create_directories(out);
  fs::create_symlink("/dev/full", metrics);
  const pid_t pid = start_kiln(kTiny + " --max-steps 4 --out " + out, log);
  REQUIRE(wait_for(pid, [&] {
    const std::string o = read_text(log);
    return contains(o, "cannot write") || contains(o, "step 2/");
  }));
  std::ofstream(d / "cut") << R"({"step": 1, "loss": 2.3)";  // as a full disk would cut it
  fs::rename(d / "cut", metrics);                            // in place of the full one at once
  const int rc = finish(pid);
  CHECK_MESSAGE(rc == 0, read_text(log));
  const std::vector<json> lines = lines_of(metrics);  // every line parses
  CHECK(lines.size() >= 2);
}

TEST_CASE("train: --out renamed mid-run stops the run, which does not make a new --out") {
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt";
  const pid_t pid = start_kiln(kTiny + " --max-steps 24 --save-every 2 --out " + out, log);
  REQUIRE(wait_for(pid, [&] { return has_step_lines(out + "/metrics.jsonl", 1); }));
  fs::rename(out, d / "moved");
  const int rc = finish(pid);
  const std::string output = read_text(log);
  CHECK_MESSAGE(rc == 1, output);
  CHECK_MESSAGE(contains(output, "kiln train: error: --out " + out +
                                     " was deleted or moved while the run was writing to it (its lock file is gone)"),
                output);
  CHECK_MESSAGE(!fs::exists(out), output);
}

TEST_CASE("train: temporary files of a dead writer in --out are removed at start-up, others kept") {
  TempDir d("kiln_signals");
  const std::string out = d / "run";
  fs::create_directories(out);
  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  const std::string pid = std::to_string(dead);
  // Removed: Kiln's own output, its writer gone, untouched for minutes.
  const std::string dead_tmp = out + "/model.safetensors.tmp." + pid;
  // Kept: a live writer's; a fresh one (a writer on another host, whose pid means nothing here); a
  // user's own file that only looks like a temporary file.
  const std::string live_tmp = out + "/summary.json.tmp." + std::to_string(::getpid()),
                    young_tmp = out + "/report.html.tmp." + pid, users = out + "/results.tmp." + pid,
                    other = out + "/notes.tmp.txt";
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(5);
  for (const std::string& f : {dead_tmp, live_tmp, young_tmp, users, other}) {
    std::ofstream(f) << "x";
    if (f != young_tmp) fs::last_write_time(f, old);
  }
  const auto r = run_kiln(kTiny + " --limit-train 64 --max-steps 1 --out " + out, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(!fs::exists(dead_tmp));
  CHECK(fs::exists(live_tmp));
  CHECK(fs::exists(young_tmp));
  CHECK(fs::exists(users));
  CHECK(fs::exists(other));
}

TEST_CASE("train: metrics lines a full disk cuts short leave every line of metrics.jsonl whole") {
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt";
  fs::create_directories(out);
  // A file-size limit of a few lines' bytes (ulimit -f counts 512- or 1024-byte blocks), with SIGXFSZ
  // ignored: a write past it is cut short, then fails with EFBIG, as on a full disk.
  const std::string cmd = "sh -c 'trap \"\" XFSZ; ulimit -f 2; exec " + std::string(KILN_BINARY) + " " + kTiny +
                          " --epochs 3 --max-steps 24 --save-every 0 --no-save-epochs --out " + out + "' > " + log +
                          " 2>&1 < /dev/null";
  const int rc = std::system(cmd.c_str());
  const std::string said = read_text(log);
  REQUIRE_MESSAGE(WIFEXITED(rc), said);
  CHECK_MESSAGE(contains(said, "cannot write the metrics line"), said);
  const std::string text = read_text(out + "/metrics.jsonl");
  REQUIRE_MESSAGE(!text.empty(), said);
  CHECK(text.back() == '\n');
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line); ++n) CHECK_MESSAGE(json::accept(line), "line ", n + 1, ": ", line);
  CHECK(n >= 2);
}

TEST_CASE("train: a masked-LM stopped before its first evaluation has no test perplexity") {
  TempDir d("kiln_signals");
  REQUIRE_MESSAGE(fs::exists(kFortunes + "/computers"), "apt-get install fortunes");
  auto r = run_kiln("vocab --text " + kFortunes + "/computers --size 1000 --out " + d / "vocab.txt", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string out = d / "run", log = d / "log.txt";
  // One epoch far longer than the wait: the stop comes before any evaluation.
  const pid_t pid = start_kiln("train --model bert-tiny --text " + kFortunes + "/computers --vocab " + d / "vocab.txt" +
                                   " --seq-len 32 --batch 2 --max-steps 100000 --log-every 1 --threads 1 --workers 0"
                                   " --progress lines --no-tensorboard --out " +
                                   out,
                               log);
  REQUIRE(wait_for(pid, [&] { return has_step_lines(out + "/metrics.jsonl", 1); }));
  ::kill(pid, SIGTERM);
  REQUIRE_MESSAGE(finish(pid) == 0, read_text(log));
  const json summary = json::parse(read_text(out + "/summary.json"));
  CHECK(summary.value("stopped", "") == "SIGTERM");
  REQUIRE(summary["per_epoch"].empty());
  CHECK(summary["test_loss"].is_null());
  CHECK(summary["test_mlm_accuracy"].is_null());
  REQUIRE(summary.contains("test_perplexity"));
  CHECK_MESSAGE(summary["test_perplexity"].is_null(), summary["test_perplexity"]);  // not exp(0) = 1
}

TEST_CASE("train: a signal stop is recorded in metrics.jsonl, and its readers take it") {
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt";
  const pid_t pid = start_kiln(kTiny + " --max-steps 24 --out " + out, log);
  REQUIRE(wait_for(pid, [&] { return has_step_lines(out + "/metrics.jsonl", 1); }));
  ::kill(pid, SIGTERM);
  const int rc = finish(pid);
  REQUIRE_MESSAGE(rc == 0, read_text(log));
  const std::vector<json> lines = lines_of(out + "/metrics.jsonl");
  REQUIRE(!lines.empty());
  const json& stop = lines.back();
  CHECK(stop.value("stopped", "") == "SIGTERM");
  const std::string ckpt = stop.value("checkpoint", "");
  CHECK(fs::exists(ckpt));
  CHECK(stop["step"] == lines[lines.size() - 2]["step"]);
  // summary.json says so too (it was not written: a tool waiting for it waited for ever): the step
  // reached, the checkpoint, and no test numbers before the first evaluation.
  REQUIRE(fs::exists(out + "/summary.json"));
  const json summary = json::parse(read_text(out + "/summary.json"));
  CHECK(summary.value("stopped", "") == "SIGTERM");
  CHECK(summary["steps"] == stop["step"]);
  CHECK(summary.value("last_checkpoint", "") == ckpt);
  if (summary["per_epoch"].empty()) CHECK(summary["test_loss"].is_null());
  auto r = run_kiln("report " + out + " --out " + d / "report.html", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(!contains(r.output, "skipped"), r.output);
  const std::string resume = kTiny + " --max-steps 24 --save-every 0 --no-save-epochs --resume auto --out " + out;
  // The resumed run removes the stop's summary: it no longer says where the run is.
  const size_t before = step_lines<json>(out + "/metrics.jsonl").size();
  const pid_t again = start_kiln(resume, d / "log2.txt");
  REQUIRE(wait_for(again, [&] { return has_step_lines(out + "/metrics.jsonl", before + 1); }));
  ::kill(again, SIGKILL);
  CHECK(finish(again) == -SIGKILL);
  CHECK(!fs::exists(out + "/summary.json"));
  // The resumed run continues, and until it saves, its last good checkpoint is the one it resumed from.
  r = run_kiln(resume, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const json resumed = json::parse(read_text(out + "/summary.json"));
  CHECK(!resumed.contains("stopped"));  // a finished run's
  CHECK(resumed.value("last_checkpoint", "") == ckpt);
  CHECK(step_lines<json>(out + "/metrics.jsonl").back()["step"] == 8);
}

TEST_CASE("train: the second interrupt says whether a checkpoint exists") {
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt";
  // Steps long enough for both signals to land within one (about half a second each).
  const pid_t pid = start_kiln(kTiny + " --limit-train 1024 --batch 256 --max-steps 4 --out " + out, log);
  REQUIRE(wait_for(pid, [&] { return has_step_lines(out + "/metrics.jsonl", 1); }));
  ::kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // two pending SIGINTs would be one
  ::kill(pid, SIGINT);
  const int rc = finish(pid);
  const std::string output = read_text(log);
  CHECK_MESSAGE(rc == 130, output);
  CHECK_MESSAGE(contains(output, "second interrupt, exiting now (no checkpoint of this run was written yet)"), output);
}

TEST_CASE("train: a failed save on a signal stop names the cause and the last good checkpoint") {
  TempDir d("kiln_signals");
  const std::string out = d / "run", log = d / "log.txt";
  fs::create_directories(out);
  std::ofstream(out + "/checkpoints") << "not a folder";  // every checkpoint fails
  const pid_t pid = start_kiln(kTiny + " --max-steps 24 --out " + out, log);
  REQUIRE(wait_for(pid, [&] { return has_step_lines(out + "/metrics.jsonl", 1); }));
  ::kill(pid, SIGTERM);
  const int rc = finish(pid);
  const std::string output = read_text(log);
  CHECK_MESSAGE(rc == 1, output);
  CHECK_MESSAGE(contains(output, "kiln train: caught SIGTERM at step"), output);
  CHECK_MESSAGE(contains(output, "but its checkpoint failed (above): this run has no checkpoint to continue from"),
                output);
}

TEST_CASE("train: an error writing the final weights is kiln train's, with exit code 1") {
  TempDir d("kiln_signals");
  const std::string out = d / "run";
  fs::create_directories(out + "/model.safetensors/x");  // the weights cannot take its place
  const auto r = run_kiln(kTiny + " --limit-train 64 --max-steps 1 --overwrite --out " + out, d.p.string());
  CHECK_MESSAGE(r.code == 1, r.output);
  CHECK_MESSAGE(contains(r.output, "kiln train: error: "), r.output);
  CHECK_MESSAGE(!contains(r.output, "kiln: error:"), r.output);
}

// `kiln train`'s output folder: a fresh run replaces every output of the run it overwrites, and two
// trainers never share one --out at once.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "io/json_text.h"
#include "io/run_checkpoint.h"
#include "test_util.h"

using kiln::testing::contains;
using kiln::testing::read_text;
using kiln::testing::run_kiln;
using kiln::testing::TempDir;
namespace fs = std::filesystem;

namespace {
// A command line as run_kiln runs one (its output to SCRATCH/cli_output.txt), given whole: `sh -c 'cd DIR
// && exec kiln ...'` runs kiln in another working directory.
kiln::testing::CliResult run_shell(const std::string& cmd_line, const std::string& scratch_dir) {
  const std::string log = scratch_dir + "/cli_output.txt";
  const int rc = std::system((cmd_line + " > " + log + " 2>&1 < /dev/null").c_str());
  kiln::testing::CliResult r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.output = read_text(log);
  return r;
}

bool any_event_file(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return true;
  return false;
}
// One byte of FILE flipped, halfway in (a tensor's bytes: only its CRC tells).
void flip_a_byte(const std::string& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff half = f.tellg() / 2;
  char c = 0;
  f.seekg(half);
  f.get(c);
  f.seekp(half);
  f.put(char(c ^ 0x10));
}
}  // namespace

TEST_CASE("train: --overwrite removes the replaced run's summary, weights, report and event files") {
  TempDir d("kiln_outdir");
  const std::string run = d / "r";
  const std::string args =
      "train --model resnet20 --limit-train 256 --limit-eval 64 --batch 32 --max-steps 8 "
      "--log-every 1 --threads 1 --workers 0 --progress lines --out " +
      run;
  auto r = run_kiln(args + " --lr 0.01", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  REQUIRE(fs::exists(run + "/summary.json"));
  REQUIRE(fs::exists(run + "/model.safetensors"));
  REQUIRE(fs::exists(run + "/report.html"));
  REQUIRE(any_event_file(run));
  // The new run diverges before its first evaluation: nothing of the old one may stand beside its curves.
  r = run_kiln(args + " --lr 1e5 --overwrite --no-tensorboard", d.p.string());
  REQUIRE_MESSAGE(r.code == 1, r.output);
  CHECK_MESSAGE(contains(r.output, "the loss is"), r.output);
  CHECK(!fs::exists(run + "/summary.json"));
  CHECK(!fs::exists(run + "/model.safetensors"));
  CHECK(!fs::exists(run + "/report.html"));
  CHECK(!any_event_file(run));  // --no-tensorboard: the old curves went all the same
}

TEST_CASE("train: a new run from a weights file into a folder holding a run needs --overwrite") {
  TempDir d("kiln_outdir");
  const std::string a = d / "a", b = d / "b";
  const std::string args =
      "train --model resnet20 --limit-train 64 --limit-eval 32 --batch 32 --max-steps 2 --threads 1 --workers 0 "
      "--progress lines --no-tensorboard --save-every 1 --out ";
  auto r = run_kiln(args + a, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln(args + b, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string summary = read_text(b + "/summary.json");
  const std::string w = d / "w.kiln";
  r = run_kiln("ckpt import " + a + "/model.safetensors --model resnet20 --set in_channels=1 --out " + w, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  // b's run is left as it was: its summary, weights and checkpoints (it deleted them before).
  r = run_kiln(args + b + " --resume " + w, d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "already holds a run"), r.output);
  CHECK_MESSAGE(contains(r.output, "add --overwrite"), r.output);
  CHECK(read_text(b + "/summary.json") == summary);
  CHECK(fs::exists(b + "/checkpoints/step-000000002.kiln"));
  // With --overwrite the old run's checkpoints go too (they would outrank the new run's in --resume auto).
  r = run_kiln(args + b + " --max-steps 1 --save-every 0 --resume " + w + " --overwrite", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(!fs::exists(b + "/checkpoints/step-000000002.kiln"));
}

TEST_CASE("train: resuming another model's checkpoint names the flag, not every tensor") {
  TempDir d("kiln_outdir");
  const std::string out = d / "r";
  const std::string args =
      "train --limit-train 64 --limit-eval 32 --batch 32 --max-steps 2 --threads 1 --workers 0 --progress lines "
      "--no-tensorboard --out " +
      out;
  auto r = run_kiln(args + " --model resnet20", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln(args + " --model resnet32 --max-steps 4 --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "was written by a run with another configuration"), r.output);
  CHECK_MESSAGE(contains(r.output, "resnet32"), r.output);
  CHECK_MESSAGE(!contains(r.output, "does not match the model"), r.output);  // a list of 72 tensors before
}

TEST_CASE("train: a second trainer on the same --out is refused, naming the first one's pid") {
  TempDir d("kiln_outdir");
  const std::string out = d / "run";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execl(KILN_BINARY, KILN_BINARY, "train", "--limit-train", "2048", "--limit-eval", "64", "--batch", "32",
            "--epochs", "3", "--log-every", "1", "--threads", "1", "--workers", "0", "--progress", "lines", "--out",
            out.c_str(), (char*)nullptr);
    ::_exit(127);
  }
  for (int waited = 0; waited < 6000 && !fs::exists(out + "/metrics.jsonl"); ++waited)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto r =
      run_kiln("train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 2 --threads 1 --overwrite --out " + out,
               d.p.string());
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "is in use by another kiln train (pid " + std::to_string(pid) + ")"), r.output);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // the first run was left alone: it saved and stopped on SIGTERM
  // With the first run gone, its lock went with it: the folder is free again.
  r = run_kiln("train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 2 --threads 1 --overwrite --out " + out,
               d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
}

TEST_CASE("train: --resume auto with the local checkpoints lost continues from the --mirror's copy") {
  TempDir d("kiln_outdir");
  const std::string run = d / "run", mirror = d / "mirror";
  const std::string args =
      "train --limit-train 256 --limit-eval 64 --batch 32 --epochs 2 --max-steps 12 --threads 1 "
      "--workers 0 --progress lines --save-every 4 --no-save-epochs --out " +
      run;
  auto r = run_kiln(args + " --mirror " + mirror, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  REQUIRE(fs::exists(mirror + "/step-000000012.kiln"));
  // As after losing the run's disk: the checkpoints gone, the rest of the folder still there.
  fs::remove_all(run + "/checkpoints");
  r = run_kiln(args + " --mirror " + mirror + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "continuing from the mirror's copy " + mirror + "/step-000000012.kiln"), r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 12"), r.output);
  // A mirror in the run's own checkpoints folder is no backup.
  r = run_kiln(args + " --mirror " + run + "/checkpoints/ --overwrite", d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "is this run's own checkpoints folder"), r.output);
}

TEST_CASE("train: --resume auto takes the newest intact checkpoint of the run's folder and the --mirror") {
  TempDir d("kiln_outdir");
  const std::string run = d / "run", mirror = d / "mirror";
  const std::string args =
      "train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 8 --threads 1 --workers 0 --progress lines "
      "--save-every 4 --no-save-epochs --no-tensorboard --out " +
      run + " --mirror " + mirror;
  auto r = run_kiln(args, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, ", 8 steps in "), r.output);  // a run of one session says no more
  REQUIRE(fs::exists(mirror + "/step-000000008.kiln"));
  // The run's newest checkpoint damaged, the mirror's copy of it intact: the copy, not step 4.
  flip_a_byte(run + "/checkpoints/step-000000008.kiln");
  r = run_kiln(args + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "skipped damaged checkpoint " + run + "/checkpoints/step-000000008.kiln"), r.output);
  CHECK_MESSAGE(contains(r.output, "continuing from the mirror's copy " + mirror +
                                       "/step-000000008.kiln, newer than step-000000004.kiln, the newest intact "
                                       "checkpoint in " +
                                       run + "/checkpoints (its copy of that step is damaged"),
                r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 8 from " + mirror + "/step-000000008.kiln"), r.output);
  // The run's step 8 gone, not damaged, while the mirror holds one: it may be another run's (a run
  // started afresh into the same --out and --mirror), so the local step 4, with a note naming the file.
  fs::remove(run + "/checkpoints/step-000000008.kiln");
  r = run_kiln(args + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "note: the mirror holds " + mirror +
                                       "/step-000000008.kiln, newer than "
                                       "step-000000004.kiln, but " +
                                       run + "/checkpoints has no file of that step"),
                r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 4 from " + run + "/checkpoints/step-000000004.kiln"), r.output);
  // Resumed at step 4, the last line's time and rate are this session's, and say so; summary.json too.
  fs::remove(run + "/checkpoints/step-000000008.kiln");
  fs::remove(mirror + "/step-000000008.kiln");
  r = run_kiln(args + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 4"), r.output);
  CHECK_MESSAGE(contains(r.output, ", 8 steps (4 in this session) in "), r.output);
  const auto summary = nlohmann::json::parse(read_text(run + "/summary.json"));
  CHECK(summary["steps"] == 8);
  CHECK(summary["session_steps"] == 4);
  CHECK(summary["session_samples_per_s"].get<double>() > 0);
}

TEST_CASE("train: the mirror never says a checkpoint --keep-last deleted is still in the run directory") {
  TempDir d("kiln_outdir");
  std::ofstream(d / "blocker") << "a file where the mirror directory should go";
  const std::string run = d / "run";
  auto r = run_kiln(
      "train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 6 --threads 1 --workers 0 "
      "--progress lines --save-every 1 --keep-last 1 --out " +
          run + " --mirror " + d / "blocker/sub",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "mirror:"), r.output);
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find("step-");
    if (line.find("mirror:") == std::string::npos || at == std::string::npos) continue;
    const std::string name = line.substr(at, 19);  // step-NNNNNNNNN.kiln
    if (contains(line, "still in the run directory")) CHECK_MESSAGE(fs::exists(run + "/checkpoints/" + name), line);
  }
}

TEST_CASE(
    "train: --resume auto --overwrite, the restart loop's idiom, starts over a run killed before any checkpoint") {
  TempDir d("kiln_outdir");
  const std::string run = d / "run";
  auto r = run_kiln("train --help", d.p.string());
  CHECK_MESSAGE(contains(r.output, "--resume auto --overwrite"), r.output);
  // As a run killed before its first checkpoint leaves its folder: metrics and nothing to continue from.
  fs::create_directories(run);
  std::ofstream(run + "/metrics.jsonl") << "{\"step\":1,\"loss\":2.3}\n";
  const std::string args =
      "train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 2 --threads 1 "
      "--workers 0 --progress lines --resume auto --out " +
      run;
  r = run_kiln(args, d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "but no checkpoint to continue from"), r.output);
  r = run_kiln(args + " --overwrite", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(fs::exists(run + "/summary.json"));
}

TEST_CASE("train: a --mirror belongs to the run that first used it: another run is refused and leaves its copies be") {
  TempDir d("kiln_outdir");
  const std::string mirror = d / "mirror", a = d / "a";
  const std::string args =
      "train --limit-train 256 --limit-eval 64 --batch 32 --threads 1 --workers 0 --progress lines --save-every 2 "
      "--no-save-epochs --keep-last 1 --mirror " +
      mirror;
  fs::create_directories(mirror);
  std::ofstream(mirror + "/notes.tmp.txt") << "the user's own file, not a checkpoint's temporary file";
  auto r = run_kiln(args + " --max-steps 4 --out " + a, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string owner = read_text(mirror + "/kiln-mirror.json");
  CHECK_MESSAGE(contains(owner, "\"out\": \"" + fs::canonical(a).string() + "\""), owner);
  CHECK(fs::exists(mirror + "/notes.tmp.txt"));  // the mirror's pruning deletes only Kiln's files
  CHECK(!fs::exists(mirror + "/step-000000002.kiln"));
  REQUIRE(fs::exists(mirror + "/step-000000004.kiln"));
  const std::string latest = read_text(mirror + "/latest");
  // Another run is refused before it deletes (--overwrite), replaces or resumes from the copies.
  const std::string refusal =
      "--mirror " + mirror + " holds the checkpoints of the run in " + fs::canonical(a).string() + " (host ";
  for (const char* extra : {"", " --overwrite"}) {
    r = run_kiln(args + " --max-steps 2 --out " + d / "b" + extra, d.p.string());
    CHECK_MESSAGE(r.code == 2, r.output);
    CHECK_MESSAGE(contains(r.output, refusal), r.output);
    CHECK_MESSAGE(contains(r.output, "give each run its own mirror folder (delete " + mirror +
                                         "/kiln-mirror.json if that run is gone"),
                  r.output);
    CHECK(fs::exists(mirror + "/step-000000004.kiln"));
    CHECK(read_text(mirror + "/latest") == latest);
  }
  // A mirror from before owners (no kiln-mirror.json): its checkpoints' config names the run.
  fs::remove(mirror + "/kiln-mirror.json");
  r = run_kiln(args + " --max-steps 2 --out " + d / "b" + " --overwrite", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "holds the checkpoints of the run in " + fs::canonical(a).string()), r.output);
  CHECK(fs::exists(mirror + "/step-000000004.kiln"));
  // Its own run, its --out written another way, adopts it and replaces its copies with --overwrite.
  std::ofstream(a + "/checkpoints/notes.tmp.txt") << "kept by the start-up sweep too";
  r = run_kiln(args + " --max-steps 2 --overwrite --out " + d.p.string() + "//a/", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK(contains(read_text(mirror + "/kiln-mirror.json"), "\"out\": \"" + fs::canonical(a).string() + "\""));
  CHECK(!fs::exists(mirror + "/step-000000004.kiln"));
  CHECK(fs::exists(mirror + "/step-000000002.kiln"));
  CHECK(fs::exists(mirror + "/notes.tmp.txt"));
  CHECK(fs::exists(a + "/checkpoints/notes.tmp.txt"));
}

TEST_CASE("train: --resume auto takes over the --mirror of its run, its folder lost, from another path") {
  TempDir d("kiln_outdir");
  const std::string mirror = d / "m", a = d / "a/run";
  const std::string args =
      "train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 4 --threads 1 --workers 0 --progress lines "
      "--save-every 4 --no-save-epochs --no-tensorboard";
  auto r = run_kiln(args + " --out " + a + " --mirror " + mirror, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  REQUIRE(fs::exists(mirror + "/step-000000004.kiln"));
  const std::string old = fs::canonical(a).string();
  // While the run's folder still holds its checkpoints, a --resume auto into another --out (a typo, a
  // second job with the same flags) does not take its mirror: it is refused as a fresh run is.
  r = run_kiln(args + " --out " + d / "typo" + " --mirror " + mirror + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(!contains(r.output, "taking it over"), r.output);
  // Why it is not taken over is said, and no takeover is suggested.
  CHECK_MESSAGE(contains(r.output, "; it is not taken over, since its folder " + old +
                                       " still holds the intact "
                                       "checkpoint " +
                                       old + "/checkpoints/step-000000004.kiln"),
                r.output);
  CHECK_MESSAGE(!contains(r.output, "takes the mirror over"), r.output);
  CHECK(contains(read_text(mirror + "/kiln-mirror.json"), "\"out\": \"" + old + "\""));
  // A folder of damaged checkpoints keeps nothing, but a run that holds its lock does.
  flip_a_byte(a + "/checkpoints/step-000000004.kiln");
  {
    const int lock = ::open((a + "/.lock").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    REQUIRE(lock >= 0);
    REQUIRE(::flock(lock, LOCK_EX | LOCK_NB) == 0);
    const std::string pid = "4242\n";
    REQUIRE(::write(lock, pid.data(), pid.size()) == ssize_t(pid.size()));
    r = run_kiln(args + " --out " + d / "typo" + " --mirror " + mirror + " --resume auto", d.p.string());
    ::close(lock);
  }
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(
      contains(r.output, "; it is not taken over, since that run is running now (pid 4242, holding " + old + "/.lock)"),
      r.output);
  fs::remove_all(d / "typo");
  fs::remove_all(d / "a");  // the run's disk lost
  fs::create_directories(d / "x");
  // Another working directory, another spelling of both folders. A fresh run is still refused.
  const std::string in_x = "sh -c 'cd " + d / "x" + " && exec " + std::string(KILN_BINARY) + " " + args;
  r = run_shell(in_x + " --out ../b//run/ --mirror ../m'", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "delete ../m/kiln-mirror.json if that run is gone"), r.output);
  r = run_shell(in_x + " --out ../b//run/ --mirror ../m --resume auto'", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "--mirror ../m: taking it over from the run in " + old + " (host "), r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 4"), r.output);
  CHECK(contains(read_text(mirror + "/kiln-mirror.json"), "\"out\": \"" + fs::canonical(d / "b/run").string() + "\""));
}

TEST_CASE("train: a --mirror that stops answering holds up the end of a run KILN_MIRROR_WAIT seconds at most") {
  TempDir d("kiln_outdir");
  const std::string mirror = d / "mirror", run = d / "run";
  fs::create_directories(mirror);
  // As a hung NFS mount: opening the copy's temporary file blocks for good (a FIFO nobody reads). Its
  // name holds kiln's pid, which `exec` keeps from the shell's $$. Without the bound, `timeout` kills it.
  const std::string cmd =
      "KILN_MIRROR_WAIT=2 timeout -s KILL 120 sh -c 'for s in 2 4; do mkfifo " + mirror +
      "/step-00000000$s.kiln.tmp.$$; done; exec " + std::string(KILN_BINARY) +
      " train --limit-train 256 --limit-eval 64 --batch 32 --max-steps 4 --threads 1 --workers 0 --progress lines "
      "--save-every 2 --no-save-epochs --out " +
      run + " --mirror " + mirror + "' > " + d / "log.txt" + " 2>&1 < /dev/null";
  const int rc = std::system(cmd.c_str());
  const std::string log = read_text(d / "log.txt");
  REQUIRE_MESSAGE(WIFEXITED(rc), log);
  CHECK_MESSAGE(WEXITSTATUS(rc) == 0, log);
  CHECK_MESSAGE(
      contains(log, "waiting for the mirror copy of step-000000002.kiln to " + mirror + " (Ctrl-C to leave it)"), log);
  CHECK_MESSAGE(contains(log, "the mirror copy of step-000000002.kiln is incomplete"), log);
  CHECK(fs::exists(run + "/checkpoints/step-000000004.kiln"));
  CHECK(fs::exists(run + "/model.safetensors"));
}

TEST_CASE("train: a mirror copy left behind at the end of a run commits nothing when it unblocks later") {
  TempDir d("kiln_outdir");
  const std::string mirror = d / "m", src = d / "step-000000002.kiln";
  // As a hung mount: reading the checkpoint blocks (a FIFO nobody writes yet), past the end of the run.
  REQUIRE(::mkfifo(src.c_str(), 0600) == 0);
  {
    kiln::io::CheckpointMirror m(mirror, 3, 0.2);
    m.enqueue(src);
  }  // left behind, blocked
  // It answers again (as while a following kiln.train in this process runs): the copy reads to its end.
  const int fd = ::open(src.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "bytes", 5) == 5);
  ::close(fd);
  // A commit would follow at once; nothing may appear (bounded wait: a thread leaves no other sign).
  bool committed = false;
  for (int i = 0; i < 200 && !committed; ++i) {
    committed = fs::exists(mirror + "/step-000000002.kiln") || fs::exists(mirror + "/latest");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(!committed);
}

TEST_CASE("train: a slow mirror copy that makes progress is waited for past KILN_MIRROR_WAIT") {
  TempDir d("kiln_outdir");
  const std::string mirror = d / "m", src = d / "step-000000002.kiln";
  // A checkpoint read at a chunk (8 MiB, the copy's) every 0.3 s, longer in all than the 1 s allowed
  // without progress.
  REQUIRE(::mkfifo(src.c_str(), 0600) == 0);
  const int chunks = 6;
  std::thread writer([&] {
    const int fd = ::open(src.c_str(), O_WRONLY);
    if (fd < 0) return;
    const std::string chunk(size_t(8) << 20, 'x');
    for (int i = 0; i < chunks; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      for (size_t done = 0; done < chunk.size();) {
        const ssize_t n = ::write(fd, chunk.data() + done, chunk.size() - done);
        if (n <= 0) break;
        done += size_t(n);
      }
    }
    ::close(fd);
  });
  {
    kiln::io::CheckpointMirror m(mirror, 3, 1.0);
    m.enqueue(src);
  }
  writer.join();
  REQUIRE(fs::exists(mirror + "/step-000000002.kiln"));
  CHECK(fs::file_size(mirror + "/step-000000002.kiln") == uintmax_t(chunks) * (uintmax_t(8) << 20));
  CHECK(read_text(mirror + "/latest") == "step-000000002.kiln\n");
}

TEST_CASE("train: a --mirror inside --out is refused however either is written") {
  TempDir d("kiln_outdir");
  // In the test's folder, for relative paths (run_kiln runs in the test's working directory).
  const auto train_in_d = [&](const std::string& args) {
    const std::string cmd = "cd " + d.p.string() + " && " + std::string(KILN_BINARY) +
                            " train --limit-train 64 --limit-eval 8 --batch 32 --max-steps 1 --threads 1 " + args +
                            " > log.txt 2>&1 < /dev/null";
    const int rc = std::system(cmd.c_str());
    return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_text(d / "log.txt"));
  };
  const std::pair<std::string, std::string> cases[] = {
      {"--out so5 --mirror " + d / "so5/checkpoints",
       "is this run's own checkpoints folder (" + d / "so5/checkpoints)"},
      {"--out so3 --mirror ./so3//checkpoints/.", "is this run's own checkpoints folder (" + d / "so3/checkpoints)"},
      {"--out so3 --mirror so3/", "--mirror so3/ (" + d / "so3) is inside this run's --out so3 (" + d / "so3)"},
      {"--out ./so3/ --mirror " + d / "so3/backup",
       "--mirror " + d / "so3/backup (" + d / "so3/backup) is inside this run's --out ./so3/ (" + d / "so3)"},
  };
  // Links that do not lead anywhere yet (a relative one, read from its folder, and an absolute one):
  // where they point, the run's own checkpoints folder or its --out, counts.
  fs::create_symlink("so6/checkpoints", d / "lnk6");
  fs::create_symlink(d / "so7", d / "lnk7");
  fs::create_symlink("lnk6", d / "lnk6b");  // a link to a link
  const std::pair<std::string, std::string> linked[] = {
      {"--out so6 --mirror lnk6", "is this run's own checkpoints folder (" + d / "so6/checkpoints)"},
      {"--out so6 --mirror lnk6b/", "is this run's own checkpoints folder (" + d / "so6/checkpoints)"},
      {"--out so7 --mirror lnk7/m", "--mirror lnk7/m (" + d / "so7/m) is inside this run's --out so7"},
  };
  for (const auto& c : linked) {
    const auto r = train_in_d(c.first);
    CHECK_MESSAGE(r.first == 2, c.first, "\n", r.second);
    CHECK_MESSAGE(contains(r.second, c.second), c.first, "\n", r.second);
  }
  CHECK(!fs::exists(d / "so6"));
  CHECK(!fs::exists(d / "so7"));
  for (const auto& c : cases) {  // (no structured bindings: doctest's messages capture them in lambdas)
    const auto r = train_in_d(c.first);
    CHECK_MESSAGE(r.first == 2, c.first, "\n", r.second);
    CHECK_MESSAGE(contains(r.second, c.second), c.first, "\n", r.second);
  }
  CHECK(!fs::exists(d / "so3"));  // refused before anything was made
  CHECK(!fs::exists(d / "so5"));
}

TEST_CASE("train: a resume compares --set as the model config it makes, and names a differing field") {
  TempDir d("kiln_outdir");
  const std::string args =
      "train --limit-train 64 --limit-eval 32 --batch 32 --max-steps 2 --threads 1 --workers 0 --progress lines "
      "--no-tensorboard --out " +
      d / "r";
  auto r = run_kiln(args + " --set zero_init_residual=true --set num_classes=12", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  // The same config written otherwise (another order, 1 for true, as Python's True, recompute added):
  // the run continues (there is nothing left to train; it was refused as "another configuration").
  for (const std::string sets : {" --set num_classes=12 --set zero_init_residual=1",
                                 " --set zero_init_residual=True --set num_classes=12 --set recompute=1",
                                 " --set 'zero_init_residual = true' --set num_classes=12 --set num_classes=12"}) {
    r = run_kiln(args + sets + " --resume auto", d.p.string());
    CHECK_MESSAGE(r.code == 0, sets, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, "resumed at step 2"), sets, " -> ", r.output);
  }
  r = run_kiln(args + " --set num_classes=12 --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(contains(r.output, "set zero_init_residual: checkpoint true, now false"), r.output);
  CHECK_MESSAGE(!contains(r.output, "set: checkpoint"), r.output);  // the field, not the whole list
}

TEST_CASE("train: an --out and --mirror whose paths are not UTF-8 checkpoint, resume and write their outputs") {
  // The checkpoint's state (its config names --out) and the mirror's owner file were dumped as JSON,
  // which takes UTF-8 only: every checkpoint failed ("[json.exception.type_error.316] invalid UTF-8
  // byte"), so --resume auto had nothing to continue from. Such strings are now written with U+FFFD.
  TempDir d("kiln_outdir_utf8");
  const std::string run = d / "run\xff", mirror = d / "mirror\xfe";
  const std::string args =
      "train --limit-train 128 --limit-eval 32 --batch 32 --epochs 2 --max-steps 8 --threads 1 --workers 0 "
      "--progress lines --save-every 2 --no-save-epochs --mirror " +
      mirror + " --out " + run;
  auto r = run_kiln(args, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(!contains(r.output, "failed"), r.output);
  for (const std::string& dir : {run + "/checkpoints", mirror})
    for (const char* step : {"/step-000000006.kiln", "/step-000000008.kiln"})
      CHECK_MESSAGE(fs::exists(dir + step), std::string(dir + step));
  CHECK(fs::exists(run + "/summary.json"));
  CHECK(fs::exists(run + "/model.safetensors"));
  CHECK(fs::exists(run + "/metrics.jsonl"));
  const auto owner = nlohmann::json::parse(read_text(mirror + "/kiln-mirror.json"));
  CHECK(contains(owner["out"].get<std::string>(), "run\xef\xbf\xbd"));  // U+FFFD for the byte 0xFF
  // The last checkpoint lost: --resume auto continues from step 6, the mirror still this run's (its owner
  // file names --out with U+FFFD), and the run writes its step 8 and its outputs again.
  fs::remove(run + "/checkpoints/step-000000008.kiln");
  fs::remove(mirror + "/step-000000008.kiln");
  fs::remove(run + "/summary.json");
  r = run_kiln(args + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 6"), r.output);
  CHECK_MESSAGE(!contains(r.output, "failed"), r.output);
  CHECK(fs::exists(run + "/checkpoints/step-000000008.kiln"));
  CHECK(fs::exists(mirror + "/step-000000008.kiln"));
  REQUIRE(fs::exists(run + "/summary.json"));
  CHECK(nlohmann::json::parse(read_text(run + "/summary.json"))["steps"] == 8);
}

TEST_CASE("train: a --mirror of a run whose --out is not UTF-8 is named by its bytes: no other run takes it over") {
  // The owner file named --out with U+FFFD alone: $'run\xfe' matched $'run\xff' (the second run used the
  // first one's mirror as its own), and a --resume auto took the mirror over while that run still had
  // its checkpoints, since the path read back ("run\uFFFD") names no folder to check.
  TempDir d("kiln_outdir_utf8_owner");
  const std::string a = d / "run\xff", b = d / "run\xfe", mirror = d / "mirror";
  const std::string args =
      "train --limit-train 64 --limit-eval 32 --batch 32 --max-steps 2 --threads 1 --workers 0 --progress lines "
      "--save-every 2 --no-save-epochs --no-tensorboard --mirror " +
      mirror;
  auto r = run_kiln(args + " --out " + a, d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  REQUIRE(fs::exists(mirror + "/step-000000002.kiln"));
  const auto owner = nlohmann::json::parse(read_text(mirror + "/kiln-mirror.json"));
  std::string hex;
  for (const unsigned char c : fs::canonical(a).string()) {
    const char digits[] = "0123456789abcdef";
    hex += digits[c >> 4];
    hex += digits[c & 15];
  }
  CHECK(owner.value("out_hex", std::string()) == hex);
  for (const char* extra : {"", " --resume auto"}) {
    r = run_kiln(args + " --out " + b + extra, d.p.string());
    CHECK_MESSAGE(r.code == 2, r.output);
    CHECK_MESSAGE(contains(r.output, "holds the checkpoints of the run in " + fs::canonical(a).string() + " (host "),
                  r.output);
    CHECK_MESSAGE(!contains(r.output, "taking it over"), r.output);
    CHECK(nlohmann::json::parse(read_text(mirror + "/kiln-mirror.json")) == owner);
  }
  CHECK_MESSAGE(contains(r.output, "; it is not taken over, since its folder " + fs::canonical(a).string() +
                                       " still holds the intact checkpoint "),
                r.output);
  // Its own run still continues from it.
  fs::remove(a + "/summary.json");
  r = run_kiln(args + " --out " + a + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step 2"), r.output);
  // An older Kiln's owner file (no out_hex) that names such a path with U+FFFD: never taken over.
  nlohmann::json old = owner;
  old.erase("out_hex");
  std::ofstream(mirror + "/kiln-mirror.json") << kiln::io::dump_json(old, 2) << "\n";
  fs::remove_all(a);  // even with that folder gone: "run\uFFFD" cannot be checked
  r = run_kiln(args + " --out " + d / "c" + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(!contains(r.output, "taking it over"), r.output);
  CHECK_MESSAGE(contains(r.output, "; it is not taken over, since that path is not UTF-8 and is named with U+FFFD"),
                r.output);
  // Nor is it the mirror of a run whose --out reads as it once written with U+FFFD ($'run\xfe' against
  // "run\uFFFD"): the review's case, which used that run's copies as its own.
  r = run_kiln(args + " --out " + b + " --resume auto", d.p.string());
  CHECK_MESSAGE(r.code == 2, r.output);
  CHECK_MESSAGE(!contains(r.output, "resumed at step"), r.output);
}

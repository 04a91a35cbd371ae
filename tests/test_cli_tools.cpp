// The smaller commands' checks of their input, each run as a user would (the kiln binary): kiln
// report never writes over a file it reads, kiln vocab over an existing file or its own input, kiln
// bench refuses bad flags before any work, kiln launch names a flag it does not know and the rank
// that caused a failure, and kiln doctor reports a bad environment variable instead of stopping on it.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "test_util.h"

using kiln::testing::contains;
using kiln::testing::read_text;
using kiln::testing::run_kiln;
using kiln::testing::TempDir;

namespace {
void write(const std::string& p, const std::string& s) { std::ofstream(p) << s; }

// An environment variable set for one scope (the kiln binary started inside inherits it).
struct ScopedEnv {
  std::string name;
  ScopedEnv(const std::string& n, const std::string& v) : name(n) { ::setenv(n.c_str(), v.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// A run directory as kiln train leaves it (two metrics lines and a summary).
void fake_run(const TempDir& d, const std::string& name) {
  std::filesystem::create_directories(d.p / name);
  write(d / (name + "/metrics.jsonl"), "{\"step\":1,\"loss\":2.0,\"lr\":0.1}\n{\"step\":2,\"loss\":1.5,\"lr\":0.1}\n");
  write(d / (name + "/summary.json"), R"({"steps":2,"test_loss":1.4})");
}
}  // namespace

TEST_CASE("cli tools: kiln report refuses an --out that is a file it reads in a run directory") {
  TempDir d("kiln_cli_report");
  fake_run(d, "run1");
  const std::string metrics = read_text(d / "run1/metrics.jsonl"), summary = read_text(d / "run1/summary.json");
  for (const std::string out : {"run1/metrics.jsonl", "run1/summary.json", "./run1/../run1/metrics.jsonl"}) {
    const auto r = run_kiln("report " + d / "run1" + " --out " + d / out, d.p.string());
    CAPTURE(out);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(contains(r.output, "writing it would replace the file being read"));
  }
  // a link to the metrics counts too
  std::filesystem::create_symlink(d.p / "run1" / "metrics.jsonl", d.p / "link.html");
  auto r = run_kiln("report " + d / "run1" + " --out " + d / "link.html", d.p.string());
  CHECK(r.code == 2);
  CHECK(read_text(d / "run1/metrics.jsonl") == metrics);
  CHECK(read_text(d / "run1/summary.json") == summary);
  // a new file beside them is written
  r = run_kiln("report " + d / "run1" + " --out " + d / "run1/page.html", d.p.string());
  CHECK(r.code == 0);
  CHECK(contains(read_text(d / "run1/page.html"), "<svg"));
}

TEST_CASE("cli tools: kiln vocab refuses an existing --out unless --overwrite, and a directory --out") {
  TempDir d("kiln_cli_vocab");
  write(d / "small.txt", "the quick brown fox jumps over the lazy dog\nthe dog sleeps and the fox runs\n");
  write(d / "exist.txt", "precious\n");
  auto r = run_kiln("vocab --text " + d / "small.txt" + " --size 100 --out " + d / "exist.txt", d.p.string());
  CHECK(r.code == 2);
  CHECK(contains(r.output, "already exists: add --overwrite"));
  CHECK(read_text(d / "exist.txt") == "precious\n");
  r = run_kiln("vocab --text " + d / "small.txt" + " --size 100 --overwrite --out " + d / "exist.txt", d.p.string());
  CHECK(r.code == 0);
  CHECK(contains(read_text(d / "exist.txt"), "[PAD]"));
  // a directory: refused before any work, no temporary file left
  std::filesystem::create_directories(d.p / "ed");
  r = run_kiln("vocab --text " + d / "small.txt" + " --size 100 --out " + d / "ed", d.p.string());
  CHECK(r.code == 2);
  CHECK(contains(r.output, "is a directory"));
  CHECK(std::filesystem::is_empty(d.p / "ed"));
  r = run_kiln("vocab --text " + d / "small.txt" + " --size 100 --out " + d / "nodir/v.txt", d.p.string());
  CHECK(r.code == 2);
  CHECK(contains(r.output, "does not exist"));
}

TEST_CASE("cli tools: kiln vocab skips its own --out in a --text directory, names an empty input") {
  TempDir d("kiln_cli_vocab2");
  std::filesystem::create_directories(d.p / "corp");
  write(d / "corp/a.txt", "alpha beta gamma delta alpha beta gamma alpha beta alpha\n");
  auto r = run_kiln("vocab --text " + d / "corp" + " --size 60 --out " + d / "corp/vocab.txt", d.p.string());
  REQUIRE(r.code == 0);
  const std::string first = read_text(d / "corp/vocab.txt");
  r = run_kiln("vocab --text " + d / "corp" + " --size 60 --overwrite --out " + d / "corp/vocab.txt", d.p.string());
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(contains(r.output, "it is the --out file"));
  CHECK(contains(r.output, "from 1 file in"));
  CHECK(read_text(d / "corp/vocab.txt") == first);  // the old vocabulary was not read as text
  // a file with no words: the --text input named, exit 2, no internal name
  write(d / "empty.txt", "");
  r = run_kiln("vocab --text " + d / "empty.txt" + " --size 60 --out " + d / "v.txt", d.p.string());
  CHECK(r.code == 2);
  CHECK(contains(r.output, "--text"));
  CHECK(contains(r.output, "empty.txt"));
  CHECK(!contains(r.output, "build_wordpiece_vocab"));
  // a --size with no room for every character: says how many were dropped
  // 26 letters as word starts or continuations: 30 pieces, 11 of them fit beside the 5 special tokens
  write(d / "fox.txt", "the quick brown fox jumps over the lazy dog\n");
  r = run_kiln("vocab --text " + d / "fox.txt" + " --size 16 --out " + d / "v16.txt", d.p.string());
  CHECK(r.code == 0);
  CAPTURE(r.output);
  CHECK(contains(r.output, "warning: --size 16 holds only the 11 most frequent characters: 16 rarer ones"));
  r = run_kiln("vocab --text " + d / "fox.txt" + " --size 60 --out " + d / "v60.txt", d.p.string());
  CHECK(!contains(r.output, "warning"));
}

TEST_CASE("cli tools: kiln bench refuses bad flags before any work, in one line, exit 2") {
  TempDir d("kiln_cli_bench");
  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {"bench train --model resnet20 --steps 1 --warmup 0 --json " + d / "nodir/x.json", "does not exist"},
      {"bench train --model bogus", "--model bogus: unknown"},
      {"bench train --device cuda:99", "--device cuda:99"},
      {"bench scaling --master-port 70000 --json " + d / "s.json", "--master-port 70000"},
      {"bench scaling --master-port 65534 --max-ranks 2", "65536"},
      {"bench scaling --model bogus", "--model bogus: unknown"},
      {"bench scaling --json " + d / "nodir/x.json", "does not exist"},
      {"bench memory --model bogus", "--model bogus: unknown"},
      {"bench memory --model resnet20 --warmup 0", "--warmup"},
      {"bench memory --model resnet20 --master-port 65535", "--master-port 65535"},
  };
  for (const Case& c : cases) {
    const auto r = run_kiln(c.args, d.p.string());
    CAPTURE(c.args);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(contains(r.output, c.says));
    CHECK(!contains(r.output, "median ms"));  // no table started
    CHECK(!contains(r.output, "samples/s"));
  }
}

TEST_CASE("cli tools: kiln bench train --warmup 0 reports no peak; scaling's JSON names the CPU") {
  TempDir d("kiln_cli_bench2");
  auto r = run_kiln(
      "bench train --model resnet20 --batch 2 --image-size 8 --steps 1 --warmup 0 --threads 1 --json " + d / "t.json",
      d.p.string());
  REQUIRE(r.code == 0);
  auto j = nlohmann::json::parse(read_text(d / "t.json"));
  CHECK(!j["rows"][0].contains("peak_mib"));
  CHECK(contains(r.output, "1 thread,"));
  r = run_kiln(
      "bench train --model resnet20 --batch 2 --image-size 8 --steps 1 --warmup 1 --threads 1 --json " + d / "t.json",
      d.p.string());
  REQUIRE(r.code == 0);
  CHECK(nlohmann::json::parse(read_text(d / "t.json"))["rows"][0]["peak_mib"].get<double>() > 0);
  r = run_kiln(
      "bench scaling --model resnet20 --batch 2 --steps 1 --warmup 0 --max-ranks 1 --master-port 29911 "
      "--json " +
          d / "s.json",
      d.p.string());
  CAPTURE(r.output);
  REQUIRE(r.code == 0);
  j = nlohmann::json::parse(read_text(d / "s.json"));
  CHECK(j.contains("cpu"));
  CHECK(j.contains("cpu_kernels"));
  CHECK(contains(r.output, "CPU kernels"));
  CHECK(contains(r.output, "1 thread per rank"));
}

TEST_CASE("cli tools: kiln bench train's median of an even step count is the mean of the two middle steps") {
  TempDir d("kiln_cli_bench_median");
  // Was the upper middle step, while the PyTorch peers of train_vs_torch took statistics.median.
  auto r = run_kiln(
      "bench train --model resnet20 --batch 2 --image-size 8 --steps 2 --warmup 0 --threads 1 --json " + d / "t.json",
      d.p.string());
  REQUIRE(r.code == 0);
  const auto row = nlohmann::json::parse(read_text(d / "t.json"))["rows"][0];
  const double lo = row["min_ms"].get<double>(), hi = row["max_ms"].get<double>();
  CHECK(lo < hi);
  CHECK(row["median_ms"].get<double>() == (lo + hi) / 2.0);
}

TEST_CASE("cli tools: kiln bench train under a launcher waits --dist-timeout, as kiln train does") {
  TempDir d("kiln_cli_bench_timeout");
  // Rank 1 of 2 whose rank 0 never comes: the wait ends after --dist-timeout (was a fixed 600 s, while
  // the message named a --dist-timeout bench train did not have).
  const char* names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"};
  const char* values[] = {"1", "2", "1", "127.0.0.1", "29973"};
  for (int i = 0; i < 5; ++i) ::setenv(names[i], values[i], 1);
  const auto r = run_kiln("bench train --model resnet20 --batch 2 --image-size 8 --steps 1 --warmup 0 --dist-timeout 2",
                          d.p.string());
  for (const char* n : names) ::unsetenv(n);
  CAPTURE(r.output);
  CHECK(r.code == 1);
  CHECK(contains(r.output, "within --dist-timeout (2 s"));
}

TEST_CASE("cli tools: a flag a command does not take is one line naming it") {
  TempDir d("kiln_cli_extras");
  std::ofstream(d / "w.safetensors") << "x";  // kiln eval's --weights must exist before extras are looked at
  const std::string w = " --weights " + d / "w.safetensors";
  // CLI11 alone printed "The following arguments were not expected: 1 --zero" and a second line.
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"eval --model resnet20 --zero 1" + w, "kiln eval: error: --zero is a kiln train flag (training only)\n"},
           {"eval --model resnet20 --memory-cap=1GiB" + w, "kiln eval: error: --memory-cap is a kiln train flag"},
           {"eval --model resnet20 --bogus 3" + w,
            "kiln eval: error: --bogus is not a flag of kiln eval (see kiln eval --help)\n"},
           {"train --bogus 3 --out r",
            "kiln train: error: --bogus is not a flag of kiln train (see kiln train --help)\n"},
           {"train --out r stray", "kiln train: error: unexpected argument 'stray'"},
           {"bench train --memory-cap 1GiB", "kiln bench train: error: --memory-cap is not a flag of kiln bench train"},
           // The mistake before a command is the top level's, not kiln launch's lone `--` (which was
           // "unexpected argument '--'").
           {"--bogus launch -- echo hi", "kiln: error: --bogus is not a flag of kiln (see kiln --help)\n"},
           {"stray launch -- echo hi", "kiln: error: 'stray' is not a kiln command (see kiln --help)\n"},
           // A mistyped command is named before the flags after it ("--out is not a flag of kiln").
           {"trian --out r", "kiln: error: 'trian' is not a kiln command (see kiln --help)\n"},
           // A command that takes a word takes more than flags: one too many is named as that.
           {"ckpt inspect " + d / "w.safetensors" + " extra",
            "kiln ckpt inspect: error: unexpected argument 'extra' (one argument too many; see kiln ckpt inspect "
            "--help)\n"},
           // Words after a command's `--` are its mistake, not the top level's ("--zero is not a flag of kiln").
           {"eval --model resnet20" + w + " -- --zero 1",
            "kiln eval: error: unexpected argument '--zero' after -- (kiln eval takes flags only; see kiln eval "
            "--help)\n"},
           {"bench train -- extra",
            "kiln bench train: error: unexpected argument 'extra' after -- (kiln bench train takes flags only; see "
            "kiln bench train --help)\n"}}) {
    const auto r = run_kiln(args, d.p.string());
    CAPTURE(args);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(contains(r.output, says));
    CHECK(!contains(r.output, "not expected"));
    CHECK(!contains(r.output, "Run with --help"));
  }
}

TEST_CASE("cli tools: kiln launch names a flag it does not know") {
  TempDir d("kiln_cli_launch");
  auto r = run_kiln("launch --bogus 2 -- echo hi", d.p.string());
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(contains(r.output, "--bogus is not a flag of kiln launch"));
  CHECK(!contains(r.output, "hi echo"));
  r = run_kiln("launch --nproc 2 -- echo hi", d.p.string());
  CHECK(r.code == 2);
  CHECK(contains(r.output, "--nproc is not a flag"));
  CHECK(contains(r.output, "--nproc-per-node"));
  r = run_kiln("launch --nproc-per-node 1 -- echo hello from a rank", d.p.string());
  CHECK(r.code == 0);
  CHECK(contains(r.output, "hello from a rank"));
  CHECK(contains(r.output, "kiln launch: 1 rank on this node"));
  // An epoch is floor(n / (ranks x batch)) steps, as one process with the whole batch takes: 3
  // samples over 2 ranks take --batch 1 (one step), and --batch 2 is refused on every rank before
  // any work (it took a step over a padded, repeated sample before).
  if (std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    const std::string train =
        "launch --nproc-per-node 2 --master-port 29713 -- kiln train --model resnet20 "
        "--limit-train 3 --limit-eval 2 --max-steps 1 --threads 1 --progress lines --out " +
        d / "padded";
    r = run_kiln(train + " --batch 1", d.p.string());
    CHECK_MESSAGE(r.code == 0, r.output);
    r = run_kiln(train + " --batch 2 --overwrite", d.p.string());
    CHECK_MESSAGE(r.code != 0, r.output);
    CHECK_MESSAGE(contains(r.output, "--batch 2 x 2 ranks is more than the 3 training samples"), r.output);
  }
}

TEST_CASE("cli tools: kiln launch's header gives the threads its ranks get, KILN_NUM_THREADS when it is set") {
  TempDir d("kiln_cli_launch_threads");
  const char* was = std::getenv("KILN_NUM_THREADS");
  const std::string before = was ? was : "";
  // The header said each rank's share of the CPUs while the ranks kept the user's KILN_NUM_THREADS.
  ::setenv("KILN_NUM_THREADS", "3", 1);
  const auto r = run_kiln("launch --nproc-per-node 2 -- sh -c 'echo rank has $KILN_NUM_THREADS'", d.p.string());
  if (was)
    ::setenv("KILN_NUM_THREADS", before.c_str(), 1);
  else
    ::unsetenv("KILN_NUM_THREADS");
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(contains(r.output, "kiln launch: 2 ranks on this node (ranks 0..1 of 2), rendezvous at "));
  CHECK(contains(r.output, ", 3 threads each (KILN_NUM_THREADS)\n"));
  CHECK(contains(r.output, "[rank 0] rank has 3\n"));
  CHECK(contains(r.output, "[rank 1] rank has 3\n"));
}

TEST_CASE("cli tools: kiln launch's header says when the command's --threads overrides the threads it gives") {
  // The header gave KILN_NUM_THREADS or the CPU share when the ranks' own --threads chose otherwise.
  TempDir d("kiln_cli_launch_threads_flag");
  for (const std::string flag : {"--threads 2", "--threads=2"}) {
    const auto r = run_kiln("launch --nproc-per-node 1 -- sh -c true sh " + flag, d.p.string());
    CAPTURE(r.output);
    CHECK(r.code == 0);
    const bool said = contains(r.output, " each (the command's --threads overrides it)\n") ||
                      contains(r.output, " each (KILN_NUM_THREADS; the command's --threads overrides it)\n");
    CHECK(said);
  }
  const auto r = run_kiln("launch --nproc-per-node 1 -- sh -c true", d.p.string());
  CHECK(!contains(r.output, "--threads"));
}

// Fake ranks (a shell script by RANK) fail as a job does when one rank dies: its ring neighbour
// exits at once with kiln's status for a collective that lost its peer (3), the rank at fault a
// moment later. The launcher names and exits with the one at fault, and lists every rank's status.
TEST_CASE("cli tools: kiln launch names the rank that caused a failure, not the peer that ended first") {
  TempDir d("kiln_cli_launch_cause");
  auto launch = [&](const std::string& name, const std::string& rank0, const std::string& rank1) {
    write(d / name, "if [ \"$RANK\" = 0 ]; then " + rank0 + "; else " + rank1 + "; fi\n");
    return run_kiln("launch --nproc-per-node 2 --grace 30 -- sh " + d / name, d.p.string());
  };
  auto r = launch("exits.sh", "sleep 0.3; exit 2", "exit 3");
  CAPTURE(r.output);
  CHECK(r.code == 2);
  CHECK(contains(r.output, "kiln launch: failed: rank 0 (pid "));
  CHECK(contains(r.output,
                 ") exited with status 2; each rank: rank 0 exited with status 2, rank 1 exited with "
                 "status 3 (a collective failed: a peer ended or hangs)"));
  // The rank at fault killed by a signal (the OOM killer's SIGKILL): its status, 128 + 9.
  r = launch("killed.sh", "sleep 0.3; kill -9 $$", "exit 3");
  CAPTURE(r.output);
  CHECK(r.code == 137);
  CHECK(contains(r.output, ") was killed by signal 9 (Killed); each rank: rank 0 was killed by signal 9"));
  // A rank the launcher stopped is not the cause either.
  r = launch("stopped.sh", "exit 4", "exec sleep 30");
  CAPTURE(r.output);
  CHECK(r.code == 4);
  CHECK(contains(r.output, "kiln launch: failed: rank 0 (pid "));
  CHECK(contains(r.output, "rank 1 was killed by signal 15 (Terminated) (stopped by the launcher)"));
  // Only peers that lost a collective: the first of them is named, with its status.
  r = launch("alone.sh", "true", "exit 3");
  CAPTURE(r.output);
  CHECK(r.code == 3);
  CHECK(contains(r.output, "kiln launch: failed: rank 1 (pid "));
  CHECK(!contains(r.output, "each rank:"));
  // A rank that stopped on a stop signal from outside (kiln.train's SystemExit(143) on the rank that
  // caught a SIGTERM) is a stop, and the others, which stop with it, are given time to end by themselves.
  r = launch("outside.sh", "sleep 1; echo rank 0 ended", "exit 143");
  CAPTURE(r.output);
  CHECK(r.code == 143);
  CHECK(contains(r.output, "kiln launch: stopped: rank 1 (pid "));
  CHECK(contains(r.output,
                 ") exited with status 143 (it caught SIGTERM, not from the launcher: the ranks stop together)"));
  CHECK(contains(r.output, "[rank 0] rank 0 ended"));
  CHECK(!contains(r.output, "failed"));
}

// A rank killed outright by SIGTERM from outside (it did not catch it: not Kiln's command, or a rank killed
// before it set its handlers) agreed no stop with the others. The launcher said "(it caught SIGTERM, not
// from the launcher: the ranks stop together)", called the job stopped and let the others run on.
TEST_CASE("cli tools: kiln launch reports a rank killed by an outside SIGTERM as a failure, not a caught stop") {
  TempDir d("kiln_cli_launch_killed_outside");
  write(d / "killed.sh", "if [ \"$RANK\" = 0 ]; then exec sleep 30; else kill -TERM $$; fi\n");
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_kiln("launch --nproc-per-node 2 --grace 30 -- sh " + d / "killed.sh", d.p.string());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(r.output);
  CHECK(r.code == 143);
  CHECK(contains(r.output, "kiln launch: failed: rank 1 (pid "));
  CHECK(contains(r.output,
                 ") was killed by signal 15 (Terminated), not sent by the launcher (the rank did not catch it, so "
                 "the others did not stop with it)"));
  CHECK(contains(r.output, "rank 0 was killed by signal 15 (Terminated) (stopped by the launcher)"));
  CHECK(!contains(r.output, "caught SIGTERM"));
  CHECK(!contains(r.output, "stopped: rank"));
  CHECK(took < 14);  // the others are stopped at once, not given half of --grace (15 s)
}

// A SIGINT death from outside counts as a stop (a Python rank's KeyboardInterrupt ends so) only when the
// others then end by themselves: a shell killed by SIGINT agreed nothing, and the launcher has to stop
// rank 0. The launcher signals each rank's process group: rank 0's shell's child sleep ends with it
// (it held the output pipe open for its 30 s before).
TEST_CASE("cli tools: kiln launch calls an outside SIGINT death a failure when the others had to be stopped") {
  TempDir d("kiln_cli_launch_sigint_outside");
  write(d / "int.sh", "if [ \"$RANK\" = 0 ]; then sleep 30; echo rank 0 slept; else kill -INT $$; fi\n");
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = run_kiln("launch --nproc-per-node 2 --grace 2 -- sh " + d / "int.sh", d.p.string());
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CAPTURE(r.output);
  CHECK(r.code == 130);
  CHECK(contains(r.output, "kiln launch: failed: rank 1 (pid "));
  CHECK(contains(r.output, "(ended by SIGINT, not from the launcher: a Python rank's KeyboardInterrupt ends so)"));
  CHECK(
      contains(r.output, "the other ranks did not end by themselves (the launcher stopped them): no stop was agreed"));
  CHECK(!contains(r.output, "stopped: rank"));
  CHECK(!contains(r.output, "rank 0 slept"));
  CHECK(took < 20);  // the sleep (30 s) was ended with its shell, not waited for
}

// A rank that hangs (here: one that ignores SIGTERM) after its peer lost it is killed --grace after
// that first failure. The launcher waited --grace before the SIGTERM and another --grace before the
// SIGKILL: rank 0 below, 1.5 x --grace from its end, outlived that and said so. (--grace 4 leaves
// 2 s of margin on either side for a loaded machine.)
TEST_CASE("cli tools: kiln launch kills a hanging rank --grace after the first failure, not twice that") {
  TempDir d("kiln_cli_launch_grace");
  const std::string flag = d / "peer_lost";
  write(d / "hang.sh", "if [ \"$RANK\" = 0 ]; then trap '' TERM; while [ ! -e " + flag +
                           " ]; do sleep 0.05; done; sleep 6; echo outlived; exit 5; else touch " + flag +
                           "; exit 3; fi\n");
  const auto r = run_kiln("launch --nproc-per-node 2 --grace 4 -- sh " + d / "hang.sh", d.p.string());
  CAPTURE(r.output);
  CHECK(!contains(r.output, "outlived"));
  CHECK(r.code == 3);
  CHECK(contains(r.output,
                 "the other ranks get 2 s to end by themselves before SIGTERM, and SIGKILL after 4 s "
                 "(--grace)"));
  CHECK(contains(r.output, "rank 0 was killed by signal 9 (Killed) (stopped by the launcher)"));
}

TEST_CASE("cli tools: KILN_NUM_THREADS follows --threads' bound; kiln doctor reports a bad variable") {
  TempDir d("kiln_cli_env");
  if (4 * int64_t(std::thread::hardware_concurrency()) >= 2000) return;  // 2000 would be within the bound
  {
    ScopedEnv e("KILN_NUM_THREADS", "2000");
    auto r = run_kiln("report " + d / "nothing", d.p.string());
    CHECK(r.code != 0);
    CHECK(contains(r.output, "KILN_NUM_THREADS must be an integer between 1 and 1024"));
    r = run_kiln("doctor --no-self-test --device cpu", d.p.string());
    CAPTURE(r.output);
    CHECK(r.code == 1);
    CHECK(contains(r.output, "Verdict: NOT ready: KILN_NUM_THREADS"));
    const auto js = run_kiln("doctor --json --no-self-test --device cpu", d.p.string());
    const auto j = nlohmann::json::parse(js.output);
    REQUIRE(j["environment_problems"].size() == 1);
    CHECK(contains(j["environment_problems"][0].get<std::string>(), "KILN_NUM_THREADS"));
    CHECK(j["build"].contains("threads_reason"));
    CHECK(j["build"].contains("cpu_kernels_reason"));
  }
  {
    ScopedEnv e("KILN_CPU_ISA", "bogus");
    const auto r = run_kiln("doctor --no-self-test --device cpu", d.p.string());
    CAPTURE(r.output);
    CHECK(r.code == 1);
    CHECK(contains(r.output, "KILN_CPU_ISA"));
    CHECK(contains(r.output, "CPU backend"));  // the rest of the report still there
  }
  const auto r = run_kiln("doctor --no-self-test --device cpu", d.p.string());
  CHECK(r.code == 0);
  CHECK(!contains(r.output, "Environment"));
}

TEST_CASE("cli tools: a true/false flag's --flag=VALUE takes true/false or 1/0, as --set and --config") {
  TempDir d("kiln_cli_bool");
  std::ofstream(d / "w.safetensors") << "x";
  // (--batch 0: a value CLI11 takes ends the run there, on its batch.) CLI11's own rule took --augment=no and
  // --augment=-1 as off, --augment=2 and --no-augment=no as on, and named neither the flag nor the command for
  // --augment=maybe.
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"train --augment=no --out r --batch 0",
            "kiln train: error: --augment=no: --augment takes true or false (or 1, 0), got 'no' (see kiln train "
            "--help)\n"},
           {"train --augment=maybe --out r --batch 0",
            "kiln train: error: --augment=maybe: --augment takes true or false"},
           {"train --augment=2 --out r --batch 0", "kiln train: error: --augment=2: --augment takes"},
           {"train --augment=-1 --out r --batch 0", "kiln train: error: --augment=-1: --augment takes"},
           {"train --no-augment=off --out r --batch 0", "kiln train: error: --no-augment=off: --no-augment takes"},
           {"train --overwrite=yes --out r --batch 0", "kiln train: error: --overwrite=yes: --overwrite takes"},
           {"train --tensorboard= --out r --batch 0",
            "kiln train: error: --tensorboard=: --tensorboard takes true or false "
            "(or 1, 0), got ''"},
           {"eval --lower-case=on --weights " + d / "w.safetensors",
            "kiln eval: error: --lower-case=on: --lower-case takes"},
           {"doctor --json=y", "kiln doctor: error: --json=y: --json takes"},
           {"vocab --overwrite=enable --text t --out v", "kiln vocab: error: --overwrite=enable: --overwrite takes"},
           {"ckpt import --allow-missing=n x.safetensors --model resnet20 --out o",
            "kiln ckpt import: error: --allow-missing=n: --allow-missing takes"},
           {"forward --train=t", "kiln forward: error: --train=t: --train takes"},
           {"--version=no", "kiln: error: --version=no: --version takes"}}) {
    const auto r = run_kiln(args, d.p.string());
    CAPTURE(args);
    CAPTURE(r.output);
    CHECK(r.code == 2);
    CHECK(contains(r.output, says));
  }
  // The values --set and --config take pass, in any case: the run then fails on its --batch alone.
  const auto r = run_kiln("train --augment=TRUE --no-tensorboard=0 --overwrite=1 --save-epochs=False --batch 0 --out r",
                          d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "--batch must be at least 1"), r.output);
  CHECK_MESSAGE(!contains(r.output, "takes true or false"), r.output);
}

TEST_CASE("cli tools: a --flag=VALUE word that an option before it takes as its value is that value") {
  TempDir d("kiln_cli_bool_value");
  // CLI11 gives --out the next word, whatever it is: --out is the folder '--augment=no' and the run ends
  // on its --batch 0, as it did before --flag=VALUE was checked; the check read it as --augment's value.
  for (const std::string& args :
       {"train --out --augment=no --batch 0", "train --batch 0 --out --overwrite=maybe", "train --out -- --batch 0"}) {
    const auto r = run_kiln(args, d.p.string());
    CAPTURE(args);
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.output, "--batch must be at least 1"), r.output);
    CHECK_MESSAGE(!contains(r.output, "takes true or false"), r.output);
  }
  // A flag (no value) before it takes nothing: the word is still checked, as is one after the value.
  for (const std::string& args :
       {"train --overwrite --augment=no --out r --batch 0", "train --out r --augment=no --batch 0"}) {
    const auto r = run_kiln(args, d.p.string());
    CAPTURE(args);
    CHECK(r.code == 2);
    CHECK_MESSAGE(contains(r.output, "kiln train: error: --augment=no: --augment takes"), r.output);
  }
  // --help=VALUE is CLI11's to answer, as before the check.
  const auto r = run_kiln("train --help=maybe", d.p.string());
  CHECK_MESSAGE(!contains(r.output, "takes true or false"), r.output);
}

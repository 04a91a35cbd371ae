// `kiln train` under mpirun (CPU ranks through Open MPI): N ranks with --batch B log the same losses
// and end with the same weights as one process with --batch N x B (BERT-tiny classification without
// dropout or batch norm), with and without gradient accumulation; only rank 0 writes; a resume with
// another world size is refused.
#include <doctest/doctest.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/checkpoint.h"
#include "io/run_checkpoint.h"
#include "io/safetensors.h"
#include "kiln.h"
#include "test_util.h"

using kiln::testing::contains;
using kiln::testing::free_port;
using kiln::testing::read_text;
using kiln::testing::run_kiln;
using kiln::testing::TempDir;
using json = nlohmann::json;

namespace {
using kiln::testing::kFortunes;

std::vector<double> losses(const std::string& path) {
  std::vector<double> out;
  for (const json& j : kiln::testing::step_lines<json>(path)) out.push_back(j["loss"].get<double>());
  return out;
}

// `mpirun -np N kiln ARGS`, allowed to run as root and with more ranks than cores.
kiln::testing::CliResult run_ranks(int n, const std::string& args, const std::string& dir) {
  const std::string log = dir + "/mpirun_output.txt";
  const std::string cmd = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 KILN_NUM_THREADS=1 mpirun -np " +
                          std::to_string(n) + " --oversubscribe " + std::string(KILN_BINARY) + " " + args + " > " + log +
                          " 2>&1 < /dev/null";
  const int rc = std::system(cmd.c_str());
  kiln::testing::CliResult r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.output = read_text(log);
  return r;
}
}  // namespace

TEST_CASE("e2e dist: N ranks x batch B = one process x batch N*B (losses and weights); rank 0 writes; world size is part of a resume") {
  REQUIRE_MESSAGE(std::system("command -v mpirun > /dev/null") == 0, "apt-get install openmpi-bin libopenmpi-dev");
  REQUIRE_MESSAGE(std::filesystem::exists(kFortunes + "/computers"), "apt-get install fortunes");
  TempDir d("kiln_dist_e2e");
  auto r = run_kiln("vocab --text " + kFortunes + "/computers " + kFortunes + "/food --size 1500 --out " + d / "vocab.txt",
                    d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  {
    std::ofstream tr(d / "train.tsv"), ev(d / "eval.tsv");
    int n = 0;
    for (const char* cat : {"computers", "food"}) {
      std::istringstream in(read_text(kFortunes + "/" + cat));
      for (std::string line; std::getline(in, line);) {
        if (line == "%" || std::count(line.begin(), line.end(), ' ') < 4) continue;
        for (char& ch : line)
          if (ch == '\t') ch = ' ';
        (n++ % 7 == 0 ? ev : tr) << cat << "\t" << line << "\n";
      }
    }
  }
  const std::string common = "train --model bert-tiny --task classify --train-tsv " + d / "train.tsv" + " --eval-tsv " +
                             d / "eval.tsv" + " --vocab " + d / "vocab.txt" +
                             " --set hidden_dropout=0 --set attention_dropout=0 --seq-len 32 --max-steps 5 --epochs 1 "
                             "--optimizer sgd --momentum 0.9 --weight-decay 0 --lr 0.05 --warmup 0 --log-every 1 "
                             "--progress lines --seed 5 --save-every 3 --threads 1";
  r = run_kiln(common + " --batch 16 --out " + d / "one", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto want = losses(d / "one/metrics.jsonl");
  REQUIRE(want.size() == 5);
  const auto want_w = kiln::io::load_safetensors(d / "one/model.safetensors");
  const json want_s = json::parse(read_text(d / "one/summary.json"));

  struct Case {
    int ranks;
    std::string extra;
    bool mpi;  // mpirun (MPI) or `kiln launch` (TCP ring)
  };
  int port = 29650;
  for (const Case& k : {Case{2, "--batch 8", true}, Case{4, "--batch 4", true}, Case{2, "--batch 4 --accum-steps 2", true},
                        Case{2, "--batch 8", false}, Case{4, "--batch 4", false}}) {
    CAPTURE(k.ranks);
    CAPTURE(k.extra);
    CAPTURE(k.mpi);
    const std::string out = d / ((k.mpi ? "ranks" : "launch") + std::to_string(k.ranks) + "_" + std::to_string(k.extra.size()));
    if (k.mpi)
      r = run_ranks(k.ranks, common + " " + k.extra + " --out " + out, d.p.string());
    else
      r = run_kiln("launch --nproc-per-node " + std::to_string(k.ranks) + " --master-port " + std::to_string(++port) +
                       " -- kiln " + common + " " + k.extra + " --out " + out,
                   d.p.string());
    REQUIRE_MESSAGE(r.code == 0, r.output);
    CHECK_MESSAGE(contains(r.output, std::to_string(k.ranks) + (k.mpi ? " ranks (mpi)" : " ranks (tcp)") + ", global batch 16"),
                  r.output);
    if (!k.mpi) CHECK(contains(r.output, "[rank 0] epoch 1"));  // each line names its rank
    const auto got = losses(out + "/metrics.jsonl");
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
    const auto w = kiln::io::load_safetensors(out + "/model.safetensors");
    for (const auto& [name, t] : want_w.tensors) CHECK_MESSAGE(kiln::allclose(w.tensors.at(name), t, 1e-4, 1e-6), name);
    const json s = json::parse(read_text(out + "/summary.json"));
    CHECK(s["test_samples"] == want_s["test_samples"]);  // evaluation counts every sample once
    CHECK(s["test_accuracy"].get<double>() == doctest::Approx(want_s["test_accuracy"].get<double>()));
    CHECK(s["config"]["world_size"] == k.ranks);
    // One metrics line per step, from rank 0 only, with every rank's time breakdown.
    const std::string lines = read_text(out + "/metrics.jsonl");
    const json first = json::parse(lines.substr(0, lines.find('\n')));
    CHECK(first["ranks"].size() == size_t(k.ranks));
  }
  // Resuming the 2-rank run from its step-3 checkpoint, again with 2 ranks, ends bit for bit where the
  // uninterrupted run ended (each rank restores its own generator; the loader position is shared).
  r = run_ranks(2, common + " --batch 8 --resume " + d / "ranks2_9/checkpoints/step-000000003.kiln" + " --out " +
                       d / "resumed2",
                d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "resumed at step 3"));
  CHECK(read_text(d / "resumed2/model.safetensors") == read_text(d / "ranks2_9/model.safetensors"));
  const json ck = json::parse(kiln::io::CheckpointReader(d / "ranks2_9/checkpoints/step-000000003.kiln").state_json());
  CHECK(ck["run"]["rng_ranks"].size() == 2);
  // Ranks started by hand (as on two machines) whose --resume files differ: rank 1's copy is another
  // step of the same run (a stale copy). Both stop before training, naming the rank (before, rank 1
  // went on from its own step and weights: it ended at once with exit 0, and rank 0 failed on a lost peer).
  std::string other;
  for (const auto& e : std::filesystem::directory_iterator(d / "ranks2_9/checkpoints"))
    if (e.path().extension() == ".kiln" && e.path().filename() != "step-000000003.kiln") other = e.path().string();
  REQUIRE(!other.empty());
  {
    const std::string env =
        "MASTER_ADDR=127.0.0.1 MASTER_PORT=29695 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 KILN_DIST_SECRET=s ";
    const std::string cmd = std::string(KILN_BINARY) + " " + common + " --batch 8 --resume ";
    const std::string both = "(" + env + "RANK=0 LOCAL_RANK=0 " + cmd + d / "ranks2_9/checkpoints/step-000000003.kiln" +
                             " --out " + d / "stale" + " > " + d / "s0.txt" + " 2>&1; echo $? > " + d / "src0) & (" +
                             env + "RANK=1 LOCAL_RANK=1 " + cmd + other + " --out " + d / "stale" + " > " +
                             d / "s1.txt" + " 2>&1; echo $? > " + d / "src1); wait";
    REQUIRE(std::system(("timeout 120 sh -c '" + both + "'").c_str()) == 0);
    CHECK(read_text(d / "src0") == "2\n");
    CHECK(read_text(d / "src1") == "2\n");
    const std::string s0 = read_text(d / "s0.txt");
    CHECK_MESSAGE(contains(s0,
                           "is not the same checkpoint on every rank: rank(s) 1 loaded other weights or another "
                           "step than rank 0"),
                  s0);
    CHECK(!std::filesystem::exists(d / "stale/model.safetensors"));
  }
  // A checkpoint of a 2-rank run does not continue as 1 rank (the global batch would change).
  r = run_kiln(common + " --batch 8 --resume " + d / "ranks2_9/checkpoints/step-000000003.kiln" + " --out " + d / "re1",
               d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "world_size: checkpoint 2, now 1"), r.output);
}

// MLM's loss is a mean over masked tokens, whose number differs between the ranks' batches: each rank
// weighs its micro-batches by their share of all ranks' masked tokens (one all-reduce of the counts), so
// N ranks log one process's losses for the whole global batch (each rank's own mean, averaged over
// ranks, gave 6.9144 against 6.9193 at step 1 here).
TEST_CASE("e2e dist: MLM over N ranks weighs masked tokens over all ranks: the losses of one process x N*B") {
  REQUIRE_MESSAGE(std::filesystem::exists(kFortunes + "/computers"), "apt-get install fortunes");
  TempDir d("kiln_dist_mlm");
  const std::string common = kiln::testing::small_mlm_train(d);
  auto r = run_kiln(common + " --batch 16 --out " + d / "one", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const auto want = losses(d / "one/metrics.jsonl");
  REQUIRE(want.size() == 3);
  const auto want_w = kiln::io::load_safetensors(d / "one/model.safetensors");
  int port = 29690;
  for (const std::string extra : {"--batch 8", "--batch 4 --accum-steps 2"}) {
    CAPTURE(extra);
    const std::string out = d / ("two_" + std::to_string(extra.size()));
    r = run_kiln("launch --nproc-per-node 2 --master-port " + std::to_string(++port) + " -- kiln " + common + " " +
                     extra + " --out " + out,
                 d.p.string());
    REQUIRE_MESSAGE(r.code == 0, r.output);
    const auto got = losses(out + "/metrics.jsonl");
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
    // A linear layer's weight gradient is one GEMM over the rank's rows, f32 sums in another order than
    // one process's GEMM over all rows: AdamW's step over a near-zero gradient carries that (an element of
    // the FFN weights was 2e-6 off here, 0.2% of one lr = 1e-3 step), so the weights agree to 1e-5.
    const auto w = kiln::io::load_safetensors(out + "/model.safetensors");
    for (const auto& [name, t] : want_w.tensors) CHECK_MESSAGE(kiln::allclose(w.tensors.at(name), t, 1e-4, 1e-5), name);
  }
}

TEST_CASE("e2e dist: a rank killed mid-run makes kiln launch stop the others and exit non-zero within seconds, naming it") {
  TempDir d("kiln_dist_kill");
  const std::string launch_log = d / "launch.txt";
  // In the background: the launcher's pid to `pid`, its exit status to `rc` when it ends.
  const std::string inner = std::string(KILN_BINARY) +
                            " launch --nproc-per-node 2 --master-port 29671 --grace 3 -- kiln train --limit-train 8192 "
                            "--limit-eval 256 --batch 32 --epochs 1 --log-every 2 --progress lines --out " + d / "run" +
                            " > " + launch_log + " 2>&1 & echo $! > " + d / "pid" + "; wait $!; echo $? > " + d / "rc";
  const std::string cmd = "sh -c '" + inner + "' > /dev/null 2>&1 &";
  REQUIRE(std::system(cmd.c_str()) == 0);
  // Wait for training to be under way (rank 0 has written metrics), then SIGKILL rank 1.
  for (int i = 0; i < 3000 && !std::filesystem::exists(d / "run/metrics.jsonl"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (int i = 0; i < 3000 && read_text(d / "run/metrics.jsonl").size() < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string pid = read_text(d / "pid").substr(0, read_text(d / "pid").find('\n'));
  // The launcher's children in start order: rank 0, rank 1.
  REQUIRE(std::system(("kill -9 $(pgrep -P " + pid + " | sort -n | tail -1)").c_str()) == 0);
  const auto t0 = std::chrono::steady_clock::now();
  int status = -1;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    const std::string rc = read_text(d / "rc");
    if (!rc.empty() && rc.back() == '\n') {
      status = std::stoi(rc);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE_MESSAGE(status >= 0, "kiln launch still running 30 s after a rank died");
  CHECK(status != 0);
  CHECK_MESSAGE(secs < 10, secs);
  const std::string out = read_text(launch_log);
  CHECK_MESSAGE(contains(out, "kiln launch: rank 1 (pid"), out);
  CHECK_MESSAGE(contains(out, "was killed by signal 9"), out);
  CHECK_MESSAGE(contains(out, "kiln launch: failed: rank 1"), out);
  // Rank 0's own error names the rank it lost ("rank 1 (the previous in the ring) closed its connection").
  CHECK_MESSAGE(contains(out, "rank 1 (the "), out);
  CHECK(!std::filesystem::exists(d / "run/model.safetensors"));
}

TEST_CASE("e2e dist: kiln launch and its ranks leave a stop signal ignored on entry ignored (nohup kiln launch)") {
  TempDir d("kiln_dist_nohup");
  const std::string run = d / "run";
  const std::string inner = "trap \"\" HUP; exec " + std::string(KILN_BINARY) +
                            " launch --nproc-per-node 1 --master-port 29681 -- kiln train --limit-train 2048 "
                            "--limit-eval 64 --batch 16 --max-steps 40 --threads 1 --workers 0 --log-every 1 "
                            "--progress lines --no-tensorboard --out " +
                            run;
  const std::string cmd = "sh -c '" + inner + "' > " + d / "log.txt" + " 2>&1 < /dev/null & echo $! > " + d / "pid" +
                          "; wait $!; echo $? > " + d / "rc";
  std::thread waiter([&] { (void)std::system(cmd.c_str()); });
  for (int i = 0; i < 3000 && read_text(run + "/metrics.jsonl").size() < 10; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string pid = read_text(d / "pid").substr(0, read_text(d / "pid").find('\n'));
  // The hang-up, to the launcher and its rank (a rank's own group gets no terminal signal, but the
  // rule is the same for it).
  CHECK(std::system(("kill -HUP " + pid + " $(pgrep -P " + pid + ")").c_str()) == 0);
  waiter.join();
  const std::string log = read_text(d / "log.txt");
  CHECK_MESSAGE(read_text(d / "rc") == "0\n", log);
  CHECK_MESSAGE(!contains(log, "SIGHUP"), log);
  CHECK_MESSAGE(std::filesystem::exists(run + "/summary.json"), log);
  CHECK_MESSAGE(!contains(read_text(run + "/summary.json"), "\"stopped\""), log);  // finished, not stopped
}

// Ranks 0 and 1 of a 400-step run into `run`, started by hand (no launcher: a signal reaches one rank
// alone), outputs in d/r0.txt and d/r1.txt, exit codes in d/rc0 and d/rc1, rank 1's pid in d/pid1;
// returns the thread that waits for both once three steps are logged.
static std::thread start_two_ranks_by_hand(const TempDir& d, const std::string& run) {
  const std::string train = std::string(KILN_BINARY) +
                            " train --limit-train 2048 --limit-eval 64 --batch 16 --max-steps 400 --threads 1 "
                            "--workers 0 --log-every 1 --progress lines --no-tensorboard --out " +
                            run;
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(free_port()) +
                          " WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 KILN_DIST_SECRET=s KILN_NUM_THREADS=1 ";
  const std::string both = "(" + env + "RANK=0 LOCAL_RANK=0 " + train + " > " + d / "r0.txt" + " 2>&1; echo $? > " +
                           d / "rc0) & (" + env + "RANK=1 LOCAL_RANK=1 " + train + " > " + d / "r1.txt" +
                           " 2>&1 & echo $! > " + d / "pid1" + "; wait $!; echo $? > " + d / "rc1); wait";
  std::thread waiter([both] { (void)std::system(("timeout 300 sh -c '" + both + "' < /dev/null").c_str()); });
  auto steps_logged = [&] {  // read while the run writes: counted, not parsed (a line may be half there)
    const std::string m = read_text(run + "/metrics.jsonl");
    size_t n = 0;
    for (size_t at = m.find("\"loss\""); at != std::string::npos; at = m.find("\"loss\"", at + 1)) ++n;
    return n;
  };
  for (int i = 0; i < 12000 && steps_logged() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return waiter;
}

TEST_CASE("e2e dist: a stop signal only rank 1 caught is reported, recorded and summarised as that signal") {
  // The signal to another machine's launcher reached rank 1 alone: the ranks agreed to stop, but rank 0,
  // which had caught nothing, said "caught SIGTERM" and wrote no {"stopped": ...} line and no summary.
  TempDir d("kiln_dist_stop_rank1");
  const std::string run = d / "run";
  std::thread waiter = start_two_ranks_by_hand(d, run);
  const std::string pid = read_text(d / "pid1").substr(0, read_text(d / "pid1").find('\n'));
  REQUIRE(!pid.empty());
  CHECK(std::system(("kill -HUP " + pid).c_str()) == 0);
  waiter.join();
  const std::string r0 = read_text(d / "r0.txt"), r1 = read_text(d / "r1.txt");
  CAPTURE(r0);
  CAPTURE(r1);
  CHECK(read_text(d / "rc0") == "0\n");
  CHECK(read_text(d / "rc1") == "0\n");
  CHECK(contains(r0, "kiln train: rank 1 caught SIGHUP at step "));
  CHECK(!contains(r0, "SIGTERM"));
  const std::string metrics = read_text(run + "/metrics.jsonl");
  CHECK_MESSAGE(contains(metrics, "\"rank\":1,\"step\":"), metrics);
  CHECK_MESSAGE(contains(metrics, "\"stopped\":\"SIGHUP\""), metrics);
  const std::string summary = read_text(run + "/summary.json");
  CHECK_MESSAGE(contains(summary, "\"stopped\": \"SIGHUP\""), summary);
}

TEST_CASE("e2e dist: when rank 0's checkpoint of a stop fails, the other ranks say why they exit 1") {
  // Rank 0's checkpoints folder replaced by a file, SIGHUP to rank 1: rank 1 exited 1 with no message.
  TempDir d("kiln_dist_stop_ckpt_fails");
  const std::string run = d / "run";
  std::thread waiter = start_two_ranks_by_hand(d, run);
  std::filesystem::remove_all(run + "/checkpoints");
  std::ofstream(run + "/checkpoints") << "not a folder\n";
  const std::string pid = read_text(d / "pid1").substr(0, read_text(d / "pid1").find('\n'));
  REQUIRE(!pid.empty());
  CHECK(std::system(("kill -HUP " + pid).c_str()) == 0);
  waiter.join();
  const std::string r0 = read_text(d / "r0.txt"), r1 = read_text(d / "r1.txt");
  CAPTURE(r0);
  CAPTURE(r1);
  CHECK(read_text(d / "rc0") == "1\n");
  CHECK(read_text(d / "rc1") == "1\n");
  CHECK(contains(r0, "kiln train: rank 1 caught SIGHUP at step "));
  CHECK(contains(r0, "and stopped, but its checkpoint failed (above)"));
  CHECK(contains(r1, "kiln train: error: rank 0 could not save the checkpoint (rank 1 caught SIGHUP at step "));
  CHECK(contains(r1, "): see rank 0's messages"));
}

TEST_CASE("e2e dist: an --out that is not UTF-8 gets its weights and summary with two ranks") {
  // finish() dumped the summary (JSON, UTF-8 only) before its try: rank 0 ended with a bare "[json.exception
  // .type_error.316]", no model.safetensors, and rank 1 exited 3.
  TempDir d("kiln_dist_out_latin1");
  const std::string out = (d.p / "caf\xe9").string();
  const auto r = run_kiln("launch --nproc-per-node 2 --master-port " + std::to_string(free_port()) +
                              " -- kiln train --limit-train 256 --limit-eval 32 --batch 16 --max-steps 2 --threads 1 "
                              "--workers 0 --no-tensorboard --out '" +
                              out + "'",
                          d.p.string());
  CAPTURE(r.output);
  CHECK(r.code == 0);
  CHECK(!contains(r.output, "kiln: error:"));  // (the checkpoint's own failure on such a path is another matter)
  CHECK(std::filesystem::exists(out + "/model.safetensors"));
  const json summary = json::parse(read_text(out + "/summary.json"));
  CHECK(summary["steps"] == 2);
}

TEST_CASE("e2e dist: a launcher started with SIGTERM ignored still stops its ranks with SIGTERM") {
  // SIGTERM is how the launcher stops the others after a failure and its death signal: a rank that kept
  // it ignored ran on until the SIGKILL after --grace, or orphaned when the launcher was killed.
  TempDir d("kiln_dist_term");
  const std::string cmd = "sh -c 'trap \"\" TERM; exec " + std::string(KILN_BINARY) +
                          " launch --nproc-per-node 1 --master-port 29684 -- sh -c \"kill -TERM \\$\\$; sleep 3; "
                          "echo survived\"' > " +
                          d / "log.txt" + " 2>&1 < /dev/null";
  CHECK(std::system(cmd.c_str()) != 0);
  const std::string r = read_text(d / "log.txt");
  CHECK_MESSAGE(!contains(r, "survived"), r);
  CHECK_MESSAGE(contains(r, "signal 15"), r);
}

TEST_CASE(
    "e2e dist: ranks with other flags stop together naming them; a 2-rank test loss is the saved model's; a launcher "
    "killed outright takes its ranks down") {
  TempDir d("kiln_dist_agree");
  const std::string train = std::string(KILN_BINARY) +
                            " train --limit-train 512 --limit-eval 64 --threads 1 --workers 0 --progress lines "
                            "--max-steps 6 ";
  // Two ranks started by hand (as on two machines), one with another --batch, --lr and --resume (a hang at the resume
  // collectives before): both exit 2 before training, rank 1 naming the flags and rank 0's values.
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=29691 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 KILN_DIST_SECRET=s ";
  const std::string both = "(" + env + "RANK=0 LOCAL_RANK=0 " + train + "--batch 16 --lr 0.1 --out " + d / "a" + " > " +
                           d / "r0.txt" + " 2>&1; echo $? > " + d / "rc0) & (" + env + "RANK=1 LOCAL_RANK=1 " + train +
                           "--batch 32 --lr 5 --threads 2 --resume auto --out " + d / "b" + " > " + d / "r1.txt" +
                           " 2>&1; echo $? > " + d / "rc1); wait";
  REQUIRE(std::system(("timeout 120 sh -c '" + both + "'").c_str()) == 0);
  CHECK(read_text(d / "rc0") == "2\n");
  CHECK(read_text(d / "rc1") == "2\n");
  const std::string r1 = read_text(d / "r1.txt");
  CHECK_MESSAGE(
      contains(r1,
               "rank 1 runs another configuration than rank 0: --batch 32 (rank 0: 16), --lr 5.0 (rank 0: 0.1), "
               "--resume \"auto\" (rank 0: \"none\")."),
      r1);
  CHECK_MESSAGE(!contains(r1, "--threads 2"), r1);  // a per-machine setting may differ
  CHECK_MESSAGE(contains(read_text(d / "r0.txt"), "1 other rank runs another configuration than rank 0"),
                read_text(d / "r0.txt"));

  // Batch-norm running statistics follow each rank's batches; evaluation and the saved weights use rank 0's.
  auto r = run_kiln(
      "launch --nproc-per-node 2 --master-port 29692 -- kiln train --limit-train 512 --limit-eval 64 "
      "--batch 16 --max-steps 6 --threads 1 --workers 0 --progress lines --out " +
          d / "ok",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("eval --weights " + d / "ok/model.safetensors" + " --limit-eval 64 --batch 16 --out " + d / "ev.json",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(json::parse(read_text(d / "ev.json"))["test_loss"].get<double>() ==
        doctest::Approx(json::parse(read_text(d / "ok/summary.json"))["test_loss"].get<double>()).epsilon(1e-6));

  // kill -9 of the launcher: its ranks get SIGTERM from the kernel, save a checkpoint and exit. Their
  // output pipes have no reader any more: a progress line must not kill a rank (SIGPIPE) before it saves.
  for (int ranks : {1, 2}) {
    CAPTURE(ranks);
    std::string name = "k";  // not "k" + to_string(): GCC 12's -Wrestrict misfires on that (a false positive)
    name += std::to_string(ranks);
    const std::string k = d / name;
    const std::string inner =
        std::string(KILN_BINARY) + " launch --nproc-per-node " + std::to_string(ranks) + " --master-port " +
        std::to_string(29693 + ranks) + " -- kiln train --limit-train " + (ranks == 1 ? "8192" : "2048") +
        " --limit-eval 64 --batch 16 --threads 1 --workers 0 --log-every 1 --progress lines --out " + k + " > " + k +
        ".txt 2>&1 & echo $! > " + k + ".pid";
    REQUIRE(std::system(("sh -c '" + inner + "' > /dev/null 2>&1").c_str()) == 0);
    for (int i = 0; i < 3000 && read_text(k + "/metrics.jsonl").size() < 10; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::string pid = read_text(k + ".pid").substr(0, read_text(k + ".pid").find('\n'));
    REQUIRE(std::system(("pgrep -P " + pid + " > " + k + ".children").c_str()) == 0);
    REQUIRE(std::system(("kill -9 " + pid).c_str()) == 0);
    std::istringstream kids(read_text(k + ".children"));
    int alive = 0;
    for (std::string child; kids >> child;) {
      CAPTURE(child);
      int left = 1;
      for (int i = 0; i < 600 && left; ++i) {  // 30 s
        left = std::system(("kill -0 " + child + " 2> /dev/null").c_str()) == 0;
        if (left) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      alive += left;
    }
    CHECK(alive == 0);
    CHECK(std::filesystem::exists(k + "/checkpoints/latest"));  // saved on the way out
  }
  // The 2-rank run goes on to its end with --resume auto (rank 0 picks the checkpoint for both).
  const std::string latest = kiln::io::find_latest_checkpoint(d / "k2/checkpoints");
  REQUIRE(!latest.empty());
  const int64_t at = json::parse(kiln::io::CheckpointReader(latest).state_json())["run"]["step"].get<int64_t>();
  r = run_kiln(
      "launch --nproc-per-node 2 --master-port 29697 -- kiln train --limit-train 2048 --limit-eval 64 "
      "--batch 16 --threads 1 --workers 0 --log-every 1 --progress lines --resume auto --out " +
          d / "k2",
      d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "resumed at step " + std::to_string(at)), r.output);
  CHECK(json::parse(read_text(d / "k2/summary.json"))["steps"] == 64);
}

// --zero 1: ZeRO stage 1 over 2 ranks (kiln launch, TCP) and 4 (mpirun) with AdamW and clipping
// logs the losses and ends with the weights of the unsharded data-parallel run; its sharded
// checkpoint resumes bit for bit with --zero 1, is refused without it (naming consolidate), and
// once consolidated resumes without it; an unsharded checkpoint resumes with --zero 1.
TEST_CASE("e2e dist: --zero 1 equals data parallel; sharded checkpoints resume, consolidate, and cross over") {
  REQUIRE_MESSAGE(std::system("command -v mpirun > /dev/null") == 0, "apt-get install openmpi-bin libopenmpi-dev");
  REQUIRE_MESSAGE(std::filesystem::exists(kFortunes + "/computers"), "apt-get install fortunes");
  TempDir d("kiln_zero_e2e");
  auto r = run_kiln("vocab --text " + kFortunes + "/computers --size 1000 --out " + d / "vocab.txt", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const std::string common = "train --model bert-tiny --text " + kFortunes + "/computers --vocab " + d / "vocab.txt" +
                             " --seq-len 32 --max-steps 5 --epochs 1 --limit-eval 32 --optimizer adamw --lr 0.001 "
                             "--clip-grad-norm 1.0 --log-every 1 --progress lines --seed 5 --save-every 3 --threads 1";
  auto launch = [&](int n, int port, const std::string& args) {
    return run_kiln("launch --nproc-per-node " + std::to_string(n) + " --master-port " + std::to_string(port) +
                        " -- kiln " + common + " " + args,
                    d.p.string());
  };
  auto weights = [&](const std::string& out) { return kiln::io::load_safetensors(out + "/model.safetensors"); };
  auto close = [](const kiln::io::SafetensorsFile& a, const kiln::io::SafetensorsFile& b) {
    for (const auto& [name, t] : a.tensors) CHECK_MESSAGE(kiln::allclose(b.tensors.at(name), t, 1e-4, 1e-6), name);
  };
  for (int n : {2, 4}) {
    CAPTURE(n);
    const std::string dp = d / ("dp" + std::to_string(n)), zero = d / ("zero" + std::to_string(n));
    const std::string batch = " --batch " + std::to_string(16 / n);
    if (n == 2) {
      r = launch(2, 29671, batch + " --out " + dp);
      REQUIRE_MESSAGE(r.code == 0, r.output);
      r = launch(2, 29672, batch + " --zero 1 --out " + zero);
    } else {
      r = run_ranks(4, common + batch + " --out " + dp, d.p.string());
      REQUIRE_MESSAGE(r.code == 0, r.output);
      r = run_ranks(4, common + batch + " --zero 1 --out " + zero, d.p.string());
    }
    REQUIRE_MESSAGE(r.code == 0, r.output);
    const auto a = losses(dp + "/metrics.jsonl"), b = losses(zero + "/metrics.jsonl");
    REQUIRE(a.size() == 5);
    REQUIRE(b.size() == 5);
    for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-5));
    close(weights(dp), weights(zero));
    const bool same = read_text(dp + "/model.safetensors") == read_text(zero + "/model.safetensors");
    MESSAGE(n, " ranks: --zero 1 weights ", std::string(same ? "bit-identical to" : "within 1e-4 of"),
            " data parallel's");
  }
  const std::string ck = d / "zero2/checkpoints/step-000000003.kiln";
  const json st = json::parse(kiln::io::CheckpointReader(ck).state_json());
  CHECK(st["zero"]["world_size"] == 2);
  // With --zero 1 and 2 ranks: exactly where the uninterrupted run ended.
  r = launch(2, 29673, "--batch 8 --zero 1 --resume " + ck + " --out " + d / "zres");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "resumed at step 3"));
  CHECK(read_text(d / "zres/model.safetensors") == read_text(d / "zero2/model.safetensors"));
  // Without --zero: refused, saying how to go on.
  r = launch(2, 29674, "--batch 8 --resume " + ck + " --out " + d / "nozero");
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, "sharded over 2 ranks (written with --zero 1)"), r.output);
  CHECK_MESSAGE(contains(r.output, "kiln ckpt consolidate"), r.output);
  // Consolidated: one whole optimizer state and the weights; resumes without --zero to the same end.
  r = run_kiln("ckpt consolidate " + ck + " --out " + d / "whole.kiln --safetensors " + d / "whole.safetensors",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK_MESSAGE(contains(r.output, "made whole from 2 ranks' shards"), r.output);
  {
    kiln::io::CheckpointReader w(d / "whole.kiln");
    CHECK(!json::parse(w.state_json()).contains("zero"));
    CHECK(w.find("optim/0.0.exp_avg") != nullptr);
    const auto sw = kiln::io::load_safetensors(d / "whole.safetensors");
    for (const auto& [name, t] : sw.tensors) CHECK(kiln::allclose(w.read("model/" + name), t, 0, 0));
  }
  r = launch(2, 29675, "--batch 8 --resume " + d / "whole.kiln" + " --out " + d / "wres");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  close(weights(d / "zero2"), weights(d / "wres"));
  // And an unsharded data-parallel checkpoint continues under --zero 1.
  r = launch(2, 29676,
             "--batch 8 --zero 1 --resume " + d / "dp2/checkpoints/step-000000003.kiln" + " --out " + d / "cross");
  REQUIRE_MESSAGE(r.code == 0, r.output);
  close(weights(d / "dp2"), weights(d / "cross"));
  r = run_kiln("ckpt consolidate " + d / "whole.kiln --out " + d / "again.kiln", d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(contains(r.output, "is not sharded"), r.output);
}

// A sample count that is no multiple of ranks x batch: an epoch is floor(n / (N*B)) steps on every
// rank, as for one process with --batch N*B, and the losses are that process's. Before, the loader
// padded the order to equal shares and each rank dropped only its own partial batch: 47 samples, 2
// ranks x batch 4 took 6 steps an epoch (one over a repeated sample), one process x batch 8 took 5.
TEST_CASE("e2e dist: a sample count that is no multiple of N*B: N ranks take one process's steps and losses") {
  REQUIRE_MESSAGE(std::filesystem::exists(kFortunes + "/computers"), "apt-get install fortunes");
  TempDir d("kiln_dist_uneven");
  kiln::testing::small_mlm_train(d);  // builds d/vocab.txt
  const std::string common = "train --model bert-tiny --text " + kFortunes + "/computers --vocab " + d / "vocab.txt" +
                             " --seq-len 32 --limit-train 47 --limit-eval 16 --epochs 2 --optimizer adamw --lr 0.001 "
                             "--log-every 1 --progress lines --seed 5 --threads 1 --no-save-epochs --set "
                             "hidden_dropout=0 --set attention_dropout=0";
  auto r = run_kiln(common + " --batch 8 --out " + d / "one", d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  r = run_kiln("launch --nproc-per-node 2 --master-port 29641 -- kiln " + common + " --batch 4 --out " + d / "two",
               d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  const json one = json::parse(read_text(d / "one/summary.json")), two = json::parse(read_text(d / "two/summary.json"));
  CHECK(one["config"]["steps_per_epoch"] == 5);
  CHECK(two["config"]["steps_per_epoch"] == 5);
  CHECK(two["config"]["total_steps"] == one["config"]["total_steps"]);
  CHECK(two["test_samples"] == one["test_samples"]);  // evaluation still counts every sample once
  const auto want = losses(d / "one/metrics.jsonl"), got = losses(d / "two/metrics.jsonl");
  REQUIRE(want.size() == 10);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
}

// Ranks started by hand (as on two machines) whose data differs: rank 1 reads another corpus, so its
// splits have other sample counts and its file other bytes. Both stop before training, rank 1 naming
// the splits and both values (before, the ranks took other step counts: collectives paired up wrongly,
// one rank printed a test loss of 0 and another ended silently).
TEST_CASE("e2e dist: ranks with other data stop together naming the split and both values") {
  REQUIRE_MESSAGE(std::filesystem::exists(kFortunes + "/food"), "apt-get install fortunes");
  TempDir d("kiln_dist_data");
  kiln::testing::small_mlm_train(d);  // builds d/vocab.txt
  const std::string train = std::string(KILN_BINARY) + " train --model bert-tiny --vocab " + d / "vocab.txt" +
                            " --seq-len 32 --batch 4 --max-steps 2 --threads 1 --progress lines --dist-timeout 30 ";
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=29642 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 KILN_DIST_SECRET=s ";
  const std::string cmd = "(" + env + "RANK=0 LOCAL_RANK=0 " + train + "--text " + kFortunes + "/computers --out " +
                          d / "a" + " > " + d / "r0.txt" + " 2>&1; echo $? > " + d / "rc0) & (" + env +
                          "RANK=1 LOCAL_RANK=1 " + train + "--text " + kFortunes + "/food --out " + d / "b" + " > " +
                          d / "r1.txt" + " 2>&1; echo $? > " + d / "rc1); wait";
  REQUIRE(std::system(("timeout 120 sh -c '" + cmd + "'").c_str()) == 0);
  CHECK(read_text(d / "rc0") == "2\n");
  CHECK(read_text(d / "rc1") == "2\n");
  const std::string r1 = read_text(d / "r1.txt"), r0 = read_text(d / "r0.txt");
  CHECK_MESSAGE(contains(r1, "rank 1 reads other data than rank 0: training samples "), r1);
  CHECK_MESSAGE(contains(r1, "), evaluation samples "), r1);
  CHECK_MESSAGE(contains(r1, ", data file --text[0]: "), r1);
  CHECK_MESSAGE(contains(r1, " (rank 0: --text[0]: "), r1);
  const size_t at = r1.find("training samples ");
  REQUIRE(at != std::string::npos);
  const size_t lead_at = r1.find("(rank 0: ", at) + 9;
  const std::string mine = r1.substr(at + 17, r1.find(' ', at + 17) - at - 17),
                    lead = r1.substr(lead_at, r1.find(')', lead_at) - lead_at);
  CHECK_MESSAGE(mine != lead, r1);  // the two counts, each a number
  CHECK(std::stoll(mine) > 0);
  CHECK(std::stoll(lead) > 0);
  CHECK_MESSAGE(contains(r0, "1 other rank reads other data than rank 0"), r0);
  CHECK_MESSAGE(!contains(r0, "epoch 1"), r0);  // nothing trained
}

// A flag left at a default that stands for a rule is named as --help names it ("default"), not by its
// internal value: rank 1 with --warmup 1 read "--warmup 1 (rank 0: -1)".
TEST_CASE("e2e dist: ranks with other flags name a rule's default as --help does, not its internal value") {
  TempDir d("kiln_dist_default");
  const std::string train = std::string(KILN_BINARY) +
                            " train --limit-train 64 --batch 4 --max-steps 2 --threads 1 "
                            "--progress lines --dist-timeout 30 ";
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=29643 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 KILN_DIST_SECRET=s ";
  const std::string cmd = "(" + env + "RANK=0 LOCAL_RANK=0 " + train + "--out " + d / "a" + " > " + d / "r0.txt" +
                          " 2>&1; echo $? > " + d / "rc0) & (" + env + "RANK=1 LOCAL_RANK=1 " + train +
                          "--warmup 1 --micro-batch 2 --out " + d / "b" + " > " + d / "r1.txt" + " 2>&1; echo $? > " +
                          d / "rc1); wait";
  REQUIRE(std::system(("timeout 120 sh -c '" + cmd + "'").c_str()) == 0);
  CHECK(read_text(d / "rc0") == "2\n");
  CHECK(read_text(d / "rc1") == "2\n");
  const std::string r1 = read_text(d / "r1.txt");
  CHECK_MESSAGE(contains(r1,
                         "rank 1 runs another configuration than rank 0: --micro-batch \"2\" (rank 0: default), "
                         "--warmup 1 (rank 0: default)."),
                r1);
}

// Ranks reading the same corpus through other --vocab files (the same tokens, two of them swapped:
// the same sample counts and data files, another vocabulary) stop before training, rank 1 naming
// the vocabulary's fingerprints. Before, the ranks compared counts and files only and trained on,
// each rank's token ids meaning other words.
TEST_CASE("e2e dist: ranks with other --vocab files stop together naming the vocabulary's fingerprint") {
  REQUIRE_MESSAGE(std::filesystem::exists(kFortunes + "/computers"), "apt-get install fortunes");
  TempDir d("kiln_dist_vocab");
  kiln::testing::small_mlm_train(d);  // builds d/vocab.txt
  std::string other = read_text(d / "vocab.txt");
  // The last two entries swapped: ordinary word pieces, so the samples are cut the same.
  const size_t last = other.rfind('\n', other.size() - 2), before = other.rfind('\n', last - 1);
  REQUIRE(before != std::string::npos);
  other = other.substr(0, before + 1) + other.substr(last + 1, other.size() - last - 2) + "\n" +
          other.substr(before + 1, last - before - 1) + "\n";
  std::ofstream(d / "other.txt", std::ios::binary) << other;
  REQUIRE(other != read_text(d / "vocab.txt"));
  const std::string train = std::string(KILN_BINARY) + " train --model bert-tiny --text " + kFortunes +
                            "/computers --seq-len 32 --batch 4 --max-steps 2 --threads 1 --progress lines "
                            "--dist-timeout 30 ";
  const std::string env = "MASTER_ADDR=127.0.0.1 MASTER_PORT=29644 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 KILN_DIST_SECRET=s ";
  const std::string cmd = "(" + env + "RANK=0 LOCAL_RANK=0 " + train + "--vocab " + d / "vocab.txt" + " --out " +
                          d / "a" + " > " + d / "r0.txt" + " 2>&1; echo $? > " + d / "rc0) & (" + env +
                          "RANK=1 LOCAL_RANK=1 " + train + "--vocab " + d / "other.txt" + " --out " + d / "b" + " > " +
                          d / "r1.txt" + " 2>&1; echo $? > " + d / "rc1); wait";
  REQUIRE(std::system(("timeout 120 sh -c '" + cmd + "'").c_str()) == 0);
  CHECK(read_text(d / "rc0") == "2\n");
  CHECK(read_text(d / "rc1") == "2\n");
  const std::string r1 = read_text(d / "r1.txt"), r0 = read_text(d / "r0.txt");
  CHECK_MESSAGE(contains(r1, "rank 1 reads other data than rank 0: data vocab_fingerprint "), r1);
  CHECK_MESSAGE(!contains(r1, "training samples"), r1);  // the same counts: only the vocabulary differs
  CHECK_MESSAGE(contains(r0, "1 other rank reads other data than rank 0"), r0);
  CHECK_MESSAGE(!contains(r0, "epoch 1"), r0);  // nothing trained
}

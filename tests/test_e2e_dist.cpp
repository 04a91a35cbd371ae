// `kiln train` under mpirun (CPU ranks through Open MPI): N ranks with --batch B log the same losses
// and end with the same weights as one process with --batch N x B (BERT-tiny classification without
// dropout or batch norm), with and without gradient accumulation; only rank 0 writes; a resume with
// another world size is refused.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "kiln.h"
#include "test_util.h"

using kiln::testing::contains;
using kiln::testing::read_text;
using kiln::testing::run_kiln;
using kiln::testing::TempDir;
using json = nlohmann::json;

namespace {
const std::string kFortunes = "/usr/share/games/fortunes";

std::vector<double> losses(const std::string& path) {
  std::vector<double> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) {
      const json j = json::parse(line);
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    }
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
  };
  for (const Case& k : {Case{2, "--batch 8"}, Case{4, "--batch 4"}, Case{2, "--batch 4 --accum-steps 2"}}) {
    CAPTURE(k.ranks);
    CAPTURE(k.extra);
    const std::string out = d / ("ranks" + std::to_string(k.ranks) + "_" + std::to_string(k.extra.size()));
    r = run_ranks(k.ranks, common + " " + k.extra + " --out " + out, d.p.string());
    REQUIRE_MESSAGE(r.code == 0, r.output);
    CHECK(contains(r.output, std::to_string(k.ranks) + " ranks (mpi), global batch 16"));
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
  // A checkpoint of a 2-rank run does not continue as 1 rank (the global batch would change).
  r = run_kiln(common + " --batch 8 --resume " + d / "ranks2_9/checkpoints/step-000000003.kiln" + " --out " + d / "re1",
               d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "world_size: checkpoint 2, now 1"), r.output);
}

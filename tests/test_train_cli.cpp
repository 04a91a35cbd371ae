// `kiln train` and `kiln eval` end to end on Fashion-MNIST (Debian's dataset-fashion-mnist, which
// scripts/test installs): bad configurations stop before any work with exit code 2; a short run
// learns, writes its metrics, summary and weights; eval of those weights agrees with the summary.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "io/data.h"
#include "test_util.h"

using kiln::testing::contains;
using kiln::testing::read_text;
using kiln::testing::run_kiln;
using kiln::testing::TempDir;
using json = nlohmann::json;

namespace {
std::vector<json> read_jsonl(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(read_text(path));
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}
}  // namespace

TEST_CASE("train: impossible configurations exit 2 with one clear line, before any work") {
  TempDir d("kiln_train");
  const std::string out = " --out " + d / "run";
  struct Case {
    std::string args, says;
  };
  const Case cases[] = {
      {"--batch 0" + out, "--batch must be at least 1"},
      {"--epochs 0" + out, "--epochs must be at least 1"},
      {"--lr -1" + out, "--lr must be positive"},
      {"--model resnet7" + out, "--model resnet7: unknown"},
      {"--data-dir " + d / "nowhere" + out, "train-images-idx3-ubyte"},
      {"--optimizer adam" + out, "--optimizer"},
      {"--data mnist" + out, "--data mnist needs --data-dir"},
      {"--device tpu" + out, "--device tpu"},
      {"--limit-train 10 --batch 64" + out, "--batch 64 is larger than the 10 training samples"},
      {"--epochs", "--epochs"},
      {"--lr 0.1", "--out is required"},
  };
  for (const auto& c : cases) {
    const auto r = run_kiln("train " + c.args, d.p.string());
    CHECK_MESSAGE(r.code == 2, c.args, " -> ", r.output);
    CHECK_MESSAGE(contains(r.output, c.says), c.args, " -> ", r.output);
  }
  std::ofstream(d / "bad.json") << R"({"epochs": 1, "learning_rate": 0.1})";
  auto r = run_kiln("train --config " + d / "bad.json" + out, d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "learning"), r.output);
  std::ofstream(d / "broken.json") << R"({"epochs": )";
  r = run_kiln("train --config " + d / "broken.json" + out, d.p.string());
  CHECK(r.code == 2);
  CHECK_MESSAGE(contains(r.output, "not valid JSON"), r.output);
  CHECK(!std::filesystem::exists(d / "run/metrics.jsonl"));
}

TEST_CASE("train: a short ResNet-20 run on Fashion-MNIST learns; eval agrees with its summary") {
  REQUIRE_MESSAGE(std::filesystem::exists(std::string(kiln::io::kFashionMnistDir) + "/train-images-idx3-ubyte.gz"),
                  "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist");
  TempDir d("kiln_train");
  // Flags from a config file, one of them overridden on the command line.
  std::ofstream(d / "run.json") << R"({"epochs": 2, "batch": 64, "lr": 0.5, "limit_train": 1536, "limit_eval": 500,
                                      "warmup": 5, "log-every": 4, "seed": 3})";
  const auto r = run_kiln("train --config " + d / "run.json" + " --lr 0.05 --threads 2 --out " + d / "run",
                          d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  CHECK(contains(r.output, "test accuracy"));

  const auto metrics = read_jsonl(d / "run/metrics.jsonl");
  std::vector<double> losses;
  for (const auto& m : metrics)
    if (m.contains("loss")) {
      for (const char* k : {"step", "epoch", "loss", "lr", "samples_per_s"}) CHECK_MESSAGE(m.contains(k), k);
      losses.push_back(m["loss"].get<double>());
    }
  REQUIRE(losses.size() == 12);  // 24 steps per epoch, a line every 4
  CHECK(losses.back() < 0.7 * losses.front());

  const json s = json::parse(read_text(d / "run/summary.json"));
  CHECK(s["steps"] == 48);
  CHECK(s["config"]["lr"] == 0.05);   // the command line won
  CHECK(s["config"]["batch"] == 64);  // from the file
  CHECK(s["test_samples"] == 500);
  const double acc = s["test_accuracy"].get<double>();
  CHECK(acc > 0.45);  // ten classes: chance is 0.1
  CHECK(s["wall_seconds"].get<double>() > 0);

  const auto e = run_kiln("eval --model resnet20 --weights " + d / "run/model.safetensors" +
                              " --limit-eval 500 --out " + d / "eval.json",
                          d.p.string());
  REQUIRE_MESSAGE(e.code == 0, e.output);
  const json ev = json::parse(read_text(d / "eval.json"));
  CHECK(ev["test_accuracy"].get<double>() == doctest::Approx(acc).epsilon(1e-9));
  CHECK(ev["test_loss"].get<double>() == doctest::Approx(s["test_loss"].get<double>()).epsilon(1e-6));

  const auto bad = run_kiln("eval --model resnet32 --weights " + d / "run/model.safetensors", d.p.string());
  CHECK(bad.code == 2);
  CHECK_MESSAGE(contains(bad.output, "layer1.3"), bad.output);
}

// kiln report (tools/report.h): the charts hold every logged point of every run, a line cut by a kill
// or an empty run is named and the rest still drawn, and the command refuses a missing directory.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "test_util.h"
#include "tools/report.h"

using namespace kiln;
using kiln::testing::TempDir;

namespace {
// data-points of the series named `name` (-1 when absent).
int points(const std::string& html, const std::string& name) {
  const std::regex re("data-series=\"" + name + "\" data-points=\"([0-9]+)\"");
  std::smatch m;
  return std::regex_search(html, m, re) ? std::stoi(m[1]) : -1;
}
void write(const std::filesystem::path& p, const std::string& s) { std::ofstream(p) << s; }
}  // namespace

TEST_CASE("report: charts, several runs, cut lines, empty runs") {
  TempDir d("kiln_report");
  std::filesystem::create_directories(d.p / "a");
  std::filesystem::create_directories(d.p / "b");
  std::filesystem::create_directories(d.p / "empty");
  std::string a;
  for (int s = 1; s <= 3; ++s)
    a += "{\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(2.0 / s) +
         ",\"lr\":0.1,\"train_accuracy\":0.5,\"samples_per_s\":100,\"data_wait_s\":0.01,"
         "\"ranks\":[{\"comm_wait_s\":0.1,\"data_wait_s\":0.01},{\"comm_wait_s\":0.2,\"data_wait_s\":0.0}]}\n";
  a += "{\"step\":3,\"epoch\":1,\"eval_loss\":0.9,\"eval_accuracy\":0.7}\n";
  a += "{\"step\":4,\"loss\":0.";  // cut by a kill
  write(d.p / "a" / "metrics.jsonl", a);
  write(d.p / "a" / "summary.json", R"({"steps":3,"test_loss":0.9,"test_accuracy":0.7,"config":{"lr":0.1}})");
  // Lines written bad, not cut: NaN is no JSON number, and an array is not a metrics line.
  write(d.p / "b" / "metrics.jsonl",
        "{\"step\":0,\"loss\":NaN}\n[1,2]\n{\"step\":1,\"loss\":3.0,\"lr\":0.2,\"loss_scale\":65536}\n");
  write(d.p / "empty" / "metrics.jsonl", "");
  std::vector<std::string> notes;
  const std::string html =
      tools::render_report({(d.p / "a").string(), (d.p / "b").string(), (d.p / "empty").string()}, "t", notes);
  CHECK(points(html, "a train") == 3);
  CHECK(points(html, "a eval") == 1);
  CHECK(points(html, "b train") == 1);
  CHECK(points(html, "a rank 1 comm") == 3);
  CHECK(points(html, "a rank 1 data") == 3);
  CHECK(points(html, "b scale") == 1);  // the loss-scale chart, log scale
  CHECK(html.find("(log scale)") != std::string::npos);
  REQUIRE(notes.size() == 4);
  CHECK(notes[0].find("a/metrics.jsonl:5: not a complete JSON line (cut by a kill?)") != std::string::npos);
  CHECK(notes[1].find("b/metrics.jsonl:1: holds NaN, which is not a JSON number") != std::string::npos);
  CHECK(notes[2].find("b/metrics.jsonl:2: a JSON array, not an object; skipped") != std::string::npos);
  CHECK(notes[3].find("empty/metrics.jsonl: no metrics") != std::string::npos);
  CHECK(html.find("accuracy 70%") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);  // nothing fetched or run
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));
}

TEST_CASE("report: a resumed run's time is its whole training time, not the last process's wall time") {
  TempDir d("kiln_report");
  std::filesystem::create_directories(d.p / "resumed");
  std::filesystem::create_directories(d.p / "old");
  write(d.p / "resumed" / "metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write(d.p / "resumed" / "summary.json", R"({"steps":9,"wall_seconds":2.5,"train_seconds":731})");
  write(d.p / "old" / "metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write(d.p / "old" / "summary.json", R"({"steps":9,"wall_seconds":42})");  // before train_seconds
  std::vector<std::string> notes;
  const std::string html = tools::render_report({(d.p / "resumed").string(), (d.p / "old").string()}, "t", notes);
  CHECK(html.find("<th>train time (s)</th>") != std::string::npos);
  CHECK(html.find("wall time (s)") == std::string::npos);
  CHECK(html.find("<td>731</td>") != std::string::npos);
  CHECK(html.find("<td>2.5</td>") == std::string::npos);
  CHECK(html.find("<td>42 (wall)</td>") != std::string::npos);
}

TEST_CASE("report: a run a signal stopped is labelled so in its row, not shown as finished") {
  TempDir d("kiln_report_stopped");
  std::filesystem::create_directories(d.p / "stopped");
  std::filesystem::create_directories(d.p / "done");
  write(d.p / "stopped" / "metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n{\"stopped\":\"SIGTERM\",\"step\":7}\n");
  write(d.p / "stopped" / "summary.json", R"({"steps":7,"test_loss":0.5,"stopped":"SIGTERM","train_seconds":3})");
  write(d.p / "done" / "metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write(d.p / "done" / "summary.json", R"({"steps":9,"test_loss":0.25,"train_seconds":4})");
  std::vector<std::string> notes;
  const std::string html = tools::render_report({(d.p / "stopped").string(), (d.p / "done").string()}, "t", notes);
  CHECK_MESSAGE(html.find("<td>stopped</td><td>stopped (SIGTERM) at step 7</td><td>0.5</td>") != std::string::npos,
                html);
  CHECK_MESSAGE(html.find("<td>done</td><td>9</td><td>0.25</td>") != std::string::npos, html);
  CHECK(html.find("stopped (SIGTERM)", html.find("<td>done</td>")) == std::string::npos);
}

TEST_CASE("report: a run without summary.json (still running) shows its last step and evaluation, labelled so") {
  TempDir d("kiln_report_running");
  std::filesystem::create_directories(d.p / "running");
  write(d.p / "running" / "metrics.jsonl",
        "{\"step\":4,\"loss\":1.0,\"samples_per_s\":120}\n"
        "{\"step\":4,\"epoch\":1,\"eval_loss\":0.75,\"eval_accuracy\":0.5}\n"
        "{\"step\":6,\"loss\":0.9,\"samples_per_s\":130}\n");
  std::vector<std::string> notes;
  const std::string html = tools::render_report({(d.p / "running").string()}, "t", notes);
  CHECK_MESSAGE(html.find("<td>running</td><td>6 (no summary.json: still running, or ended before writing one)</td>"
                          "<td>0.75 (eval, step 4)</td><td>accuracy 50% (eval, step 4)</td>"
                          "<td>130 (last step)</td>") != std::string::npos,
                html);
}

TEST_CASE("report: the test metric is the task's, not the last test_* number (a masked-LM's perplexity)") {
  TempDir d("kiln_report_metric");
  std::filesystem::create_directories(d.p / "mlm");
  std::filesystem::create_directories(d.p / "cls");
  write(d.p / "mlm" / "metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write(
      d.p / "mlm" / "summary.json",
      R"({"task":"mlm","steps":5,"test_loss":11.49,"test_mlm_accuracy":0.25,"test_samples":8,"test_perplexity":97830})");
  write(d.p / "cls" / "metrics.jsonl", "{\"step\":1,\"loss\":1.0}\n");
  write(d.p / "cls" / "summary.json", R"({"task":"classify","steps":5,"test_loss":0.5,"test_accuracy":0.75})");
  std::vector<std::string> notes;
  const std::string html = tools::render_report({(d.p / "mlm").string(), (d.p / "cls").string()}, "t", notes);
  CHECK_MESSAGE(html.find("<td>mlm_accuracy 25%</td>") != std::string::npos, html);
  CHECK_MESSAGE(html.find("<td>accuracy 75%</td>") != std::string::npos, html);
  CHECK(html.find("perplexity") == std::string::npos);
}

TEST_CASE("report: a chart's axes, and no data") {
  tools::Chart c{"T", "step", "loss", false, {{"s", {{0, 1}, {10, 3}}, false}}};
  const std::string svg = tools::render_chart(c);
  CHECK(svg.find(">step<") != std::string::npos);
  CHECK(svg.find(">loss<") != std::string::npos);
  CHECK(svg.find("data-points=\"2\"") != std::string::npos);
  CHECK(tools::render_chart(tools::Chart{"E", "x", "y", false, {}}).find("no data") != std::string::npos);
}

TEST_CASE("report: benchmark JSON of each kind, and one it does not know") {
  TempDir d("kiln_report_bench");
  write(d.p / "gemm.json", R"({"benchmark":"gemm","cpu":"X","cpu_kernels":"avx2","rows":[
    {"m":256,"n":256,"k":256,"layout":"NN","dtype":"f32","gflops":100,"openblas_gflops":120},
    {"m":1024,"n":1024,"k":1024,"layout":"NN","dtype":"f32","gflops":150,"openblas_gflops":160},
    {"m":512,"n":512,"k":512,"layout":"NN","dtype":"f64","gflops":50,"openblas_gflops":null}]})");
  write(d.p / "ar.json", R"({"benchmark":"allreduce","backend":"tcp","ranks":2,"rows":[
    {"bytes":1024,"algbw_GBps":0.1,"busbw_GBps":0.1},{"bytes":1048576,"algbw_GBps":1.0,"busbw_GBps":1.0},
    {"bytes":67108864,"algbw_GBps":2.0,"busbw_GBps":2.0}]})");
  write(d.p / "scaling.json", R"({"bench":"scaling","model":"resnet20","rows":[
    {"ranks":1,"samples_per_s":100,"efficiency":1.0},{"ranks":2,"samples_per_s":180,"efficiency":0.9}]})");
  write(d.p / "train.json", R"({"bench":"train","rows":[{"model":"resnet20","amp":"off","input":"x","median_ms":10},
    {"model":"resnet20","amp":"bf16","input":"x","median_ms":8}]})");
  write(d.p / "memory.json", R"({"bench":"memory","cpu":"X","cpu_kernels":"avx2","rows":[
    {"model":"bert-base","run":"1 rank","peak_mib":2974.3,"median_ms":5171.3},
    {"model":"bert-base","run":"1 rank, --recompute blocks","peak_mib":1852.9,"median_ms":6504.4}]})");
  write(d.p / "odd.json", R"({"benchmark":"mystery","rows":[]})");
  write(d.p / "bad.json", "{\"benchmark\": ");
  write(d.p / "rows.json", R"([{"image":"500x375","pass":"eval","ms":0.3}])");  // an old bench_image_resize
  write(d.p / "typed.json", R"({"benchmark":3,"rows":[]})");                    // a field of the wrong type
  write(d.p / "resize.json", R"({"benchmark":"image_resize","cpu":"X","cpu_kernels":"avx2","threads":1,"rows":[
    {"image":"500x375","pass":"eval","out":224,"ms":0.35,"pil_ms":0.7},{"image":"4000x3000","pass":"eval","out":224,"ms":23}]})");
  std::vector<std::string> notes;
  std::vector<std::string> in;
  for (const char* f : {"gemm.json", "ar.json", "scaling.json", "train.json", "memory.json", "odd.json", "bad.json",
                        "rows.json", "typed.json", "resize.json"})
    in.push_back((d.p / f).string());
  const std::string html = tools::render_report(in, "bench", notes);
  CHECK(points(html, "Kiln f32 NN") == 2);
  CHECK(points(html, "OpenBLAS f32 NN") == 2);  // the peer, dashed
  CHECK(points(html, "Kiln f64 NN") == 1);
  CHECK(points(html, "OpenBLAS f64 NN") == -1);  // no peer measured: no series
  CHECK(points(html, "bus bandwidth") == 3);
  CHECK(points(html, "ideal \\(linear\\)") == 2);
  CHECK(points(html, "bars") == 2);
  CHECK(html.find("Peak memory of a training step (per rank) on X (avx2)") != std::string::npos);
  CHECK(html.find("bert-base 1 rank, --recompute blocks") != std::string::npos);
  CHECK(html.find("stroke-dasharray") != std::string::npos);
  CHECK(html.find("message size (bytes) (log scale)") != std::string::npos);
  CHECK(html.find("Image resize to 224x224 (PIL's bilinear), per image on X (avx2)") != std::string::npos);
  CHECK(html.find("PIL 500x375 eval") != std::string::npos);
  CHECK(html.find("PIL 4000x3000 eval") == std::string::npos);  // not measured: no bar
  REQUIRE(notes.size() == 4);
  CHECK(notes[0].find("odd.json: a benchmark JSON of an unknown kind (\"mystery\"") != std::string::npos);
  CHECK(notes[1].find("bad.json: not a readable JSON file") != std::string::npos);
  CHECK(notes[2].find("rows.json: a JSON array, not a benchmark's object") != std::string::npos);
  CHECK(notes[3].find("typed.json: not a benchmark's JSON as Kiln writes it (type must be string") !=
        std::string::npos);
}

TEST_CASE("report: bench_ops' rows without a backward are drawn with their forward time, labelled so") {
  TempDir d("kiln_report_ops");
  write(d.p / "ops.json", R"({"benchmark":"ops","cpu":"X","cpu_kernels":"avx2","threads":1,"rows":[
    {"row":"matmul","cpu_fwd_ms":1.5,"cpu_fwd_bwd_ms":4.25},
    {"row":"argmax","cpu_fwd_ms":0.75,"cpu_fwd_bwd_ms":null},
    {"row":"broken","cpu_fwd_ms":null,"cpu_fwd_bwd_ms":null}]})");
  std::vector<std::string> notes;
  const std::string html = tools::render_report({(d.p / "ops.json").string()}, "bench", notes);
  CHECK(notes.empty());
  CHECK(points(html, "bars") == 2);  // the row with no number has no bar
  CHECK(html.find("nan ms") == std::string::npos);
  CHECK(html.find(">matmul<") != std::string::npos);
  CHECK(html.find(">argmax (forward only)<") != std::string::npos);
  CHECK(html.find("broken") == std::string::npos);
}

TEST_CASE("report: bench_gpu's JSON, with the datasheet's peaks as reference lines") {
  TempDir d("kiln_report_gpu");
  write(d.p / "gpu.json", R"({"device":"NVIDIA H200","datasheet":{"memory_TBps":4.8,"f16_TFLOPs":989,"tf32_TFLOPs":494,
    "f32_TFLOPs":67},"memory_bound":[{"kernel":"softmax","GBps":3000},{"kernel":"gelu","GBps":3500}],
    "gemm":[{"dtype":"f16","m":2048,"TFLOPs":500},{"dtype":"f16","m":4096,"TFLOPs":700},{"dtype":"f32","m":2048,"TFLOPs":50}],
    "tc_gemm":[{"shape":"bert","kiln_ms":1.0,"cublaslt_ms":0.9}],"conv":[]})");
  std::vector<std::string> notes;
  const std::string html = tools::render_report({(d.p / "gpu.json").string()}, "gpu", notes);
  CHECK(notes.empty());
  CHECK(points(html, "f16") == 2);
  CHECK(points(html, "peak f16/bf16") == 2);
  CHECK(points(html, "peak f32") == 2);
  CHECK(points(html, "peak tf32") == -1);  // no tf32 rows: no tf32 peak
  CHECK(html.find("4800 GB/s") != std::string::npos);
  CHECK(html.find("bert: cuBLASLt") != std::string::npos);
}

TEST_CASE("report: a field of the wrong type, a run with no metrics, a malformed benchmark JSON") {
  TempDir d("kiln_report_bad");
  std::filesystem::create_directories(d.p / "a");
  std::filesystem::create_directories(d.p / "nometrics");
  write(d.p / "a" / "metrics.jsonl",
        "{\"step\":\"x\",\"loss\":1.0}\n{\"step\":2,\"loss\":\"1.5\"}\n{\"step\":3,\"loss\":-Infinity}\n"
        "{\"step\":4,\"loss\":1.0,\"note\":\"NaN in a string is fine\"}\n");
  write(d.p / "nometrics" / "summary.json", R"({"steps":3})");
  write(d.p / "bad.json", "{\"bench\": \"train\", \"rows\": [1, 2, la]}");
  std::vector<std::string> notes;
  const std::string html = tools::render_report(
      {(d.p / "a").string(), (d.p / "nometrics").string(), (d.p / "bad.json").string()}, "t", notes);
  CHECK(points(html, "a train") == 1);  // the last line only
  REQUIRE(notes.size() == 5);
  CHECK(notes[0].find("a/metrics.jsonl:1: \"step\" is a string (\"x\"), not a number; skipped") != std::string::npos);
  CHECK(notes[1].find("a/metrics.jsonl:2: \"loss\" is a string") != std::string::npos);
  CHECK(notes[2].find("a/metrics.jsonl:3: holds -Infinity, which is not a JSON number") != std::string::npos);
  CHECK(notes[3].find("nometrics/metrics.jsonl: missing: the run has a summary.json but no metrics") !=
        std::string::npos);
  CAPTURE(notes[4]);
  CHECK(notes[4].find("bad.json: not a readable JSON file (parse error") != std::string::npos);
  CHECK(notes[4].find("invalid literal; last read: '2, l')") != std::string::npos);  // whole, not cut mid-word
  CHECK(notes[4].find("[json.exception") == std::string::npos);
}

TEST_CASE("report: --out may not name a file the report reads from a run directory") {
  TempDir d("kiln_report_out");
  std::filesystem::create_directories(d.p / "run1");
  write(d.p / "run1" / "metrics.jsonl", "{\"step\":1,\"loss\":2.0}\n");
  write(d.p / "run1" / "summary.json", R"({"steps":1})");
  for (const char* f : {"metrics.jsonl", "summary.json"}) {
    tools::ReportOptions o;
    o.runs = {(d.p / "run1").string()};
    o.out = (d.p / "run1" / "." / f).string();
    CHECK(tools::run_report(o) == 2);
  }
  CHECK(kiln::testing::read_text((d.p / "run1" / "metrics.jsonl").string()) == "{\"step\":1,\"loss\":2.0}\n");
  CHECK(kiln::testing::read_text((d.p / "run1" / "summary.json").string()) == R"({"steps":1})");
}

TEST_CASE("report: --clip-grad-norm's grad_norm is a chart of its own; a null one (inf or NaN) is let be") {
  TempDir d("kiln_report_gn");
  std::filesystem::create_directories(d.p / "r");
  write(d.p / "r" / "metrics.jsonl",
        "{\"step\":1,\"loss\":2.0,\"lr\":0.1,\"grad_norm\":3.5}\n"
        "{\"step\":2,\"loss\":1.5,\"lr\":0.1,\"grad_norm\":null}\n"
        "{\"step\":3,\"loss\":1.0,\"lr\":0.1,\"grad_norm\":0.75}\n");
  std::vector<std::string> notes;
  const std::string html = tools::render_report({(d.p / "r").string()}, "t", notes);
  CHECK(notes.empty());
  CHECK(points(html, "grad norm") == 2);
  CHECK(html.find("Gradient norm (before clipping)") != std::string::npos);
  // a string where the number belongs is named, as for the other drawn fields
  write(d.p / "r" / "metrics.jsonl", "{\"step\":1,\"loss\":2.0,\"grad_norm\":\"x\"}\n");
  notes.clear();
  tools::render_report({(d.p / "r").string()}, "t", notes);
  REQUIRE(!notes.empty());
  CHECK_MESSAGE(notes[0].find("\"grad_norm\" is a string") != std::string::npos, notes[0]);
  // runs without it have no such chart
  write(d.p / "r" / "metrics.jsonl", "{\"step\":1,\"loss\":2.0}\n");
  CHECK(tools::render_report({(d.p / "r").string()}, "t", notes).find("Gradient norm") == std::string::npos);
}

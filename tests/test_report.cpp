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
         "\"ranks\":[{\"comm_wait_s\":0.1},{\"comm_wait_s\":0.2}]}\n";
  a += "{\"step\":3,\"epoch\":1,\"eval_loss\":0.9,\"eval_accuracy\":0.7}\n";
  a += "{\"step\":4,\"loss\":0.";  // cut by a kill
  write(d.p / "a" / "metrics.jsonl", a);
  write(d.p / "a" / "summary.json", R"({"steps":3,"test_loss":0.9,"test_accuracy":0.7,"config":{"lr":0.1}})");
  write(d.p / "b" / "metrics.jsonl", "{\"step\":1,\"loss\":3.0,\"lr\":0.2,\"loss_scale\":65536}\n");
  write(d.p / "empty" / "metrics.jsonl", "");
  std::vector<std::string> notes;
  const std::string html =
      tools::render_report({(d.p / "a").string(), (d.p / "b").string(), (d.p / "empty").string()}, "t", notes);
  CHECK(points(html, "a train") == 3);
  CHECK(points(html, "a eval") == 1);
  CHECK(points(html, "b train") == 1);
  CHECK(points(html, "a rank 1") == 3);
  CHECK(points(html, "b scale") == 1);  // the loss-scale chart, log scale
  CHECK(html.find("(log scale)") != std::string::npos);
  REQUIRE(notes.size() == 2);
  CHECK(notes[0].find("a/metrics.jsonl:5") != std::string::npos);
  CHECK(notes[1].find("empty/metrics.jsonl: no metrics") != std::string::npos);
  CHECK(html.find("accuracy 70%") != std::string::npos);
  CHECK(html.find("<script") == std::string::npos);  // nothing fetched or run
  CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));
}

TEST_CASE("report: a chart's axes, and no data") {
  tools::Chart c{"T", "step", "loss", false, {{"s", {{0, 1}, {10, 3}}, false}}};
  const std::string svg = tools::render_chart(c);
  CHECK(svg.find(">step<") != std::string::npos);
  CHECK(svg.find(">loss<") != std::string::npos);
  CHECK(svg.find("data-points=\"2\"") != std::string::npos);
  CHECK(tools::render_chart(tools::Chart{"E", "x", "y", false, {}}).find("no data") != std::string::npos);
}

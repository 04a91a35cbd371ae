// `kiln forward` end to end: weights and inputs written with the safetensors writer, the binary
// run as a user would, its outputs and gradients compared with the same model run in-process.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "kiln.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "test_util.h"

using namespace kiln;
using kiln::testing::TempDir;
namespace fs = std::filesystem;

namespace {

int run(const std::string& args) {
  const std::string cmd = std::string(KILN_BINARY) + " forward " + args + " > /dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace

TEST_CASE("forward: resnet20 outputs and gradients match the in-process model") {
  TempDir d;
  models::ResNetConfig cfg{"resnet20", 4, 1};
  auto m = models::make_resnet(cfg);
  io::save_safetensors(d / "w.safetensors", m->state_dict());
  const Tensor x = randn({2, 1, 12, 12});
  io::save_safetensors(d / "x.safetensors", {{"input", x}});
  m->eval();
  Tensor want;
  {
    NoGradGuard ng;
    want = (*m)(x);
  }
  const std::string base = "--model resnet20 --set num_classes=4 --set in_channels=1 --weights " + d / "w.safetensors" +
                           " --inputs " + d / "x.safetensors";
  REQUIRE(run(base + " --out " + d / "y.safetensors") == 0);
  const auto y = io::load_safetensors(d / "y.safetensors");
  CHECK(allclose(y.tensors.at("output"), want, 1e-5, 1e-6));

  // Training-mode batch norm with a gradient: compare every parameter's gradient.
  const Tensor g = randn({2, 4});
  io::save_safetensors(d / "g.safetensors", {{"output", g}});
  REQUIRE(run(base + " --train --grad-output " + d / "g.safetensors" + " --out " + d / "y2.safetensors") == 0);
  const auto y2 = io::load_safetensors(d / "y2.safetensors");
  auto m2 = models::make_resnet(cfg);
  m2->load_state_dict(m->state_dict());
  m2->train();
  Tensor xi = x.clone().set_requires_grad();
  (*m2)(xi).backward(g);
  CHECK(allclose(y2.tensors.at("grad.input"), xi.grad(), 1e-4, 1e-6));
  for (auto& [n, p] : m2->named_parameters()) {
    INFO(n);
    CHECK(allclose(y2.tensors.at("grad." + n), p.grad(), 1e-4, 1e-6));
  }
}

TEST_CASE("forward: bert-tiny-mlm, bad weights and flags") {
  TempDir d;
  models::BertConfig c = models::bert_config("tiny");
  c.vocab_size = 40;
  c.hidden_dropout = c.attention_dropout = 0;
  models::BertForMaskedLM m(c);
  m.eval();
  io::save_safetensors(d / "w.safetensors", m.state_dict());
  const Tensor ids = randint(0, 40, {2, 5});
  const Tensor mask = ones({2, 5}, TensorOptions(DType::i64));
  io::save_safetensors(d / "x.safetensors", {{"input_ids", ids}, {"attention_mask", mask}});
  const std::string base = "--model bert-tiny-mlm --set vocab_size=40 --inputs " + d / "x.safetensors";
  REQUIRE(run(base + " --weights " + d / "w.safetensors" + " --out " + d / "y.safetensors") == 0);
  Tensor want;
  {
    NoGradGuard ng;
    want = m.forward(ids, mask);
  }
  CHECK(allclose(io::load_safetensors(d / "y.safetensors").tensors.at("output"), want, 1e-5, 1e-6));

  // Old gamma/beta names load as aliases.
  nn::StateDict old = m.state_dict();
  old["bert.embeddings.LayerNorm.gamma"] = old.at("bert.embeddings.LayerNorm.weight");
  old.erase("bert.embeddings.LayerNorm.weight");
  io::save_safetensors(d / "old.safetensors", old);
  CHECK(run(base + " --weights " + d / "old.safetensors" + " --out " + d / "y3.safetensors") == 0);

  // A pretraining checkpoint (Hugging Face BertForPreTraining, or a Kiln masked-LM run from before the
  // pooler was dropped) also holds the pooler and the next-sentence head: masked LM never uses them, so
  // they are ignored, and named.
  nn::StateDict pre = m.state_dict();
  pre["bert.pooler.dense.weight"] = zeros({c.hidden_size, c.hidden_size});
  pre["bert.pooler.dense.bias"] = zeros({c.hidden_size});
  pre["cls.seq_relationship.weight"] = zeros({2, c.hidden_size});
  pre["cls.seq_relationship.bias"] = zeros({2});
  io::save_safetensors(d / "pre.safetensors", pre);
  const auto r = testing::run_kiln(
      "forward " + base + " --weights " + d / "pre.safetensors" + " --out " + d / "y2.safetensors", d.p.string());
  CHECK(r.code == 0);
  CHECK_MESSAGE(r.output.find("ignored 4 tensors of " + d / "pre.safetensors" +
                              " that bert-tiny-mlm does not use: "
                              "bert.pooler.dense.bias, bert.pooler.dense.weight, cls.seq_relationship.bias, "
                              "cls.seq_relationship.weight") != std::string::npos,
                r.output);
  CHECK(allclose(io::load_safetensors(d / "y2.safetensors").tensors.at("output"), want, 1e-5, 1e-6));

  // Missing and unexpected names are errors (exit 1); --allow-missing tolerates the missing.
  nn::StateDict bad = m.state_dict();
  bad.erase("cls.predictions.bias");
  io::save_safetensors(d / "missing.safetensors", bad);
  CHECK(run(base + " --weights " + d / "missing.safetensors" + " --out " + d / "y4.safetensors") == 1);
  CHECK(run(base + " --weights " + d / "missing.safetensors" + " --allow-missing --out " + d / "y4.safetensors") == 0);
  bad["stray.weight"] = zeros({1});
  io::save_safetensors(d / "stray.safetensors", bad);
  CHECK(run(base + " --weights " + d / "stray.safetensors" + " --allow-missing --out " + d / "y5.safetensors") == 1);
  // Bad flags: exit 2 before any work.
  CHECK(run("--model bert-tiny-mlm --weights " + d / "nope.safetensors" + " --inputs " + d / "x.safetensors" +
            " --out " + d / "y6.safetensors") == 2);
  CHECK(run(base + " --weights " + d / "w.safetensors" + " --set colour=blue --out " + d / "y7.safetensors") == 1);
  CHECK(!fs::exists(d / "y7.safetensors"));
}

TEST_CASE("models by name: every name of the table builds and runs; an unknown one's error lists them all") {
  // What the command line promises: the ResNet depths and every BERT size, bare or with a head.
  std::vector<std::string> names = models::resnet_names();
  for (const auto& size : models::bert_sizes())
    for (const char* head : {"", "-mlm", "-cls"}) names.push_back("bert-" + size + head);
  TempDir d;
  io::save_safetensors(d / "none.safetensors", {});  // with --allow-missing: the initializer's weights
  io::save_safetensors(d / "image.safetensors", {{"input", randn({1, 3, 32, 32})}});
  io::save_safetensors(d / "tokens.safetensors", {{"input_ids", randint(0, 40, {1, 4})}});
  const std::string files = " --weights " + d / "none.safetensors" + " --allow-missing --out " + d / "y.safetensors";

  const auto r = testing::run_kiln("forward --model resnet7 --inputs " + d / "image.safetensors" + files, d.p.string());
  CHECK(r.code == 1);
  const std::string lead = "--model resnet7: unknown (expected one of ";
  const size_t at = r.output.find(lead);
  REQUIRE_MESSAGE(at != std::string::npos, r.output);
  const size_t end = r.output.find(')', at);
  REQUIRE(end != std::string::npos);
  std::vector<std::string> listed;
  std::istringstream list(r.output.substr(at + lead.size(), end - at - lead.size()));
  for (std::string n; std::getline(list, n, ',');) listed.push_back(n.substr(n.find_first_not_of(' ')));
  CHECK(listed == names);

  for (const auto& n : listed) {
    // BERT with one layer and a small vocabulary: each size's width and heads, built in seconds.
    const bool bert = n.rfind("bert-", 0) == 0;
    const std::string args = "forward --model " + n + " --inputs " + d / (bert ? "tokens" : "image") + ".safetensors" +
                             (bert ? " --set vocab_size=40 --set num_layers=1" : "") + files;
    const auto b = testing::run_kiln(args, d.p.string());
    CHECK_MESSAGE(b.code == 0, n, ": ", b.output);
    if (b.code == 0) CHECK(io::load_safetensors(d / "y.safetensors").tensors.count("output") == 1);
    fs::remove(d / "y.safetensors");
  }
}

TEST_CASE("forward: an input the model refuses is named with its file") {
  TempDir d;
  models::BertConfig c = models::bert_config("tiny");
  c.vocab_size = 40;
  models::BertForMaskedLM m(c);
  io::save_safetensors(d / "w.safetensors", m.state_dict());
  const std::string base =
      "forward --model bert-tiny-mlm --set vocab_size=40 --weights " + d / "w.safetensors" + " --out " + d / "y.st";
  auto says = [&](const std::map<std::string, Tensor>& inputs, const std::string& what, const std::string& model_args) {
    io::save_safetensors(d / "x.st", inputs);
    const auto r = testing::run_kiln(model_args + " --inputs " + d / "x.st", d.p.string());
    CHECK(r.code != 0);
    CHECK_MESSAGE(testing::contains(r.output, d / "x.st" + ": " + what), r.output);
  };
  const Tensor ids = randint(0, 40, {2, 5});
  says({{"input_ids", ids}, {"token_type_ids", full({2, 5}, 7.0, TensorOptions(DType::i64))}},
       "input 'token_type_ids' holds 7, outside 0..1 (the model's type_vocab_size is 2)", base);
  says({{"input_ids", full({2, 5}, 40.0, TensorOptions(DType::i64))}},
       "input 'input_ids' holds 40, outside 0..39 (the model's vocab_size is 40)", base);
  says({{"input_ids", ids.to(DType::f32)}}, "input 'input_ids' is f32: it holds indices", base);
  // A ResNet given integers instead of an image.
  auto r = models::make_resnet({"resnet20", 10, 1});
  io::save_safetensors(d / "r.safetensors", r->state_dict());
  says({{"input", ones({1, 1, 8, 8}, TensorOptions(DType::i64))}}, "input 'input' is i64: the model takes images",
       "forward --model resnet20 --set in_channels=1 --weights " + d / "r.safetensors" + " --out " + d / "y.st");
  // Any other error of the model names the file too: an image of 3 channels for a 1-channel ResNet.
  says({{"input", ones({1, 3, 8, 8})}}, "running resnet20 on its tensors failed: ",
       "forward --model resnet20 --set in_channels=1 --weights " + d / "r.safetensors" + " --out " + d / "y.st");
}

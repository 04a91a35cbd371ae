// `kiln forward` end to end: weights and inputs written with the safetensors writer, the binary
// run as a user would, its outputs and gradients compared with the same model run in-process.
#include <cmath>
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "kiln.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "test_util.h"
#include "tools/zoo.h"

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

TEST_CASE("models by name: --set values are checked when the model is built") {
  auto bert = [](const std::vector<std::string>& sets) { return tools::bert_config_from("tiny", sets); };
  // A dropout probability outside [0, 1] failed only at the first forward; a zero or NaN epsilon never.
  for (const char* s : {"hidden_dropout=1.5", "hidden_dropout=-0.1", "attention_dropout=2", "hidden_dropout=nan"})
    CHECK_THROWS_WITH_AS(bert({s}), doctest::Contains("a dropout probability must be in [0, 1]"), Error);
  for (const char* s : {"layer_norm_eps=0", "layer_norm_eps=nan", "layer_norm_eps=-1e-5", "layer_norm_eps=inf"})
    CHECK_THROWS_WITH_AS(bert({s}), doctest::Contains("--set layer_norm_eps="), Error);
  CHECK(bert({"hidden_dropout=1", "attention_dropout=0", "layer_norm_eps=1e-5"}).layer_norm_eps == 1e-5);
  // The CLI's own path refuses them before any work.
  CHECK_THROWS_WITH_AS(tools::model_family("bert-tiny").build("bert-tiny", {"hidden_dropout=1.5"}, false),
                       doctest::Contains("hidden_dropout=1.5"), Error);
  // Booleans: true/false or 1/0; 2 is not read as true.
  CHECK(tools::resnet_config_from("resnet20", {"zero_init_residual=true"}).zero_init_residual);
  CHECK(!tools::resnet_config_from("resnet20", {"zero_init_residual=False"}).zero_init_residual);
  CHECK(tools::resnet_config_from("resnet20", {"recompute=1"}).recompute);
  CHECK_THROWS_WITH_AS(tools::resnet_config_from("resnet20", {"zero_init_residual=2"}),
                       doctest::Contains("--set zero_init_residual=2: expected a boolean"), Error);
  CHECK(bert({"recompute=true"}).recompute);
}

TEST_CASE("models by name: each --set size has an upper bound naming the field; spaces are trimmed alike") {
  auto bert = [](const std::vector<std::string>& sets) { return tools::bert_config_from("tiny", sets); };
  // Past them a shape's element count overflowed without naming the field, or kiln plan ran for minutes.
  CHECK_THROWS_WITH_AS(bert({"hidden_size=99999999998"}),
                       doctest::Contains("--set hidden_size=99999999998: must be at most 65536"), Error);
  CHECK_THROWS_WITH_AS(bert({"num_layers=100000000"}), doctest::Contains("--set num_layers=100000000: must be at most"),
                       Error);
  for (const char* s : {"vocab_size=999999999", "intermediate_size=99999999", "max_position=99999999",
                        "type_vocab_size=9999999", "num_labels=999999999", "num_heads=8192"})
    CHECK_THROWS_WITH_AS(bert({s}), doctest::Contains((std::string("--set ") + s + ": must be at most").c_str()),
                         Error);
  CHECK_THROWS_WITH_AS(tools::resnet_config_from("resnet20", {"num_classes=999999999"}),
                       doctest::Contains("--set num_classes=999999999: must be at most"), Error);
  CHECK_THROWS_WITH_AS(tools::resnet_config_from("resnet20", {"in_channels=9999999"}),
                       doctest::Contains("--set in_channels=9999999: must be at most"), Error);
  // Real models pass: BERT-large (and a bigger vocabulary, longer positions), ResNet-152 on ImageNet-21k.
  const models::BertConfig large = tools::bert_config_from("large", {"vocab_size=250002", "max_position=8192"});
  CHECK(large.num_layers == 24);
  CHECK(tools::resnet_config_from("resnet152", {"num_classes=21841"}).num_classes == 21841);
  // "num_layers= 2" was taken and "num_layers=2 " refused: both are 2 now, as is " num_layers =2".
  for (const char* s : {"num_layers= 2", "num_layers=2 ", " num_layers = 2 "}) CHECK(bert({s}).num_layers == 2);
  CHECK_THROWS_WITH_AS(bert({" =2"}), doctest::Contains("expected key=value"), Error);
}

TEST_CASE("models by name: model_config_fields writes a real number as the shortest text that reads back") {
  // A resume refusal names the two runs' fields: 0.1 as given, not %.17g's 0.10000000000000001.
  std::map<std::string, std::string> f;
  for (const auto& [k, v] : tools::model_config_fields("bert-tiny", {"hidden_dropout=0.1", "layer_norm_eps=1e-12"}))
    f[k] = v;
  CHECK(f.at("hidden_dropout") == "0.1");
  CHECK(f.at("layer_norm_eps") == "1e-12");
  CHECK(f.at("attention_dropout") == "0.1");  // the default
  // Still exact: a value that needs 17 digits keeps them.
  for (const auto& [k, v] : tools::model_config_fields("bert-tiny", {"hidden_dropout=0.30000000000000004"})) f[k] = v;
  CHECK(f.at("hidden_dropout") == "0.30000000000000004");
}

TEST_CASE("checkpoint names: tied decoder, two decoder biases and the bert. prefix") {
  models::BertConfig c = models::bert_config("tiny");
  c.vocab_size = 40;
  c.num_layers = 1;
  models::BertForMaskedLM mlm(c);
  const nn::StateDict mine = mlm.state_dict();
  const std::string emb = "bert.embeddings.word_embeddings.weight";

  // A decoder equal to the embeddings (the tied tensor saved twice) is dropped; a different one is
  // refused naming both, not dropped without a word.
  nn::StateDict sd = mine;
  sd["cls.predictions.decoder.weight"] = mine.at(emb).clone();
  CHECK(tools::normalise_checkpoint_names(sd, mine).count("cls.predictions.decoder.weight") == 0);
  // The same tensor holding a NaN (a diverged run's) is still the same tensor saved twice.
  {
    nn::StateDict nan_sd = mine;
    Tensor e = mine.at(emb).clone();
    e.data<float>()[0] = std::nanf("");
    nan_sd[emb] = e;
    nan_sd["cls.predictions.decoder.weight"] = e.clone();
    CHECK(tools::normalise_checkpoint_names(nan_sd, mine).count("cls.predictions.decoder.weight") == 0);
  }
  sd["cls.predictions.decoder.weight"] = mine.at(emb) + 1.0;
  const std::string untied = "w.st: 'cls.predictions.decoder.weight' differs from '" + emb +
                             "': this model ties its decoder to the word embeddings";
  CHECK_THROWS_WITH_AS(tools::normalise_checkpoint_names(sd, mine, "w.st"), doctest::Contains(untied.c_str()), Error);

  // cls.predictions.decoder.bias is the same parameter as cls.predictions.bias: equal, one is kept;
  // different, neither silently wins.
  sd = mine;
  sd["cls.predictions.decoder.bias"] = mine.at("cls.predictions.bias").clone();
  CHECK(allclose(tools::normalise_checkpoint_names(sd, mine).at("cls.predictions.bias"),
                 mine.at("cls.predictions.bias")));
  sd["cls.predictions.decoder.bias"] = mine.at("cls.predictions.bias") + 1.0;
  CHECK_THROWS_WITH_AS(tools::normalise_checkpoint_names(sd, mine),
                       doctest::Contains("'cls.predictions.bias' and 'cls.predictions.decoder.bias' both give"), Error);
  sd.erase("cls.predictions.bias");  // the decoder's name alone still maps
  CHECK(tools::normalise_checkpoint_names(sd, mine).count("cls.predictions.bias") == 1);

  // An encoder-only model takes a Hugging Face checkpoint whose encoder is under "bert." (and
  // ignores its heads, as from_pretrained does); the prefixed names of a headed model stay.
  models::BertModel enc(c);
  const nn::StateDict enc_sd = enc.state_dict();
  nn::StateDict hf;
  for (const auto& kv : enc_sd) hf["bert." + kv.first] = kv.second;
  hf["cls.predictions.bias"] = zeros({40});
  nn::StateDict got = tools::normalise_checkpoint_names(hf, enc_sd);
  tools::drop_unused_heads(enc, got, "hf.st", "bert-tiny", "test");
  CHECK(got.size() == enc_sd.size());
  for (const auto& kv : enc_sd) CHECK_MESSAGE(got.count(kv.first), kv.first);
  CHECK(tools::normalise_checkpoint_names(mine, mine).size() == mine.size());
  // A model without a masked-LM head (the encoder, a classifier) ignores a pretraining file's heads,
  // an untied decoder and two different decoder biases included: nothing there to tie or to fill.
  hf["cls.predictions.decoder.weight"] = zeros({40, c.hidden_size});
  hf["cls.predictions.decoder.bias"] = ones({40});
  got = tools::normalise_checkpoint_names(hf, enc_sd, "hf.st");
  tools::drop_unused_heads(enc, got, "hf.st", "bert-tiny", "test");
  CHECK(got.size() == enc_sd.size());

  // The same through `kiln forward`: the untied decoder is an error naming both.
  TempDir d;
  sd = mine;
  sd["cls.predictions.decoder.weight"] = mine.at(emb) * 2.0;
  io::save_safetensors(d / "untied.st", sd);
  io::save_safetensors(d / "x.st", {{"input_ids", randint(0, 40, {1, 4})}});
  const auto r = testing::run_kiln("forward --model bert-tiny-mlm --set vocab_size=40 --set num_layers=1 --weights " +
                                       d / "untied.st" + " --inputs " + d / "x.st" + " --out " + d / "y.st",
                                   d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(testing::contains(r.output, "untied.st: 'cls.predictions.decoder.weight' differs from '" + emb + "'"),
                r.output);  // the file is named
  // and an encoder-only forward reads a "bert."-prefixed checkpoint.
  io::save_safetensors(d / "hf.st", hf);
  const auto r2 = testing::run_kiln("forward --model bert-tiny --set vocab_size=40 --set num_layers=1 --weights " +
                                        d / "hf.st" + " --inputs " + d / "x.st" + " --out " + d / "y2.st",
                                    d.p.string());
  CHECK_MESSAGE(r2.code == 0, r2.output);
}

TEST_CASE("checkpoint names: a bare encoder's checkpoint (no bert. prefix) fills a headed model's encoder") {
  // Hugging Face's BertModel.save_pretrained (and Kiln's bert-SIZE) names the encoder without
  // "bert.": loaded into -cls or -mlm it matched nothing, and strict=False kept a random encoder.
  models::BertConfig c = models::bert_config("tiny");
  c.vocab_size = 40;
  c.num_layers = 1;
  c.num_labels = 3;
  models::BertModel enc(c);
  const nn::StateDict bare = enc.state_dict();
  REQUIRE(bare.count("embeddings.word_embeddings.weight"));
  models::BertForSequenceClassification cls(c);
  const nn::StateDict cls_sd = cls.state_dict();
  nn::StateDict got = tools::normalise_checkpoint_names(bare, cls_sd, "base.st");
  CHECK(got.size() == bare.size());
  for (const auto& kv : bare) {
    REQUIRE_MESSAGE(got.count("bert." + kv.first), kv.first);
    CHECK(got.at("bert." + kv.first).storage() == kv.second.storage());
  }
  // Everything but the new classifier is given; the classifier's tensors stay missing.
  for (const auto& kv : cls_sd)
    CHECK_MESSAGE(got.count(kv.first) == (kv.first.rfind("classifier.", 0) == 0 ? 0u : 1u), kv.first);
  // The masked-LM model takes the encoder too; the pooler it has none of is dropped as unused.
  models::BertForMaskedLM mlm(c);
  got = tools::normalise_checkpoint_names(bare, mlm.state_dict(), "base.st");
  tools::drop_unused_heads(mlm, got, "base.st", "bert-tiny-mlm", "test");
  for (const auto& kv : mlm.state_dict())
    CHECK_MESSAGE(got.count(kv.first) == (kv.first.rfind("cls.", 0) == 0 ? 0u : 1u), kv.first);

  // Through the CLI: kiln forward --allow-missing runs the classifier with the file's encoder (its
  // pooled output is the bare encoder's), not a random one.
  TempDir d;
  io::save_safetensors(d / "base.st", bare);
  const Tensor ids = randint(0, 40, {2, 5});
  io::save_safetensors(d / "x.st", {{"input_ids", ids}});
  const std::string sets = " --set vocab_size=40 --set num_layers=1 --set num_labels=3";
  REQUIRE(run("--model bert-tiny-cls" + sets + " --allow-missing --weights " + d / "base.st" + " --inputs " +
              d / "x.st" + " --out " + d / "y.st") == 0);
  enc.eval();
  NoGradGuard ng;
  const Tensor want = enc.forward(ids, Tensor(), Tensor()).pooled_output;
  CHECK(allclose(io::load_safetensors(d / "y.st").tensors.at("pooled_output"), want, 1e-5, 1e-6));
}

TEST_CASE("hf config: a Hugging Face config.json sizes the model; what Kiln's BERT does not compute is refused") {
  TempDir d;
  // transformers' BertConfig(vocab_size=40, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
  // intermediate_size=96, max_position_embeddings=32, num_labels=3).to_json_string(), abridged.
  const std::string cfg = R"({"architectures": ["BertForSequenceClassification"], "attention_probs_dropout_prob": 0.0,
    "classifier_dropout": null, "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "hidden_size": 64,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}, "initializer_range": 0.02, "intermediate_size": 96,
    "is_decoder": false, "layer_norm_eps": 1e-12, "max_position_embeddings": 32, "model_type": "bert",
    "num_attention_heads": 4, "num_hidden_layers": 1, "pad_token_id": 0, "position_embedding_type": "absolute",
    "problem_type": null, "type_vocab_size": 2, "vocab_size": 40})";
  std::ofstream(d / "config.json") << cfg;
  const std::vector<std::string> sets = tools::hf_bert_config_sets(d / "config.json");
  const models::BertConfig c = tools::bert_config_from("tiny", sets);
  CHECK(c.vocab_size == 40);
  CHECK(c.hidden_size == 64);
  CHECK(c.num_layers == 1);
  CHECK(c.num_heads == 4);
  CHECK(c.intermediate_size == 96);
  CHECK(c.max_position == 32);
  CHECK(c.type_vocab_size == 2);
  CHECK(c.layer_norm_eps == 1e-12);
  CHECK(c.hidden_dropout == 0.0);
  CHECK(c.attention_dropout == 0.0);
  CHECK(c.num_labels == 3);  // id2label's count
  // An absent key is transformers' default, not the Kiln size's (bert-tiny has 2 heads, 128 wide).
  std::ofstream(d / "sparse.json") << R"({"hidden_size": 64, "num_attention_heads": 4})";
  const models::BertConfig sparse = tools::bert_config_from("tiny", tools::hf_bert_config_sets(d / "sparse.json"));
  CHECK(sparse.num_layers == 12);
  CHECK(sparse.vocab_size == 30522);
  CHECK(sparse.hidden_dropout == 0.1);

  // Refused, naming the file, the key and its value.
  const std::pair<std::string, std::string> refused[] = {
      {R"("hidden_act": "gelu_new")", "hidden_act is \"gelu_new\": Kiln's BERT computes the exact (erf) GELU"},
      {R"("hidden_act": "relu")", "hidden_act is \"relu\""},
      {R"("position_embedding_type": "relative_key")", "position_embedding_type is \"relative_key\""},
      {R"("model_type": "roberta")", "model_type is \"roberta\""},
      {R"("is_decoder": true)", "is_decoder is true"},
      {R"("pad_token_id": 1)", "pad_token_id is 1"},
      {R"("classifier_dropout": 0.3)", "classifier_dropout is 0.3"},
      {R"("problem_type": "multi_label_classification")", "problem_type is \"multi_label_classification\""},
      {R"("num_attention_heads": "4")", "num_attention_heads is \"4\", not a whole number"},
  };
  for (const auto& [entry, says] : refused) {
    std::ofstream(d / "bad.json") << "{" << entry << ", \"hidden_size\": 64}";
    CHECK_THROWS_WITH_AS(tools::hf_bert_config_sets(d / "bad.json"),
                         doctest::Contains((d / "bad.json: " + says).c_str()), Error);
  }

  // Through kiln forward: 4 heads have the shapes of 2, so without the config the weights load and
  // give other numbers; with --hf-config they are the model's.
  models::BertConfig mc = c;
  models::BertModel m(mc);
  m.eval();
  NoGradGuard ng;
  // Sharper attention than the initialisation's near-uniform one, so how it is split into heads shows.
  for (auto& [n, p] : m.named_parameters())
    if (n.find("self.query.weight") != std::string::npos || n.find("self.key.weight") != std::string::npos)
      p.mul_(30.0);
  io::save_safetensors(d / "w.st", m.state_dict());
  const Tensor ids = randint(0, 40, {2, 6});
  io::save_safetensors(d / "x.st", {{"input_ids", ids}});
  const Tensor want = m.forward(ids, Tensor(), Tensor()).last_hidden_state;
  const std::string common = "--model bert-tiny --weights " + d / "w.st" + " --inputs " + d / "x.st";
  REQUIRE(run(common + " --hf-config " + d / "config.json" + " --out " + d / "y.st") == 0);
  CHECK(allclose(io::load_safetensors(d / "y.st").tensors.at("output"), want, 1e-5, 1e-6));
  const std::string by_hand =
      " --set vocab_size=40 --set hidden_size=64 --set num_layers=1 --set intermediate_size=96 "
      "--set max_position=32";
  REQUIRE(run(common + by_hand + " --out " + d / "y2.st") == 0);  // heads forgotten: loads, wrong numbers
  CHECK(!allclose(io::load_safetensors(d / "y2.st").tensors.at("output"), want, 1e-3, 1e-3));
  // and kiln ckpt import refuses a config Kiln cannot compute, naming the key.
  std::ofstream(d / "new.json") << R"({"hidden_size": 64, "hidden_act": "gelu_new"})";
  const auto r = testing::run_kiln(
      "ckpt import " + d / "w.st" + " --model bert-tiny --hf-config " + d / "new.json" + " --out " + d / "i.kiln",
      d.p.string());
  CHECK(r.code != 0);
  CHECK_MESSAGE(testing::contains(r.output, "new.json: hidden_act is \"gelu_new\""), r.output);
  const auto ok = testing::run_kiln(
      "ckpt import " + d / "w.st" + " --model bert-tiny --hf-config " + d / "config.json" + " --out " + d / "i.kiln",
      d.p.string());
  CHECK_MESSAGE(ok.code == 0, ok.output);
}

TEST_CASE("hf config: gelu_python is the exact GELU, and initializer_range starts a new head as transformers") {
  TempDir d;
  // transformers' "gelu_python" is the erf GELU of "gelu", written in Python: the same numbers.
  std::ofstream(d / "py.json") << R"({"hidden_size": 64, "num_attention_heads": 4, "hidden_act": "gelu_python"})";
  CHECK(tools::bert_config_from("tiny", tools::hf_bert_config_sets(d / "py.json")).hidden_size == 64);
  // initializer_range is the std of a new head's weights; absent, transformers' 0.02.
  std::ofstream(d / "init.json") << R"({"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1,
    "intermediate_size": 96, "vocab_size": 40, "max_position_embeddings": 32, "initializer_range": 0.5,
    "id2label": {"0": "a", "1": "b", "2": "c"}})";
  const std::vector<std::string> sets = tools::hf_bert_config_sets(d / "init.json");
  CHECK(tools::bert_config_from("tiny", sets).initializer_range == 0.5);
  CHECK(tools::bert_config_from("tiny", tools::hf_bert_config_sets(d / "py.json")).initializer_range == 0.02);
  CHECK_THROWS_WITH_AS(tools::bert_config_from("tiny", {"initializer_range=-1"}),
                       doctest::Contains("--set initializer_range=-1: must be a finite number >= 0"), Error);
  // kiln ckpt import --allow-missing --seed 3 --hf-config: the new classifier is the one a model with
  // that std gives under that seed (transformers' BertForSequenceClassification.from_pretrained draws
  // it from N(0, initializer_range) too).
  models::BertConfig c = tools::bert_config_from("tiny", sets);
  models::BertModel enc(c);
  io::save_safetensors(d / "enc.st", enc.state_dict());
  const auto r = testing::run_kiln("ckpt import " + d / "enc.st" + " --model bert-tiny-cls --hf-config " +
                                       d / "init.json" + " --allow-missing --seed 3 --out " + d / "start.kiln",
                                   d.p.string());
  REQUIRE_MESSAGE(r.code == 0, r.output);
  manual_seed(3);
  const auto want = tools::model_family("bert-tiny-cls").build("bert-tiny-cls", sets, false).module->state_dict();
  const Tensor got = io::CheckpointReader(d / "start.kiln").read("model/classifier.weight");
  CHECK(allclose(got, want.at("classifier.weight"), 0.0, 0.0));
  // Drawn with std 0.5, not 0.02: the file's std says so without the model above.
  CHECK(stddev(got).item<float>() > 0.3f);
}

TEST_CASE("checkpoint names: a batch norm saved without num_batches_tracked starts it at 0, as torch") {
  auto m = models::make_resnet(models::ResNetConfig{"resnet20", 4, 1});
  const nn::StateDict mine = m->state_dict();
  nn::StateDict old;  // torchvision's first ResNet weights have no num_batches_tracked
  for (const auto& [n, t] : mine)
    if (n.find("num_batches_tracked") == std::string::npos) old[n] = t;
  REQUIRE(old.size() < mine.size());
  const nn::StateDict got = tools::normalise_checkpoint_names(old, mine);
  CHECK(got.size() == mine.size());
  CHECK(got.at("bn1.num_batches_tracked").item<int64_t>() == 0);
  CHECK(got.at("bn1.num_batches_tracked").dtype() == mine.at("bn1.num_batches_tracked").dtype());
  m->load_state_dict(got, /*strict=*/true);
  // A layer missing altogether is not filled in: its absence is still reported.
  old.erase("bn1.running_mean");
  CHECK(tools::normalise_checkpoint_names(old, mine).count("bn1.num_batches_tracked") == 0);
}

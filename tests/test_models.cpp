// ResNet and BERT: published parameter counts, checkpoint names, forward shapes, and whole-model
// gradients against finite differences on a few parameters.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "kiln.h"
#include "models/bert.h"
#include "models/resnet.h"

using namespace kiln;
using namespace kiln::models;

namespace {

std::set<std::string> keys(const nn::Module& m) {
  std::set<std::string> k;
  for (auto& [n, t] : m.state_dict()) k.insert(n);
  return k;
}

// Central differences of loss() w.r.t. a few entries of each parameter, against autograd, in f64.
void check_model_grads(nn::Module& m, const std::function<Tensor()>& loss, int per_param = 2, double tol = 1e-5) {
  m.to(DType::f64);
  m.zero_grad();
  loss().backward();
  Generator gen(17);
  int checked = 0;
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    const Tensor g = t.grad();
    REQUIRE_MESSAGE(g.defined(), name, " got no gradient");
    const std::vector<double> gv = g.to_vector();
    for (int k = 0; k < per_param; ++k) {
      const int64_t e = randint(0, t.numel(), {1}, TensorOptions(DType::i64), &gen).item<int64_t>();
      double* d = t.data<double>() + e;
      const double orig = *d, h = 1e-6;
      double fp, fm;
      {
        NoGradGuard ng;
        *d = orig + h;
        t.bump_version();
        fp = loss().item<double>();
        *d = orig - h;
        t.bump_version();
        fm = loss().item<double>();
        *d = orig;
        t.bump_version();
      }
      const double num = (fp - fm) / (2 * h);
      INFO(name << "[" << e << "]");
      CHECK(gv[size_t(e)] == doctest::Approx(num).epsilon(tol).scale(1e-3));
      ++checked;
    }
  }
  CHECK(checked > 0);
}

}  // namespace

TEST_CASE("models: published parameter counts") {
  CHECK(make_resnet({"resnet50", 1000, 3})->num_parameters() == 25557032);
  CHECK(make_resnet({"resnet18", 1000, 3})->num_parameters() == 11689512);
  BertConfig base = bert_config("base");
  CHECK(BertModel(base).num_parameters() == 109482240);
  // ResNet-20 with projection shortcuts, counted from its definition: 3x3 convs, BN (2 per channel),
  // two 1x1 projections with BN, and the classifier.
  auto r20 = make_resnet({"resnet20", 10, 3});
  int64_t want = 3 * 16 * 9 + 2 * 16;                        // stem
  want += 6 * (16 * 16 * 9 + 2 * 16);                        // stage 1: 3 blocks x 2 convs
  want += (16 * 32 * 9 + 2 * 32) + 5 * (32 * 32 * 9 + 2 * 32) + (16 * 32 + 2 * 32);  // stage 2 + projection
  want += (32 * 64 * 9 + 2 * 64) + 5 * (64 * 64 * 9 + 2 * 64) + (32 * 64 + 2 * 64);  // stage 3 + projection
  want += 64 * 10 + 10;                                      // fc
  CHECK(r20->num_parameters() == want);
}

TEST_CASE("models: torchvision and BERT checkpoint names") {
  const auto rk = keys(*make_resnet({"resnet50", 1000, 3}));
  for (const char* n : {"conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
                        "layer1.0.downsample.0.weight", "layer2.0.downsample.1.running_var", "layer4.2.bn3.bias",
                        "fc.weight", "fc.bias"})
    CHECK_MESSAGE(rk.count(n), n);
  CHECK(keys(*make_resnet({"resnet18", 10, 3})).count("layer1.0.downsample.0.weight") == 0);  // identity shortcut

  BertConfig tiny = bert_config("tiny");
  tiny.vocab_size = 100;
  const auto mk = keys(BertForMaskedLM(tiny));
  for (const char* n :
       {"bert.embeddings.word_embeddings.weight", "bert.embeddings.LayerNorm.weight",
        "bert.encoder.layer.0.attention.self.query.weight", "bert.encoder.layer.1.attention.output.dense.weight",
        "bert.encoder.layer.0.attention.output.LayerNorm.bias", "bert.encoder.layer.0.intermediate.dense.weight",
        "bert.encoder.layer.0.output.LayerNorm.weight", "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.bias"})
    CHECK_MESSAGE(mk.count(n), n);
  // Masked LM has no pooler (its forward never reads the pooled [CLS]); classification has one.
  CHECK(mk.count("bert.pooler.dense.weight") == 0);
  CHECK(keys(BertForSequenceClassification(tiny)).count("classifier.weight") == 1);
  CHECK(keys(BertForSequenceClassification(tiny)).count("bert.pooler.dense.weight") == 1);
  CHECK_THROWS_WITH_AS(make_resnet({"resnet21", 10, 3}), doctest::Contains("resnet20"), kiln::Error);
  CHECK_THROWS_AS(bert_config("huge"), kiln::Error);
}

TEST_CASE("models: forward shapes, train/eval, zero-init residual") {
  auto r = make_resnet({"resnet20", 10, 1});
  CHECK((*r)(randn({2, 1, 28, 28})).shape() == Shape{2, 10});
  CHECK_THROWS_WITH_AS((*r)(randn({2, 3, 28, 28})), doctest::Contains("[2,3,28,28]"), kiln::Error);
  auto r18 = make_resnet({"resnet18", 5, 3, true});
  r18->eval();
  CHECK((*r18)(randn({1, 3, 64, 64})).shape() == Shape{1, 5});
  auto& blk = dynamic_cast<BasicBlock&>((*r18->stages[0])[0]);
  CHECK(amax(abs(blk.bn2->weight)).item<double>() == 0.0);

  BertConfig c = bert_config("tiny");
  c.vocab_size = 50;
  c.num_labels = 3;
  BertForMaskedLM mlm(c);
  const Tensor ids = randint(1, 50, {2, 7});
  const Tensor mask = from_vector({1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1}, {2, 7}, TensorOptions(DType::i64));
  CHECK(mlm.forward(ids, mask).shape() == Shape{2, 7, 50});
  BertForSequenceClassification cls(c);
  CHECK(cls.forward(ids, mask).shape() == Shape{2, 3});
  // Padding is invisible: with dropout off, changing padded tokens leaves kept positions unchanged.
  mlm.eval();
  Tensor ids2 = ids.clone();
  ids2.select(0, 0).narrow(0, 5, 2).fill_(3);
  CHECK(allclose(mlm.forward(ids, mask).select(0, 0).narrow(0, 0, 5), mlm.forward(ids2, mask).select(0, 0).narrow(0, 0, 5),
                 1e-4, 1e-5));
  CHECK_THROWS_AS(mlm.forward(randint(0, 50, {1, 600})), kiln::Error);  // beyond max_position
}

TEST_CASE("models: whole-model gradients against finite differences") {
  // A small-image ResNet in training mode (batch statistics) on 8x8 inputs.
  auto r = make_resnet({"resnet20", 3, 2});
  Generator g(5);
  const Tensor x = randn({3, 2, 8, 8}, TensorOptions(DType::f64), &g);
  const Tensor y = from_vector({0, 2, 1}, {3}, TensorOptions(DType::i64));
  check_model_grads(*r, [&] { return cross_entropy((*r)(x), y); }, 1);

  BertConfig c = bert_config("tiny");
  c.vocab_size = 30;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_heads = 2;
  c.max_position = 8;
  c.hidden_dropout = c.attention_dropout = 0.0;
  BertForMaskedLM mlm(c);
  const Tensor ids = randint(1, 30, {2, 6}, TensorOptions(DType::i64), &g);
  const Tensor mask = from_vector({1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1}, {2, 6}, TensorOptions(DType::i64));
  const Tensor labels = from_vector({3, -100, 7, -100, -100, -100, 1, 2, -100, 9, -100, 4}, {12}, TensorOptions(DType::i64));
  check_model_grads(mlm, [&] { return cross_entropy(mlm.forward(ids, mask).reshape({12, 30}), labels); }, 1);
}

TEST_CASE("models: state dict round trip between two instances") {
  auto a = make_resnet({"resnet20", 10, 1}), b = make_resnet({"resnet20", 10, 1});
  a->eval();
  b->eval();
  const Tensor x = randn({2, 1, 16, 16});
  CHECK(!allclose((*a)(x), (*b)(x)));
  b->load_state_dict(a->state_dict());
  CHECK(allclose((*a)(x), (*b)(x), 0, 0));
}

// A whole ResNet fed channels_last batches: every activation stays channels_last, and on the CPU
// (NCHW kernels on copies) the loss and every parameter gradient equal the NCHW run's bit for bit.
TEST_CASE("models: ResNet-20 on channels_last input matches NCHW exactly") {
  std::vector<std::vector<double>> runs;
  for (int cl = 0; cl < 2; ++cl) {
    Generator g(5);
    manual_seed(7);
    auto r = make_resnet({"resnet20", 10, 3});
    r->train();
    Tensor x = randn({4, 3, 12, 12}, TensorOptions(DType::f32), &g);
    if (cl) x = x.contiguous(MemoryFormat::channels_last);
    const Tensor y = randint(0, 10, {4}, DType::i64, &g);
    const Tensor loss = cross_entropy((*r)(x), y);
    loss.backward();
    std::vector<double> all{loss.item<double>()};
    for (const auto& [name, p] : r->named_parameters()) {
      const auto v = p.grad().to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    runs.push_back(all);
  }
  CHECK(runs[0] == runs[1]);
}

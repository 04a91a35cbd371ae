// Tasks: the model, the data and the scoring of one kind of training run.
//   classify (ResNet on an MNIST-format data set): cross-entropy on logits, accuracy.
#include <algorithm>
#include <numeric>

#include "engine/autograd.h"
#include "io/data.h"
#include "tools/train.h"
#include "tools/zoo.h"

namespace kiln::tools {
namespace {

// The first `limit` samples of a data set (all when limit is 0).
class Prefix final : public io::Dataset {
 public:
  Prefix(std::shared_ptr<const io::Dataset> ds, int64_t limit) : ds_(std::move(ds)), n_(std::min(limit, ds_->size())) {}
  int64_t size() const override { return n_; }
  io::Batch get_batch(const std::vector<int64_t>& idx, uint64_t seed) const override { return ds_->get_batch(idx, seed); }

 private:
  std::shared_ptr<const io::Dataset> ds_;
  int64_t n_;
};

std::shared_ptr<const io::Dataset> limit(std::shared_ptr<const io::Dataset> ds, int64_t n) {
  if (n <= 0 || n >= ds->size()) return ds;
  return std::make_shared<Prefix>(std::move(ds), n);
}

Task image_classification(const TrainConfig& c) {
  const std::string dir = !c.data_dir.empty() ? c.data_dir : c.data == "fashion-mnist" ? io::kFashionMnistDir : "";
  // Fashion-MNIST's pixel mean and standard deviation over the training set (MNIST: 0.1307, 0.3081).
  io::ImageTransform tr;
  tr.mean = {c.data == "fashion-mnist" ? 0.2860f : 0.1307f};
  tr.std = {c.data == "fashion-mnist" ? 0.3530f : 0.3081f};
  if (c.augment) {
    tr.pad_crop = 2;
    tr.hflip = c.data == "fashion-mnist";  // clothes mirror; digits do not
  }
  io::ImageClassData d;
  try {
    d = io::load_mnist_dir(dir, tr, c.data);
  } catch (const Error& e) {
    if (c.data == "fashion-mnist" && c.data_dir.empty())
      KILN_FAIL(e.message(), "\n  Fashion-MNIST comes from Debian's package: apt-get install dataset-fashion-mnist "
                "(or pass --data-dir)");
    throw;
  }
  std::vector<std::string> sets = {"in_channels=" + std::to_string(d.channels),
                                   "num_classes=" + std::to_string(d.num_classes)};
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());  // the user's --set wins
  const models::ResNetConfig rc = resnet_config_from(c.model, sets);
  KILN_CHECK(rc.in_channels == d.channels, "--set in_channels=", rc.in_channels, ": the ", c.data, " images have ",
             d.channels, " channel(s)");
  KILN_CHECK(rc.num_classes >= d.num_classes, "--set num_classes=", rc.num_classes, ": the ", c.data, " labels need ",
             d.num_classes);
  auto model = models::make_resnet(rc);
  Task t;
  t.name = "classify";
  t.metric = "accuracy";
  t.model = model;
  t.train_data = limit(d.train, c.limit_train);
  t.eval_data = limit(d.test, c.limit_eval);
  const double smoothing = c.label_smoothing;
  t.step = [model, smoothing](const io::Batch& b) {
    const Tensor& x = b.at("input");
    const Tensor& y = b.at("target");
    Tensor logits = (*model)(x);
    StepResult r;
    r.loss = cross_entropy(logits, y, -100, model->is_training() ? smoothing : 0.0);
    const Tensor pred = argmax(logits.detach(), 1);
    const int64_t* p = pred.data<int64_t>();
    const int64_t* q = y.data<int64_t>();
    for (int64_t i = 0; i < y.numel(); ++i) r.correct += p[i] == q[i];
    r.count = y.numel();
    return r;
  };
  t.data_info = {{"name", c.data},
                 {"dir", dir},
                 {"train_samples", t.train_data->size()},
                 {"eval_samples", t.eval_data->size()},
                 {"shape", {d.channels, d.height, d.width}},
                 {"classes", d.class_names}};
  return t;
}

}  // namespace

Task make_task(const TrainConfig& c) {
  if (models::is_resnet_name(c.model)) return image_classification(c);
  KILN_FAIL("--model ", c.model, ": no training task for it in this build");
}

EvalResult evaluate(Task& task, const TrainConfig& c) {
  const auto t0 = std::chrono::steady_clock::now();
  NoGradGuard no_grad;
  const bool was_training = task.model->is_training();
  task.model->eval();
  io::LoaderOptions lo;
  lo.batch_size = c.batch;
  lo.shuffle = false;
  lo.workers = c.workers;
  io::DataLoader loader(task.eval_data, lo);
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0;
  while (auto b = loader.next()) {
    const StepResult s = task.step(*b);
    loss_sum += s.loss.item<double>() * double(s.count);
    correct += s.correct;
    r.count += s.count;
  }
  task.model->train(was_training);
  r.loss = r.count ? loss_sum / double(r.count) : 0.0;
  r.accuracy = r.count ? double(correct) / double(r.count) : 0.0;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kiln::tools

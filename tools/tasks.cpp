// Tasks: the model, the data and the scoring of one kind of training run.
//   classify (ResNet on an MNIST-format data set): cross-entropy on logits, accuracy.
//   mlm (BERT on a text corpus): cross-entropy at the masked positions, their accuracy.
//   classify (BERT on label<TAB>text files): cross-entropy on the pooled output's logits, accuracy.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include <chrono>
#include <filesystem>
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/random.h"
#include "io/checkpoint.h"
#include "io/data.h"
#include "io/images.h"
#include "io/json_text.h"
#include "io/text.h"
#include "models/bert.h"
#include "tools/train.h"
#include "tools/zoo.h"

namespace kiln::tools {
namespace {

// `limit` samples of a data set (all when limit is 0): the first ones, or (spread) ones drawn over the
// whole set by a fixed-seed shuffle, independent of --seed so a train and an eval limit pick alike; for
// data sets in class order (image folders), where the first ones would be one class.
class Prefix final : public io::Dataset {
 public:
  Prefix(std::shared_ptr<const io::Dataset> ds, int64_t limit, bool spread)
      : ds_(std::move(ds)), n_(std::min(limit, ds_->size())) {
    if (!spread) return;
    std::vector<int64_t> order(size_t(ds_->size()));
    std::iota(order.begin(), order.end(), int64_t(0));
    PhiloxStream rng(0x5eed11317ULL, 0);
    for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.below(uint64_t(i + 1))]);
    order.resize(size_t(n_));
    std::sort(order.begin(), order.end());
    idx_ = std::move(order);
  }
  int64_t size() const override { return n_; }
  io::Batch get_batch(const std::vector<int64_t>& idx, uint64_t seed) const override {
    if (idx_.empty()) return ds_->get_batch(idx, seed);
    std::vector<int64_t> mapped;
    for (int64_t i : idx) mapped.push_back(idx_.at(size_t(i)));
    return ds_->get_batch(mapped, seed);
  }
  bool random() const override { return ds_->random(); }

 private:
  std::shared_ptr<const io::Dataset> ds_;
  int64_t n_;
  std::vector<int64_t> idx_;
};

std::shared_ptr<const io::Dataset> limit(std::shared_ptr<const io::Dataset> ds, int64_t n, bool spread = false) {
  if (n <= 0 || n >= ds->size()) return ds;
  return std::make_shared<Prefix>(std::move(ds), n, spread);
}

// On the logits' device (i64 0-dim): a training step does not wait to count.
Tensor count_correct(const Tensor& logits, const Tensor& target) {
  return sum(eq(argmax(logits.detach(), -1), target));
}

// Loss (label smoothing only while training) and the count of correct predictions of one batch.
StepResult score(const Tensor& logits, const Tensor& target, double smoothing, bool training) {
  StepResult r;
  r.loss = cross_entropy(logits, target, -100, training ? smoothing : 0.0);
  r.correct = count_correct(logits, target);
  r.count = target.numel();
  return r;
}

Task resnet_task(const TrainConfig& c, std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
                 int64_t channels, int64_t classes, nlohmann::json info);

// One data file's entry in data_info.contents: "label: N bytes, crc32c X". What a resume compares
// instead of the file's path (io/run_checkpoint.cpp), so the same bytes under another path resume.
std::string file_content(const std::string& path, const std::string& label) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), label, " ", path, ": cannot open");
  std::vector<char> buf(size_t(1) << 20);
  uint32_t crc = 0;
  uint64_t bytes = 0;
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    const size_t got = size_t(in.gcount());
    crc = io::crc32c(buf.data(), got, crc);
    bytes += got;
  }
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return label + ": " + std::to_string(bytes) + " bytes, crc32c " + hex;
}

// An image folder split's entry in data_info.contents: its files' paths below `dir`, sorted, and
// sizes, hashed (FNV-1a 64). Reading every image's bytes would cost a pass over the data set; the
// names and sizes tell another folder (or an added, removed or re-encoded image) at a stat each.
// A folder with files in a class folder's sub-folders is hashed in sample order instead, under its
// own wording: the sample order of such folders changed (a class folder's own files first, commit
// dbb9e6e), and a checkpoint of the old order would resume, and --limit-train pick, on another
// index -> file mapping. Folders without sub-folders kept their order and their fingerprint.
std::string folder_content(const io::ImageFolderDataset& ds, const std::filesystem::path& dir,
                           const std::string& label) {
  std::vector<std::pair<std::string, uint64_t>> files;
  uint64_t total = 0;
  bool nested = false;  // a file below class/sub/
  for (int64_t i = 0; i < ds.size(); ++i) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(ds.file(i), ec);
    KILN_CHECK(!ec, label, " ", ds.file(i), ": cannot read its size (", ec.message(), ")");
    const std::filesystem::path rel = std::filesystem::path(ds.file(i)).lexically_relative(dir);
    nested = nested || std::distance(rel.begin(), rel.end()) > 2;
    files.emplace_back(rel.generic_string(), size);
    total += size;
  }
  if (!nested) std::sort(files.begin(), files.end());
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](const std::string& text) {
    for (const char ch : text) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  };
  for (const auto& f : files) mix(f.first + "\t" + std::to_string(f.second) + "\n");
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return label + ": " + std::to_string(files.size()) + " files, " + std::to_string(total) + " bytes, names and sizes " +
         (nested ? "in sample order " : "") + hex;
}

Task image_folder(const TrainConfig& c) {
  namespace fs = std::filesystem;
  const fs::path root(c.data_dir);
  const fs::path val = fs::is_directory(root / "val") ? root / "val" : root / "test";
  // `kiln eval` of weights that carry their class names: those fix the ids, train/ is not read.
  const bool stored_classes = !c.label_names.empty();
  KILN_CHECK((stored_classes || fs::is_directory(root / "train")) && fs::is_directory(val), "--data-dir ", c.data_dir,
             ": an image-folder data set holds train/ and val/ (or test/), each with one sub-directory per class");
  // The --set parser's reading (spaces trimmed, the last one wins), not a prefix match of its own.
  const int64_t channels = resnet_config_from(c.model, c.sets).in_channels;
  KILN_CHECK(channels == 1 || channels == 3, "--set in_channels=", channels, ": images load as 1 (grey) or 3 (RGB) channels");
  io::ImageFolderOptions o;
  o.size = c.image_size;
  o.resize = c.image_size * 8 / 7;  // 224 -> 256, the usual evaluation resize
  o.channels = channels;
  // --mean / --std, one value or one per channel (ImageNet's when not given), as data_info keeps them:
  // a resume with others is refused, and the weights carry them for kiln eval.
  const auto per_channel = [&](const char* flag, const std::string& text, std::vector<double> rgb, double grey) {
    if (text.empty()) return channels == 1 ? std::vector<double>{grey} : rgb;
    std::vector<double> v = normalisation_values(flag, text);
    KILN_CHECK(v.size() == 1 || int64_t(v.size()) == channels, flag, " '", text, "': ", v.size(),
               " values, but the images load as 1 channel (grey, --set in_channels=1): give one");
    v.resize(size_t(channels), v[0]);  // one value: every channel's, as torchvision's Normalize broadcasts it
    return v;
  };
  const std::vector<double> mean = per_channel("--mean", c.norm_mean, {0.485, 0.456, 0.406}, 0.449),
                            std_dev = per_channel("--std", c.norm_std, {0.229, 0.224, 0.225}, 0.226);
  o.mean.assign(mean.begin(), mean.end());
  o.std.assign(std_dev.begin(), std_dev.end());
  o.skip_bad = c.skip_bad_samples;
  o.train = c.augment;
  std::shared_ptr<io::ImageFolderDataset> train, test;
  if (!stored_classes) train = std::make_shared<io::ImageFolderDataset>((root / "train").string(), o);
  o.train = false;
  // The weights' class names are as written in their metadata (JSON): U+FFFD for each byte of a folder
  // name that is not UTF-8. Each such name is the val/ folder that reads as it when written so (one
  // alone: of two that do, neither is guessed at, and the folder check names the one left out).
  std::vector<std::string> classes = stored_classes ? c.label_names : train->classes();
  if (stored_classes) {
    std::map<std::string, std::vector<std::string>> folders;  // as written -> the folders written so
    std::set<std::string> exact;                              // a folder of the name itself is that class
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(val, ec))
      if (e.is_directory(ec)) {
        const std::string name = e.path().filename().string();
        exact.insert(name);
        if (io::as_json_text(name) != name) folders[io::as_json_text(name)].push_back(name);
      }
    for (std::string& name : classes)
      if (const auto it = folders.find(name); !exact.count(name) && it != folders.end() && it->second.size() == 1)
        name = it->second[0];
  }
  test = std::make_shared<io::ImageFolderDataset>(val.string(), o, classes);
  if (!train) train = test;
  for (const auto& ds : train == test ? std::vector{test} : std::vector{train, test})
    if (const std::string note = ds->other_files_note(); !note.empty())
      std::fprintf(stderr, "kiln: note: %s\n", note.c_str());
  nlohmann::json info = {{"name", "folder"},
                         {"dir", c.data_dir},
                         {"shape", {channels, c.image_size, c.image_size}},
                         {"classes", test->classes()},
                         {"image_size", c.image_size},
                         {"mean", mean},
                         {"std", std_dev}};
  // What the folders hold, so a resume from another --data-dir with the same classes and counts is told
  // (a stat per image: kiln eval, which resumes nothing, skips it).
  if (!c.evaluating) {
    info["contents"] = {folder_content(*test, val, val.filename().string() + "/")};
    if (train != test)
      info["contents"].insert(info["contents"].begin(), folder_content(*train, root / "train", "train/"));
  }
  // The folders are in class order: a --limit takes samples spread over them, not the first class.
  Task t = resnet_task(c, limit(train, c.limit_train, true), limit(test, c.limit_eval, true), channels,
                       int64_t(test->classes().size()), info);
  if (train == test)
    t.bad_samples = [test] { return test->bad_samples(); };
  else
    t.bad_samples = [train, test] { return train->bad_samples() + test->bad_samples(); };
  return t;
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
    // Only the --limit-train / --limit-eval samples stay in memory (the first ones, as limit() takes).
    d = io::load_mnist_dir(dir, tr, c.data, c.evaluating, c.limit_train, c.limit_eval);
  } catch (const Interrupted&) {
    throw;  // Ctrl-C while reading (kiln.train's KeyboardInterrupt), not a missing package
  } catch (const Error& e) {
    if (c.data == "fashion-mnist" && c.data_dir.empty() && !std::filesystem::exists(dir))
      KILN_FAIL(e.message(), "\n  Fashion-MNIST comes from Debian's package: apt-get install dataset-fashion-mnist "
                "(or pass --data-dir)");
    throw;
  }
  // What the idx files hold (decoded, named by stem), so a resume from another --data-dir is told by its bytes.
  return resnet_task(c, d.train, d.test, d.channels, d.num_classes,
                     {{"name", c.data},
                      {"dir", dir},
                      {"shape", {d.channels, d.height, d.width}},
                      {"classes", d.class_names},
                      {"contents", d.contents}});
}

// The parts every task sets the same way: its kind, metric, model and the two data sets cut to
// --limit-train / --limit-eval.
Task task_of(const TrainConfig& c, const char* name, const char* metric, std::shared_ptr<nn::Module> model,
             std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> eval) {
  Task t;
  t.name = name;
  t.metric = metric;
  t.model = std::move(model);
  t.train_data = limit(std::move(train), c.limit_train);
  t.eval_data = limit(std::move(eval), c.limit_eval);
  return t;
}

Task resnet_task(const TrainConfig& c, std::shared_ptr<const io::Dataset> train, std::shared_ptr<const io::Dataset> test,
                 int64_t channels, int64_t classes, nlohmann::json info) {
  std::vector<std::string> sets = {"in_channels=" + std::to_string(channels), "num_classes=" + std::to_string(classes)};
  if (c.recompute == "blocks") sets.push_back("recompute=1");
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());  // the user's --set wins
  const models::ResNetConfig rc = resnet_config_from(c.model, sets);
  KILN_CHECK(rc.in_channels == channels, "--set in_channels=", rc.in_channels, ": the ", c.data, " images have ",
             channels, " channel(s)");
  KILN_CHECK(rc.num_classes >= classes, "--set num_classes=", rc.num_classes, ": the ", c.data, " labels need ", classes);
  auto model = models::make_resnet(rc);
  Task t = task_of(c, "classify", "accuracy", model, train, test);
  t.model_sets = sets;
  const double smoothing = c.label_smoothing;
  const Device dev = c.resolved_device();
  const MemoryFormat fmt = c.channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
  t.step = [model, smoothing, dev, fmt](const io::Batch& b) {
    const Tensor x = b.at("input").to(dev).contiguous(fmt);
    return score((*model)(x), b.at("target").to(dev), smoothing, model->is_training());
  };
  info["train_samples"] = t.train_data->size();
  info["eval_samples"] = t.eval_data->size();
  t.data_info = info;
  return t;
}

// A subset of another data set's samples, by index.
class Subset final : public io::Dataset {
 public:
  Subset(std::shared_ptr<const io::Dataset> ds, std::vector<int64_t> idx) : ds_(std::move(ds)), idx_(std::move(idx)) {}
  int64_t size() const override { return int64_t(idx_.size()); }
  io::Batch get_batch(const std::vector<int64_t>& idx, uint64_t seed) const override {
    std::vector<int64_t> mapped;
    for (int64_t i : idx) mapped.push_back(idx_.at(size_t(i)));
    return ds_->get_batch(mapped, seed);
  }
  bool random() const override { return ds_->random(); }

 private:
  std::shared_ptr<const io::Dataset> ds_;
  std::vector<int64_t> idx_;
};


// The size's config sized to the vocabulary (and `extra`), then the user's --set; checked against
// the vocabulary and the sequence length.
std::vector<std::string> bert_sets_for(const TrainConfig& c, const io::WordPieceTokenizer& tok,
                                       const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"vocab_size=" + std::to_string(tok.vocab().size())};
  sets.insert(sets.end(), extra.begin(), extra.end());
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  return sets;
}

models::BertConfig bert_config_for(const TrainConfig& c, const BertName& bn, const io::WordPieceTokenizer& tok,
                                   std::vector<std::string> extra) {
  std::vector<std::string> sets = bert_sets_for(c, tok, extra);
  if (c.recompute == "blocks") sets.push_back("recompute=1");
  const models::BertConfig bc = bert_config_from(bn.size, sets);
  KILN_CHECK(bc.vocab_size == tok.vocab().size(), "--set vocab_size=", bc.vocab_size, ": ", c.vocab, " holds ",
             tok.vocab().size(), " tokens");
  KILN_CHECK(c.seq_len <= bc.max_position, "--seq-len ", c.seq_len, " exceeds the model's ", bc.max_position,
             " positions (--set max_position=N)");
  return bc;
}

// What a resume compares instead of the data files' paths (io/run_checkpoint.cpp): each file's size
// and CRC-32C, named by its flag and place in the list, so the same bytes under another path (./txt,
// an absolute path, a copy) resume and a changed file is named. The files are read whole anyway.
std::vector<std::string> file_contents(const std::vector<std::string>& files, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i < files.size(); ++i) out.push_back(file_content(files[i], flag + "[" + std::to_string(i) + "]"));
  return out;
}

// A vocabulary's fingerprint (FNV-1a 64 of its tokens, one a line, in hex): the weights carry it, so
// `kiln eval` can tell a vocab.txt other than the one they were trained with, even of the same size.
std::string vocab_fingerprint(const io::Vocab& v) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](unsigned char b) { h = (h ^ b) * 1099511628211ull; };
  for (int64_t i = 0; i < v.size(); ++i) {
    for (const char ch : v.token(i)) mix(static_cast<unsigned char>(ch));
    mix('\n');
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// io::MlmDataset's label where no token was masked.
constexpr int64_t kUnmasked = -100;

Task bert_mlm(const TrainConfig& c, const BertName& bn) {
  io::BasicTokenizerOptions bo{c.lower_case, c.lower_case};
  auto tok = std::make_shared<io::WordPieceTokenizer>(io::Vocab::load(c.vocab), bo);
  io::MlmOptions mo{c.seq_len, c.mask_prob};
  // kiln eval with --eval-text scores all of it and reads no training corpus (--text, if given too, is not read).
  const bool eval_only = c.evaluating && !c.eval_text.empty();
  const std::vector<std::string> files = eval_only ? std::vector<std::string>() : expand_text_paths(c.text, "--text");
  std::shared_ptr<io::MlmDataset> corpus;
  std::shared_ptr<const io::Dataset> train, eval;
  std::string eval_split;  // which sequences are scored, as kiln eval says it
  if (eval_only) {
    corpus = std::make_shared<io::MlmDataset>(tok, expand_text_paths(c.eval_text, "--eval-text"), mo);
    train = eval = corpus;  // not trained on: kiln eval only evaluates
    eval_split = "all of --eval-text";
  } else if (!c.eval_text.empty()) {
    corpus = std::make_shared<io::MlmDataset>(tok, files, mo);
    train = corpus;
    eval = std::make_shared<io::MlmDataset>(tok, expand_text_paths(c.eval_text, "--eval-text"), mo);
    eval_split = "all of --eval-text";
  } else {
    // Every 50th sequence is held out: the held-out text comes from all over the corpus.
    corpus = std::make_shared<io::MlmDataset>(tok, files, mo);
    std::vector<int64_t> tr, ev;
    for (int64_t i = 0; i < corpus->size(); ++i) (i % 50 == 49 ? ev : tr).push_back(i);
    KILN_CHECK(!ev.empty(), "--text: ", corpus->size(), " sequences are too few to hold 2% out for evaluation (give --eval-text)");
    train = std::make_shared<Subset>(corpus, tr);
    eval = std::make_shared<Subset>(corpus, ev);
    eval_split = "the held-out split of --text: every 50th sequence";
  }
  auto model = std::make_shared<models::BertForMaskedLM>(bert_config_for(c, bn, *tok, {}));
  Task t = task_of(c, "mlm", "mlm_accuracy", model, train, eval);
  t.model_sets = bert_sets_for(c, *tok, {});
  const Device dev = c.resolved_device();
  t.step = [model, dev](const io::Batch& b) {
    const Tensor& labels = b.at("labels");  // read on the host: batches are made on the CPU
    // Score the masked positions only: gather them before the vocabulary projection.
    std::vector<int64_t> pos, tgt;
    const int64_t* l = labels.data<int64_t>();
    for (int64_t i = 0; i < labels.numel(); ++i)
      if (l[i] != kUnmasked) {
        pos.push_back(i);
        tgt.push_back(l[i]);
      }
    const Tensor positions = from_blob_copy(pos.data(), {int64_t(pos.size())}).to(dev);
    const Tensor target = from_blob_copy(tgt.data(), {int64_t(tgt.size())}).to(dev);
    const Tensor logits = model->forward_at(b.at("input_ids").to(dev), positions, b.at("attention_mask").to(dev),
                                            b.at("token_type_ids").to(dev));
    return score(logits, target, 0.0, false);
  };
  t.terms = [](const io::Batch& b) {
    const Tensor& labels = b.at("labels");
    const int64_t* l = labels.data<int64_t>();
    return int64_t(std::count_if(l, l + labels.numel(), [](int64_t v) { return v != kUnmasked; }));
  };
  std::vector<std::string> contents = file_contents(files, "--text");
  for (const auto& e : file_contents(expand_text_paths(c.eval_text, "--eval-text"), "--eval-text"))
    contents.push_back(e);
  t.data_info = {{"name", "text"},
                 {"files", files},
                 {"contents", contents},
                 {"vocab", c.vocab},
                 {"vocab_size", tok->vocab().size()},
                 {"train_samples", t.train_data->size()},
                 {"eval_samples", t.eval_data->size()},
                 {"corpus_tokens", corpus->tokens()},
                 {"seq_len", c.seq_len},
                 {"lower_case", c.lower_case},
                 {"mask_prob", c.mask_prob},
                 {"eval_split", eval_split},
                 {"vocab_fingerprint", vocab_fingerprint(tok->vocab())}};
  return t;
}

Task bert_classify(const TrainConfig& c, const BertName& bn) {
  io::BasicTokenizerOptions bo{c.lower_case, c.lower_case};
  auto tok = std::make_shared<io::WordPieceTokenizer>(io::Vocab::load(c.vocab), bo);
  // kiln eval: the label names come with the weights, and --train-tsv is needed only without them.
  KILN_CHECK(!c.train_tsv.empty() || !c.label_names.empty(),
             "--task classify: the weights carry no label names (kiln train's model.safetensors and kiln ckpt "
             "export's of its checkpoints have them; Hugging Face's and an import's not): give --train-tsv, the file "
             "the model was trained on, for them");
  std::shared_ptr<io::TsvClassificationDataset> train, eval;
  if (!c.train_tsv.empty()) {
    train = std::make_shared<io::TsvClassificationDataset>(tok, c.train_tsv, c.seq_len, c.label_names);
    eval = std::make_shared<io::TsvClassificationDataset>(tok, c.eval_tsv, c.seq_len, train->label_names());
  } else {
    // The weights' label names are as written in their metadata (JSON): U+FFFD for each byte that is not
    // UTF-8 (a latin-1 label). Each such name is the file's label that reads as it when written so (one
    // alone: of two that do, neither is guessed at, and the file's check names the one left out).
    std::vector<std::string> labels = c.label_names;
    if (std::any_of(labels.begin(), labels.end(),
                    [](const std::string& l) { return l.find("\xef\xbf\xbd") != std::string::npos; })) {
      std::map<std::string, std::vector<std::string>> raw;                 // as written -> the file's labels written so
      const io::TsvClassificationDataset own(tok, c.eval_tsv, c.seq_len);  // the file's own labels
      const std::set<std::string> exact(own.label_names().begin(), own.label_names().end());
      for (const std::string& l : own.label_names())
        if (io::as_json_text(l) != l) raw[io::as_json_text(l)].push_back(l);
      for (std::string& l : labels)
        if (const auto it = raw.find(l); !exact.count(l) && it != raw.end() && it->second.size() == 1)
          l = it->second[0];
    }
    eval = std::make_shared<io::TsvClassificationDataset>(tok, c.eval_tsv, c.seq_len, labels);
    train = eval;  // not trained on: kiln eval only evaluates
  }
  const int64_t labels = int64_t(train->label_names().size());
  const models::BertConfig bc = bert_config_for(c, bn, *tok, {"num_labels=" + std::to_string(labels)});
  // Checked here, as the ResNet task checks num_classes: a label past the classifier's outputs would
  // otherwise stop the run in its first loss, after it started writing.
  KILN_CHECK(bc.num_labels >= labels, "--set num_labels=", bc.num_labels, ": the labels of ",
             c.train_tsv.empty() ? c.eval_tsv : c.train_tsv, " need ", labels);
  auto model = std::make_shared<models::BertForSequenceClassification>(bc);
  Task t = task_of(c, "classify", "accuracy", model, train, eval);
  t.model_sets = bert_sets_for(c, *tok, {"num_labels=" + std::to_string(labels)});
  const double smoothing = c.label_smoothing;
  const Device dev = c.resolved_device();
  t.step = [model, smoothing, dev](const io::Batch& b) {
    return score(model->forward(b.at("input_ids").to(dev), b.at("attention_mask").to(dev),
                                b.at("token_type_ids").to(dev)),
                 b.at("target").to(dev), smoothing, model->is_training());
  };
  t.data_info = {
      {"name", "tsv"},
      {"train", c.train_tsv},
      {"eval", c.eval_tsv},
      {"contents", c.train_tsv.empty() ? std::vector<std::string>() : file_contents({c.train_tsv}, "--train-tsv")},
      {"vocab", c.vocab},
      {"labels", train->label_names()},
      {"text_columns", eval->text_columns()},
      {"train_samples", t.train_data->size()},
      {"eval_samples", t.eval_data->size()},
      {"seq_len", c.seq_len},
      {"lower_case", c.lower_case},
      {"vocab_size", tok->vocab().size()},
      {"vocab_fingerprint", vocab_fingerprint(tok->vocab())}};
  return t;
}

// What the model family of --model takes (make_task has checked that the name is known).
ModelInput input_of(const TrainConfig& c) { return model_family(c.model).input; }

}  // namespace

namespace {
// The text files under `dir`, its sub-directories included: symbolic links to files are followed
// (a Hugging Face cache snapshot is made of them), links to directories are not (they may loop);
// hidden entries (.git, .gitattributes) and binary files (io::file_binary_offset: a .gz by what it
// holds, so data.tar.gz is skipped) are left out.
void text_files_under(const std::filesystem::path& dir, const std::string& flag, std::vector<std::string>& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  KILN_CHECK(!ec, flag, " ", dir.string(), ": cannot read the directory (", ec.message(), ")");
  for (const auto& e : it) {
    if (e.path().filename().string().rfind('.', 0) == 0) continue;
    if (e.is_directory(ec)) {
      if (!e.is_symlink(ec)) text_files_under(e.path(), flag, out);
    } else if (e.is_regular_file(ec) &&
               io::file_binary_offset(e.path().string()) == std::string::npos) {  // is_regular_file follows a link
      out.push_back(e.path().string());
    }
  }
}
}  // namespace

std::vector<std::string> expand_text_paths(const std::vector<std::string>& paths, const std::string& flag) {
  std::vector<std::string> out;
  for (const auto& p : paths) {
    struct stat st{};
    KILN_CHECK(::stat(p.c_str(), &st) == 0, flag, " ", p, ": no such file or directory");
    if (!S_ISDIR(st.st_mode)) {
      KILN_CHECK(io::file_binary_offset(p) == std::string::npos, flag, " ", p,
                 ": binary data (a NUL byte in its first 4 KiB), not a text file (give text files, or directories "
                 "of them: there binary files are skipped)");
      out.push_back(p);
      continue;
    }
    std::vector<std::string> files;
    text_files_under(p, flag, files);
    KILN_CHECK(!files.empty(), flag, " ", p, ": the directory holds no text files");
    std::sort(files.begin(), files.end());
    // A file reached twice (fortune's art.u8 -> art) is read once, under its first name.
    std::set<std::string> seen;
    for (const auto& f : files) {
      std::error_code ec;
      const std::filesystem::path real = std::filesystem::canonical(f, ec);
      if (seen.insert(ec ? f : real.string()).second) out.push_back(f);
    }
  }
  return out;
}

const std::vector<TaskKind>& task_kinds() {
  static const std::vector<TaskKind> kinds = {
      {"classify/image-folder",
       [](const TrainConfig& c) { return input_of(c) == ModelInput::images && c.data == "folder"; }, image_folder},
      {"classify/idx", [](const TrainConfig& c) { return input_of(c) == ModelInput::images && c.data != "folder"; },
       image_classification},
      {"mlm",
       [](const TrainConfig& c) { return input_of(c) == ModelInput::tokens && (c.task.empty() || c.task == "mlm"); },
       [](const TrainConfig& c) { return bert_mlm(c, parse_bert_name(c.model)); }},
      {"classify/text", [](const TrainConfig& c) { return input_of(c) == ModelInput::tokens && c.task == "classify"; },
       [](const TrainConfig& c) { return bert_classify(c, parse_bert_name(c.model)); }},
  };
  return kinds;
}

const std::vector<std::string>& data_names() {
  static const std::vector<std::string> names = {"fashion-mnist", "mnist", "folder"};
  return names;
}

const std::vector<OptimizerKind>& optimizer_kinds() {
  static const std::vector<OptimizerKind> kinds = {
      {"sgd",
       [](const TrainConfig& c, std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
         return std::make_unique<optim::SGD>(std::move(g), optim::SgdOptions{c.momentum, 0.0, c.nesterov});
       }},
      {"adamw",
       [](const TrainConfig& c, std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
         return std::make_unique<optim::AdamW>(std::move(g),
                                               optim::AdamOptions{c.betas.at(0), c.betas.at(1), c.adam_eps()});
       }},
      {"lamb",
       [](const TrainConfig& c, std::vector<optim::ParamGroup> g) -> std::unique_ptr<optim::Optimizer> {
         return std::make_unique<optim::LAMB>(std::move(g),
                                              optim::AdamOptions{c.betas.at(0), c.betas.at(1), c.adam_eps()});
       }},
  };
  return kinds;
}

std::vector<std::string> optimizer_names() {
  std::vector<std::string> names;
  for (const auto& k : optimizer_kinds()) names.push_back(k.name);
  return names;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, nn::Module& m) {
  return make_optimizer(c, optim::decay_groups(m.named_parameters(), c.lr, c.weight_decay));
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<optim::ParamGroup> groups) {
  for (const auto& k : optimizer_kinds())
    if (c.optimizer == k.name) return k.make(c, std::move(groups));
  KILN_FAIL("--optimizer ", c.optimizer, ": unknown (expected one of ", nlohmann::json(optimizer_names()).dump(), ")");
}

namespace {
Device x_home(Device dev) { return dev.is_meta() ? kMeta : kCPU; }  // where a non-CUDA step's batch lives
}  // namespace

SyntheticStep synthetic_step(const std::string& name, int64_t batch, int64_t seq_len, int64_t image_size,
                             int64_t in_channels, const std::vector<std::string>& sets, Device dev) {
  std::optional<MetaInitGuard> meta;
  if (dev.is_meta()) meta.emplace();  // parameters and batch as shapes only
  SyntheticStep st;
  const ModelFamily& family = model_family(name);
  st.images = family.input == ModelInput::images;
  if (st.images) {
    auto rc = resnet_config_from(name, sets);
    if (in_channels > 0) rc.in_channels = in_channels;
    auto m = models::make_resnet(rc);
    st.model = m;
    const int64_t s = image_size > 0 ? image_size : m->imagenet ? 224 : 32;
    st.batch = batch > 0 ? batch : m->imagenet ? 32 : 128;
    if (dev.is_cuda()) m->to(dev);
    const Tensor x = randn({st.batch, rc.in_channels, s, s}).to(dev.is_cuda() ? dev : x_home(dev));
    const Tensor y = randint(0, rc.num_classes, {st.batch}).to(dev.is_cuda() ? dev : x_home(dev));
    st.loss = [m, x, y] { return cross_entropy((*m)(x), y); };
    st.input = std::to_string(st.batch) + "x" + std::to_string(rc.in_channels) + "x" + std::to_string(s) + "x" +
               std::to_string(s);
    return st;
  }
  const BertName bn = parse_bert_name(name);
  const models::BertConfig bc = bert_config_from(bn.size, sets);
  st.batch = batch > 0 ? batch : 32;
  if (bn.head == "cls") {  // sequence classification: the pooled first token through the classifier
    auto m = std::make_shared<models::BertForSequenceClassification>(bc);
    st.model = m;
    Tensor ids = randint(0, bc.vocab_size, {st.batch, seq_len}), labels = randint(0, bc.num_labels, {st.batch});
    Tensor attn = ones({st.batch, seq_len}, DType::i64);
    if (dev.is_cuda()) {
      m->to(dev);
      ids = ids.to(dev), labels = labels.to(dev), attn = attn.to(dev);
    }
    st.loss = [m, ids, labels, attn] { return cross_entropy(m->forward(ids, attn), labels); };
    st.input = std::to_string(st.batch) + "x" + std::to_string(seq_len) + " tokens";
    return st;
  }
  auto m = std::make_shared<models::BertForMaskedLM>(bc);
  st.model = m;
  // The masked-LM shape of work as `kiln train` does it: 15% of the positions (rounded; a fixed
  // count, so a planned step and a measured one do the same work) go through the vocabulary
  // projection and the loss.
  const int64_t n = st.batch * seq_len, picked = std::max<int64_t>(1, (n * 15 + 50) / 100);
  const Tensor ids = randint(0, bc.vocab_size, {st.batch, seq_len});
  Tensor positions, target;
  if (ids.device().is_meta()) {
    positions = empty({picked}, DType::i64);
    target = empty({picked}, DType::i64);
  } else {
    std::vector<int64_t> order(size_t(n), 0);
    for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
    PhiloxStream rng(default_generator().seed, default_generator().reserve(uint64_t(n) * 2) / 4);
    for (int64_t i = n - 1; i > 0; --i) std::swap(order[size_t(i)], order[rng.below(uint64_t(i + 1))]);
    order.resize(size_t(picked));
    std::sort(order.begin(), order.end());
    std::vector<int64_t> tgt;
    for (int64_t p : order) tgt.push_back(ids.data<int64_t>()[p]);
    positions = from_vector(std::vector<double>(order.begin(), order.end()), {picked}, DType::i64);
    target = from_vector(std::vector<double>(tgt.begin(), tgt.end()), {picked}, DType::i64);
  }
  Tensor attn = ones({st.batch, seq_len}, DType::i64), ids_on = ids;
  if (dev.is_cuda()) {
    m->to(dev);
    ids_on = ids.to(dev), positions = positions.to(dev), target = target.to(dev), attn = attn.to(dev);
  }
  st.loss = [m, ids = ids_on, positions, target, attn] {
    return cross_entropy(m->forward_at(ids, positions, attn), target);
  };
  st.input = std::to_string(st.batch) + "x" + std::to_string(seq_len) + " tokens";
  return st;
}

Task make_task(const TrainConfig& c) {
  model_family(c.model);  // an unknown name: the list of known ones, before any task is asked
  const TaskKind* kind = nullptr;
  for (const auto& k : task_kinds())
    if (k.takes(c)) {
      kind = &k;
      break;
    }
  KILN_CHECK(kind, "no task takes --model ", c.model, " with --task ", c.task.empty() ? "(default)" : c.task,
             " and --data ", c.data);
  Task t = kind->make(c);
  // Built on the CPU (the same initial weights on every device), then moved; the steps move each
  // batch after the loader made it.
  t.model->to(c.resolved_device());
  return t;
}

EvalResult evaluate(Task& task, const TrainConfig& c, dist::Communicator* comm) {
  const auto t0 = std::chrono::steady_clock::now();
  NoGradGuard no_grad;
  const std::optional<DType> low = amp_dtype(c.amp);
  amp::AutocastGuard autocast(low.value_or(DType::f16), low.has_value());  // evaluate as the run trains
  const bool was_training = task.model->is_training();
  task.model->eval();
  io::LoaderOptions lo;
  lo.batch_size = c.batch;
  lo.shuffle = false;
  lo.workers = c.workers;
  if (comm) {
    lo.rank = comm->rank();
    lo.world_size = comm->world_size();
    lo.pad_ranks = false;  // exactly once over all ranks
  }
  io::DataLoader loader(task.eval_data, lo);
  EvalResult r;
  double loss_sum = 0;
  int64_t correct = 0;
  while (auto b = loader.next()) {
    const StepResult s = task.step(*b);
    loss_sum += s.loss.item<double>() * double(s.count);
    correct += s.correct.item<int64_t>();
    r.count += s.count;
    r.samples += b->begin()->second.size(0);
  }
  task.model->train(was_training);
  if (comm && comm->world_size() > 1) {
    Tensor sums = from_vector({loss_sum, double(correct), double(r.count), double(r.samples)}, {4}, DType::f64);
    comm->all_reduce(sums, dist::ReduceOp::sum);
    loss_sum = sums.data<double>()[0];
    correct = int64_t(sums.data<double>()[1]);
    r.count = int64_t(sums.data<double>()[2]);
    r.samples = int64_t(sums.data<double>()[3]);
  }
  r.loss = r.count ? loss_sum / double(r.count) : 0.0;
  r.accuracy = r.count ? double(correct) / double(r.count) : 0.0;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::map<std::string, std::string> weights_metadata(const nlohmann::json& config) {
  std::map<std::string, std::string> meta;
  if (!config.is_object()) return meta;
  // A value as metadata text; one of another type (a hand-edited state) is left out, not guessed at.
  const auto put = [&meta](const std::string& key, const nlohmann::json& v) {
    if (v.is_string())
      meta[key] = v.get<std::string>();
    else if (v.is_boolean())
      meta[key] = v.get<bool>() ? "true" : "false";
    else if (v.is_number_integer())
      meta[key] = std::to_string(v.get<int64_t>());
  };
  if (config.contains("model")) put("model", config["model"]);
  if (config.contains("task")) put("task", config["task"]);
  // Its --amp: `kiln eval` evaluates as the run's own evaluations did (bf16 weights evaluated in f32
  // gave another loss than the run's summary).
  if (config.contains("amp")) put("amp", config["amp"]);
  // The run's --set (a JSON list of key=value): `kiln eval` builds the same model without it repeated.
  if (config.contains("set") && config["set"].is_array()) meta["set"] = io::dump_json(config["set"]);
  const nlohmann::json info = config.value("data_info", nlohmann::json::object());
  if (!info.is_object()) return meta;
  if (info.contains("labels")) meta["labels"] = io::dump_json(info["labels"]);
  if (info.value("name", nlohmann::json()) == "folder") {  // `kiln eval` gets the ids and size of this run
    if (info.contains("classes")) meta["labels"] = io::dump_json(info["classes"]);
    if (info.contains("image_size")) put("image_size", info["image_size"]);
    // --mean / --std as the flags take them ("0.485,0.456,0.406"): kiln eval normalises as the run did.
    for (const char* key : {"mean", "std"})
      if (info.contains(key) && info[key].is_array()) {
        std::string text;
        for (const auto& v : info[key]) text += (text.empty() ? "" : ",") + io::dump_json(v);
        meta[key] = text;
      }
  }
  // A BERT model's text settings: what turns its text into these ids, so `kiln eval` makes the same.
  if (info.contains("vocab_fingerprint"))
    for (const char* key : {"lower_case", "seq_len", "vocab", "vocab_size", "vocab_fingerprint"})
      if (info.contains(key)) put(key, info[key]);
  // A masked-LM run's --mask-prob (data "text"; a checkpoint from before data_info held it, the
  // config's): `kiln eval` masks as many of its tokens as the run's test did.
  if (info.value("name", nlohmann::json()) == "text") {
    const nlohmann::json mp =
        info.contains("mask_prob") ? info["mask_prob"] : config.value("mask_prob", nlohmann::json());
    if (mp.is_number()) meta["mask_prob"] = io::dump_json(mp);
  }
  return meta;
}

}  // namespace kiln::tools

// The model-family table, the families' builders and config overrides for the command line.
#include "tools/zoo.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "io/json_parse.h"

namespace kiln::tools {

// Spaces around the key and the value are dropped, both sides alike: "num_layers= 2" and
// "num_layers=2 " are num_layers=2 (kiln.models.create strips its comma-separated pairs too).
std::pair<std::string, std::string> split_set(const std::string& kv) {
  const auto trim = [](std::string s) {
    const auto space = [](char ch) { return std::isspace(static_cast<unsigned char>(ch)) != 0; };
    while (!s.empty() && space(s.back())) s.pop_back();
    s.erase(s.begin(), std::find_if_not(s.begin(), s.end(), space));
    return s;
  };
  const auto eq = kv.find('=');
  KILN_CHECK(eq != std::string::npos && !trim(kv.substr(0, eq)).empty(), "--set ", kv, ": expected key=value");
  return {trim(kv.substr(0, eq)), trim(kv.substr(eq + 1))};
}

namespace {

// A size field's upper bound: far above any real model (BERT-large: 24 layers of 1024, vocabulary
// 30522; ImageNet-21k: 21841 classes), and low enough that a typo ("num_layers=100000000") is named
// here rather than planned or allocated for minutes, or overflowing a shape's element count.
void check_at_most(const char* field, int64_t v, int64_t most) {
  KILN_CHECK(v <= most, "--set ", field, "=", v, ": must be at most ", most);
}

template <typename T> T parse_number(const std::string& k, const std::string& v) {
  size_t used = 0;
  T x{};
  try {
    if constexpr (std::is_integral_v<T>) x = std::stoll(v, &used);
    else x = std::stod(v, &used);
  } catch (...) {
    used = 0;
  }
  KILN_CHECK(used == v.size() && !v.empty(), "--set ", k, "=", v, ": expected ",
             std::is_integral_v<T> ? "an integer" : "a number");
  return x;
}

// A boolean field: true/false (any case) or 1/0; anything else (2, "yes") is refused rather than
// read as true.
bool parse_bool(const std::string& k, const std::string& v) {
  std::string l = v;
  for (char& ch : l) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (l == "1" || l == "true") return true;
  if (l == "0" || l == "false") return false;
  KILN_FAIL("--set ", k, "=", v, ": expected a boolean (true, false, 1 or 0)");
}

// A probability of dropout: in [0, 1] (NaN refused), checked when the model is built rather than at
// its first forward.
void check_dropout(const char* k, double p) {
  KILN_CHECK(p >= 0 && p <= 1, "--set ", k, "=", p, ": a dropout probability must be in [0, 1]");
}

}  // namespace

models::ResNetConfig resnet_config_from(const std::string& name, const std::vector<std::string>& sets) {
  models::ResNetConfig c;
  c.name = name;
  for (const auto& kv : sets) {
    const auto [k, v] = split_set(kv);
    if (k == "num_classes") c.num_classes = parse_number<int64_t>(k, v);
    else if (k == "in_channels") c.in_channels = parse_number<int64_t>(k, v);
    else if (k == "zero_init_residual")
      c.zero_init_residual = parse_bool(k, v);
    else if (k == "recompute")
      c.recompute = parse_bool(k, v);
    else
      KILN_FAIL("--set ", k, ": not a ResNet config field (num_classes, in_channels, zero_init_residual, recompute)");
  }
  KILN_CHECK(c.num_classes >= 1, "--set num_classes=", c.num_classes, ": must be at least 1");
  KILN_CHECK(c.in_channels >= 1, "--set in_channels=", c.in_channels, ": must be at least 1");
  check_at_most("num_classes", c.num_classes, int64_t(1) << 24);
  check_at_most("in_channels", c.in_channels, 65536);
  return c;
}

BertName parse_bert_name(const std::string& name) {
  for (const auto& size : models::bert_sizes())
    for (const char* head : {"", "mlm", "cls"})
      if (name == "bert-" + size + (*head ? std::string("-") + head : "")) return {size, head};
  KILN_FAIL(unknown_model_message(name));
}

std::string trained_model_name(const std::string& name, const std::string& task) {
  const ModelFamily* f = find_model_family(name);
  if (!f || f->input != ModelInput::tokens) return name;
  return "bert-" + parse_bert_name(name).size + (task == "classify" ? "-cls" : "-mlm");
}

models::BertConfig bert_config_from(const std::string& size, const std::vector<std::string>& sets) {
  models::BertConfig c = models::bert_config(size);
  for (const auto& kv : sets) {
    const auto [k, v] = split_set(kv);
    if (k == "vocab_size") c.vocab_size = parse_number<int64_t>(k, v);
    else if (k == "hidden_size") c.hidden_size = parse_number<int64_t>(k, v);
    else if (k == "num_layers") c.num_layers = parse_number<int64_t>(k, v);
    else if (k == "num_heads") c.num_heads = parse_number<int64_t>(k, v);
    else if (k == "intermediate_size") c.intermediate_size = parse_number<int64_t>(k, v);
    else if (k == "max_position") c.max_position = parse_number<int64_t>(k, v);
    else if (k == "type_vocab_size") c.type_vocab_size = parse_number<int64_t>(k, v);
    else if (k == "num_labels") c.num_labels = parse_number<int64_t>(k, v);
    else if (k == "layer_norm_eps") c.layer_norm_eps = parse_number<double>(k, v);
    else if (k == "hidden_dropout") c.hidden_dropout = parse_number<double>(k, v);
    else if (k == "attention_dropout") c.attention_dropout = parse_number<double>(k, v);
    else if (k == "initializer_range")
      c.initializer_range = parse_number<double>(k, v);
    else if (k == "recompute")
      c.recompute = parse_bool(k, v);
    else
      KILN_FAIL("--set ", k,
                ": not a BERT config field (vocab_size, hidden_size, num_layers, num_heads, "
                "intermediate_size, max_position, type_vocab_size, num_labels, layer_norm_eps, hidden_dropout, "
                "attention_dropout, initializer_range, recompute)");
  }
  // Sizes named by field: the model's own check (models/bert.cpp) runs only when it is built.
  std::vector<models::SizeField> sizes = models::size_fields(c);
  sizes.emplace_back("num_labels", c.num_labels, 1);  // the classifier's (the encoder has none)
  for (const auto& [field, v, least] : sizes)
    KILN_CHECK(v >= least, "--set ", field, "=", v, ": must be at least ", least);
  const std::pair<const char*, int64_t> most[] = {{"vocab_size", int64_t(1) << 24},
                                                  {"hidden_size", 65536},
                                                  {"num_layers", 1024},
                                                  {"num_heads", 4096},
                                                  {"intermediate_size", 262144},
                                                  {"max_position", int64_t(1) << 20},
                                                  {"type_vocab_size", 65536},
                                                  {"num_labels", int64_t(1) << 24}};
  for (const auto& [field, v, least] : sizes)
    for (const auto& [name, limit] : most)
      if (std::string(field) == name) check_at_most(name, v, limit);
  KILN_CHECK(c.hidden_size % c.num_heads == 0, "--set hidden_size=", c.hidden_size, " / num_heads=", c.num_heads,
             ": hidden_size must be a multiple of num_heads");
  // The ranges the layers would refuse only at the first forward (dropout) or never (a zero or NaN
  // epsilon gives NaN outputs), refused when the model is built.
  KILN_CHECK(std::isfinite(c.layer_norm_eps) && c.layer_norm_eps > 0, "--set layer_norm_eps=", c.layer_norm_eps,
             ": must be a finite number > 0");
  KILN_CHECK(std::isfinite(c.initializer_range) && c.initializer_range >= 0,
             "--set initializer_range=", c.initializer_range,
             ": must be a finite number >= 0 (the std of the initial weights)");
  check_dropout("hidden_dropout", c.hidden_dropout);
  check_dropout("attention_dropout", c.attention_dropout);
  return c;
}

std::vector<std::string> hf_bert_config_sets(const std::string& path) {
  nlohmann::json cfg;
  {
    std::ifstream in(path, std::ios::binary);
    KILN_CHECK(in.good(), path, ": cannot open the config (", std::strerror(errno), ")");
    std::ostringstream text;
    text << in.rdbuf();
    // A key given twice would take its last value silently (transformers' json.load does too): refused.
    cfg = io::parse_json_file_text(text.str(), path);
  }
  KILN_CHECK(cfg.is_object(), path, ": a config is a JSON object, this one is a JSON ", cfg.type_name());
  const auto shown = [&cfg](const char* key) { return cfg[key].dump(); };
  // A key's string value, or `fallback` (transformers' default) when absent or null (problem_type).
  const auto text = [&](const char* key, const char* fallback) {
    if (!cfg.contains(key) || cfg[key].is_null()) return std::string(fallback);
    KILN_CHECK(cfg[key].is_string(), path, ": ", key, " is ", shown(key), ", not a string");
    return cfg[key].get<std::string>();
  };
  const auto whole = [&](const char* key, int64_t fallback) {
    if (!cfg.contains(key)) return fallback;
    KILN_CHECK(cfg[key].is_number_integer(), path, ": ", key, " is ", shown(key), ", not a whole number");
    return cfg[key].get<int64_t>();
  };
  const auto number = [&](const char* key, double fallback) {
    if (!cfg.contains(key)) return fallback;
    KILN_CHECK(cfg[key].is_number(), path, ": ", key, " is ", shown(key), ", not a number");
    return cfg[key].get<double>();
  };
  const auto flag = [&](const char* key) {
    if (!cfg.contains(key) || cfg[key].is_null()) return false;
    KILN_CHECK(cfg[key].is_boolean(), path, ": ", key, " is ", shown(key), ", not true or false");
    return cfg[key].get<bool>();
  };
  // What Kiln's BERT does not compute: refused by key and value, since the weights would load and
  // give other numbers.
  const std::string model_type = text("model_type", "bert");
  KILN_CHECK(model_type == "bert", path, ": model_type is \"", model_type,
             "\": Kiln's BERT models load a BERT config (model_type \"bert\") only");
  // transformers' "gelu_python" is the same exact GELU written in Python (before torch had one).
  const std::string act = text("hidden_act", "gelu");
  KILN_CHECK(act == "gelu" || act == "gelu_python", path, ": hidden_act is \"", act,
             "\": Kiln's BERT computes the exact (erf) GELU, transformers' \"gelu\" (or \"gelu_python\"), only");
  const std::string pos = text("position_embedding_type", "absolute");
  KILN_CHECK(pos == "absolute", path, ": position_embedding_type is \"", pos,
             "\": Kiln's BERT has absolute position embeddings only");
  KILN_CHECK(!flag("is_decoder"), path, ": is_decoder is true: Kiln's BERT is an encoder (no causal mask)");
  KILN_CHECK(!flag("add_cross_attention"), path, ": add_cross_attention is true: Kiln's BERT has no cross-attention");
  if (cfg.contains("pad_token_id"))
    KILN_CHECK(cfg["pad_token_id"] == 0, path, ": pad_token_id is ", shown("pad_token_id"),
               ": Kiln's word embeddings keep id 0 as the padding row (no gradient), as transformers' with 0");
  const double hidden_dropout = number("hidden_dropout_prob", 0.1);
  if (cfg.contains("classifier_dropout") && !cfg["classifier_dropout"].is_null())
    KILN_CHECK(number("classifier_dropout", 0) == hidden_dropout, path, ": classifier_dropout is ",
               shown("classifier_dropout"), ", not hidden_dropout_prob (", hidden_dropout,
               "): Kiln's classifier drops out at hidden_dropout_prob");
  const std::string problem = text("problem_type", "single_label_classification");
  KILN_CHECK(problem == "single_label_classification", path, ": problem_type is \"", problem,
             "\": Kiln's BERT classifier is single-label (cross-entropy) only");
  int64_t num_labels = 2;  // transformers' default
  if (cfg.contains("id2label")) {
    KILN_CHECK(cfg["id2label"].is_object(), path, ": id2label is ", shown("id2label"), ", not an object");
    num_labels = int64_t(cfg["id2label"].size());
  }
  num_labels = whole("num_labels", num_labels);
  // Numbers as the shortest text that reads back as the same double (1e-12, not 9.99...e-13).
  const auto real = [](double v) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr);
  };
  return {"vocab_size=" + std::to_string(whole("vocab_size", 30522)),
          "hidden_size=" + std::to_string(whole("hidden_size", 768)),
          "num_layers=" + std::to_string(whole("num_hidden_layers", 12)),
          "num_heads=" + std::to_string(whole("num_attention_heads", 12)),
          "intermediate_size=" + std::to_string(whole("intermediate_size", 3072)),
          "max_position=" + std::to_string(whole("max_position_embeddings", 512)),
          "type_vocab_size=" + std::to_string(whole("type_vocab_size", 2)),
          "layer_norm_eps=" + real(number("layer_norm_eps", 1e-12)), "hidden_dropout=" + real(hidden_dropout),
          "attention_dropout=" + real(number("attention_probs_dropout_prob", 0.1)),
          // The std of the weights a new head (--allow-missing) starts from, as transformers' _init_weights.
          "initializer_range=" + real(number("initializer_range", 0.02)), "num_labels=" + std::to_string(num_labels)};
}

std::vector<std::string> sets_with_hf_config(const std::string& model, const std::string& hf_config,
                                             const std::vector<std::string>& sets) {
  if (hf_config.empty()) return sets;
  KILN_CHECK(model_family(model).input == ModelInput::tokens, "--hf-config ", hf_config,
             ": a Hugging Face BERT config, but --model ", model, " is not a BERT model");
  std::vector<std::string> all = hf_bert_config_sets(hf_config);
  all.insert(all.end(), sets.begin(), sets.end());
  return all;
}

bool weights_config_field(const std::string& field, bool classifier) {
  if (field == "hidden_dropout" || field == "attention_dropout" || field == "zero_init_residual") return false;
  return field != "num_labels" || classifier;
}

std::vector<std::pair<std::string, std::string>> model_config_fields(const std::string& name,
                                                                     const std::vector<std::string>& sets) {
  // The shortest text that reads back as the same double: a resume refusal says 0.1, not
  // 0.10000000000000001 (as hf_bert_config_sets writes them).
  const auto number = [](double v) {
    char b[64];
    const auto r = std::to_chars(b, b + sizeof b, v);
    return std::string(b, r.ptr);
  };
  const ModelFamily& family = model_family(name);
  if (family.input == ModelInput::images) {
    const models::ResNetConfig c = resnet_config_from(name, sets);
    return {{"num_classes", std::to_string(c.num_classes)},
            {"in_channels", std::to_string(c.in_channels)},
            {"zero_init_residual", c.zero_init_residual ? "true" : "false"}};
  }
  const models::BertConfig c = bert_config_from(parse_bert_name(name).size, sets);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [field, v, least] : models::size_fields(c)) out.emplace_back(field, std::to_string(v));
  out.emplace_back("num_labels", std::to_string(c.num_labels));
  out.emplace_back("layer_norm_eps", number(c.layer_norm_eps));
  out.emplace_back("hidden_dropout", number(c.hidden_dropout));
  out.emplace_back("attention_dropout", number(c.attention_dropout));
  return out;
}

namespace {

const Tensor& need(const std::map<std::string, Tensor>& in, const std::string& name, const std::string& file) {
  auto it = in.find(name);
  KILN_CHECK(it != in.end(), file, ": no tensor named '", name, "'");
  return it->second;
}

// An input tensor the model would refuse deep inside (an embedding's index out of range, a
// convolution of integers) is checked here, where the message can name the file and the tensor.
void check_ids(const std::map<std::string, Tensor>& in, const char* name, int64_t rows, const char* config,
               const std::string& file) {
  auto it = in.find(name);
  if (it == in.end()) return;
  const Tensor& t = it->second;
  KILN_CHECK(!is_floating(t.dtype()) && t.dtype() != DType::boolean, file, ": input '", name, "' is ", t.dtype(),
             ": it holds indices, give it as an integer tensor (i64 or i32)");
  if (!t.device().is_cpu()) return;  // reading a GPU tensor's values would stall every step (Python's run)
  for (const int64_t v : t.values<int64_t>())
    KILN_CHECK(v >= 0 && v < rows, file, ": input '", name, "' holds ", v, ", outside 0..", rows - 1, " (the model's ",
               config, " is ", rows, ")");
}

BuiltModel build_resnet(const std::string& name, const std::vector<std::string>& sets, bool /*deterministic*/) {
  auto m = models::make_resnet(resnet_config_from(name, sets));  // no dropout to turn off
  BuiltModel b;
  b.module = m;
  b.input_names = {"input"};
  b.run = [m](const std::map<std::string, Tensor>& in, const std::string& file) {
    const Tensor& x = need(in, "input", file);
    KILN_CHECK(is_floating(x.dtype()), file, ": input 'input' is ", x.dtype(),
               ": the model takes images as a floating tensor (f32, f16, bf16 or f64) [N, C, H, W]");
    return std::map<std::string, Tensor>{{"output", (*m)(x)}};
  };
  return b;
}

// bert-SIZE: the encoder (output: the last hidden state); -mlm: the masked-LM head (output: the
// vocabulary logits); -cls: sequence classification (output: the logits). The encoder and the
// classifier also give their pooled output.
BuiltModel build_bert(const std::string& name, const std::vector<std::string>& sets, bool deterministic) {
  const BertName bn = parse_bert_name(name);
  models::BertConfig c = bert_config_from(bn.size, sets);
  if (deterministic) c.hidden_dropout = c.attention_dropout = 0.0;
  auto opt = [](const std::map<std::string, Tensor>& in, const char* n) {
    auto it = in.find(n);
    return it == in.end() ? Tensor() : it->second;
  };
  BuiltModel b;
  b.input_names = {"input_ids", "attention_mask", "token_type_ids"};
  if (bn.head == "mlm") {
    auto m = std::make_shared<models::BertForMaskedLM>(c);
    b.module = m;
    b.run = [m, opt](const std::map<std::string, Tensor>& in, const std::string& file) {
      return std::map<std::string, Tensor>{
          {"output", m->forward(need(in, "input_ids", file), opt(in, "attention_mask"), opt(in, "token_type_ids"))}};
    };
  } else if (bn.head == "cls") {
    auto m = std::make_shared<models::BertForSequenceClassification>(c);
    b.module = m;
    b.run = [m, opt](const std::map<std::string, Tensor>& in, const std::string& file) {
      const models::BertOutputs bo =
          m->bert->forward(need(in, "input_ids", file), opt(in, "attention_mask"), opt(in, "token_type_ids"));
      return std::map<std::string, Tensor>{{"output", (*m->classifier)((*m->dropout)(bo.pooled_output))},
                                           {"pooled_output", bo.pooled_output}};
    };
  } else {
    auto m = std::make_shared<models::BertModel>(c);
    b.module = m;
    b.run = [m, opt](const std::map<std::string, Tensor>& in, const std::string& file) {
      const models::BertOutputs bo =
          m->forward(need(in, "input_ids", file), opt(in, "attention_mask"), opt(in, "token_type_ids"));
      return std::map<std::string, Tensor>{{"output", bo.last_hidden_state}, {"pooled_output", bo.pooled_output}};
    };
  }
  b.run = [c, run = std::move(b.run)](const std::map<std::string, Tensor>& in, const std::string& file) {
    check_ids(in, "input_ids", c.vocab_size, "vocab_size", file);
    check_ids(in, "token_type_ids", c.type_vocab_size, "type_vocab_size", file);
    return run(in, file);
  };
  return b;
}

std::vector<std::string> bert_names() {
  std::vector<std::string> v;
  for (const auto& size : models::bert_sizes())
    for (const char* head : {"", "-mlm", "-cls"}) v.push_back("bert-" + size + head);
  return v;
}

}  // namespace

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {
      {"ResNet", ModelInput::images, models::resnet_names(), build_resnet},
      {"BERT", ModelInput::tokens, bert_names(), build_bert},
  };
  return families;
}

const ModelFamily* find_model_family(const std::string& name) {
  for (const ModelFamily& f : model_families())
    if (std::find(f.names.begin(), f.names.end(), name) != f.names.end()) return &f;
  return nullptr;
}

const ModelFamily& model_family(const std::string& name) {
  const ModelFamily* f = find_model_family(name);
  KILN_CHECK(f != nullptr, unknown_model_message(name));
  return *f;
}

std::string model_names_text() {
  std::string s;
  for (const ModelFamily& f : model_families())
    for (const auto& n : f.names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string unknown_model_message(const std::string& name) {
  return "--model " + name + ": unknown (expected one of " + model_names_text() + ")";
}

namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Whether two tensors of a checkpoint hold the same values (a tied pair saved twice).
bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && allclose(a.to(DType::f64), b.to(DType::f64), 0.0, 0.0, /*equal_nan=*/true);
}

std::string where(const std::string& file) { return file.empty() ? std::string() : file + ": "; }

}  // namespace

// Old BERT checkpoints name LayerNorm parameters gamma/beta, and carry the tied decoder and
// position ids; Hugging Face's headed BERT checkpoints name the encoder under "bert.", its bare
// BertModel ones without it; map them onto Kiln's names. What cannot be represented (an untied
// decoder, two different decoder biases) is refused naming both tensors rather than dropped.
nn::StateDict normalise_checkpoint_names(const nn::StateDict& in, const nn::StateDict& mine, const std::string& file) {
  // An encoder-only model (bert-SIZE) has no "bert." prefix; a checkpoint of one of the headed models
  // (BertForPreTraining, BertForMaskedLM) has it on every encoder name: strip it, as Hugging Face's
  // BertModel.from_pretrained does.
  const bool mine_prefixed =
      std::any_of(mine.begin(), mine.end(), [](const auto& kv) { return starts_with(kv.first, "bert."); });
  const bool in_prefixed =
      std::any_of(in.begin(), in.end(), [](const auto& kv) { return starts_with(kv.first, "bert."); });
  const bool strip_bert = !mine_prefixed && in_prefixed && mine.count("embeddings.word_embeddings.weight");
  // The reverse: a bare encoder's checkpoint (BertModel.save_pretrained, bert-SIZE's) given to a
  // headed model (-mlm, -cls) names its encoder without "bert.": add it, as Hugging Face's
  // BertForSequenceClassification.from_pretrained does; without it nothing matched, and a strict=False
  // load left the whole encoder at its random initialisation.
  const bool add_bert = mine_prefixed && !in_prefixed && in.count("embeddings.word_embeddings.weight");
  const auto encoder_name = [](const std::string& k) {
    return starts_with(k, "embeddings.") || starts_with(k, "encoder.") || starts_with(k, "pooler.");
  };
  // Only a model with a masked-LM head ties a decoder; for the others (a classifier, the bare
  // encoder) the checkpoint's cls.* heads are unused: kept here, so drop_unused_heads drops them
  // unexamined and a strict load (Python's load_state_dict) names them as unexpected.
  const bool mlm_head = mine.count("cls.predictions.bias") > 0;
  // The BERT mappings only for a BERT model: another model's load stays strict about every name (a
  // stray BERT key is unexpected); what applies to all is the batch-norm counter below.
  const bool bert =
      mine.count("embeddings.word_embeddings.weight") || mine.count("bert.embeddings.word_embeddings.weight");
  nn::StateDict out;
  std::map<std::string, std::string> source;  // Kiln name -> the checkpoint's name it came from
  std::vector<std::pair<std::string, Tensor>> decoders;
  for (const auto& [n, t] : in) {
    std::string k = n;
    if (strip_bert && starts_with(k, "bert.")) k = k.substr(5);
    if (add_bert && encoder_name(k)) k = "bert." + k;
    if (bert && k.find("LayerNorm.") != std::string::npos && ends_with(k, ".gamma"))
      k = k.substr(0, k.size() - 6) + ".weight";
    if (bert && k.find("LayerNorm.") != std::string::npos && ends_with(k, ".beta"))
      k = k.substr(0, k.size() - 5) + ".bias";
    if (k == "cls.predictions.decoder.weight" && !mine.count(k) && mlm_head) {
      decoders.emplace_back(n, t);  // tied: checked against the word embeddings below
      continue;
    }
    if (bert && ends_with(k, "embeddings.position_ids") && !mine.count(k)) continue;
    if (k == "cls.predictions.decoder.bias" && mlm_head) k = "cls.predictions.bias";
    if (auto it = out.find(k); it != out.end()) {
      // The decoder's bias given both as cls.predictions.bias and cls.predictions.decoder.bias (or a
      // LayerNorm parameter under both of its names): one value, or the file is ambiguous.
      KILN_CHECK(same_values(it->second, t), where(file), "'", source[k], "' and '", n, "' both give the model's '", k,
                 "' but hold different values; keep the one you mean");
      continue;
    }
    source[k] = n;
    out[k] = t;
  }
  // The model ties its masked-LM decoder to the word embeddings: a decoder equal to them is the same
  // tensor saved twice; a different one cannot be represented.
  for (const auto& d : decoders) {
    const std::string emb =
        mine_prefixed ? "bert.embeddings.word_embeddings.weight" : "embeddings.word_embeddings.weight";
    auto it = out.find(emb);
    if (it == out.end()) continue;  // the embeddings' absence is reported as missing
    KILN_CHECK(same_values(it->second, d.second), where(file), "'", d.first, "' differs from '", source[emb],
               "': this model ties its decoder to the word embeddings, so an untied decoder cannot be loaded");
  }
  // A batch norm saved before PyTorch 0.4.1 (torchvision's first ResNet weights among them) has no
  // num_batches_tracked: it starts at 0, as torch's BatchNorm loads such a file. Only next to the
  // layer's running_mean, so a layer missing altogether is still named as missing.
  const std::string counter = "num_batches_tracked";
  for (const auto& [n, t] : mine) {
    if (!ends_with(n, counter) || out.count(n)) continue;
    const std::string mean = n.substr(0, n.size() - counter.size()) + "running_mean";
    if (out.count(mean)) out[n] = zeros_like(t);
  }
  return out;
}

std::string remove_unused_heads(const nn::Module& m, nn::StateDict& in, const std::string& file,
                                const std::string& model) {
  std::vector<std::string> prefixes;
  if (m.type_name() == "BertForMaskedLM") prefixes = {"bert.pooler.", "cls.seq_relationship."};
  // A pretraining checkpoint's heads are unused by the classifier and the bare encoder.
  if (m.type_name() == "BertForSequenceClassification" || m.type_name() == "BertModel") prefixes = {"cls."};
  const nn::StateDict mine = m.state_dict();
  std::vector<std::string> dropped;
  for (auto it = in.begin(); it != in.end();) {
    const bool unused = !mine.count(it->first) && std::any_of(prefixes.begin(), prefixes.end(), [&](const auto& p) {
      return it->first.rfind(p, 0) == 0;
    });
    if (unused) {
      dropped.push_back(it->first);
      it = in.erase(it);
    } else {
      ++it;
    }
  }
  if (dropped.empty()) return {};
  std::string s = "ignored " + std::to_string(dropped.size()) + " tensor" + (dropped.size() == 1 ? "" : "s") + " of " +
                  file + " that " + model + " does not use:";
  for (size_t i = 0; i < dropped.size(); ++i) s += (i ? ", " : " ") + dropped[i];
  return s;
}

void drop_unused_heads(const nn::Module& m, nn::StateDict& in, const std::string& file, const std::string& model,
                       const char* who) {
  if (const std::string s = remove_unused_heads(m, in, file, model); !s.empty())
    std::fprintf(stderr, "%s: %s\n", who, s.c_str());
}

}  // namespace kiln::tools

// Model names and config overrides for the command line.
#include "tools/zoo.h"

namespace kiln::tools {
namespace {

std::pair<std::string, std::string> split_set(const std::string& kv) {
  const auto eq = kv.find('=');
  KILN_CHECK(eq != std::string::npos && eq > 0, "--set ", kv, ": expected key=value");
  return {kv.substr(0, eq), kv.substr(eq + 1)};
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

}  // namespace

models::ResNetConfig resnet_config_from(const std::string& name, const std::vector<std::string>& sets) {
  models::ResNetConfig c;
  c.name = name;
  for (const auto& kv : sets) {
    const auto [k, v] = split_set(kv);
    if (k == "num_classes") c.num_classes = parse_number<int64_t>(k, v);
    else if (k == "in_channels") c.in_channels = parse_number<int64_t>(k, v);
    else if (k == "zero_init_residual") c.zero_init_residual = parse_number<int64_t>(k, v) != 0;
    else KILN_FAIL("--set ", k, ": not a ResNet config field (num_classes, in_channels, zero_init_residual)");
  }
  return c;
}

BertName parse_bert_name(const std::string& name) {
  KILN_CHECK(name.rfind("bert-", 0) == 0, "--model ", name,
             ": unknown (expected resnet20..resnet152, bert-SIZE, bert-SIZE-mlm or bert-SIZE-cls; SIZE is tiny, "
             "mini, small, base or large)");
  BertName b{name.substr(5), ""};
  for (const char* h : {"-mlm", "-cls"})
    if (b.size.size() > 4 && b.size.compare(b.size.size() - 4, 4, h) == 0) {
      b.head = h + 1;
      b.size = b.size.substr(0, b.size.size() - 4);
    }
  return b;
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
    else KILN_FAIL("--set ", k, ": not a BERT config field (vocab_size, hidden_size, num_layers, num_heads, "
                   "intermediate_size, max_position, type_vocab_size, num_labels, layer_norm_eps, hidden_dropout, "
                   "attention_dropout)");
  }
  return c;
}

// Old BERT checkpoints name LayerNorm parameters gamma/beta, and carry the tied decoder and
// position ids; map them onto Kiln's names.
nn::StateDict normalise_checkpoint_names(const nn::StateDict& in, const nn::StateDict& mine) {
  nn::StateDict out;
  for (const auto& [n, t] : in) {
    std::string k = n;
    auto ends = [&](const std::string& s) { return k.size() >= s.size() && k.compare(k.size() - s.size(), s.size(), s) == 0; };
    if (k.find("LayerNorm.") != std::string::npos && ends(".gamma")) k = k.substr(0, k.size() - 6) + ".weight";
    if (k.find("LayerNorm.") != std::string::npos && ends(".beta")) k = k.substr(0, k.size() - 5) + ".bias";
    if (k == "cls.predictions.decoder.bias") k = "cls.predictions.bias";
    if ((k == "cls.predictions.decoder.weight" || ends("embeddings.position_ids")) && !mine.count(k)) continue;
    out[k] = t;
  }
  return out;
}

}  // namespace kiln::tools

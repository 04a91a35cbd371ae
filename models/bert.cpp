// BERT definitions: each class is one box of the usual diagram, named as checkpoints name it.
#include "models/bert.h"

#include <cmath>
#include <tuple>

#include "engine/autograd.h"
#include "engine/init.h"

namespace kiln::models {

namespace {
struct BertSize {
  const char* name;
  int64_t layers, hidden, heads;
};
// The sizes of Turc et al.'s compact BERTs and the original two, smallest first.
constexpr BertSize kBertSizes[] = {
    {"tiny", 2, 128, 2}, {"mini", 4, 256, 4}, {"small", 4, 512, 8}, {"base", 12, 768, 12}, {"large", 24, 1024, 16},
};
}  // namespace

const std::vector<std::string>& bert_sizes() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const BertSize& s : kBertSizes) v.push_back(s.name);
    return v;
  }();
  return names;
}

BertConfig bert_config(const std::string& size) {
  for (const BertSize& s : kBertSizes)
    if (size == s.name) {
      BertConfig c;
      c.num_layers = s.layers;
      c.hidden_size = s.hidden;
      c.num_heads = s.heads;
      c.intermediate_size = 4 * s.hidden;
      return c;
    }
  std::string known;
  for (const BertSize& s : kBertSizes) known += (known.empty() ? "" : ", ") + std::string(s.name);
  KILN_FAIL("unknown BERT size '", size, "' (known: ", known, ")");
}

std::vector<SizeField> size_fields(const BertConfig& c) {
  return {{"vocab_size", c.vocab_size, 1},
          {"hidden_size", c.hidden_size, 1},
          {"num_layers", c.num_layers, 0},
          {"num_heads", c.num_heads, 1},
          {"intermediate_size", c.intermediate_size, 1},
          {"max_position", c.max_position, 1},
          {"type_vocab_size", c.type_vocab_size, 1}};
}

namespace {
void check_config(const BertConfig& c) {
  // Named one by one: "sizes must be positive" left the user to find which.
  for (const auto& [field, v, least] : size_fields(c))
    KILN_CHECK(v >= least, "BERT config: ", field, " is ", v, ", must be at least ", least);
  KILN_CHECK(c.hidden_size % c.num_heads == 0, "BERT config: hidden_size (", c.hidden_size,
             ") must be a multiple of num_heads (", c.num_heads, ")");
}
}  // namespace

BertEmbeddings::BertEmbeddings(const BertConfig& c) {
  word_embeddings = register_module("word_embeddings", std::make_shared<nn::Embedding>(c.vocab_size, c.hidden_size, 0));
  position_embeddings = register_module("position_embeddings", std::make_shared<nn::Embedding>(c.max_position, c.hidden_size));
  token_type_embeddings =
      register_module("token_type_embeddings", std::make_shared<nn::Embedding>(c.type_vocab_size, c.hidden_size));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout));
}

Tensor BertEmbeddings::forward(const Tensor& ids, const Tensor& types) {
  KILN_CHECK(ids.dim() == 2, "BERT: input_ids must be [batch, length], got ", ids.shape());
  const int64_t len = ids.size(1), maxp = position_embeddings->weight.size(0);
  KILN_CHECK(len <= maxp, "BERT: sequence length ", len, " exceeds max_position ", maxp);
  const Tensor pos = arange(len, TensorOptions(DType::i64, ids.device()));
  Tensor h = (*word_embeddings)(ids) + (*position_embeddings)(pos);
  h = h + (*token_type_embeddings)(types.defined() ? types : zeros(ids.shape(), TensorOptions(DType::i64, ids.device())));
  return (*dropout)((*LayerNorm)(h));
}

BertSelfAttention::BertSelfAttention(const BertConfig& c) : heads(c.num_heads), dropout_p(c.attention_dropout) {
  query = register_module("query", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
  key = register_module("key", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
  value = register_module("value", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
}

Tensor BertSelfAttention::forward(const Tensor& x, const Tensor& mask) {
  const int64_t b = x.size(0), l = x.size(1), e = x.size(2), d = e / heads;
  auto split = [&](const Tensor& t) { return t.view({b, l, heads, d}).transpose(1, 2); };
  const Tensor ctx = scaled_dot_product_attention(split((*query)(x)), split((*key)(x)), split((*value)(x)), mask,
                                                  dropout_p, is_training());
  return ctx.transpose(1, 2).reshape({b, l, e});
}

BertResidualOutput::BertResidualOutput(int64_t in, const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::Linear>(in, c.hidden_size));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout));
}

Tensor BertResidualOutput::forward(const Tensor& x, const Tensor& residual) {
  return (*LayerNorm)((*dropout)((*dense)(x)) + residual);
}

BertAttention::BertAttention(const BertConfig& c) {
  self = register_module("self", std::make_shared<BertSelfAttention>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.hidden_size, c));
}

Tensor BertAttention::forward(const Tensor& x, const Tensor& mask) { return output->forward(self->forward(x, mask), x); }

BertIntermediate::BertIntermediate(const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::Linear>(c.hidden_size, c.intermediate_size));
}

BertLayer::BertLayer(const BertConfig& c) {
  attention = register_module("attention", std::make_shared<BertAttention>(c));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c));
  output = register_module("output", std::make_shared<BertResidualOutput>(c.intermediate_size, c));
}

Tensor BertLayer::forward(const Tensor& x, const Tensor& mask) {
  const Tensor a = attention->forward(x, mask);
  return output->forward(intermediate->forward(a), a);
}

BertEncoder::BertEncoder(const BertConfig& c) {
  layer = register_module("layer", std::make_shared<nn::ModuleList<BertLayer>>());
  for (int64_t i = 0; i < c.num_layers; ++i) layer->push_back(std::make_shared<BertLayer>(c));
  recompute = c.recompute;
}

Tensor BertEncoder::forward(const Tensor& x, const Tensor& mask) {
  Tensor h = x;
  size_t index = 0;
  for (auto& l : *layer) {
    nn::BlockScope scope("encoder.layer", index++);
    if (!recompute) {
      h = l->forward(h, mask);
      continue;
    }
    BertLayer* one = l.get();
    h = autograd::checkpoint(
        [one](const std::vector<Tensor>& in) { return std::vector<Tensor>{one->forward(in[0], in[1])}; }, {h, mask})[0];
  }
  return h;
}

BertPooler::BertPooler(const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
}

BertModel::BertModel(const BertConfig& c, bool add_pooling_layer) : config(c) {
  check_config(c);
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<BertEncoder>(c));
  if (add_pooling_layer) pooler = register_module("pooler", std::make_shared<BertPooler>(c));
  init_bert_weights(*this, c.initializer_range);
}

BertOutputs BertModel::forward(const Tensor& ids, const Tensor& attention_mask, const Tensor& types) {
  KILN_CHECK(ids.dtype() == DType::i64 || ids.dtype() == DType::i32, "BERT: input_ids must be integer, got ",
             ids.type_str());
  if (attention_mask.defined())
    KILN_CHECK(attention_mask.shape() == ids.shape(), "BERT: attention_mask ", attention_mask.shape(),
               " must match input_ids ", ids.shape());
  if (types.defined())
    KILN_CHECK(types.shape() == ids.shape(), "BERT: token_type_ids ", types.shape(), " must match input_ids ",
               ids.shape());
  const Tensor h0 = embeddings->forward(ids, types);
  const Tensor mask = attention_mask.defined() ? nn::additive_padding_mask(attention_mask, h0.dtype()) : Tensor();
  BertOutputs out;
  out.last_hidden_state = encoder->forward(h0, mask);
  if (pooler) out.pooled_output = pooler->forward(out.last_hidden_state);
  return out;
}

BertForMaskedLM::Transform::Transform(const BertConfig& c) {
  dense = register_module("dense", std::make_shared<nn::Linear>(c.hidden_size, c.hidden_size));
  LayerNorm = register_module("LayerNorm", std::make_shared<nn::LayerNorm>(Shape{c.hidden_size}, c.layer_norm_eps));
}
BertForMaskedLM::Predictions::Predictions(const BertConfig& c) {
  transform = register_module("transform", std::make_shared<Transform>(c));
  bias = register_parameter("bias", zeros({c.vocab_size}));
}
BertForMaskedLM::Cls::Cls(const BertConfig& c) {
  predictions = register_module("predictions", std::make_shared<Predictions>(c));
}

BertForMaskedLM::BertForMaskedLM(const BertConfig& c) {
  bert = register_module("bert", std::make_shared<BertModel>(c, /*add_pooling_layer=*/false));
  cls = register_module("cls", std::make_shared<Cls>(c));
  init_bert_weights(*cls, c.initializer_range);
}

Tensor BertForMaskedLM::forward(const Tensor& ids, const Tensor& mask, const Tensor& types) {
  return head(bert->forward(ids, mask, types).last_hidden_state);
}

Tensor BertForMaskedLM::head(const Tensor& hidden) {
  const auto& t = *cls->predictions->transform;
  const Tensor h = (*t.LayerNorm)(gelu((*t.dense)(hidden)));
  // The decoder is tied to the word embeddings: the same tensor, so it trains once.
  return linear(h, bert->embeddings->word_embeddings->weight, cls->predictions->bias);
}

Tensor BertForMaskedLM::forward_at(const Tensor& ids, const Tensor& positions, const Tensor& mask, const Tensor& types) {
  KILN_CHECK(positions.dtype() == DType::i64 && positions.dim() == 1, "BertForMaskedLM::forward_at: positions must be "
             "i64 [P] (indices into the flattened [B*L] tokens), got ", positions.type_str());
  const Tensor hidden = bert->forward(ids, mask, types).last_hidden_state;
  return head(index_select(hidden.reshape({-1, hidden.size(-1)}), 0, positions));
}

BertForSequenceClassification::BertForSequenceClassification(const BertConfig& c) {
  KILN_CHECK(c.num_labels >= 1, "BERT: num_labels must be >= 1, got ", c.num_labels);
  bert = register_module("bert", std::make_shared<BertModel>(c));
  dropout = register_module("dropout", std::make_shared<nn::Dropout>(c.hidden_dropout));
  classifier = register_module("classifier", std::make_shared<nn::Linear>(c.hidden_size, c.num_labels));
  init_bert_weights(*classifier, c.initializer_range);
}

Tensor BertForSequenceClassification::forward(const Tensor& ids, const Tensor& mask, const Tensor& types) {
  return (*classifier)((*dropout)(bert->forward(ids, mask, types).pooled_output));
}

void init_bert_weights(nn::Module& m, double std) {
  for (auto& [name, p] : m.named_parameters()) {
    Tensor t = p;
    const bool is_ln = name.find("LayerNorm") != std::string::npos;
    if (is_ln) {
      if (name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0) nn::init::ones_(t);
      else nn::init::zeros_(t);
    } else if (t.dim() >= 2) {
      nn::init::normal_(t, 0.0, std);
    } else {
      nn::init::zeros_(t);
    }
  }
  // Embedding padding rows stay zero, as the reference implementation keeps them.
  for (auto& [name, p] : m.named_parameters())
    if (name == "embeddings.word_embeddings.weight" || name == "word_embeddings.weight") {
      Tensor t = p;
      NoGradGuard ng;
      t.select(0, 0).zero_();
    }
}

}  // namespace kiln::models

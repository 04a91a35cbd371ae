// The BERT family (Devlin et al.): embeddings, post-LayerNorm encoder layers, pooler, and the
// masked-LM and sequence-classification heads, under the parameter names of the common BERT
// checkpoints (bert.encoder.layer.0.attention.self.query.weight, cls.predictions.bias, ...).
#pragma once
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/nn.h"

namespace kiln::models {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position = 512;
  int64_t type_vocab_size = 2;
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double layer_norm_eps = 1e-12;
  double initializer_range = 0.02;
  int64_t num_labels = 2;  // sequence classification
  // Keep only each encoder layer's input for backward and run the layer again there
  // (autograd::checkpoint), replaying its dropout masks.
  bool recompute = false;
};
// The encoder's integer sizes, each with the least value it may take: (field, value, least). The
// model's own check and `--set`'s name a bad one by its field from this list.
using SizeField = std::tuple<const char*, int64_t, int64_t>;
std::vector<SizeField> size_fields(const BertConfig& c);
// "tiny" (2/128/2), "mini" (4/256/4), "small" (4/512/8), "base" (12/768/12), "large" (24/1024/16);
// intermediate size is 4 x hidden.
BertConfig bert_config(const std::string& size);
// The sizes bert_config takes, smallest first.
const std::vector<std::string>& bert_sizes();

class BertEmbeddings final : public nn::Module {
 public:
  explicit BertEmbeddings(const BertConfig& c);
  std::string type_name() const override { return "BertEmbeddings"; }
  // input_ids, token_type_ids [B, L] (token types may be undefined: all 0).
  Tensor forward(const Tensor& input_ids, const Tensor& token_type_ids);
  std::shared_ptr<nn::Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

class BertSelfAttention final : public nn::Module {
 public:
  explicit BertSelfAttention(const BertConfig& c);
  std::string type_name() const override { return "BertSelfAttention"; }
  Tensor forward(const Tensor& x, const Tensor& mask);
  std::shared_ptr<nn::Linear> query, key, value;
  int64_t heads;
  double dropout_p;
};

// dense -> dropout -> LayerNorm(x + residual): BertSelfOutput and BertOutput.
class BertResidualOutput final : public nn::Module {
 public:
  BertResidualOutput(int64_t in, const BertConfig& c);
  std::string type_name() const override { return "BertOutput"; }
  Tensor forward(const Tensor& x, const Tensor& residual);
  std::shared_ptr<nn::Linear> dense;
  std::shared_ptr<nn::LayerNorm> LayerNorm;
  std::shared_ptr<nn::Dropout> dropout;
};

class BertAttention final : public nn::Module {
 public:
  explicit BertAttention(const BertConfig& c);
  std::string type_name() const override { return "BertAttention"; }
  Tensor forward(const Tensor& x, const Tensor& mask);
  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<BertResidualOutput> output;
};

class BertIntermediate final : public nn::Module {
 public:
  explicit BertIntermediate(const BertConfig& c);
  std::string type_name() const override { return "BertIntermediate"; }
  Tensor forward(const Tensor& x) { return gelu((*dense)(x)); }
  std::shared_ptr<nn::Linear> dense;
};

class BertLayer final : public nn::Module {
 public:
  explicit BertLayer(const BertConfig& c);
  std::string type_name() const override { return "BertLayer"; }
  Tensor forward(const Tensor& x, const Tensor& mask);
  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertResidualOutput> output;
};

class BertEncoder final : public nn::Module {
 public:
  explicit BertEncoder(const BertConfig& c);
  std::string type_name() const override { return "BertEncoder"; }
  Tensor forward(const Tensor& x, const Tensor& mask);
  std::shared_ptr<nn::ModuleList<BertLayer>> layer;
  bool recompute = false;  // BertConfig::recompute
};

class BertPooler final : public nn::Module {
 public:
  explicit BertPooler(const BertConfig& c);
  std::string type_name() const override { return "BertPooler"; }
  // tanh(dense(hidden[:, 0])): the [CLS] position.
  Tensor forward(const Tensor& hidden) { return tanh((*dense)(hidden.select(1, 0))); }
  std::shared_ptr<nn::Linear> dense;
};

struct BertOutputs {
  Tensor last_hidden_state;  // [B, L, H]
  Tensor pooled_output;      // [B, H]; undefined without a pooler
};

class BertModel final : public nn::Module {
 public:
  // add_pooling_layer false: no pooler (its parameters are not created), as a masked-LM model has
  // none: its head reads every position, never the pooled [CLS].
  explicit BertModel(const BertConfig& c, bool add_pooling_layer = true);
  std::string type_name() const override { return "BertModel"; }
  // input_ids [B, L] i64; attention_mask [B, L] (1 keep, 0 pad) or undefined; token_type_ids or undefined.
  BertOutputs forward(const Tensor& input_ids, const Tensor& attention_mask = {}, const Tensor& token_type_ids = {});
  BertConfig config;
  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<BertEncoder> encoder;
  std::shared_ptr<BertPooler> pooler;  // null without a pooling layer
};

// Masked-LM head: cls.predictions.transform (dense + GELU + LayerNorm), a decoder tied to the word
// embeddings, and cls.predictions.bias. Its BertModel has no pooler (as a Hugging Face BertForMaskedLM
// checkpoint has none).
class BertForMaskedLM final : public nn::Module {
 public:
  explicit BertForMaskedLM(const BertConfig& c);
  std::string type_name() const override { return "BertForMaskedLM"; }
  // Logits over the vocabulary [B, L, V].
  Tensor forward(const Tensor& input_ids, const Tensor& attention_mask = {}, const Tensor& token_type_ids = {});
  // Logits [P, V] at `positions` (i64 indices into the flattened B*L tokens) only: masked-LM training
  // scores about 15% of the tokens, so the vocabulary projection runs on those alone.
  Tensor forward_at(const Tensor& input_ids, const Tensor& positions, const Tensor& attention_mask = {},
                    const Tensor& token_type_ids = {});
  // The prediction head on hidden states [..., H] -> [..., V].
  Tensor head(const Tensor& hidden);
  std::shared_ptr<BertModel> bert;
  struct Transform final : nn::Module {
    explicit Transform(const BertConfig& c);
    std::string type_name() const override { return "BertPredictionHeadTransform"; }
    std::shared_ptr<nn::Linear> dense;
    std::shared_ptr<nn::LayerNorm> LayerNorm;
  };
  struct Predictions final : nn::Module {
    explicit Predictions(const BertConfig& c);
    std::string type_name() const override { return "BertLMPredictionHead"; }
    std::shared_ptr<Transform> transform;
    Tensor bias;
  };
  struct Cls final : nn::Module {
    explicit Cls(const BertConfig& c);
    std::string type_name() const override { return "BertOnlyMLMHead"; }
    std::shared_ptr<Predictions> predictions;
  };
  std::shared_ptr<Cls> cls;
};

class BertForSequenceClassification final : public nn::Module {
 public:
  explicit BertForSequenceClassification(const BertConfig& c);
  std::string type_name() const override { return "BertForSequenceClassification"; }
  // Logits [B, num_labels].
  Tensor forward(const Tensor& input_ids, const Tensor& attention_mask = {}, const Tensor& token_type_ids = {});
  std::shared_ptr<BertModel> bert;
  std::shared_ptr<nn::Dropout> dropout;
  std::shared_ptr<nn::Linear> classifier;
};

// Initialises every Linear/Embedding weight from N(0, initializer_range), biases 0, LayerNorm 1/0.
void init_bert_weights(nn::Module& m, double std);

}  // namespace kiln::models

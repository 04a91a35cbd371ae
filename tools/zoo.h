// Model names on the command line (resnet20, bert-base-mlm, ...) and `--set key=value` overrides,
// shared by `kiln forward`, `kiln train`, `kiln eval` and `kiln bench`.
#pragma once
#include <string>
#include <vector>

#include "models/bert.h"
#include "models/resnet.h"

namespace kiln::tools {

// Applies `key=value` overrides to a ResNet config (num_classes, in_channels, zero_init_residual).
models::ResNetConfig resnet_config_from(const std::string& name, const std::vector<std::string>& sets);

struct BertName {
  std::string size;  // tiny, mini, small, base, large
  std::string head;  // "", "mlm" or "cls"
};
// "bert-tiny", "bert-base-mlm", "bert-small-cls"; anything else is an error listing the known names.
BertName parse_bert_name(const std::string& name);
// The size's config with `key=value` overrides (vocab_size, hidden_size, num_layers, ...).
models::BertConfig bert_config_from(const std::string& size, const std::vector<std::string>& sets);

// Old BERT checkpoints name LayerNorm parameters gamma/beta and carry the tied decoder and position
// ids: `in` with those mapped onto Kiln's names (`mine`: the model's state dict).
nn::StateDict normalise_checkpoint_names(const nn::StateDict& in, const nn::StateDict& mine);

}  // namespace kiln::tools

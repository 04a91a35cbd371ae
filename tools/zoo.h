// Models by name on the command line (resnet20, bert-base-mlm, ...): one table of model families,
// each with every name it takes and how it builds them with `--set key=value` overrides. `kiln
// forward`, `kiln train`, `kiln eval`, `kiln bench` and `kiln ckpt import` look names up here, and
// an unknown name's error lists the table's names; a new family is one row of model_families().
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/bert.h"
#include "models/resnet.h"

namespace kiln::tools {

// What a family's models take: the tasks, defaults and checks of `kiln train` and the synthetic
// batches of `kiln bench train` follow it.
enum class ModelInput {
  images,  // [N, C, H, W] batches: image classification
  tokens,  // input_ids (attention_mask, token_type_ids): masked LM, text classification
};

// One model ready for `kiln forward` and `kiln ckpt import`: the module, the tensors its forward
// takes (by name, from a safetensors file), and that forward by name.
struct BuiltModel {
  std::shared_ptr<nn::Module> module;
  std::vector<std::string> input_names;
  // in: the inputs by name (from `file`, which a missing one's error names) -> the outputs by
  // name, "output" first among them.
  std::function<std::map<std::string, Tensor>(const std::map<std::string, Tensor>& in, const std::string& file)> run;
};

struct ModelFamily {
  const char* name;                // "ResNet", "BERT": what messages call the family
  ModelInput input;
  std::vector<std::string> names;  // every --model value of the family, in the order they are listed
  // The model `name` (one of names) with `key=value` overrides; deterministic: dropout off whatever
  // the config says (`kiln forward` compares outputs with other frameworks).
  BuiltModel (*build)(const std::string& name, const std::vector<std::string>& sets, bool deterministic);
};

const std::vector<ModelFamily>& model_families();
// The family that takes `name`, or null.
const ModelFamily* find_model_family(const std::string& name);
// The family that takes `name`; an unknown name is an error listing every name of the table.
const ModelFamily& model_family(const std::string& name);
// "--model NAME: unknown (expected one of resnet20, ..., bert-large-cls)": the error of an unknown
// name, for a caller that collects errors rather than throwing.
std::string unknown_model_message(const std::string& name);
// Every name of the table, comma-separated (for --help).
std::string model_names_text();

// The model `kiln train --model name --task task` builds, by its full name: a BERT name is
// bert-SIZE-cls under --task classify and bert-SIZE-mlm under mlm (or no task, its default), whatever
// head the name says; any other name is itself. Two runs' weights have the same tensors only if these match.
std::string trained_model_name(const std::string& name, const std::string& task);

// Applies `key=value` overrides to a ResNet config (num_classes, in_channels, zero_init_residual).
models::ResNetConfig resnet_config_from(const std::string& name, const std::vector<std::string>& sets);

struct BertName {
  std::string size;  // one of models::bert_sizes()
  std::string head;  // "", "mlm" or "cls"
};
// A BERT family name ("bert-tiny", "bert-base-mlm", "bert-small-cls") split; anything else is
// the unknown-model error.
BertName parse_bert_name(const std::string& name);
// The size's config with `key=value` overrides (vocab_size, hidden_size, num_layers, ...).
models::BertConfig bert_config_from(const std::string& size, const std::vector<std::string>& sets);

// The `--set` overrides (key=value, Kiln's keys) of a Hugging Face BERT config.json at `path`:
// hidden_size, num_hidden_layers (num_layers), num_attention_heads (num_heads), intermediate_size,
// vocab_size, max_position_embeddings (max_position), type_vocab_size, layer_norm_eps,
// hidden_dropout_prob (hidden_dropout), attention_probs_dropout_prob (attention_dropout) and
// num_labels (or id2label's count), each absent key at transformers' BertConfig default. What Kiln's
// BERT does not compute (hidden_act other than gelu, the exact one; position_embedding_type other
// than absolute; a decoder; pad_token_id other than 0; a model_type other than bert; ...) is an error
// naming the file, the key and its value, rather than a model that loads and gives other numbers.
std::vector<std::string> hf_bert_config_sets(const std::string& path);
// The overrides of a command with --hf-config (`hf_config`, or "" for none) and --set (`sets`, after
// it, so a --set given wins) for `model`; a config given for a model outside the BERT family is an
// error naming both.
std::vector<std::string> sets_with_hf_config(const std::string& model, const std::string& hf_config,
                                             const std::vector<std::string>& sets);

// The metadata every safetensors file of model weights Kiln writes starts with (kiln train's
// model.safetensors, kiln ckpt export's and consolidate's): "format" "pt", as torch's save_file
// writes, since the names, dtypes and layout are torch's and Hugging Face's transformers 4.x refuses
// any other format (pt, tf, flax, mlx) in from_pretrained; "writer" "kiln" says who wrote it (no
// reader needs it; files before it said "format" "kiln" and load the same).
inline std::map<std::string, std::string> torch_compatible_metadata() { return {{"format", "pt"}, {"writer", "kiln"}}; }

// A --set's key=value, spaces around each dropped; one without '=' or a key is refused.
std::pair<std::string, std::string> split_set(const std::string& kv);

// The model config `sets` make of model `name`'s defaults, as (field, value) text: what a resume compares,
// so the same config written another way (keys in another order, zero_init_residual=1 or =true, a
// default given) is the same. recompute is left out: it changes the memory, not the model; so is
// initializer_range: it changes only the weights a model starts from, which a resume loads.
std::vector<std::pair<std::string, std::string>> model_config_fields(const std::string& name,
                                                                     const std::vector<std::string>& sets);
// Whether a model_config_fields field must match between weights and the model they load into: not
// dropout or zero_init_residual (a run's choice, not what the weights compute), and num_labels only
// for a classifier (a masked LM neither builds nor loads that head; an import's --hf-config names it
// for any BERT).
bool weights_config_field(const std::string& field, bool classifier);

// Old BERT checkpoints name LayerNorm parameters gamma/beta and carry the tied decoder and position
// ids, and Hugging Face's name the encoder under "bert.": `in` with those mapped onto Kiln's names
// (`mine`: the model's state dict; "bert." is stripped for an encoder-only model, and added to a bare
// encoder's names, embeddings./encoder./pooler., for a headed one). A decoder weight
// that differs from the word embeddings the model ties it to, or cls.predictions.decoder.bias
// differing from cls.predictions.bias, is an error naming both (`file` names the checkpoint). For
// any model, a batch norm's missing num_batches_tracked (weights saved before PyTorch 0.4.1) is 0 when
// the layer's running_mean is there; the BERT mappings apply only to a BERT model.
nn::StateDict normalise_checkpoint_names(const nn::StateDict& in, const nn::StateDict& mine,
                                         const std::string& file = {});

// Removes from `in` the tensors of a checkpoint (names normalised) that model `m` has no parameter for
// and never needs: the family's other heads (BERT masked LM: a pretraining checkpoint's pooler and
// next-sentence head, or an older Kiln masked-LM checkpoint's pooler; classification: the pretraining
// heads, cls.*), and says so on stderr: "WHO: ignored 2 tensors of FILE that MODEL does not use: a, b".
void drop_unused_heads(const nn::Module& m, nn::StateDict& in, const std::string& file, const std::string& model,
                       const char* who);
// drop_unused_heads without the print: returns what it would say after "WHO: " ("" when nothing was
// dropped), for a caller that says it its own way (Python's from_pretrained, as a warning).
std::string remove_unused_heads(const nn::Module& m, nn::StateDict& in, const std::string& file,
                                const std::string& model);

}  // namespace kiln::tools

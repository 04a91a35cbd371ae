// `kiln forward`: run one model on inputs from a safetensors file and write its outputs (and, with
// --grad-output, the gradients of every parameter and floating input), so Kiln can be checked
// against any other framework tensor by tensor.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/nn.h"
#include "io/safetensors.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "tools/commands.h"
#include "tools/zoo.h"

namespace kiln::tools {

void add_forward_flags(CLI::App& app, ForwardOptions& o) {
  app.add_option("--model", o.model, "resnet20..resnet152, bert-SIZE, bert-SIZE-mlm, bert-SIZE-cls (SIZE: tiny mini small base large)")
      ->required();
  app.add_option("--set", o.sets, "Override a config field, key=value (repeatable)");
  app.add_option("--weights", o.weights, "Weights (safetensors)")->required()->check(CLI::ExistingFile);
  app.add_option("--inputs", o.inputs, "Inputs (safetensors): input, or input_ids/attention_mask/token_type_ids")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--out", o.out, "Where to write the outputs (safetensors)")->required();
  app.add_flag("--train", o.train, "Training-mode batch norm (batch statistics); dropout stays off");
  app.add_option("--grad-output", o.grad_output, "Gradient of `output` to backpropagate (safetensors)")
      ->check(CLI::ExistingFile);
  app.add_flag("--allow-missing", o.allow_missing, "Start parameters missing from --weights from the initializer");
}

namespace {

struct Built {
  std::shared_ptr<nn::Module> module;
  std::function<std::map<std::string, Tensor>(const std::map<std::string, Tensor>&)> run;
  std::vector<std::string> input_names;
};

const Tensor& need(const std::map<std::string, Tensor>& in, const std::string& name, const std::string& file) {
  auto it = in.find(name);
  KILN_CHECK(it != in.end(), file, ": no tensor named '", name, "'");
  return it->second;
}

Built build(const ForwardOptions& o) {
  Built b;
  if (models::is_resnet_name(o.model)) {
    const models::ResNetConfig c = resnet_config_from(o.model, o.sets);
    auto m = models::make_resnet(c);
    b.module = m;
    b.input_names = {"input"};
    b.run = [m, file = o.inputs](const std::map<std::string, Tensor>& in) {
      return std::map<std::string, Tensor>{{"output", (*m)(need(in, "input", file))}};
    };
    return b;
  }
  const BertName bn = parse_bert_name(o.model);
  const std::string& head = bn.head;
  models::BertConfig c = bert_config_from(bn.size, o.sets);
  // Deterministic outputs: dropout is always off here (eval, and --train means batch-norm mode only).
  c.hidden_dropout = c.attention_dropout = 0.0;
  b.input_names = {"input_ids", "attention_mask", "token_type_ids"};
  const std::string file = o.inputs;
  auto opt = [](const std::map<std::string, Tensor>& in, const char* n) {
    auto it = in.find(n);
    return it == in.end() ? Tensor() : it->second;
  };
  if (head == "mlm") {
    auto m = std::make_shared<models::BertForMaskedLM>(c);
    b.module = m;
    b.run = [m, file, opt](const std::map<std::string, Tensor>& in) {
      return std::map<std::string, Tensor>{
          {"output", m->forward(need(in, "input_ids", file), opt(in, "attention_mask"), opt(in, "token_type_ids"))}};
    };
  } else if (head == "cls") {
    auto m = std::make_shared<models::BertForSequenceClassification>(c);
    b.module = m;
    b.run = [m, file, opt](const std::map<std::string, Tensor>& in) {
      const models::BertOutputs bo =
          m->bert->forward(need(in, "input_ids", file), opt(in, "attention_mask"), opt(in, "token_type_ids"));
      return std::map<std::string, Tensor>{{"output", (*m->classifier)((*m->dropout)(bo.pooled_output))},
                                           {"pooled_output", bo.pooled_output}};
    };
  } else {
    auto m = std::make_shared<models::BertModel>(c);
    b.module = m;
    b.run = [m, file, opt](const std::map<std::string, Tensor>& in) {
      const models::BertOutputs bo =
          m->forward(need(in, "input_ids", file), opt(in, "attention_mask"), opt(in, "token_type_ids"));
      return std::map<std::string, Tensor>{{"output", bo.last_hidden_state}, {"pooled_output", bo.pooled_output}};
    };
  }
  return b;
}

}  // namespace

int run_forward(const ForwardOptions& o) {
  Built b = build(o);
  nn::Module& m = *b.module;
  // Weights: every mismatch reported at once.
  const io::SafetensorsFile wf = io::load_safetensors(o.weights);
  const nn::StateDict mine = m.state_dict();
  const nn::StateDict given = normalise_checkpoint_names(wf.tensors, mine);
  std::vector<std::string> missing, unexpected;
  for (const auto& [n, t] : mine)
    if (!given.count(n)) missing.push_back(n);
  for (const auto& [n, t] : given)
    if (!mine.count(n)) unexpected.push_back(n);
  std::string problems;
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
  if (!unexpected.empty()) problems += "\n  unexpected: " + list(unexpected);
  if (!missing.empty() && !o.allow_missing) problems += "\n  missing (use --allow-missing to initialise them): " + list(missing);
  KILN_CHECK(problems.empty(), o.weights, " does not match --model ", o.model, ":", problems);
  m.load_state_dict(given, /*strict=*/false);  // shapes are still checked, every mismatch listed
  m.train(o.train);

  const io::SafetensorsFile inf = io::load_safetensors(o.inputs);
  std::map<std::string, Tensor> inputs;
  for (const auto& [n, t] : inf.tensors) {
    KILN_CHECK(std::find(b.input_names.begin(), b.input_names.end(), n) != b.input_names.end(), o.inputs,
               ": unexpected tensor '", n, "' (this model takes ", list(b.input_names), ")");
    Tensor x = t;
    if (is_floating(x.dtype()) && !o.grad_output.empty()) x = x.to(DType::f32).detach().set_requires_grad();
    inputs[n] = x;
  }
  std::map<std::string, Tensor> outs;
  {
    std::unique_ptr<NoGradGuard> ng;
    if (o.grad_output.empty()) ng = std::make_unique<NoGradGuard>();
    outs = b.run(inputs);
  }
  std::map<std::string, Tensor> write;
  for (const auto& [n, t] : outs) write[n] = t.detach();
  if (!o.grad_output.empty()) {
    const io::SafetensorsFile gf = io::load_safetensors(o.grad_output);
    const Tensor& g = need(gf.tensors, "output", o.grad_output);
    KILN_CHECK(g.shape() == outs.at("output").shape(), o.grad_output, ": 'output' has shape ", g.shape(),
               ", the model's output has ", outs.at("output").shape());
    outs.at("output").backward(g.to(outs.at("output").dtype()));
    for (const auto& [n, p] : m.named_parameters()) {
      const Tensor gp = p.grad();
      write["grad." + n] = gp.defined() ? gp : zeros_like(p);
    }
    for (const auto& [n, x] : inputs)
      if (is_floating(x.dtype())) write["grad." + n] = x.grad().defined() ? x.grad() : zeros_like(x);
  }
  io::save_safetensors(o.out, write, {{"model", o.model}, {"mode", o.train ? "train" : "eval"}});
  std::printf("wrote %zu tensors to %s\n", write.size(), o.out.c_str());
  return 0;
}

}  // namespace kiln::tools

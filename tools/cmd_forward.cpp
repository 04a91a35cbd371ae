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
#include "io/weights.h"
#include "tools/cli_checks.h"
#include "tools/commands.h"
#include "tools/zoo.h"

namespace kiln::tools {

void add_forward_flags(CLI::App& app, ForwardOptions& o) {
  app.add_option("--model", o.model, "One of " + model_names_text())->required();
  app.add_option("--set", o.sets, "Override a config field, key=value (repeatable)");
  app.add_option("--hf-config", o.hf_config,
                 "A Hugging Face BERT config.json: its sizes as --set (a --set given wins); what Kiln's BERT "
                 "does not compute (hidden_act gelu_new, relative positions, ...) is refused")
      ->check(CLI::ExistingFile);
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

int run_forward(const ForwardOptions& o) {
  if (const std::string clash = output_is_input("--out", o.out, {o.weights, o.inputs, o.grad_output}); !clash.empty()) {
    std::fprintf(stderr, "kiln forward: error: %s\n", clash.c_str());
    return 2;
  }
  // Dropout off: the outputs are deterministic (--train means batch-norm mode only).
  const BuiltModel b =
      model_family(o.model).build(o.model, sets_with_hf_config(o.model, o.hf_config, o.sets), /*deterministic=*/true);
  nn::Module& m = *b.module;
  // Weights
  const io::SafetensorsFile wf = io::load_safetensors(o.weights);
  const nn::StateDict mine = m.state_dict();
  nn::StateDict given = normalise_checkpoint_names(wf.tensors, mine, o.weights);
  drop_unused_heads(m, given, o.weights, o.model, "kiln forward");
  // Every mismatch at once, naming the file (missing names are fine with --allow-missing).
  io::check_weights(m, given, o.weights, o.allow_missing, ", use --allow-missing to initialise them");
  m.load_state_dict(given, /*strict=*/false);  // shapes are still checked, every mismatch listed
  m.train(o.train);

  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  };
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
    try {
      outs = b.run(inputs, o.inputs);
    } catch (const OutOfMemory&) {
      throw;  // kept as it is: callers (Python's run(), the CLI) treat it apart
    } catch (const Interrupted&) {
      throw;
    } catch (const Error& e) {
      // The model's own errors ("conv2d: ...") would not say which file's tensors it was given.
      const std::string msg = e.message();
      if (msg.rfind(o.inputs + ": ", 0) == 0) throw;
      KILN_FAIL(o.inputs, ": running ", o.model, " on its tensors failed: ", msg);
    }
  }
  std::map<std::string, Tensor> write;
  for (const auto& [n, t] : outs) write[n] = t.detach();
  if (!o.grad_output.empty()) {
    const io::SafetensorsFile gf = io::load_safetensors(o.grad_output);
    const auto gi = gf.tensors.find("output");
    KILN_CHECK(gi != gf.tensors.end(), o.grad_output, ": no tensor named 'output'");
    const Tensor& g = gi->second;
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

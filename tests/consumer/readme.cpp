// The C++ snippets of README.md ("Using Kiln from your own CMake project"), verbatim, so the
// includes and calls it teaches keep compiling against an installed Kiln. Compiled, not run (the
// second writes a file).
#include <kiln/kiln.h>
using namespace kiln;

void readme_autograd() {
  Tensor x = randn({32, 64}), y = randn({32, 10});
  Tensor w = randn({64, 10}).set_requires_grad();
  Tensor loss = mean(pow(matmul(x, w) - y, 2.0));
  loss.backward();  // w.grad() now holds d loss / d w
}

#include <kiln/io/checkpoint.h>   // io::save_checkpoint, io::CheckpointReader
#include <kiln/io/data.h>         // io::Dataset, io::DataLoader, io::Batch
#include <kiln/io/safetensors.h>  // io::save_safetensors, io::load_safetensors
#include <kiln/models/bert.h>     // models::BertModel, models::BertForMaskedLM
#include <kiln/models/resnet.h>   // models::make_resnet

void readme_models() {
  auto model = models::make_resnet({.name = "resnet20", .num_classes = 10});
  io::save_safetensors("resnet20.safetensors", model->state_dict());
  model->load_state_dict(io::load_safetensors("resnet20.safetensors").tensors);
}

// Weights from a file (safetensors, a checkpoint) into a model: every tensor checked against the
// parameter or buffer it fills before any value is copied, each problem naming the file and tensor.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "engine/nn.h"

namespace kiln::io {

// Whether a tensor stored as `stored` may fill a parameter or buffer of dtype `expected`: floating
// dtypes convert to each other (f64, f16, bf16 -> f32 and back) and integer ones to each other, but
// an integer or bool tensor is never converted to a floating one or the reverse: the bytes of a
// mislabelled tensor would load as silently wrong numbers.
bool dtype_fits(DType stored, DType expected);
// "dtype of NAME: stored i32, model f32 (...)": the problem of loading a tensor stored as `stored`
// into the model's `name` of dtype `expected`, or "" when it fits.
std::string dtype_problem(const std::string& name, DType stored, DType expected);

// What a file holds under a name, without its values.
struct StoredTensor {
  Shape shape;
  DType dtype = DType::f32;
};
// The lines of what keeps `stored` from loading into a model whose state dict is `mine` (empty when
// it loads): the missing names (unless allow_missing; `missing_hint` follows their count), the
// unexpected ones, and each shape or dtype difference, every list cut to its first 10 and a count.
// `where` names the file's side in a shape line ("checkpoint", "file").
std::vector<std::string> weights_mismatch(const nn::StateDict& mine, const std::map<std::string, StoredTensor>& stored,
                                          bool allow_missing, const std::string& where,
                                          const std::string& missing_hint = "");
// "a [3,4], b [5], ... and 29 more": the names of `tensors` with their shapes for a one-line
// message, cut as weights_mismatch cuts its lists.
std::string names_with_shapes(const nn::StateDict& tensors);
// Throws "FILE does not match the model:" and those lines when `given` cannot load into `model`
// (load_state_dict's own message names no file and lists every name).
void check_weights(const nn::Module& model, const nn::StateDict& given, const std::string& file,
                   bool allow_missing = false, const std::string& missing_hint = "");

}  // namespace kiln::io

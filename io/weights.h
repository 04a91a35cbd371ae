// Weights from a file (safetensors, a checkpoint) into a model: every tensor checked against the
// parameter or buffer it fills before any value is copied, each problem naming the file and tensor.
#pragma once
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
// Throws, naming `file`, when any tensor of `given` has a dtype that cannot fill the model's tensor
// of the same name (names the model lacks are left to the caller's name check).
void check_weight_dtypes(const nn::Module& model, const nn::StateDict& given, const std::string& file);

}  // namespace kiln::io

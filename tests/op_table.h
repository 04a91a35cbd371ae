// The op table: one row per op (or per variant of an op worth its own inputs), the only list the op
// tests read. Each row names the public functions it exercises, its inputs (shapes and value
// kinds), the computation, a plain f64 reference where one is short to write (otherwise the CPU
// backend in f64 is the reference), whether it has gradients, its tolerances and its autocast rule.
// One harness runs every row (tests/test_op_table.cpp on the CPU, tests/test_gpu_parity.cpp on
// CUDA, bench/ops.cpp for timings). Adding an op means adding a row in op_table.cpp; a test fails
// when a public op of engine/ops.h or engine/nn_ops.h, or an op recorded with autograd, has none.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/autocast.h"
#include "engine/context.h"
#include "engine/tensor.h"

namespace kiln::optable {

enum class Kind {
  normal,    // N(0, 1)
  positive,  // U[0.5, 1.5)
  unit,      // U[0, 1)
  nonzero,   // N(0, 1) moved at least 0.1 away from 0 (kinks of abs, relu, sign)
  index,     // i64 in [0, hi)
  mask,      // bool, about 30% true
};
struct In {
  Shape shape;
  Kind kind = Kind::normal;
  int64_t hi = 0;     // indices: [0, hi)
  bool grad = true;   // floating inputs: differentiated (false: a buffer such as running statistics)
};

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Row {
  std::string name;
  std::vector<In> inputs;
  Fn fn;                               // inputs (any device and dtype) -> outputs
  std::vector<std::string> ops;        // public functions exercised; {name} when not set
  Fn reference;                        // plain f64 code on f64 CPU inputs; empty: fn in f64 on the CPU
  std::optional<amp::AutocastOp> rule; // the autocast rule its first output follows; none: not checked
  double tol32 = 2e-4;                 // f32: against the f64 reference, and CUDA against the CPU
  double tol16 = 2e-2;                 // f16 and bf16 (bf16 against f64: 4x, for its 8 significant bits)
  bool lowp = true;                    // also run in f16 and bf16
  bool grad = true;                    // gradients against finite differences (f64)
  std::string no_f64_reference;        // why f32 is not compared with f64 (random streams per dtype)

  Row& covers(std::vector<std::string> names) { ops = std::move(names); return *this; }
  Row& ref(Fn f) { reference = std::move(f); return *this; }
  Row& autocast(amp::AutocastOp op) { rule = op; return *this; }
  Row& tol(double t16, double t32 = 2e-4) { tol16 = t16; tol32 = t32; return *this; }
  Row& f32_only() { lowp = false; return *this; }
  Row& no_grad() { grad = false; return *this; }
  Row& dtype_dependent(std::string why) { no_f64_reference = std::move(why); return *this; }
};

// Every row, in a fixed order; names are unique.
const std::vector<Row>& rows();
const Row* find_row(const std::string& name);

// ---- the harness ----

// Whether an input is made transposed (stored with its last two dims swapped, then viewed back) in
// the non-contiguous runs.
bool transposable(const In& in);
// A row's inputs on the CPU: drawn in f64 from Generator(seed), rounded to `dt` (floating inputs),
// stored transposed when `transposed`.
std::vector<Tensor> make_inputs(const Row& row, DType dt, bool transposed, uint64_t seed = 1234);
// Runs a row on `dev` from CPU inputs (transposed ones viewed back), then backward of
// sum(w_i * out_i) for random w_i; returns the outputs, then one gradient per input (undefined
// where none), all on the CPU. As `dtype`: the inputs converted to it first (f64 for a reference).
struct RunResult {
  std::vector<Tensor> outputs;
  std::vector<Tensor> grads;
};
RunResult run_row(const Row& row, const std::vector<Tensor>& cpu_inputs, bool transposed, Device dev,
                  std::optional<DType> dtype = std::nullopt, uint64_t grad_seed = 99);
// The timing mode's work for one row (bench/ops.cpp): the row's f32 inputs put on `dev` once
// (floating ones leaves wanting gradients where the row differentiates them) and, from one untimed
// forward, an N(0, 1) upstream gradient for each differentiable output, drawn on `dev` once.
// `forward` runs the op under NoGradGuard; `forward_backward` runs it, backward(gy) from those
// outputs, then clears the inputs' .grad: nothing is copied, cast or reduced beyond the op itself
// (run_row builds a loss and copies to the CPU: it is for correctness, not timing). Empty
// `forward_backward` when no output is differentiable.
struct TimedStep {
  std::vector<Tensor> inputs;  // on `dev`
  std::function<void()> forward;
  std::function<void()> forward_backward;
};
TimedStep timed_step(const Row& row, Device dev);
// Largest |a - b| / (1 + |b|), NaN matching NaN only and infinities matching exactly; +inf when
// the shapes differ.
double worst_error(const Tensor& got, const Tensor& want);
// Compares two runs result by result; returns "" or a message naming the row, the result and the
// error. `what` says which comparison this is.
std::string compare(const Row& row, const RunResult& got, const RunResult& want, double tol, const std::string& what);

// Parity of a device with the CPU: the row through `got` (the device under test, from the CPU
// inputs) against run_row on the CPU, in f32 with tol32 and, where lowp, f16 and bf16 with tol16,
// contiguous and (where an input is transposable) non-contiguous. Returns every failure's message
// (`who` names the device in them); empty when all agree.
using Runner = std::function<RunResult(const std::vector<Tensor>& cpu_inputs, bool transposed)>;
std::vector<std::string> parity(const Row& row, const std::string& who, const Runner& got);

// The deterministic mode for a CUDA run inside a row (the CPU has one mode); the Context's guard
// restores the settings at scope exit.
class DeterministicOnCuda {
 public:
  explicit DeterministicOnCuda(const Tensor& x);

 private:
  ContextGuard guard_;
};

}  // namespace kiln::optable

// The op table's CPU harness (rows in tests/op_table.cpp): every row against its plain f64
// reference, in f32/f16/bf16 against f64 with contiguous and non-contiguous inputs, gradients
// against finite differences, the autocast rule, and the check that every public op and every op
// the models record has a row. CUDA against the CPU is tests/test_gpu_parity.cpp, over the same rows.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>

#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/gradcheck.h"
#include "engine/nn_ops.h"
#include "engine/ops.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "tests/op_table.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::optable;
using namespace kiln::models;

namespace {

bool any_transposable(const Row& r) {
  for (const In& in : r.inputs)
    if (transposable(in)) return true;
  return false;
}

// The names record() is called with, while a RecordNames is alive.
std::mutex g_names_mu;
std::set<std::string>* g_names = nullptr;
struct RecordNames {
  std::set<std::string> names;
  RecordNames() {
    g_names = &names;
    autograd::set_record_observer([](const char* n) {
      const std::lock_guard<std::mutex> lock(g_names_mu);
      if (g_names) g_names->insert(n);
    });
  }
  ~RecordNames() {
    autograd::set_record_observer(nullptr);
    g_names = nullptr;
  }
  RecordNames(const RecordNames&) = delete;
  RecordNames& operator=(const RecordNames&) = delete;
};

// The free functions a public header declares (operators and helpers excluded by the regex).
std::set<std::string> declared_functions(const std::string& header) {
  std::ifstream f(std::string(KILN_TEST_SOURCE_DIR) + "/../" + header);
  REQUIRE_MESSAGE(f.good(), "cannot read ", header);
  const std::regex decl(R"(^(?:template <[^>]*> )?(?:[A-Za-z_:<>]+ )+([a-z_0-9]+)\()");
  std::set<std::string> out;
  for (std::string line; std::getline(f, line);) {
    std::smatch m;
    if (std::regex_search(line, m, decl)) out.insert(m[1]);
  }
  return out;
}

}  // namespace

TEST_CASE("op table: row names are unique and every row names what it covers") {
  std::set<std::string> names;
  for (const Row& r : rows()) {
    CHECK_MESSAGE(names.insert(r.name).second, "two rows named ", r.name);
    CHECK_MESSAGE(!r.ops.empty(), r.name);
    CHECK_MESSAGE(find_row(r.name) == &r, r.name);
  }
  CHECK(rows().size() >= 50);
}

TEST_CASE("op table: each plain f64 reference equals the op in f64") {
  int checked = 0;
  for (const Row& r : rows()) {
    if (!r.reference) continue;
    const std::vector<Tensor> in = make_inputs(r, DType::f64, false);
    const RunResult got = run_row(r, in, false, kCPU);
    RunResult want;
    want.outputs = r.reference(in);
    want.grads = got.grads;  // the plain references are forward only
    const std::string err = compare(r, got, want, 1e-12, "f64 against the plain reference");
    CHECK_MESSAGE(err.empty(), err);
    ++checked;
  }
  CHECK(checked >= 20);
}

TEST_CASE("op table: f32, f16 and bf16 on the CPU against f64, contiguous and non-contiguous") {
  for (const Row& r : rows()) {
    if (!r.no_f64_reference.empty()) continue;
    std::vector<DType> dts = {DType::f32};
    if (r.lowp) dts.insert(dts.end(), {DType::f16, DType::bf16});
    for (DType dt : dts)
      for (bool transposed : {false, true}) {
        if (transposed && !any_transposable(r)) continue;
        // Inputs rounded to dt, so both runs start from the same values.
        const std::vector<Tensor> in = make_inputs(r, dt, transposed);
        const RunResult got = run_row(r, in, transposed, kCPU);
        const RunResult want = run_row(r, in, transposed, kCPU, DType::f64);
        std::ostringstream what;
        what << dt << (transposed ? ", non-contiguous" : "") << " against f64";
        const double tol = dt == DType::f32 ? r.tol32 : dt == DType::bf16 ? 4 * r.tol16 : r.tol16;
        const std::string err = compare(r, got, want, tol, what.str());
        CHECK_MESSAGE(err.empty(), err);
      }
  }
}

TEST_CASE("op table: gradients against finite differences in f64, through contiguous and strided inputs") {
  GradcheckOptions opts;
  opts.max_checks = 48;  // per input, spread over it: two f64 forwards each
  int checked = 0;
  for (const Row& r : rows()) {
    for (bool transposed : {false, true}) {
      if (!r.grad || (transposed && !any_transposable(r))) continue;
      // Transposed: the inputs are stored with their last two dims swapped and fn sees transposed
      // views of them, so the backward of every strided path meets finite differences too.
      const std::vector<Tensor> in = make_inputs(r, DType::f64, transposed);
      opts.differentiate.clear();
      for (const In& i : r.inputs) opts.differentiate.push_back(i.grad);
      std::vector<size_t> diff;  // the outputs with gradients, found on the first (grad-enabled) call
      bool first = true;
      auto fn = [&](const std::vector<Tensor>& leaves) {
        std::vector<Tensor> xs = leaves;
        if (transposed)
          for (size_t i = 0; i < xs.size(); ++i)
            if (transposable(r.inputs[i])) xs[i] = xs[i].transpose(-1, -2);
        const std::vector<Tensor> outs = r.fn(xs);
        if (first) {
          for (size_t i = 0; i < outs.size(); ++i)
            if (outs[i].defined() && is_floating(outs[i].dtype()) && outs[i].requires_grad()) diff.push_back(i);
          first = false;
        }
        std::vector<Tensor> flat;
        for (size_t i : diff) flat.push_back(cast(outs[i], DType::f64).reshape({-1}));
        return cat(flat, 0);
      };
      const std::string err = gradcheck(fn, in, opts);
      CHECK_MESSAGE(err.empty(), r.name, std::string(transposed ? " (strided inputs)" : ""), ": ", err);
      CHECK_MESSAGE(!diff.empty(), r.name, " says it has gradients but no output requires one");
      ++checked;
    }
  }
  CHECK(checked >= 80);
}

TEST_CASE("op table: second derivatives in f64 are right, or refused naming the op") {
  // F(x) = d(sum(w * op(x)^2))/dx, computed with create_graph, is differentiated again by gradcheck
  // against finite differences of F. An op whose backward is not differentiable must refuse (an
  // error naming it) rather than give a silently wrong second derivative.
  GradcheckOptions opts;
  opts.max_checks = 16;
  int checked = 0;
  std::vector<std::string> refused;
  for (const Row& r : rows()) {
    if (!r.grad) continue;
    const std::vector<Tensor> in = make_inputs(r, DType::f64, false);
    opts.differentiate.clear();
    for (const In& i : r.inputs) opts.differentiate.push_back(i.grad);
    std::vector<Tensor> w;  // one weight per differentiable output, drawn on the first call
    std::vector<size_t> diff;
    bool first = true;
    auto first_grads = [&](const std::vector<Tensor>& leaves) {
      // gradcheck's first call (grad mode on) differentiates F again; its finite differences call F
      // under no_grad with perturbed values: fresh leaves then, without create_graph.
      const bool again = GradMode::enabled();
      std::vector<Tensor> xs = leaves, wrt;
      for (size_t i = 0; i < xs.size(); ++i) {
        if (!xs[i].defined() || !is_floating(xs[i].dtype()) || !r.inputs[i].grad) continue;
        if (!again) xs[i] = xs[i].detach().set_requires_grad(true);
        wrt.push_back(xs[i]);
      }
      struct On {
        bool prev = GradMode::enabled();
        On() { GradMode::set_enabled(true); }
        ~On() { GradMode::set_enabled(prev); }
      } on;
      const std::vector<Tensor> outs = r.fn(xs);
      if (first) {
        Generator gen(77);
        for (size_t i = 0; i < outs.size(); ++i)
          if (outs[i].defined() && is_floating(outs[i].dtype()) && outs[i].requires_grad()) {
            diff.push_back(i);
            w.push_back(uniform(outs[i].shape(), -1.5, 1.5, TensorOptions(DType::f64), &gen));
          }
        first = false;
      }
      Tensor loss;
      for (size_t k = 0; k < diff.size(); ++k) {
        // Squared, so the gradient reaching the op's backward has a history of its own too.
        const Tensor o = cast(outs[diff[k]], DType::f64);
        const Tensor part = sum(o * o * w[k]);
        loss = loss.defined() ? loss + part : part;
      }
      const std::vector<Tensor> g = autograd::grad({loss}, wrt, {}, false, /*materialize=*/true, again);
      std::vector<Tensor> flat;
      for (const Tensor& t : g) flat.push_back(cast(t, DType::f64).reshape({-1}));
      return cat(flat, 0);
    };
    std::string err;
    try {
      err = gradcheck(first_grads, in, opts);
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("is not differentiable in Kiln") == std::string::npos) {
        err = what;
      } else {
        refused.push_back(r.name);
        continue;
      }
    }
    CHECK_MESSAGE(err.empty(), r.name, ": second derivative: ", err);
    ++checked;
  }
  std::string names;
  for (const std::string& n : refused) names += " " + n;
  MESSAGE(checked, " rows' second derivatives checked; refused (not differentiable twice):", names);
  // Every row's ops have recorded backwards under create_graph but one: two zero srcs in one place of
  // scatter_reduce's prod, refused as torch's. A row that starts refusing fails here.
  CHECK_MESSAGE(refused == std::vector<std::string>{"scatter_reduce_prod_zeros"}, "refused:", names);
  CHECK(checked >= 140);
}

TEST_CASE("op table: each row's op follows its autocast rule") {
  // Rows autocast has nothing to say about (docs/amp.md): explicit casts, factories and random fills
  // make the dtype asked for; batch_norm_deterministic runs backward inside, so it needs gradients. The
  // decompositions (engine/ops_decomp.cpp, engine/ops_spectral.cpp) take f32 and f64 only, refusing 16-bit input as torch.linalg does,
  // and autocast leaves them alone: f32 in, f32 out, what torch's autocast (fp32 list) gives.
  const std::set<std::string> no_rule = {
      "cast",         "cast_grad",      "factories",           "random",          "batch_norm_deterministic",
      "linalg_solve", "linalg_inv_det", "linalg_det_singular", "linalg_cholesky", "linalg_solve_triangular",
      "linalg_lu",    "linalg_eigh",    "linalg_svd",          "linalg_qr"};
  int checked = 0;
  for (const Row& r : rows()) {
    if (!r.rule) {
      // Every other row whose op gives a floating tensor must name its rule.
      if (no_rule.count(r.name)) continue;
      bool floating = false;
      for (const Tensor& o : r.fn(make_inputs(r, DType::f32, false)))
        floating = floating || (o.defined() && is_floating(o.dtype()));
      CHECK_MESSAGE(!floating, "op-table row ", r.name, " gives a floating output but names no autocast rule");
      continue;
    }
    const amp::CastPolicy policy = amp::autocast_policy()[size_t(*r.rule)].policy;
    auto first_floating = [&](DType input_dt, DType autocast_dt) {
      const std::vector<Tensor> in = make_inputs(r, input_dt, false);
      const amp::AutocastGuard on(autocast_dt);
      for (const Tensor& o : r.fn(in))
        if (o.defined() && is_floating(o.dtype())) return o.dtype();
      FAIL(r.name, " has no floating output");
      return DType::f32;
    };
    // f32 inputs under f16 autocast, then f16 inputs under bf16 autocast: each policy gives a
    // different pair of output dtypes.
    const DType a = first_floating(DType::f32, DType::f16), b = first_floating(DType::f16, DType::bf16);
    INFO(r.name, " under rule ", std::string(amp::autocast_policy()[size_t(*r.rule)].name), " (",
         std::string(amp::policy_name(policy)), ")");
    switch (policy) {
      case amp::CastPolicy::lower: CHECK(a == DType::f16); CHECK(b == DType::bf16); break;
      case amp::CastPolicy::fp32: CHECK(a == DType::f32); CHECK(b == DType::f32); break;
      case amp::CastPolicy::native: CHECK(a == DType::f32); CHECK(b == DType::f16); break;
    }
    ++checked;
  }
  // Every rule of the policy table is exercised by some row.
  std::set<int> rules;
  for (const Row& r : rows())
    if (r.rule) rules.insert(int(*r.rule));
  for (const amp::AutocastRule& rule : amp::autocast_policy())
    CHECK_MESSAGE(rules.count(int(rule.op)), "no row exercises the autocast rule ", std::string(rule.name));
  CHECK(checked >= 30);
}

TEST_CASE("op table: every public op and every op the models record has a row") {
  std::set<std::string> covered;
  for (const Row& r : rows()) covered.insert(r.ops.begin(), r.ops.end());

  // Public functions without a row, and why.
  const std::map<std::string, std::string> exempt = {
      {"empty", "uninitialised memory: nothing to compare"},
      {"empty_like", "uninitialised memory: nothing to compare"},
      {"from_vector", "wraps host values: tests/test_tensor.cpp"},
      {"from_blob", "wraps a caller's buffer: tests/test_tensor.cpp and tests/consumer"},
      {"from_blob_copy", "copies a caller's buffer: tests/test_tensor.cpp"},
      {"broadcast_shapes", "shape arithmetic: tests/test_tensor.cpp"},
      {"allclose", "a host-side comparison for tests"},
      {"result_type", "a dtype rule: tests/test_ops.cpp (type promotion)"},
      {"alpha_fits", "add/sub's alpha rule: tests/test_ops.cpp (integer alpha) and tests/python/test_ops.py"},
  };
  for (const std::string header : {"engine/ops.h", "engine/nn_ops.h"}) {
    const std::set<std::string> declared = declared_functions(header);
    CHECK_MESSAGE(declared.size() >= 20, header, ": the declaration pattern found only ", declared.size());
    for (const std::string& f : declared)
      CHECK_MESSAGE((covered.count(f) || exempt.count(f)), header, " declares ", f,
                    " but no row of tests/op_table.cpp covers it (add a row, or an exemption with its reason)");
  }
  // kv.first, not a structured binding: doctest's CHECK_MESSAGE captures it in a lambda, which clang 14
  // refuses for a binding.
  for (const auto& kv : exempt) CHECK_MESSAGE(!covered.count(kv.first), kv.first, " has a row: drop its exemption");

  // The ops the table records with autograd, against those the models and modules record.
  RecordNames in_table;
  for (const Row& r : rows()) {
    run_row(r, make_inputs(r, DType::f64, false), false, kCPU);
    if (!r.grad) continue;
    // And a backward with create_graph, which records the backward's own ops (slice_backward, ...).
    std::vector<Tensor> xs = make_inputs(r, DType::f64, false), wrt;
    for (size_t i = 0; i < xs.size(); ++i)
      if (is_floating(xs[i].dtype()) && r.inputs[i].grad) wrt.push_back(xs[i].set_requires_grad(true));
    Tensor loss;
    for (const Tensor& o : r.fn(xs))
      if (o.defined() && is_floating(o.dtype()) && o.requires_grad())
        {
        const Tensor o64 = cast(o, DType::f64);
        loss = loss.defined() ? loss + sum(o64 * o64) : sum(o64 * o64);
      }
    if (loss.defined()) autograd::grad({loss}, wrt, {}, false, true, /*create_graph=*/true);
  }
  const std::set<std::string> table_records = in_table.names;

  RecordNames in_models;
  {
    Generator g(3);
    auto net = make_resnet({"resnet20", 10, 3});
    sum(net->forward(randn({2, 3, 16, 16}, DType::f32, &g))).backward();
    BertConfig c = bert_config("tiny");
    BertForMaskedLM mlm(c);
    const Tensor ids = randint(0, c.vocab_size, {2, 12}, DType::i64, &g);
    const Tensor mask = ones({2, 12}, DType::i64);
    const Tensor logits = mlm.forward_at(ids, from_vector({1, 5, 13}, {3}, DType::i64), mask);
    cross_entropy(logits, from_vector({4, 7, 9}, {3}, DType::i64)).backward();
    BertForSequenceClassification cls(c);
    sum(cls.forward(ids, mask)).backward();
  }
  for (const std::string& n : in_models.names)
    CHECK_MESSAGE(table_records.count(n), "the models record '", n, "' but no row of the op table does");
  CHECK(in_models.names.size() >= 10);

  // Every literal name in the engine's record() calls is recorded by some row.
  for (const std::string src :
       {"engine/ops_elementwise.cpp", "engine/ops_nn.cpp", "engine/ops_reduce.cpp", "engine/ops_index.cpp",
        "engine/ops_linalg.cpp", "engine/ops_decomp.cpp", "engine/ops_spectral.cpp", "engine/ops_scan_sort.cpp",
        "engine/ops_nn_composite.cpp", "engine/tensor.cpp"}) {
    const std::string text = testing::read_text(std::string(KILN_TEST_SOURCE_DIR) + "/../" + src);
    REQUIRE_MESSAGE(!text.empty(), "cannot read ", src);
    const std::regex lit(R"(record\("([a-z_0-9]+)\")");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), lit); it != std::sregex_iterator(); ++it)
      CHECK_MESSAGE(table_records.count((*it)[1]), src, " records '", (*it)[1].str(), "' but no row of the op table does");
  }
}

TEST_CASE("op table: the timing step runs the op and its backward alone, then clears the gradients") {
  // bench_ops times timed_step: the ops recorded in one forward + backward must be the row's own
  // (run_row's loss adds mul, cast and sum), a gradient must reach the inputs, and none may be left.
  int timed = 0;
  for (const Row& r : rows()) {
    const TimedStep st = timed_step(r, kCPU);
    if (!st.forward_backward) continue;
    ++timed;
    std::set<std::string> own;
    {
      RecordNames rec;
      (void)r.fn(st.inputs);
      own = rec.names;
    }
    int reached = 0;
    std::vector<std::pair<Tensor, int>> hooks;
    for (Tensor x : st.inputs)
      if (x.requires_grad())
        hooks.emplace_back(x, x.register_hook([&reached](const Tensor&) {
          ++reached;
          return Tensor();
        }));
    std::set<std::string> step;
    {
      RecordNames rec;
      st.forward_backward();
      step = rec.names;
    }
    for (auto& [x, id] : hooks) x.remove_hook(id);
    CHECK_MESSAGE(step == own, r.name, ": the timed step records more than the op");
    CHECK_MESSAGE(reached > 0, r.name, ": no gradient reached the inputs");
    for (const Tensor& x : st.inputs) CHECK_MESSAGE(!x.grad().defined(), r.name, ": a gradient was left on an input");
  }
  CHECK(timed > 50);
}

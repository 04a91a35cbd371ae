// Multi-rank tests, run by ctest under `mpirun -np 2` and `-np 4` (CPU ranks through MPI): the
// collectives, DataParallel against one process with the whole batch, bit-identical parameters on
// every rank, accumulation, a one-rank overflow that every rank skips, a model mismatch; and, with
// KILN_DIST_TEST_HANG=1, a rank that never joins a collective (the timeout must end the job).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <thread>

#include "engine/dist.h"
#include "engine/zero.h"
#include "kiln.h"
#include "tools/environment.h"

using namespace kiln;

namespace {
dist::Communicator* g_comm = nullptr;
dist::Communicator& comm() { return *g_comm; }

// A small model without batch norm, so per-rank batches average exactly to the whole batch.
struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
  explicit Mlp(int64_t hidden = 64) {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(20, hidden));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(hidden, hidden));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(hidden, 5));
  }
  std::string type_name() const override { return "Mlp"; }
  Tensor forward(const Tensor& x) { return fc3->forward(gelu(fc2->forward(gelu(fc1->forward(x))))); }
};

// The whole batch of step `s`: the same on every rank.
void batch(int64_t s, int64_t n, Tensor& x, Tensor& y) {
  Generator g(1000 + uint64_t(s));
  x = randn({n, 20}, TensorOptions(), &g);
  y = randint(0, 5, {n}, TensorOptions(DType::i64), &g);
}

std::vector<Tensor> flat_params(nn::Module& m) {
  std::vector<Tensor> out;
  for (const auto& [n, p] : m.named_parameters()) out.push_back(p.detach().clone());
  return out;
}
}  // namespace

TEST_CASE("dist: collectives") {
  const int r = comm().rank(), w = comm().world_size();
  Tensor a = full({5}, double(r + 1));
  comm().all_reduce(a, dist::ReduceOp::sum);
  CHECK(a.to_vector() == std::vector<double>(5, w * (w + 1) / 2.0));
  Tensor m = from_vector({double(r), -double(r)}, {2}, DType::f64);
  comm().all_reduce(m, dist::ReduceOp::max);
  CHECK(m.to_vector() == std::vector<double>{double(w - 1), 0.0});
  Tensor avg = full({3}, double(r), TensorOptions(DType::f16));
  comm().all_reduce(avg, dist::ReduceOp::avg);  // 16-bit: reduced in f32
  CHECK(avg.dtype() == DType::f16);
  CHECK(avg.to_vector() == std::vector<double>(3, (w - 1) / 2.0));
  Tensor i = full({4}, double(r), TensorOptions(DType::i64));
  comm().all_reduce(i, dist::ReduceOp::min);
  CHECK(i.to_vector() == std::vector<double>(4, 0.0));
  Tensor b = r == w - 1 ? arange(0, 6).to(DType::f32) : zeros({6});
  comm().broadcast(b, w - 1);
  CHECK(b.to_vector() == arange(0, 6).to_vector());
  Tensor g = zeros({w, 2});
  comm().all_gather(from_vector({double(r), double(10 * r)}, {2}), g);
  for (int k = 0; k < w; ++k) CHECK(g.select(0, k).to_vector() == std::vector<double>{double(k), double(10 * k)});
  Tensor in = arange(0, 3 * w).to(DType::f32) * double(r + 1);
  Tensor out = zeros({3});
  comm().reduce_scatter(in, out, dist::ReduceOp::sum);
  for (int k = 0; k < 3; ++k) CHECK(out.to_vector()[size_t(k)] == double(3 * r + k) * (w * (w + 1) / 2.0));
  comm().barrier();
  // Many in flight at once complete in order.
  std::vector<Tensor> ts;
  std::vector<std::shared_ptr<dist::Work>> works;
  for (int k = 0; k < 20; ++k) {
    ts.push_back(full({1000}, double(k + r)));
    works.push_back(comm().all_reduce_async(ts.back(), dist::ReduceOp::sum));
  }
  for (int k = 0; k < 20; ++k) {
    works[size_t(k)]->wait();
    CHECK(works[size_t(k)]->done());  // once waited for, done
    CHECK(ts[size_t(k)].to_vector()[999] == double(w * k + w * (w - 1) / 2));
  }
  // done() is a poll: it turns true by itself, and then the collective has let go of its buffers
  // (dropping `held` frees its bytes while the Work is still alive).
  Tensor held = full({w * 4096}, 1.0), part = zeros({4096});
  const std::shared_ptr<dist::Work> rs = comm().reduce_scatter_async(held, part, dist::ReduceOp::sum);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!rs->done() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(rs->done());
  const size_t before = cpu_memory_stats().allocated;
  held = Tensor();
  CHECK(before - cpu_memory_stats().allocated >= size_t(w) * 4096 * sizeof(float));
  rs->wait();
  CHECK(part.to_vector() == std::vector<double>(4096, double(w)));
}

TEST_CASE("dist: DataParallel with batch B per rank matches one process with batch N x B; ranks stay bit-identical") {
  const int r = comm().rank(), w = comm().world_size();
  const int64_t per = 8, steps = 6;
  manual_seed(uint64_t(7 + r));  // different initial weights per rank: DataParallel broadcasts rank 0's
  Mlp model;
  manual_seed(7);
  Mlp ref;  // rank 0's initial weights, trained on the whole batch in this process
  dist::DataParallelOptions o;
  o.first_bucket_bytes = 2048;  // several buckets even for this small model
  o.bucket_bytes = 8192;
  dist::DataParallel dp(model, comm(), o);
  CHECK(dp.num_buckets() > 2);
  {
    const auto a = flat_params(model), b = flat_params(ref);
    for (size_t k = 0; k < a.size(); ++k) CHECK(a[k].to_vector() == b[k].to_vector());  // the broadcast
  }
  optim::SGD opt({optim::ParamGroup(model.parameters(), 0.1)}, optim::SgdOptions{0.9, 0, false});
  optim::SGD opt_ref({optim::ParamGroup(ref.parameters(), 0.1)}, optim::SgdOptions{0.9, 0, false});
  for (int64_t s = 0; s < steps; ++s) {
    Tensor x, y;
    batch(s, per * w, x, y);
    // This rank's slice: rows r, r + w, ... (the loader's strided slice).
    const Tensor idx = arange(r, per * w, w).to(DType::i64);
    opt.zero_grad();
    cross_entropy(model.forward(index_select(x, 0, idx)), index_select(y, 0, idx)).backward();
    dp.finish();
    opt.step();
    opt_ref.zero_grad();
    cross_entropy(ref.forward(x), y).backward();
    opt_ref.step();
  }
  const auto mine = flat_params(model), want = flat_params(ref);
  for (size_t k = 0; k < mine.size(); ++k) {
    CAPTURE(k);
    CHECK(allclose(mine[k], want[k], 1e-4, 1e-6));  // f32 reduction order differs from one big batch
    // Every rank holds exactly rank 0's parameters.
    Tensor all = zeros({w, mine[k].numel()});
    comm().all_gather(mine[k].reshape({-1}).contiguous(), all);
    for (int q = 1; q < w; ++q) CHECK(all.select(0, q).to_vector() == all.select(0, 0).to_vector());
  }
}

// ZeRO-1 against DataParallel in the same ranks: AdamW over decay groups with gradient clipping,
// accumulation over 2 micro-batches, several buckets. Every rank holds the same parameters after
// every step, they match the DataParallel run's, and each rank's optimizer state is about 1/N.
TEST_CASE(
    "dist: ZeRO-1 matches DataParallel; ranks identical every step; optimizer state about 1/N; state round trip") {
  const int r = comm().rank(), w = comm().world_size();
  const int64_t per = 8, steps = 5;
  manual_seed(uint64_t(11 + r));
  Mlp zm, dm;
  dist::DataParallelOptions o;
  o.first_bucket_bytes = 2048;
  o.bucket_bytes = 8192;
  dist::DataParallel dp(dm, comm(), o);
  dm.load_state_dict([&] {  // both start from the same weights: rank 0's of the DataParallel model
    nn::StateDict sd;
    for (const auto& [n, t] : dm.state_dict()) sd[n] = t.clone();
    return sd;
  }());
  zm.load_state_dict(dm.state_dict());
  dist::ZeroRedundancy zero(zm, optim::decay_groups(zm.named_parameters(), 0.01, 0.1), comm(), o);
  CHECK(zero.num_buckets() > 2);
  optim::AdamW zopt(zero.shard_groups());
  optim::AdamW dopt(optim::decay_groups(dm.named_parameters(), 0.01, 0.1));
  for (int64_t s = 0; s < steps; ++s) {
    Tensor x, y;
    batch(s, per * w * 2, x, y);
    zero.zero_grad();
    zopt.zero_grad();
    dopt.zero_grad();
    for (int k = 0; k < 2; ++k) {
      const Tensor idx = arange(k * per * w + r, (k + 1) * per * w, w).to(DType::i64);
      const Tensor xs = index_select(x, 0, idx), ys = index_select(y, 0, idx);
      zero.set_sync(k == 1);
      dp.set_sync(k == 1);
      (cross_entropy(zm.forward(xs), ys) * 0.5).backward();
      (cross_entropy(dm.forward(xs), ys) * 0.5).backward();
    }
    zero.finish();
    dp.finish();
    // The buckets took the gradients over: the model's parameters hold none of their own.
    for (const auto& [n, p] : zm.named_parameters()) CHECK_MESSAGE(!p.grad().defined(), n);
    const double zn = zero.clip_grad_norm(0.5).item<double>();
    const double dn = optim::clip_grad_norm(dm.parameters(), 0.5).item<double>();
    CHECK(zn == doctest::Approx(dn).epsilon(1e-5));
    zopt.step();
    zero.gather();
    dopt.step();
    for (const auto& [n, p] : zm.named_parameters()) {  // every rank holds rank 0's bits
      Tensor all = zeros({w, p.numel()});
      comm().all_gather(p.reshape({-1}).contiguous(), all);
      for (int q = 1; q < w; ++q) CHECK_MESSAGE(all.select(0, q).to_vector() == all.select(0, 0).to_vector(), n);
    }
  }
  const auto zp = zm.named_parameters(), dpp = dm.named_parameters();
  for (size_t k = 0; k < zp.size(); ++k) CHECK_MESSAGE(allclose(zp[k].second, dpp[k].second, 1e-4, 1e-6), zp[k].first);
  int64_t mine = 0, whole = 0;
  for (const auto& [n, t] : zopt.state().tensors) mine += t.numel();
  for (const auto& [n, t] : dopt.state().tensors) whole += t.numel();
  MESSAGE("rank ", r, " of ", w, ": optimizer state ", mine, " elements, unsharded ", whole);
  CHECK(mine <= whole / w + 2 * 2 * zero.num_buckets());  // two slots; a bucket's padding at most its chunk's rounding
  CHECK(mine >= whole / w - 2 * 2 * zero.num_buckets());

  // The state as a checkpoint holds it (every rank's chunks, flat per bucket), back into a fresh
  // optimizer over a fresh ZeRO of the same layout: the same state, and the same next step.
  std::map<std::string, Tensor> saved;
  for (auto& [name, make] : zero.state_entries(zopt)) saved[name] = make();
  std::vector<std::string> slots = {"exp_avg", "exp_avg_sq"};
  Mlp again;
  again.load_state_dict(zm.state_dict());
  dist::ZeroRedundancy zero2(again, optim::decay_groups(again.named_parameters(), 0.01, 0.1), comm(), o);
  optim::AdamW zopt2(zero2.shard_groups());
  optim::OptimizerState st =
      zero2.local_state([&](const std::string& n) { return saved.at(n); }, slots, zero.layout(), "the test's state");
  st.scalars = zopt.state().scalars;
  zopt2.load_state(st);
  const auto a = zopt.state(), b = zopt2.state();
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [n, t] : a.tensors) CHECK_MESSAGE(t.to_vector() == b.tensors.at(n).to_vector(), n);
  dist::ZeroLayout other = zero.layout();
  other.world_size = w + 1;
  CHECK_THROWS_WITH_AS(zero2.local_state([&](const std::string& n) { return saved.at(n); }, slots, other, "ckpt"),
                       doctest::Contains(("sharded over " + std::to_string(w + 1) + " ranks, this run has").c_str()),
                       Error);
}

TEST_CASE("dist: accumulation reduces once per optimizer step and matches the whole batch") {
  const int r = comm().rank(), w = comm().world_size();
  const int64_t per = 4, micro = 3;
  manual_seed(11);
  Mlp model(32), ref(32);
  ref.load_state_dict(model.state_dict());
  dist::DataParallel dp(model, comm());
  Tensor x, y;
  batch(99, per * w * micro, x, y);
  // One optimizer step over `micro` micro-batches of `per` rows per rank; the whole batch is
  // micro x w x per rows, micro-batch k of rank r holding rows k*w*per + r, + w, ...
  model.zero_grad();
  for (int64_t k = 0; k < micro; ++k) {
    dp.set_sync(k == micro - 1);
    const Tensor idx = arange(k * w * per + r, (k + 1) * w * per, w).to(DType::i64);
    (cross_entropy(model.forward(index_select(x, 0, idx)), index_select(y, 0, idx)) * (1.0 / double(micro))).backward();
  }
  dp.finish();
  ref.zero_grad();
  cross_entropy(ref.forward(x), y).backward();
  const auto pm = model.parameters(), pr = ref.parameters();
  for (size_t k = 0; k < pm.size(); ++k) CHECK(allclose(pm[k].grad(), pr[k].grad(), 1e-4, 1e-7));
}

TEST_CASE("dist: an overflow on one rank makes every rank skip the step") {
  const int w = comm().world_size();
  manual_seed(3);
  Mlp model(16);
  dist::DataParallel dp(model, comm());
  optim::SGD opt({optim::ParamGroup(model.parameters(), 0.1)});
  amp::GradScaler scaler;
  scaler.agree = [](Tensor& found_inf) { comm().all_reduce(found_inf, dist::ReduceOp::max); };
  const auto before = flat_params(model);
  Tensor x, y;
  batch(5, 4, x, y);
  opt.zero_grad();
  scaler.scale(cross_entropy(model.forward(x), y)).backward();
  dp.finish();
  // Rank w-1's gradient overflows after the reduction (as a local unscale could find).
  if (comm().rank() == w - 1) model.parameters()[0].grad().data<float>()[0] = INFINITY;
  scaler.step(opt, model.parameters());
  const bool skipped = scaler.last_step_skipped();
  scaler.update();
  CHECK(skipped);
  CHECK(scaler.get_scale() == 32768.0);
  const auto after = flat_params(model);
  for (size_t k = 0; k < after.size(); ++k) CHECK(after[k].to_vector() == before[k].to_vector());
}

TEST_CASE("dist: ranks that built different models are told where they differ") {
  const int w = comm().world_size();
  Mlp model(comm().rank() == w - 1 ? 48 : 64);  // the last rank's hidden size differs
  std::string msg;
  try {
    dist::DataParallel dp(model, comm());
  } catch (const Error& e) {
    msg = e.message();
  }
  CHECK_MESSAGE(msg.find("the model differs between ranks") != std::string::npos, msg);
  if (comm().rank() == w - 1) CHECK_MESSAGE(msg.find("parameter fc1.weight f32 [48,20]', rank 0 has 'parameter fc1.weight f32 [64,20]") != std::string::npos, msg);
  else CHECK_MESSAGE(msg.find("rank(s) " + std::to_string(w - 1)) != std::string::npos, msg);
}

int main(int argc, char** argv) {
  tools::apply_environment();
  const dist::DistEnv env = kiln::tools::dist_env();
  const bool hang = std::getenv("KILN_DIST_TEST_HANG") != nullptr;
  auto c = dist::make_cpu_communicator(env, std::chrono::seconds(hang ? 3 : 120));
  g_comm = c.get();
  if (hang) {
    // The last rank never joins: the others must report the collective and their rank, then end the job.
    // The communicator throws CollectiveError; later collectives on it fail at once, unsent.
    if (c->rank() != c->world_size() - 1) {
      try {
        c->all_reduce(ones({1024}), dist::ReduceOp::sum);
      } catch (const dist::CollectiveError& e) {
        std::string later;
        try {
          c->all_reduce(ones({4}), dist::ReduceOp::sum);
        } catch (const dist::CollectiveError& e2) {
          later = e2.message();
        }
        const bool same = later == e.message();
        std::fprintf(stderr, "kiln: error: %s%s\n", e.message().c_str(),
                     e.timed_out() && same ? "" : " [the error is not a timeout, or a later collective did not fail with it]");
        std::fflush(nullptr);
        std::_Exit(3);  // as `kiln` does: MPI's finalisation would wait for the hung rank
      }
    }
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  // Every rank must agree on the outcome, or mpirun reports the failing one.
  return rc;
}

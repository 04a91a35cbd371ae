// One row of bench_ops' JSON, apart so a test can check it without timing anything.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::bench {

// Median milliseconds of one op-table row on one device.
struct OpTiming {
  double fwd = 0, both = 0;
  bool backward = false;  // false: the row has no gradient, `both` not measured
};

// A row's JSON: the CPU times and, where `cuda` is given, the CUDA times and the CPU/CUDA ratios.
// What was not measured (fwd+bwd of a row without gradients) is null, never another figure under
// its name: cpu_over_cuda_fwd is the forward's ratio, cpu_over_cuda_fwd_bwd that of forward +
// backward (null without a backward).
inline nlohmann::json ops_row_json(const std::string& name, const OpTiming& cpu, const OpTiming* cuda) {
  const auto ms_or_null = [](const OpTiming& t) {
    return t.backward ? nlohmann::json(t.both) : nlohmann::json(nullptr);
  };
  nlohmann::json j = {{"row", name}, {"cpu_fwd_ms", cpu.fwd}, {"cpu_fwd_bwd_ms", ms_or_null(cpu)}};
  if (cuda) {
    j["cuda_fwd_ms"] = cuda->fwd;
    j["cuda_fwd_bwd_ms"] = ms_or_null(*cuda);
    j["cpu_over_cuda_fwd"] = cpu.fwd / cuda->fwd;
    j["cpu_over_cuda_fwd_bwd"] =
        cpu.backward && cuda->backward ? nlohmann::json(cpu.both / cuda->both) : nlohmann::json(nullptr);
  }
  return j;
}

}  // namespace kiln::bench

// Parameter initialisers matching the common ones (fan-in/fan-out conventions of PyTorch's
// nn.init). Each fills a tensor in place from a generator (the default one when null).
#pragma once
#include <string>

#include "engine/ops.h"

namespace kiln::nn::init {

enum class FanMode { fan_in, fan_out };
// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (weights [out, in, ...]).
std::pair<int64_t, int64_t> fans(const Tensor& w);
// Gain for "linear", "conv", "sigmoid", "tanh", "relu", "leaky_relu" (with slope a), "selu".
double gain(const std::string& nonlinearity, double a = 0.0);

void uniform_(Tensor& t, double low, double high, Generator* gen = nullptr);
void normal_(Tensor& t, double mean, double std, Generator* gen = nullptr);
// Normal(mean, std) resampled until inside [a, b] (absolute bounds).
void trunc_normal_(Tensor& t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                   Generator* gen = nullptr);
void zeros_(Tensor& t);
void ones_(Tensor& t);
void constant_(Tensor& t, double value);
void kaiming_uniform_(Tensor& t, double a = 0.0, FanMode mode = FanMode::fan_in,
                      const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
void kaiming_normal_(Tensor& t, double a = 0.0, FanMode mode = FanMode::fan_in,
                     const std::string& nonlinearity = "leaky_relu", Generator* gen = nullptr);
void xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
void xavier_normal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace kiln::nn::init

// The CPU backend's kernels, gathered into the Backend table by backend_cpu.cpp.
#pragma once
#include "kernels/backend.h"

namespace kiln::cpu {

void copy(const TensorDesc& dst, const TensorDesc& src);
void fill(const TensorDesc& dst, double value);
void arange(const TensorDesc& dst, double start, double step);
void unary(UnaryOp op, const TensorDesc& dst, const TensorDesc& src, double p0, double p1);
void binary(BinaryOp op, const TensorDesc& dst, const TensorDesc& a, const TensorDesc& b, double alpha);
void where(const TensorDesc& dst, const TensorDesc& cond, const TensorDesc& a, const TensorDesc& b);
void reduce(ReduceOp op, void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t outer, int64_t r,
            int64_t inner);
void random(RandomKind kind, const TensorDesc& dst, uint64_t seed, uint64_t offset, double p0, double p1);

}  // namespace kiln::cpu

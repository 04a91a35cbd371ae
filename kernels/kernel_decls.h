// The kernels every backend implements, declared from the one list (kernels/kernel_list.h) inside
// namespace kiln::cpu (kernels/cpu/ops_cpu.h) and kiln::cuda (kernels/cuda/ops_cuda.h), so the two
// cannot drift. No include guard and no includes: the including header has kernels/backend.h.
#define KILN_KERNEL(name, params) void name params;
#include "kernels/kernel_list.h"
#undef KILN_KERNEL

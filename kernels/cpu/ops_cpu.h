// The CPU backend's kernels, gathered into the Backend table by backend_cpu.cpp.
#pragma once
#include "kernels/backend.h"

namespace kiln::cpu {

#include "kernels/kernel_decls.h"

}  // namespace kiln::cpu

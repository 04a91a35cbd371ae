// The kernels' dtype dispatch, written once: fn(T{}) for the one of Ts whose DType is dt, else an
// error naming the backend, the op, the dtype and the ones the kernel takes. Each kernel file
// states its own list (dispatch_one_of<float, double>(...)); base/dtype.h's visit_dtype takes all.
#pragma once
#include <string>

#include "base/dtype.h"
#include "base/error.h"

namespace kiln {

template <typename... Ts, typename Fn> void dispatch_one_of(DType dt, const char* backend, const char* op, Fn&& fn) {
  bool done = false;
  ((!done && DTypeOf<Ts>::value == dt ? (fn(Ts{}), done = true) : false), ...);
  if (done) return;
  std::string takes;
  ((takes += std::string(takes.empty() ? "" : ", ") + dtype_name(DTypeOf<Ts>::value)), ...);
  KILN_FAIL(backend, " ", op, ": dtype ", dt, " is not supported (", takes, ")");
}

}  // namespace kiln

// The decompositions of engine/ops.h (engine/ops_decomp.cpp) as private module functions; kiln/_linalg_lu.py
// puts torch's signatures over them (kiln.linalg.solve, kiln.det, ...). The GIL is released around each.
#include <nanobind/stl/pair.h>

#include "common.h"

namespace kiln::py {

void bind_linalg_lu(nb::module_& m) {
  auto nogil = nb::call_guard<GilRelease>();
  m.def(
      "_linalg_lu_factor",
      [](const Tensor& A) {
        const LUFactor f = linalg_lu_factor(A);
        return std::make_pair(f.LU, f.pivots);
      },
      nb::arg("A"), nogil);
  m.def("_linalg_lu_solve", &linalg_lu_solve, nb::arg("LU"), nb::arg("pivots"), nb::arg("B"), nb::arg("left"),
        nb::arg("adjoint"), nogil);
  m.def("_linalg_solve", &linalg_solve, nb::arg("A"), nb::arg("B"), nb::arg("left"), nogil);
  m.def("_linalg_inv", &linalg_inv, nb::arg("A"), nogil);
  m.def("_linalg_det", &linalg_det, nb::arg("A"), nogil);
  m.def(
      "_linalg_slogdet",
      [](const Tensor& A) {
        const SignLogAbsDet s = linalg_slogdet(A);
        return std::make_pair(s.sign, s.logabsdet);
      },
      nb::arg("A"), nogil);
  m.def("_logdet", &logdet, nb::arg("A"), nogil);
  m.def("_linalg_cholesky", &linalg_cholesky, nb::arg("A"), nb::arg("upper"), nogil);
  m.def(
      "_linalg_cholesky_ex",
      [](const Tensor& A, bool upper) {
        const CholeskyEx c = linalg_cholesky_ex(A, upper);
        return std::make_pair(c.L, c.info);
      },
      nb::arg("A"), nb::arg("upper"), nogil);
  m.def("_cholesky_solve", &cholesky_solve, nb::arg("B"), nb::arg("L"), nb::arg("upper"), nogil);
  m.def("_cholesky_inverse", &cholesky_inverse, nb::arg("L"), nb::arg("upper"), nogil);
  m.def("_linalg_solve_triangular", &linalg_solve_triangular, nb::arg("A"), nb::arg("B"), nb::arg("upper"),
        nb::arg("left"), nb::arg("unitriangular"), nogil);
}

}  // namespace kiln::py

// The spectral decompositions of engine/ops.h (engine/ops_spectral.cpp) as private module functions;
// python/kiln/_linalg_spectral.py gives them torch.linalg's names, arguments and named tuples. The GIL is
// released around each decomposition.
#include <string>

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "common.h"

namespace kiln::py {

void bind_linalg_spectral(nb::module_& m) {
  m.def(
      "_linalg_eigh",
      [](const Tensor& a, bool upper) {
        EighResult r;
        {
          GilRelease g;
          r = linalg_eigh(a, upper);
        }
        return nb::make_tuple(r.eigenvalues, r.eigenvectors);
      },
      nb::arg("A"), nb::arg("upper") = false);
  m.def(
      "_linalg_eigvalsh",
      [](const Tensor& a, bool upper) {
        GilRelease g;
        return linalg_eigvalsh(a, upper);
      },
      nb::arg("A"), nb::arg("upper") = false);
  m.def(
      "_linalg_svd",
      [](const Tensor& a, bool full_matrices) {
        SvdResult r;
        {
          GilRelease g;
          r = linalg_svd(a, full_matrices);
        }
        return nb::make_tuple(r.U, r.S, r.Vh);
      },
      nb::arg("A"), nb::arg("full_matrices") = true);
  m.def(
      "_linalg_svdvals",
      [](const Tensor& a) {
        GilRelease g;
        return linalg_svdvals(a);
      },
      nb::arg("A"));
  m.def(
      "_linalg_qr",
      [](const Tensor& a, const std::string& mode) {
        QrMode qm = QrMode::reduced;
        if (mode == "complete")
          qm = QrMode::complete;
        else if (mode == "r")
          qm = QrMode::r;
        else if (mode != "reduced")
          value_error("qr received unrecognized mode '" + mode +
                      "' but expected one of 'reduced' (default), 'r', or 'complete'");
        QrResult r;
        {
          GilRelease g;
          r = linalg_qr(a, qm);
        }
        return nb::make_tuple(r.Q, r.R);
      },
      nb::arg("A"), nb::arg("mode") = "reduced");
}

}  // namespace kiln::py

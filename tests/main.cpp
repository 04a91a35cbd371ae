// doctest's main: the one translation unit that instantiates the test runner. The library reads no
// environment, so the runner applies KILN_NUM_THREADS, KILN_CPU_CACHE_MB, KILN_GEMM and KILN_CPU_ISA as
// `kiln` does.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/cpu_isa.h"
#include "tests/op_table.h"
#include "tools/environment.h"

int main(int argc, char** argv) {
  // The op table's row names, one per line: ctest makes a gpu_parity_<row> entry of each.
  if (argc == 2 && std::strcmp(argv[1], "--list-op-rows") == 0) {
    for (const kiln::optable::Row& r : kiln::optable::rows()) std::printf("%s\n", r.name.c_str());
    return 0;
  }
  // A kernel set this CPU cannot run (ctest's gemm_avx512 on an AVX2 machine, say): skipped, not failed.
  if (const char* isa = std::getenv("KILN_CPU_ISA"); isa && *isa) {
    try {
      if (kiln::parse_cpu_isa(isa, "KILN_CPU_ISA") > kiln::cpu_isa_supported()) {
        std::printf("skipped: KILN_CPU_ISA=%s, and this CPU supports at most %s\n", isa,
                    kiln::cpu_isa_name(kiln::cpu_isa_supported()));
        return 77;
      }
    } catch (const kiln::Error&) {
      // apply_environment reports it
    }
  }
  try {
    kiln::tools::apply_environment();
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_tests: %s\n", e.message().c_str());
    return 2;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

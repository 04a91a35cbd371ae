// doctest's main: the one translation unit that instantiates the test runner. The library reads no
// environment, so the runner applies KILN_NUM_THREADS, KILN_CPU_CACHE_MB and KILN_GEMM as `kiln` does.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>

#include "tests/op_table.h"
#include "tools/environment.h"

int main(int argc, char** argv) {
  // The op table's row names, one per line: ctest makes a gpu_parity_<row> entry of each.
  if (argc == 2 && std::strcmp(argv[1], "--list-op-rows") == 0) {
    for (const kiln::optable::Row& r : kiln::optable::rows()) std::printf("%s\n", r.name.c_str());
    return 0;
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

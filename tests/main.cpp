// doctest's main: the one translation unit that instantiates the test runner. The library reads no
// environment, so the runner applies KILN_NUM_THREADS, KILN_CPU_CACHE_MB and KILN_GEMM as `kiln` does.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tools/environment.h"

int main(int argc, char** argv) {
  try {
    kiln::tools::apply_environment();
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_tests: %s\n", e.message().c_str());
    return 2;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

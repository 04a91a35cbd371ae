// libFuzzer target: arbitrary bytes as a safetensors file, through the in-memory parser.
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)kiln::io::parse_safetensors(data, size, "fuzz input");
  } catch (const kiln::Error&) {
  }
  return 0;
}

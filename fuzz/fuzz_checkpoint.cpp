// libFuzzer target: arbitrary bytes as a checkpoint file. The reader must reject them with a
// kiln::Error or accept them; it must never crash, hang, read out of bounds or allocate wildly.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("kiln_fuzz_ckpt", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t off = 0;
  while (off < size) {
    const ssize_t w = ::write(fd, data + off, size - off);
    if (w <= 0) break;
    off += size_t(w);
  }
  try {
    kiln::io::CheckpointReader r("/proc/self/fd/" + std::to_string(fd));
    (void)r.verify();
    for (const auto& e : r.entries()) {
      try {
        (void)r.read(e.name);
      } catch (const kiln::Error&) {
      }
    }
  } catch (const kiln::Error&) {
  }
  ::close(fd);
  return 0;
}

// libFuzzer target: arbitrary bytes as a checkpoint file. The reader must reject them with a
// kiln::Error or accept them; it must never crash, hang, read out of bounds or allocate wildly.
// Each input is read twice: as given, and with the manifest's and the header's checksums made to
// match, since a random mutation almost never keeps a CRC-32C right and the manifest's parser and
// the entry checks behind it would otherwise be out of the fuzzer's reach.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace {

void read_as_checkpoint(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("kiln_fuzz_ckpt", MFD_CLOEXEC);
  if (fd < 0) return;
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
}

// The header's fields (io/checkpoint.cpp): the manifest's offset at byte 16 and length at 24, its CRC-32C
// at 32, and the header's own over bytes 0..35 at 36, all little-endian.
template <typename T> T field(const uint8_t* h, size_t at) {
  T v;
  std::memcpy(&v, h + at, sizeof v);
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  read_as_checkpoint(data, size);
  if (size < 64) return 0;
  const uint64_t at = field<uint64_t>(data, 16), len = field<uint64_t>(data, 24);
  if (at < 64 || at > size || len > size - at) return 0;
  std::vector<uint8_t> fixed(data, data + size);
  const uint32_t manifest_crc = kiln::io::crc32c(fixed.data() + at, size_t(len));
  std::memcpy(fixed.data() + 32, &manifest_crc, 4);
  const uint32_t header_crc = kiln::io::crc32c(fixed.data(), 36);
  std::memcpy(fixed.data() + 36, &header_crc, 4);
  if (std::memcmp(fixed.data(), data, 40) != 0) read_as_checkpoint(fixed.data(), fixed.size());
  return 0;
}

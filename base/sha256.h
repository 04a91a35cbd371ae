// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the communicators' handshake: each rank
// proves it knows the job's secret without sending it (engine/dist_tcp.cpp). Small and portable;
// not a general crypto library.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

using Digest256 = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Digest256 finish();  // the object is spent afterwards

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

Digest256 sha256(const void* data, size_t n);
Digest256 hmac_sha256(std::string_view key, const void* msg, size_t n);
// Equality that takes the same time wherever the first difference is.
bool digest_equal(const Digest256& a, const Digest256& b);

}  // namespace kiln

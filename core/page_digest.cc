#include "core/page_digest.h"

#include <cstring>

namespace kvstrata {

uint64_t PageDigest64(const void* data, size_t n) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t sum = 0;
  const size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes + 8 * i, 8);  // little-endian hosts only (as the page format)
    sum += PageDigestMix(w + (i + 1) * kPageDigestGolden);
  }
  if (n % 8 != 0) {
    uint64_t w = 0;
    std::memcpy(&w, bytes + 8 * words, n % 8);
    sum += PageDigestMix(w + (words + 1) * kPageDigestGolden);
  }
  return PageDigestMix(sum ^ static_cast<uint64_t>(n));
}

}  // namespace kvstrata

// The page digest (docs/kv-format.md §8) against vectors from an independent Python
// implementation of its definition, and the properties the GPU check relies on.

#include "core/page_digest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

namespace kvstrata {
namespace {

TEST(PageDigest, MatchesTheReferenceVectors) {
  EXPECT_EQ(PageDigest64("", 0), 0x0ull);
  EXPECT_EQ(PageDigest64("abc", 3), 0xa92d7fae4059ee0aull);
  std::vector<uint8_t> ramp(100);
  std::iota(ramp.begin(), ramp.end(), 0);
  EXPECT_EQ(PageDigest64(ramp.data(), ramp.size()), 0xbc36877016046e8cull);
  std::vector<uint8_t> page(16448, 0x5a);
  EXPECT_EQ(PageDigest64(page.data(), page.size()), 0x3bcc926481b2629eull);
}

TEST(PageDigest, EveryBitAndEveryPositionCounts) {
  std::vector<uint8_t> page(4096);
  for (size_t i = 0; i < page.size(); ++i) page[i] = static_cast<uint8_t>(i * 31 + 7);
  const uint64_t base = PageDigest64(page.data(), page.size());
  for (size_t byte : {size_t{0}, size_t{63}, size_t{2048}, size_t{4095}}) {
    for (int bit = 0; bit < 8; ++bit) {
      page[byte] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(PageDigest64(page.data(), page.size()), base) << byte << ":" << bit;
      page[byte] ^= static_cast<uint8_t>(1 << bit);
    }
  }
  // Two words swapped: the same terms' values at other positions.
  std::vector<uint8_t> swapped = page;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(PageDigest64(swapped.data(), swapped.size()), base);
  // Truncated, or zero-extended: the length is in the digest.
  EXPECT_NE(PageDigest64(page.data(), page.size() - 8), base);
  page.resize(4104, 0);
  EXPECT_NE(PageDigest64(page.data(), page.size()), base);
}

}  // namespace
}  // namespace kvstrata

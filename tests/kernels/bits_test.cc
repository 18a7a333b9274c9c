#include "kernels/bits.h"

#include <gtest/gtest.h>

namespace kvstrata::kernels {
namespace {

TEST(Segments, FollowTheDocumentedSchedule) {
  const SplitLayout l;  // sink 64, recent >= 256, pages of 64
  struct Row {
    int64_t n, sink, history, recent;
  };
  const Row rows[] = {
      {0, 0, 0, 0},
      {1, 1, 0, 0},
      {40, 40, 0, 0},
      {64, 64, 0, 0},
      {65, 64, 0, 1},
      {320, 64, 0, 256},
      {383, 64, 0, 319},
      {384, 64, 64, 256},
      {447, 64, 64, 319},
      {448, 64, 128, 256},
      {131072, 64, 130752, 256},
  };
  for (const Row& r : rows) {
    const SplitSegments s = SegmentsAt(l, r.n);
    EXPECT_EQ(s.sink, r.sink) << r.n;
    EXPECT_EQ(s.history, r.history) << r.n;
    EXPECT_EQ(s.recent, r.recent) << r.n;
  }
}

TEST(Segments, RecentWindowNeverShrinksBelowItsMinimum) {
  const SplitLayout l;
  for (int64_t n = 320; n < 5000; ++n) {
    const SplitSegments s = SegmentsAt(l, n);
    EXPECT_GE(s.recent, 256);
    EXPECT_LT(s.recent, 256 + 64);
    EXPECT_EQ(s.history % 64, 0);
  }
}

TEST(Bits, QwenShapedAt128KMatchesTheHandCount) {
  // 36 layers x 8 KV heads x 128 dims, group 128, at 131072 tokens:
  // INT2 history 130752 tokens at 2.25 bits, 320 BF16 tokens, 2048 page headers of 64 bytes.
  const KvGeometry g{
      .num_layers = 36, .num_kv_heads = 8, .head_dim = 128, .group_size = 128, .page_tokens = 64};
  const double per_token_elems = 36.0 * 2 * 8 * 128;
  const double expect_bits =
      (130752.0 * 2.25 * per_token_elems + 320.0 * 16 * per_token_elems + 2048.0 * 64 * 8) /
      (131072.0 * per_token_elems);
  EXPECT_NEAR(SplitBitsPerElement(SplitLayout{}, g, 131072), expect_bits, 1e-12);
  EXPECT_NEAR(SplitBitsPerElement(SplitLayout{}, g, 131072), 2.2836, 1e-3);
  // 576 rows per token (36 layers x K,V x 8 heads): 36 bytes each in INT2, 256 in BF16.
  EXPECT_EQ(SplitSequenceBytes(SplitLayout{}, g, 131072),
            int64_t{130752} * 576 * 36 + int64_t{320} * 576 * 256 + 2048 * 64);
}

TEST(Bits, ShortSequencesAreAllBf16) {
  const KvGeometry g{
      .num_layers = 2, .num_kv_heads = 1, .head_dim = 64, .group_size = 64, .page_tokens = 64};
  // 100 tokens: all BF16 (16 bits) plus two page headers.
  EXPECT_NEAR(SplitBitsPerElement(SplitLayout{}, g, 100), 16.0 + 2 * 64 * 8 / (100.0 * 256), 1e-12);
}

TEST(Bits, Baselines) {
  EXPECT_DOUBLE_EQ(Int2HistoryBitsPerElement(128), 2.25);
  EXPECT_DOUBLE_EQ(Int2HistoryBitsPerElement(64), 2.5);
  EXPECT_DOUBLE_EQ(Int4BitsPerElement(128), 4.25);
  EXPECT_DOUBLE_EQ(Fp8E4M3BitsPerElement(128), 8.125);
  EXPECT_DOUBLE_EQ(Turbo3BitsPerElement(128), 3.125);
  // KIVI-2 at 1000 tokens, group 32, residual 32: 960 quantised tokens, 40 in full precision.
  EXPECT_DOUBLE_EQ(Kivi2BitsPerElement(1000, 32, 32), (960 * 3.0 + 40 * 16.0) / 1000);
}

}  // namespace
}  // namespace kvstrata::kernels

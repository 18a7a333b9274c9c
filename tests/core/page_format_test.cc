#include "core/page_format.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.h"

namespace kvstrata {
namespace {

KvGeometry SmallGeometry() {
  return KvGeometry{
      .num_layers = 3, .num_kv_heads = 2, .head_dim = 64, .group_size = 32, .page_tokens = 64};
}

PageKey Key(uint8_t fill) {
  PageKey k;
  k.bytes.fill(fill);
  return k;
}

std::vector<float> RandomKv(const KvGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> kv(kernels::NumBlocks(g) * g.page_tokens * g.head_dim);
  for (auto& v : kv) v = normal(rng);
  return kv;
}

std::vector<uint8_t> MustEncode(const PageSpec& spec, const std::vector<float>& kv) {
  absl::StatusOr<std::vector<uint8_t>> page = EncodePage(spec, kv);
  EXPECT_TRUE(page.ok()) << page.status();
  return *page;
}

void ExpectError(std::span<const uint8_t> bytes, const std::string& needle) {
  absl::StatusOr<PageRef> ref = ParsePage(bytes);
  ASSERT_FALSE(ref.ok()) << "expected an error mentioning " << needle;
  EXPECT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(ref.status().message()).find(needle), std::string::npos)
      << ref.status().message();
}

TEST(PageFormat, Bf16RoundTrip) {
  const KvGeometry g = SmallGeometry();
  const std::vector<float> kv = RandomKv(g, 1);
  const PageSpec spec{g, PageEncoding::kBf16, 0, Key(7), Key(3)};
  const std::vector<uint8_t> page = MustEncode(spec, kv);
  EXPECT_EQ(page.size(), 64u + 3 * 2 * 2 * 64 * 64 * 2);
  absl::StatusOr<PageRef> ref = ParsePage(page);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->key(), Key(7));
  EXPECT_EQ(ref->parent_key(), Key(3));
  EXPECT_EQ(ref->header.page_index, 0u);
  std::vector<float> back(kv.size());
  ASSERT_TRUE(DecodePage(*ref, back).ok());
  for (size_t i = 0; i < kv.size(); ++i) ASSERT_EQ(back[i], kernels::RoundToBf16(kv[i]));
  EXPECT_TRUE(CheckPageMatches(*ref, g, PageEncoding::kBf16, Key(7)).ok());
}

TEST(PageFormat, Int2RoundTripAndLayout) {
  for (PageEncoding e : {PageEncoding::kInt2Uniform, PageEncoding::kInt2LloydMax}) {
    for (int head_dim : {64, 128}) {
      KvGeometry g = SmallGeometry();
      g.head_dim = head_dim;
      g.group_size = head_dim;
      const std::vector<float> kv = RandomKv(g, 2);
      const std::vector<uint8_t> page = MustEncode({g, e, 5, Key(1), Key(2)}, kv);
      // 2 bits per element plus one fp16 pair per token and group, plus the header.
      EXPECT_EQ(page.size(), 64u + 3 * 2 * 2 * 64 * (head_dim / 4 + 4));
      absl::StatusOr<PageRef> ref = ParsePage(page);
      ASSERT_TRUE(ref.ok()) << ref.status();
      std::vector<float> back(kv.size());
      ASSERT_TRUE(DecodePage(*ref, back).ok());
      double err = 0, energy = 0;
      for (size_t i = 0; i < kv.size(); ++i) {
        err += (back[i] - kv[i]) * (back[i] - kv[i]);
        energy += kv[i] * kv[i];
      }
      // 2-bit Gaussian data: relative MSE in the 0.1-0.2 range, never garbage.
      EXPECT_LT(err / energy, 0.25);
      EXPECT_GT(err / energy, 0.05);
    }
  }
}

TEST(PageFormat, ClipRatiosArePerBlock) {
  const KvGeometry g = SmallGeometry();
  const std::vector<float> kv = RandomKv(g, 3);
  std::vector<float> ratios(kernels::NumBlocks(g), 1.0f);
  ratios[5] = 0.5f;  // only block 5 is clipped
  absl::StatusOr<std::vector<uint8_t>> clipped =
      EncodePage({g, PageEncoding::kInt2Uniform, 1, Key(1), Key(2)}, kv, ratios);
  ASSERT_TRUE(clipped.ok());
  const std::vector<uint8_t> plain =
      MustEncode({g, PageEncoding::kInt2Uniform, 1, Key(1), Key(2)}, kv);
  const int64_t bb = kernels::BlockBytes(g, PageEncoding::kInt2Uniform);
  for (int b = 0; b < kernels::NumBlocks(g); ++b) {
    const bool same =
        std::memcmp(clipped->data() + 64 + b * bb, plain.data() + 64 + b * bb, bb) == 0;
    EXPECT_EQ(same, b != 5) << b;
  }
  ratios[0] = 1.5f;
  EXPECT_FALSE(EncodePage({g, PageEncoding::kInt2Uniform, 1, Key(1), Key(2)}, kv, ratios).ok());
  EXPECT_FALSE(EncodePage({g, PageEncoding::kInt2Uniform, 1, Key(1), Key(2)}, kv,
                          std::span<const float>(ratios.data(), 3))
                   .ok());
}

TEST(PageFormat, WrongLengthBuffersAreErrors) {
  const KvGeometry g = SmallGeometry();
  std::vector<uint8_t> page =
      MustEncode({g, PageEncoding::kInt2Uniform, 0, Key(1), Key(2)}, RandomKv(g, 4));
  ExpectError(std::span<const uint8_t>(page.data(), 10), "shorter than");
  ExpectError(std::span<const uint8_t>(page.data(), page.size() - 1), "bytes; its header says");
  page.push_back(0);
  ExpectError(page, "bytes; its header says");
  std::vector<float> too_few(10);
  EXPECT_FALSE(EncodePage({g, PageEncoding::kBf16, 0, Key(1), Key(2)}, too_few).ok());
  page.pop_back();
  absl::StatusOr<PageRef> ref = ParsePage(page);
  ASSERT_TRUE(ref.ok());
  EXPECT_FALSE(DecodePage(*ref, too_few).ok());
}

TEST(PageFormat, MalformedHeadersAreErrorsNamingTheField) {
  const KvGeometry g = SmallGeometry();
  const std::vector<uint8_t> good =
      MustEncode({g, PageEncoding::kInt2Uniform, 0, Key(1), Key(2)}, RandomKv(g, 5));
  auto mutate = [&](size_t offset, std::vector<uint8_t> bytes) {
    std::vector<uint8_t> page = good;
    std::memcpy(page.data() + offset, bytes.data(), bytes.size());
    return page;
  };
  ExpectError(mutate(0, {'X'}), "magic");
  ExpectError(mutate(4, {2, 0}), "version");
  ExpectError(mutate(6, {9}), "encoding");
  ExpectError(mutate(7, {1}), "reserved");
  ExpectError(mutate(14, {96, 0}), "head_dim=96");
  ExpectError(mutate(16, {24, 0}), "group_size=24");
  ExpectError(mutate(10, {0, 0}), "num_layers=0");
  ExpectError(mutate(24, {1}), "body_bytes");
  ExpectError(mutate(6, {1}), "group_size must be 0");  // bf16 encoding with a group size
}

// A codec page's size is its codec's, which ParsePage cannot know: it checks the header, and
// that the body is a multiple of 16 bytes between every block's row scales and a BF16 page.
// Building and decoding one takes the codec (engine/kv_cache.h), so the codec-free helpers refuse
// it. The same holds for both codec encodings: codec blocks and codec fragment blocks.
TEST(PageFormat, CodecPagesAreCheckedAsFarAsTheHeaderGoes) {
  const KvGeometry g = SmallGeometry();
  const std::vector<float> kv = RandomKv(g, 7);
  const std::vector<uint8_t> bf16 = MustEncode({g, PageEncoding::kBf16, 0, Key(1), Key(2)}, kv);
  const uint64_t bf16_body = bf16.size() - kernels::kPageHeaderBytes;
  for (const PageEncoding encoding : {PageEncoding::kCodec, PageEncoding::kCodecFragment}) {
    const std::string name = PageEncodingName(encoding);
    SCOPED_TRACE(name);
    auto codec_page = [&](uint64_t body, uint16_t group_size = 0) {
      std::vector<uint8_t> page(kernels::kPageHeaderBytes + body, 0x5A);
      kernels::PageHeader h;
      std::memcpy(&h, bf16.data(), sizeof(h));
      h.encoding = static_cast<uint8_t>(encoding);
      h.group_size = group_size;
      h.body_bytes = body;
      std::memcpy(page.data(), &h, sizeof(h));
      return page;
    };
    const std::vector<uint8_t> page = codec_page(4096);
    absl::StatusOr<PageRef> ref = ParsePage(page);
    ASSERT_TRUE(ref.ok()) << ref.status();
    EXPECT_EQ(ref->encoding, encoding);
    EXPECT_EQ(ref->key(), Key(1));
    EXPECT_TRUE(ParsePage(codec_page(bf16_body)).ok());
    ExpectError(codec_page(0), "body_bytes=0");
    ExpectError(codec_page(12 * 80 - 16), "[960, ");  // 12 blocks of at least 80 bytes
    EXPECT_TRUE(ParsePage(codec_page(12 * 80)).ok());
    ExpectError(codec_page(4100), "multiple of 16");
    ExpectError(codec_page(bf16_body + 16), "body_bytes");
    ExpectError(codec_page(4096, 32), "group_size must be 0 for a " + name + " page");
    std::vector<uint8_t> short_page = page;
    short_page.pop_back();
    ExpectError(short_page, "its header says");
    std::vector<float> out(kv.size());
    EXPECT_EQ(DecodePage(*ref, out).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_FALSE(EncodePage({g, encoding, 0, Key(1), Key(2)}, kv).ok());
  }
  EXPECT_STREQ(PageEncodingName(PageEncoding::kCodec), "codec");
  EXPECT_STREQ(PageEncodingName(PageEncoding::kCodecFragment), "codec-fragment");
}

TEST(PageFormat, RandomCorruptionNeverCrashes) {
  const KvGeometry g = SmallGeometry();
  const std::vector<uint8_t> good =
      MustEncode({g, PageEncoding::kBf16, 0, Key(1), Key(2)}, RandomKv(g, 6));
  std::mt19937 rng(8);
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::vector<uint8_t> page = good;
    const int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) page[rng() % 64] ^= static_cast<uint8_t>(1 + rng() % 255);
    const size_t len = trial % 3 == 0 ? rng() % page.size() : page.size();
    absl::StatusOr<PageRef> ref = ParsePage(std::span<const uint8_t>(page.data(), len));
    if (ref.ok()) {
      // Only flips in key/parent/page_index bytes can leave a valid page, or the encoding
      // turned to codec (whose size only its engine can check, and which needs its codec).
      ++accepted;
      std::vector<float> kv(kernels::NumBlocks(ref->geometry) * ref->geometry.page_tokens *
                            ref->geometry.head_dim);
      const absl::Status decoded = DecodePage(*ref, kv);
      if (kernels::IsCodec(ref->encoding)) {
        ASSERT_EQ(decoded.code(), absl::StatusCode::kFailedPrecondition);
      } else {
        ASSERT_TRUE(decoded.ok()) << decoded;
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, 20000);
}

TEST(PageFormat, MismatchesAreReported) {
  const KvGeometry g = SmallGeometry();
  const std::vector<uint8_t> page =
      MustEncode({g, PageEncoding::kInt2Uniform, 0, Key(1), Key(2)}, RandomKv(g, 7));
  absl::StatusOr<PageRef> ref = ParsePage(page);
  ASSERT_TRUE(ref.ok());
  EXPECT_FALSE(CheckPageMatches(*ref, g, PageEncoding::kBf16, Key(1)).ok());
  EXPECT_FALSE(CheckPageMatches(*ref, g, PageEncoding::kInt2Uniform, Key(9)).ok());
  KvGeometry other = g;
  other.num_layers = 4;
  EXPECT_FALSE(CheckPageMatches(*ref, other, PageEncoding::kInt2Uniform, Key(1)).ok());
  EXPECT_TRUE(CheckPageMatches(*ref, g, PageEncoding::kInt2Uniform, Key(1)).ok());
}

TEST(PageFormat, GeometryValidation) {
  KvGeometry g = SmallGeometry();
  EXPECT_TRUE(ValidateGeometry(g, PageEncoding::kInt2Uniform).ok());
  g.head_dim = 256;
  EXPECT_NE(std::string(ValidateGeometry(g, PageEncoding::kBf16).message()).find("head_dim=256"),
            std::string::npos);
  g.head_dim = 128;
  g.group_size = 48;
  EXPECT_FALSE(ValidateGeometry(g, PageEncoding::kInt2Uniform).ok());
  EXPECT_TRUE(ValidateGeometry(g, PageEncoding::kBf16).ok());  // BF16 has no groups
}

}  // namespace
}  // namespace kvstrata

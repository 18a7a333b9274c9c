// GPU test: the append (rotate + BF16 write) and demotion (clip + quantise + pack) kernels
// against the CPU reference. Skips itself when no CUDA device is present.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "kernels/cuda/append.h"
#include "kernels/quant.h"
#include "kernels/rotation.h"
#include "tests/kernels/gpu_test_util.h"

namespace kvstrata::kernels {
namespace {

TEST(AppendGpu, RotatesWritesAndDemotesLikeTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  for (int d : {64, 128}) {
    const KvGeometry g{3, 2, d, d, 64};
    std::mt19937 rng(d);
    std::normal_distribution<float> normal;
    // Random orthogonal rotations (random-sign Hadamard) per (layer, head).
    std::vector<float> rk, rv;
    for (int m = 0; m < g.num_layers * g.num_kv_heads; ++m) {
      std::vector<float> r(d * d);
      RandomSignHadamard(d, 100 + m, r.data());
      rk.insert(rk.end(), r.begin(), r.end());
      RandomSignHadamard(d, 500 + m, r.data());
      rv.insert(rv.end(), r.begin(), r.end());
    }
    // 64 tokens fill one page; written in a shuffled order of rows.
    const int tokens = 64;
    std::vector<uint16_t> k(g.num_layers * tokens * g.num_kv_heads * d), v(k.size());
    for (auto& x : k) x = FloatToBf16(normal(rng) * 3.0f);
    for (auto& x : v) x = FloatToBf16(normal(rng));
    std::vector<int32_t> slot(tokens, 1), row(tokens);
    for (int i = 0; i < tokens; ++i) row[i] = (i * 37) % 64;
    const int64_t bf16_stride = PageBytes(g, PageEncoding::kBf16);
    const int64_t int2_stride = PageBytes(g, PageEncoding::kInt2Uniform);
    std::vector<uint8_t> bf16_pool(2 * bf16_stride, 0);
    uint8_t* d_bf16 = ToDevice(bf16_pool);
    AppendParams ap;
    ap.k = ToDevice(k);
    ap.v = ToDevice(v);
    ap.num_tokens = tokens;
    ap.k_rotation = ToDevice(rk);
    ap.v_rotation = ToDevice(rv);
    ap.slot = ToDevice(slot);
    ap.row = ToDevice(row);
    ap.bf16_pool = d_bf16;
    ap.slot_stride = bf16_stride;
    ap.geometry = g;
    ASSERT_EQ(AppendRotatedRows(ap, nullptr), cudaSuccess);
    // The same rows given in fp32 (the engine's path) write the same bytes.
    {
      std::vector<float> k32, v32;
      for (uint16_t x : k) k32.push_back(Bf16ToFloat(x));
      for (uint16_t x : v) v32.push_back(Bf16ToFloat(x));
      uint8_t* d_bf16_f32 = ToDevice(bf16_pool);
      AppendParams af = ap;
      af.k = nullptr;
      af.v = nullptr;
      af.k_f32 = ToDevice(k32);
      af.v_f32 = ToDevice(v32);
      af.bf16_pool = d_bf16_f32;
      ASSERT_EQ(AppendRotatedRows(af, nullptr), cudaSuccess);
      std::vector<uint8_t> a(bf16_pool.size()), b(bf16_pool.size());
      ASSERT_EQ(cudaMemcpy(a.data(), d_bf16, a.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(b.data(), d_bf16_f32, b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(a, b) << "fp32 and bf16 inputs of the same values";
      cudaFree(d_bf16_f32);
      cudaFree(const_cast<float*>(af.k_f32));
      cudaFree(const_cast<float*>(af.v_f32));
    }
    std::vector<float> clip(g.num_layers * 2 * g.num_kv_heads);
    for (size_t i = 0; i < clip.size(); ++i) clip[i] = i % 3 == 0 ? 1.0f : 0.9f + 0.01f * (i % 7);
    std::vector<uint8_t> int2_pool(2 * int2_stride, 0);
    uint8_t* d_int2 = ToDevice(int2_pool);
    DemoteParams dp;
    dp.bf16_pool = d_bf16;
    dp.bf16_stride = bf16_stride;
    dp.int2_pool = d_int2;
    dp.int2_stride = int2_stride;
    const std::vector<int32_t> src{1}, dst{0};
    dp.src_slot = ToDevice(src);
    dp.dst_slot = ToDevice(dst);
    dp.num_pages = 1;
    dp.clip = ToDevice(clip);
    dp.geometry = g;
    ASSERT_EQ(DemotePages(dp, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(bf16_pool.data(), d_bf16, bf16_pool.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(int2_pool.data(), d_int2, int2_pool.size(), cudaMemcpyDeviceToHost);

    // Rotated BF16 rows: within one bf16 rounding of the CPU's rotation.
    int64_t bf16_mismatch = 0, code_mismatch = 0, code_bytes = 0;
    for (int l = 0; l < g.num_layers; ++l) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int h = 0; h < g.num_kv_heads; ++h) {
          const std::vector<uint16_t>& src_rows = kind == 0 ? k : v;
          const float* R = (kind == 0 ? rk : rv).data() + (l * g.num_kv_heads + h) * d * d;
          std::vector<float> x(d), y(d);
          const uint8_t* blk =
              bf16_pool.data() + bf16_stride + BlockOffset(g, PageEncoding::kBf16, l, kind, h);
          for (int t = 0; t < tokens; ++t) {
            for (int i = 0; i < d; ++i)
              x[i] = Bf16ToFloat(src_rows[((l * tokens + t) * g.num_kv_heads + h) * d + i]);
            ApplyRotation(x.data(), 1, d, R, y.data());
            for (int i = 0; i < d; ++i) {
              uint16_t got;
              std::memcpy(&got, blk + (row[t] * d + i) * 2, 2);
              const float diff = std::fabs(Bf16ToFloat(got) - y[i]);
              ASSERT_LE(diff, std::fabs(y[i]) * (1.0f / 128) + 1e-6f)
                  << "layer " << l << " token " << t;
              bf16_mismatch += got != FloatToBf16(y[i]);
            }
          }
          // Demotion: EncodeInt2Block on the GPU's own BF16 block must give the same bytes.
          std::vector<float> rows(64 * d);
          DecodeBf16Block(blk, 64, g, rows.data());
          std::vector<uint8_t> expect(BlockBytes(g, PageEncoding::kInt2Uniform));
          EncodeInt2Block(rows.data(), 64, g, clip[(l * 2 + kind) * g.num_kv_heads + h],
                          PageEncoding::kInt2Uniform, kind, expect.data());
          const uint8_t* got =
              int2_pool.data() + kPageHeaderBytes +
              ((l * 2 + kind) * g.num_kv_heads + h) * BlockBytes(g, PageEncoding::kInt2Uniform);
          for (size_t i = 0; i < expect.size(); ++i) code_mismatch += got[i] != expect[i];
          code_bytes += static_cast<int64_t>(expect.size());
        }
      }
    }
    EXPECT_EQ(code_mismatch, 0) << "of " << code_bytes << " INT2 bytes (head_dim " << d << ")";
    std::printf(
        "append head_dim %d: %lld of %lld bf16 values differ by one rounding from the CPU's; "
        "INT2 bytes differing: %lld of %lld\n",
        d, static_cast<long long>(bf16_mismatch),
        static_cast<long long>(g.num_layers * 2 * g.num_kv_heads * tokens * d),
        static_cast<long long>(code_mismatch), static_cast<long long>(code_bytes));
  }
}

// The codec format's demotion: BF16 pages into codec blocks, byte for byte EncodeCodecBlock on
// the same values (or, with `fragment`, into codec fragment blocks as EncodeCodecFragmentBlock
// writes them), for recipes of every bit width (3-bit codes across bytes or in two parts, a
// dropped region), rows of very different norms, an all-zero row and an all-zero head, several
// pages at once and a device-side page count.
void ExpectCodecDemotionLikeTheCpu(bool fragment) {
  const struct {
    int d;
    const char* spec;
  } cases[] = {
      {64, "4x16+3x16+2x32:s8:pr|3x16+2x16+1x32:s8:pr"},
      {64, "4x64:s8:pr|2x32+1x16+0x16:s8:pr"},
      {128, "4x32+3x32+2x32+1x32:s8:pr|3x16+2x32+1x32+0x48:s8:pr"},
  };
  for (const auto& c : cases) {
    const int d = c.d, heads = 3, pages = 3;
    HistoryCodec codec;
    std::string error;
    // Fragment blocks code uniform levels: every recipe with u.
    std::string spec = c.spec;
    for (size_t at = spec.find(":pr"); fragment && at != std::string::npos;
         at = spec.find(":pr", at + 5)) {
      spec.insert(at + 3, ":u");
    }
    ASSERT_TRUE(ParseHistoryCodec(spec, d, &codec, &error)) << error;
    const auto block_bytes_of = [&](const SideRecipe& r) {
      return fragment ? CodecFragmentBlockLayoutFor(r).bytes : CodecBlockLayoutFor(r, 64).bytes;
    };
    const KvGeometry g{1, heads, d, d, 64};
    // A history page of this one layer: K blocks of every head, then V blocks, 64-byte slots.
    const int64_t kb = block_bytes_of(codec.Side(0, 0));
    const int64_t vb = block_bytes_of(codec.Side(0, 1));
    const int64_t k0 = kPageHeaderBytes, v0 = k0 + heads * kb;
    const int64_t stride = (v0 + heads * vb + 63) / 64 * 64;
    const int64_t bf16_stride = PageBytes(g, PageEncoding::kBf16);
    std::mt19937 rng(d + heads);
    std::normal_distribution<float> normal;
    std::vector<uint8_t> bf16_pool(pages * bf16_stride, 0);
    for (int p = 0; p < pages; ++p) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int h = 0; h < heads; ++h) {
          std::vector<float> rows(64 * d, 0.0f);
          if (!(p == 1 && h == 2)) {  // one block all zeros
            for (int t = 0; t < 64; ++t) {
              const float r = t == 5 ? 0.0f : std::exp(2.0f * normal(rng));
              for (int i = 0; i < d; ++i) rows[t * d + i] = r * normal(rng) * (i % 7 == 0 ? 4 : 1);
            }
          }
          EncodeBf16Block(rows.data(), 64, g,
                          bf16_pool.data() + p * bf16_stride +
                              BlockOffset(g, PageEncoding::kBf16, 0, kind, h));
        }
      }
    }
    std::vector<uint8_t> history(pages * stride, 0xcd);
    DemoteCodecParams dp;
    dp.bf16_pool = ToDevice(bf16_pool);
    dp.bf16_stride = bf16_stride;
    dp.history_pool = ToDevice(history);
    dp.history_stride = stride;
    const std::vector<int32_t> src{2, 0, 1}, dst{1, 2, 0}, count{2};
    dp.src_slot = ToDevice(src);
    dp.dst_slot = ToDevice(dst);
    dp.num_pages = pages;
    dp.num_pages_device = ToDevice(count);  // the third page is not demoted
    dp.geometry = g;
    if (fragment) {
      dp.codec = CodecFragmentLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), k0, v0);
      SetCodecFragmentLevels(&dp);
    } else {
      dp.codec = CodecLayerLayoutFor(codec.Side(0, 0), codec.Side(0, 1), 64, k0, v0);
    }
    ASSERT_EQ(DemoteCodecPages(dp, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(history.data(), dp.history_pool, history.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    int64_t mismatch = 0, bytes = 0;
    for (int i = 0; i < pages; ++i) {
      for (int kind = 0; kind < 2; ++kind) {
        const SideRecipe& r = codec.Side(0, kind);
        const int64_t block_bytes = kind == 0 ? kb : vb;
        for (int h = 0; h < heads; ++h) {
          const uint8_t* got = history.data() + dst[i] * stride + (kind == 0 ? k0 : v0) +
                               h * block_bytes;
          if (i >= count[0]) {  // not demoted: untouched
            for (int64_t j = 0; j < block_bytes; ++j) ASSERT_EQ(got[j], 0xcd);
            continue;
          }
          std::vector<float> rows(64 * d);
          DecodeBf16Block(bf16_pool.data() + src[i] * bf16_stride +
                              BlockOffset(g, PageEncoding::kBf16, 0, kind, h),
                          64, g, rows.data());
          std::vector<uint8_t> expect(block_bytes);
          if (fragment) {
            EncodeCodecFragmentBlock(rows.data(), d, r, kind, expect.data());
          } else {
            EncodeCodecBlock(rows.data(), 64, d, r, expect.data());
          }
          for (int64_t j = 0; j < block_bytes; ++j) mismatch += got[j] != expect[j];
          bytes += block_bytes;
        }
      }
    }
    EXPECT_EQ(mismatch, 0) << "of " << bytes << " codec bytes (" << spec << ")";
    std::printf("%s demotion, head_dim %d, %s: %lld of %lld bytes differ from the CPU's\n",
                fragment ? "codec fragment" : "codec", d, spec.c_str(),
                static_cast<long long>(mismatch), static_cast<long long>(bytes));
    for (const void* a : {static_cast<const void*>(dp.bf16_pool), static_cast<const void*>(dp.history_pool),
                          static_cast<const void*>(dp.src_slot), static_cast<const void*>(dp.dst_slot),
                          static_cast<const void*>(dp.num_pages_device)}) {
      cudaFree(const_cast<void*>(a));
    }
  }
}

TEST(AppendGpu, DemotesCodecPagesLikeTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ExpectCodecDemotionLikeTheCpu(/*fragment=*/false);
}

TEST(AppendGpu, DemotesCodecFragmentPagesLikeTheCpu) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ExpectCodecDemotionLikeTheCpu(/*fragment=*/true);
}

}  // namespace
}  // namespace kvstrata::kernels

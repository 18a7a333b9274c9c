// GPU test: the INT2 dequantisation kernel against the CPU reference (DecodeInt2Block).
// Skips itself when no CUDA device is present.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kernels/cuda/int2_dequant.h"
#include "kernels/quant.h"
#include "tests/kernels/gpu_test_util.h"

namespace kvstrata::kernels {
namespace {

TEST(Int2DequantGpu, MatchesCpuReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  int shapes = 0;
  double worst = 0;
  for (int head_dim : {64, 128}) {
    for (int group : {32, 64, 128}) {
      if (group > head_dim) continue;
      for (PageEncoding e : {PageEncoding::kInt2Uniform, PageEncoding::kInt2LloydMax}) {
        const KvGeometry g{.num_layers = 3,
                           .num_kv_heads = 2,
                           .head_dim = head_dim,
                           .group_size = group,
                           .page_tokens = 64};
        const int num_pages = 5;
        const int64_t stride = PageBytes(g, e) + 128;
        std::vector<uint8_t> pages(num_pages * stride, 0);
        std::vector<float> expect(num_pages * NumBlocks(g) * 64 * head_dim);
        std::mt19937 rng(head_dim + group);
        std::normal_distribution<float> normal(0.0f, 3.0f);
        std::vector<float> rows(64 * head_dim);
        for (int p = 0; p < num_pages; ++p) {
          for (int64_t b = 0; b < NumBlocks(g); ++b) {
            for (auto& v : rows) v = normal(rng);
            uint8_t* block = pages.data() + p * stride + kPageHeaderBytes + b * BlockBytes(g, e);
            const int kind = static_cast<int>(b / g.num_kv_heads) % 2;
            EncodeInt2Block(rows.data(), 64, g, 0.96f, e, kind, block);
            DecodeInt2Block(block, 64, g, e, kind,
                            expect.data() + (p * NumBlocks(g) + b) * 64 * head_dim);
          }
        }
        uint8_t* d_pages = nullptr;
        float* d_out = nullptr;
        ASSERT_EQ(cudaMalloc(&d_pages, pages.size()), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&d_out, expect.size() * sizeof(float)), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d_pages, pages.data(), pages.size(), cudaMemcpyHostToDevice),
                  cudaSuccess);
        Int2DequantParams params{d_pages, stride, num_pages, g, e, d_out};
        ASSERT_EQ(LaunchInt2Dequant(params, nullptr), cudaSuccess);
        std::vector<float> got(expect.size());
        ASSERT_EQ(cudaMemcpy(got.data(), d_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        cudaFree(d_pages);
        cudaFree(d_out);
        for (size_t i = 0; i < got.size(); ++i) {
          // The kernel computes offset + scale * level exactly as the reference does; allow
          // for fused multiply-add rounding.
          const double err = std::abs(got[i] - expect[i]);
          worst = std::max(worst, err);
          ASSERT_LE(err, 1e-5 * (1.0 + std::abs(expect[i]))) << "i=" << i;
        }
        ++shapes;
      }
    }
  }
  EXPECT_EQ(shapes, 10);
  std::printf("int2 dequant: %d shapes, largest abs error %.3g\n", shapes, worst);
}

TEST(Int2DequantGpu, RejectsUnsupportedShapes) {
  Int2DequantParams params;
  params.num_pages = 1;
  params.geometry = {
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 96, .group_size = 32, .page_tokens = 64};
  EXPECT_EQ(LaunchInt2Dequant(params, nullptr), cudaErrorInvalidValue);  // no device needed
  params.geometry.head_dim = 128;
  params.geometry.group_size = 24;
  EXPECT_EQ(LaunchInt2Dequant(params, nullptr), cudaErrorInvalidValue);
  params.encoding = PageEncoding::kBf16;
  params.geometry.group_size = 32;
  EXPECT_EQ(LaunchInt2Dequant(params, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvstrata::kernels

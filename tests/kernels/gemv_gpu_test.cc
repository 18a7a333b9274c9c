// GPU test: the few-row matrix-vector product (kernels/cuda/gemv.h) against the same product in
// double on the CPU, over the shapes decode uses (rows 1..4, a row length that is not a
// multiple of the kernel's step, accumulate on and off, bf16 and fp16). Skips itself without a
// CUDA device.

#include "kernels/cuda/gemv.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/numeric.h"
#include "tests/kernels/gpu_test_util.h"

namespace kvstrata::kernels {
namespace {

struct Shape {
  int rows, in, out;
};

// x is written by a kernel right before the GEMV (ConvertFloat, which lets a dependent start
// early), over a buffer that held other values: a variant that read x before that kernel ended
// would be caught.
void Check(const Shape& s, GemmType type, bool accumulate, uint32_t seed, const GemvVariant& v) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  auto round = [&](float f) {
    return type == GemmType::kBf16 ? FloatToBf16(f) : FloatToFp16(f);
  };
  auto value = [&](uint16_t h) { return type == GemmType::kBf16 ? Bf16ToFloat(h) : Fp16ToFloat(h); };
  std::vector<uint16_t> x(static_cast<size_t>(s.rows) * s.in), w(static_cast<size_t>(s.out) * s.in);
  for (auto& v : x) v = round(normal(rng));
  for (auto& v : w) v = round(normal(rng) * 0.05f);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = value(x[i]);
  std::vector<float> y0(static_cast<size_t>(s.rows) * s.out);
  for (auto& v : y0) v = normal(rng);
  uint16_t* dx = ToDevice(std::vector<uint16_t>(x.size(), round(7.0f)));
  float* dxf = ToDevice(xf);
  uint16_t* dw = ToDevice(w);
  float* dy = ToDevice(y0);
  ASSERT_TRUE(GemvSupports(s.rows, s.in, type, dx, dw));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(ConvertFloat(dxf, static_cast<int64_t>(xf.size()), dx, type, stream), cudaSuccess);
  ASSERT_EQ(Gemv(dx, s.rows, s.in, dw, s.out, dy, accumulate, type, stream, v), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  std::vector<float> got(y0.size());
  cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dxf);
  cudaFree(dw);
  cudaFree(dy);
  for (int r = 0; r < s.rows; ++r) {
    for (int n = 0; n < s.out; ++n) {
      double sum = 0, mag = 0;
      for (int k = 0; k < s.in; ++k) {
        const double p = double{value(w[static_cast<size_t>(n) * s.in + k])} *
                         value(x[static_cast<size_t>(r) * s.in + k]);
        sum += p;
        mag += std::fabs(p);
      }
      const double expect = sum + (accumulate ? y0[static_cast<size_t>(r) * s.out + n] : 0.0);
      const double err = std::fabs(got[static_cast<size_t>(r) * s.out + n] - expect);
      ASSERT_LE(err, 3e-5 * mag + 1e-6)
          << "rows " << s.rows << " in " << s.in << " out " << s.out << " at (" << r << ", " << n
          << "), one_wave " << v.one_wave << " overlap " << v.overlap_previous << ": got "
          << got[static_cast<size_t>(r) * s.out + n] << ", expected " << expect;
    }
  }
}

TEST(GemvGpu, MatchesTheProductInDouble) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1;
  for (GemmType type : {GemmType::kBf16, GemmType::kFp16}) {
    // The last shape has more rows than one wave of warps: the grid-stride loop takes the rest.
    for (const Shape& s : {Shape{1, 4096, 1024}, Shape{1, 576, 1536}, Shape{2, 8, 7},
                           Shape{3, 4104, 33}, Shape{4, 12288, 257}, Shape{1, 1032, 5000},
                           Shape{2, 256, 40000}}) {
      for (bool accumulate : {false, true}) {
        for (bool one_wave : {false, true}) {
          for (bool overlap : {false, true}) {
            Check(s, type, accumulate, seed++, GemvVariant{one_wave, overlap});
          }
        }
      }
    }
  }
}

TEST(GemvGpu, RefusesWhatItDoesNotTake) {
  alignas(16) static uint16_t buffer[64];
  EXPECT_FALSE(GemvSupports(0, 64, GemmType::kBf16, buffer, buffer));
  EXPECT_FALSE(GemvSupports(kGemvMaxRows + 1, 64, GemmType::kBf16, buffer, buffer));
  EXPECT_FALSE(GemvSupports(1, 60, GemmType::kBf16, buffer, buffer));  // not a multiple of 8
  EXPECT_FALSE(GemvSupports(1, 64, GemmType::kFp32, buffer, buffer));
  EXPECT_FALSE(GemvSupports(1, 64, GemmType::kBf16, buffer + 1, buffer));  // misaligned x
  EXPECT_TRUE(GemvSupports(1, 64, GemmType::kFp16, buffer, buffer));
  EXPECT_EQ(Gemv(buffer, 1, 60, buffer, 4, nullptr, false, GemmType::kBf16, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvstrata::kernels

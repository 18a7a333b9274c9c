// GPU test: the few-row matrix-vector product (kernels/cuda/gemv.h) against the same product in
// double on the CPU, over the shapes decode uses (rows 1..4, a row length that is not a
// multiple of the kernel's step, accumulate on and off, bf16 and fp16); and the GEMV of an
// RMS-normed input (plain and SwiGLU) against the launches it replaces and against double.
// Skips itself without a CUDA device.

#include "kernels/cuda/gemv.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
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

// The GEMV of RMSNorm(x), plain or SwiGLU, with x written by the kernel right before it over a
// buffer of other values. Against (1) RmsNormTo + Gemv (+ SwiGluTo) on the GPU: the same bits
// (rows of up to 4,096 values); (2) the same math in double.
void CheckNormed(int rows, int in, int out, bool swiglu, GemmType type, uint32_t seed,
                 const GemvVariant& fused = {}) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  auto round = [&](float f) {
    return type == GemmType::kBf16 ? FloatToBf16(f) : FloatToFp16(f);
  };
  auto value = [&](uint16_t h) { return type == GemmType::kBf16 ? Bf16ToFloat(h) : Fp16ToFloat(h); };
  const int w_rows = swiglu ? 2 * out : out;
  const float eps = 1e-6f;
  std::vector<float> x(static_cast<size_t>(rows) * in), nw(in);
  for (auto& v : x) v = 3.0f * normal(rng);
  for (auto& v : nw) v = 1.0f + 0.2f * normal(rng);
  std::vector<uint16_t> w(static_cast<size_t>(w_rows) * in);
  for (auto& v : w) v = round(normal(rng) * 0.05f);
  float* dsrc = ToDevice(x);
  float* dx = ToDevice(std::vector<float>(x.size(), 7.0f));
  float* dnw = ToDevice(nw);
  uint16_t* dw = ToDevice(w);
  uint16_t* dhn = ToDevice(std::vector<uint16_t>(x.size()));
  float* dy_ref = ToDevice(std::vector<float>(static_cast<size_t>(rows) * w_rows));
  float* dy = ToDevice(std::vector<float>(static_cast<size_t>(rows) * w_rows, -1.0f));
  uint16_t* dact_ref = ToDevice(std::vector<uint16_t>(static_cast<size_t>(rows) * out));
  uint16_t* dact = ToDevice(std::vector<uint16_t>(static_cast<size_t>(rows) * out));
  ASSERT_TRUE(GemvRmsNormedSupports(rows, in, type, dx, dnw, dw));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const int64_t n = static_cast<int64_t>(x.size());
  // The launches the fused GEMV replaces.
  ASSERT_EQ(ConvertFloat(dsrc, n, dx, GemmType::kFp32, stream), cudaSuccess);
  ASSERT_EQ(RmsNormTo(dx, in, rows, in, dnw, eps, dhn, type, stream), cudaSuccess);
  ASSERT_EQ(Gemv(dhn, rows, in, dw, w_rows, dy_ref, false, type, stream, GemvVariant{false, true}),
            cudaSuccess);
  if (swiglu) {
    ASSERT_EQ(SwiGluTo(dy_ref, dy_ref + out, rows, out, 2 * int64_t{out}, dact_ref, type, stream),
              cudaSuccess);
  }
  // The fused one, x rewritten just before it.
  ASSERT_EQ(cudaMemsetAsync(dx, 0x7f, n * 4, stream), cudaSuccess);
  ASSERT_EQ(ConvertFloat(dsrc, n, dx, GemmType::kFp32, stream), cudaSuccess);
  if (swiglu) {
    ASSERT_EQ(GemvRmsNormedSwiGlu(dx, rows, in, dnw, eps, dw, out, dact, type, stream, fused),
              cudaSuccess);
  } else {
    ASSERT_EQ(GemvRmsNormed(dx, rows, in, dnw, eps, dw, out, dy, type, stream, fused), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  std::vector<float> y(static_cast<size_t>(rows) * out), y_ref(static_cast<size_t>(rows) * w_rows);
  std::vector<uint16_t> act(static_cast<size_t>(rows) * out), act_ref(act.size());
  cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(y_ref.data(), dy_ref, y_ref.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(act.data(), dact, act.size() * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(act_ref.data(), dact_ref, act_ref.size() * 2, cudaMemcpyDeviceToHost);
  for (void* p : std::initializer_list<void*>{dsrc, dx, dnw, dw, dhn, dy_ref, dy, dact_ref, dact}) {
    cudaFree(p);
  }
  const std::string what = std::string(swiglu ? "SwiGLU" : "plain") + " rows " +
                           std::to_string(rows) + " in " + std::to_string(in) + " out " +
                           std::to_string(out) + (type == GemmType::kBf16 ? " bf16" : " fp16") +
                           (fused.one_wave ? ", one wave" : "") +
                           (fused.paired_rows ? ", paired rows" : "");
  if (in <= 4096) {
    if (swiglu) {
      EXPECT_EQ(std::memcmp(act.data(), act_ref.data(), act.size() * 2), 0) << what;
    } else {
      for (int r = 0; r < rows; ++r) {
        EXPECT_EQ(std::memcmp(y.data() + static_cast<size_t>(r) * out,
                              y_ref.data() + static_cast<size_t>(r) * w_rows,
                              static_cast<size_t>(out) * 4),
                  0)
            << what << ", row " << r;
      }
    }
  }
  // Double: the normed row rounded to the type as the kernel stores it, then the products.
  for (int r = 0; r < rows; ++r) {
    const float* xr = x.data() + static_cast<size_t>(r) * in;
    double ss = 0;
    for (int k = 0; k < in; ++k) ss += double{xr[k]} * xr[k];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / in + eps));
    std::vector<double> hn(in);
    for (int k = 0; k < in; ++k) hn[k] = value(round(xr[k] * inv * nw[k]));
    auto dot = [&](int row, double* mag) {
      double sum = 0;
      *mag = 0;
      for (int k = 0; k < in; ++k) {
        const double p = double{value(w[static_cast<size_t>(row) * in + k])} * hn[k];
        sum += p;
        *mag += std::fabs(p);
      }
      return sum;
    };
    for (int o = 0; o < out; ++o) {
      double mag_g = 0, mag_u = 0;
      const double g = dot(o, &mag_g);
      // A normed value whose rounding went the other way moves a product by one unit of the
      // type: 2^-8 of it in bf16, 2^-11 in fp16.
      const double slack = (type == GemmType::kBf16 ? 4e-3 : 5e-4) * 1.0 / std::sqrt(in);
      const double tol_g = (3e-5 + slack) * mag_g + 1e-6;
      if (!swiglu) {
        const double got = y[static_cast<size_t>(r) * out + o];
        ASSERT_LE(std::fabs(got - g), tol_g) << what << " at (" << r << ", " << o << ")";
        continue;
      }
      const double u = dot(out + o, &mag_u);
      const double tol_u = (3e-5 + slack) * mag_u + 1e-6;
      const double silu = g / (1.0 + std::exp(-g));
      const double expect = silu * u;
      const double got = value(act[static_cast<size_t>(r) * out + o]);
      const double tol = 1.2 * std::fabs(u) * tol_g + std::fabs(silu) * tol_u +
                         (type == GemmType::kBf16 ? 4e-3 : 5e-4) * std::fabs(expect) + 1e-6;
      ASSERT_LE(std::fabs(got - expect), tol) << what << " at (" << r << ", " << o << ")";
    }
  }
}

TEST(GemvGpu, NormedInputMatchesTheNormThenTheProduct) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  for (GemmType type : {GemmType::kBf16, GemmType::kFp16}) {
    for (bool swiglu : {false, true}) {
      // The 8B model's q/k/v and gate/up (hidden 4,096), the default model's (576), a row whose
      // chunks are not a multiple of the kernel's step, and a grid-stride tail.
      CheckNormed(1, 4096, 6144, swiglu, type, seed++);
      CheckNormed(2, 4096, swiglu ? 12288 : 6144, swiglu, type, seed++);
      CheckNormed(1, 576, 1536, swiglu, type, seed++);
      CheckNormed(2, 1032, 300, swiglu, type, seed++);
      CheckNormed(1, 256, 70000, swiglu, type, seed++);
      CheckNormed(1, 8192, 500, swiglu, type, seed++);  // past RmsNormTo's 256 threads
      // One wave of CTAs, each warp taking several rows (the same bits as the launches above).
      const GemvVariant one_wave{.one_wave = true};
      CheckNormed(1, 4096, swiglu ? 12288 : 6144, swiglu, type, seed++, one_wave);
      CheckNormed(2, 4096, swiglu ? 12288 : 6144, swiglu, type, seed++, one_wave);
      CheckNormed(1, 256, 70000, swiglu, type, seed++, one_wave);
      // Two rows at a time per warp (the same bits): one wave, a row count that leaves some
      // warps one row, a grid-stride tail, and rows that are not a multiple of the step.
      const GemvVariant paired{.one_wave = true, .paired_rows = true};
      CheckNormed(1, 4096, swiglu ? 12288 : 6144, swiglu, type, seed++, paired);
      CheckNormed(2, 4096, swiglu ? 12288 : 6144, swiglu, type, seed++, paired);
      CheckNormed(1, 256, 70000, swiglu, type, seed++, paired);
      CheckNormed(2, 1032, 300, swiglu, type, seed++, GemvVariant{.paired_rows = true});
    }
  }
}

TEST(GemvGpu, NormedInputRefusesWhatItDoesNotTake) {
  alignas(16) static float x[64];
  alignas(16) static uint16_t w[64];
  EXPECT_FALSE(GemvRmsNormedSupports(3, 64, GemmType::kBf16, x, x, w));  // rows
  EXPECT_FALSE(GemvRmsNormedSupports(2, 16384, GemmType::kBf16, x, x, w));  // shared memory
  EXPECT_FALSE(GemvRmsNormedSupports(1, 60, GemmType::kBf16, x, x, w));
  EXPECT_FALSE(GemvRmsNormedSupports(1, 64, GemmType::kFp32, x, x, w));
  EXPECT_FALSE(GemvRmsNormedSupports(1, 64, GemmType::kBf16, x, x + 1, w));  // norm weight
  EXPECT_TRUE(GemvRmsNormedSupports(2, 64, GemmType::kFp16, x, x, w));
  EXPECT_EQ(GemvRmsNormed(x, 1, 60, x, 1e-6f, w, 4, x, GemmType::kBf16, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(GemvRmsNormedSwiGlu(x, 1, 64, x, 1e-6f, w, 4, nullptr, GemmType::kBf16, nullptr),
            cudaErrorInvalidValue);
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

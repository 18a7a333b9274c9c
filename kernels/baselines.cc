#include "kernels/baselines.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/numeric.h"
#include "kernels/quant.h"
#include "kernels/rotation.h"

namespace kvstrata::kernels {

namespace {

// Asymmetric min-max with 2^bits levels over n values at stride `stride`, fp16 parameters.
void MinMaxFakeQuant(const float* x, int n, int64_t stride, int bits, float* y) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  const int max_code = (1 << bits) - 1;
  const float m = Fp16ToFloat(FloatToFp16Saturate(lo));
  const float s = Fp16ToFloat(FloatToFp16Saturate((hi - lo) / max_code));
  for (int i = 0; i < n; ++i) {
    int q = 0;
    if (s > 0.0f)
      q = std::clamp(static_cast<int>(std::floor((x[i * stride] - m) / s + 0.5f)), 0, max_code);
    y[i * stride] = m + s * q;
  }
}

// Centroids of the 8-level Lloyd-Max quantiser of a unit Gaussian.
constexpr float kGaussianLloydMax8[8] = {-2.1520f, -1.3439f, -0.7560f, -0.2451f,
                                         0.2451f,  0.7560f,  1.3439f,  2.1520f};

}  // namespace

uint8_t FloatToE4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to the largest finite value
  // Find the nearest representable value by rounding in the value's own binade.
  int exp;
  std::frexp(a, &exp);  // a = frac * 2^exp, frac in [0.5, 1)
  int e = exp - 1;      // a in [2^e, 2^(e+1))
  if (e < -6) e = -6;   // subnormal range: step 2^-9
  const float step = std::ldexp(1.0f, e - 3);
  float q = std::nearbyint(a / step);  // ties to even under the default rounding mode
  float value = q * step;
  if (value == 0.0f) return sign;
  // Encode value back into bits.
  int ve;
  std::frexp(value, &ve);
  int biased = ve - 1 + 7;
  if (biased <= 0) {
    const int man = static_cast<int>(value / std::ldexp(1.0f, -9));
    return sign | static_cast<uint8_t>(man);
  }
  const int man = static_cast<int>(value / std::ldexp(1.0f, ve - 1 - 3)) - 8;
  return sign | static_cast<uint8_t>(biased << 3 | man);
}

float E4M3ToFloat(uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exp = (v >> 3) & 0xf;
  const int man = v & 0x7;
  if (exp == 0xf && man == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man), -9);
  return sign * std::ldexp(1.0f + man / 8.0f, exp - 7);
}

void FakeQuantBf16(const float* x, int64_t n, int d, float* y) {
  for (int64_t i = 0; i < n * d; ++i) y[i] = RoundToBf16(x[i]);
}

void FakeQuantFp8E4M3(const float* x, int64_t n, int d, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * d;
    float amax = 0.0f;
    for (int i = 0; i < d; ++i) amax = std::max(amax, std::fabs(xr[i]));
    const float s = Fp16ToFloat(FloatToFp16Saturate(amax / 448.0f));
    for (int i = 0; i < d; ++i) {
      y[t * d + i] = s > 0.0f ? s * E4M3ToFloat(FloatToE4M3(xr[i] / s)) : 0.0f;
    }
  }
}

void FakeQuantInt4(const float* x, int64_t n, int d, int group, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    for (int g = 0; g < d; g += group) MinMaxFakeQuant(x + t * d + g, group, 1, 4, y + t * d + g);
  }
}

void FakeQuantNaiveInt2(const float* x, int64_t n, int d, int group, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    for (int g = 0; g < d; g += group) MinMaxFakeQuant(x + t * d + g, group, 1, 2, y + t * d + g);
  }
}

void FakeQuantRotatedInt2(const float* x, int64_t n, int d, int group, const float* r,
                          float clip_ratio, PageEncoding encoding, float* y) {
  std::vector<float> rotated(n * d), deq(n * d);
  ApplyRotation(x, n, d, r, rotated.data());
  std::vector<uint8_t> codes(d);
  std::vector<uint16_t> params(2 * (d / group));
  for (int64_t t = 0; t < n; ++t) {
    QuantizeRowInt2(rotated.data() + t * d, d, group, clip_ratio, encoding, codes.data(),
                    params.data());
    DequantizeRowInt2(codes.data(), params.data(), d, group, encoding, deq.data() + t * d);
  }
  ApplyRotationTransposed(deq.data(), n, d, r, y);
}

int64_t Kivi2QuantizedTokens(int64_t n, int token_group, int residual) {
  const int64_t eligible = std::max<int64_t>(0, n - residual);
  return eligible / token_group * token_group;
}

void FakeQuantKivi2Keys(const float* x, int64_t n, int d, int token_group, int residual, float* y) {
  const int64_t quantized = Kivi2QuantizedTokens(n, token_group, residual);
  for (int64_t t0 = 0; t0 < quantized; t0 += token_group) {
    for (int c = 0; c < d; ++c) {
      MinMaxFakeQuant(x + t0 * d + c, token_group, d, 2, y + t0 * d + c);
    }
  }
  FakeQuantBf16(x + quantized * d, n - quantized, d, y + quantized * d);
}

void FakeQuantKivi2Values(const float* x, int64_t n, int d, int channel_group, int token_group,
                          int residual, float* y) {
  // Values are quantised per token, but on the same schedule as keys (chunks leave the
  // residual together), so the residual holds the same tokens for K and V.
  const int64_t quantized = Kivi2QuantizedTokens(n, token_group, residual);
  FakeQuantNaiveInt2(x, quantized, d, channel_group, y);
  FakeQuantBf16(x + quantized * d, n - quantized, d, y + quantized * d);
}

void FakeQuantTurbo3(const float* x, int64_t n, int d, uint64_t seed, float* y) {
  std::vector<float> r(int64_t{d} * d);
  RandomSignHadamard(d, seed, r.data());
  std::vector<float> rotated(n * d), deq(n * d);
  ApplyRotation(x, n, d, r.data(), rotated.data());
  for (int64_t t = 0; t < n; ++t) {
    const float* row = rotated.data() + t * d;
    double sq = 0.0;
    for (int i = 0; i < d; ++i) sq += double{row[i]} * row[i];
    const float norm = Fp16ToFloat(FloatToFp16Saturate(static_cast<float>(std::sqrt(sq))));
    const float sigma = norm / std::sqrt(static_cast<float>(d));
    for (int i = 0; i < d; ++i) {
      int best = 0;
      float best_err = std::fabs(row[i] - sigma * kGaussianLloydMax8[0]);
      for (int k = 1; k < 8; ++k) {
        const float err = std::fabs(row[i] - sigma * kGaussianLloydMax8[k]);
        if (err < best_err) best = k, best_err = err;
      }
      deq[t * d + i] = sigma * kGaussianLloydMax8[best];
    }
  }
  ApplyRotationTransposed(deq.data(), n, d, r.data(), y);
}

}  // namespace kvstrata::kernels

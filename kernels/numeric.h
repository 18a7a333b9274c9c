#pragma once

// Half-precision conversions shared by the CPU reference and the CUDA kernels.
// Both round to nearest, ties to even, like the hardware conversions they stand in for.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KV_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KV_HOST_DEVICE inline
#endif

namespace kvstrata::kernels {

KV_HOST_DEVICE uint32_t FloatBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

KV_HOST_DEVICE float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// float -> bfloat16 bits, round to nearest even. NaN stays a (quiet) NaN.
KV_HOST_DEVICE uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

KV_HOST_DEVICE float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

KV_HOST_DEVICE float RoundToBf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }

// IEEE binary16 bits -> float (exact).
KV_HOST_DEVICE float Fp16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (man << 13));
  return BitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// float -> IEEE binary16 bits, round to nearest even, overflow to infinity, with subnormals.
KV_HOST_DEVICE uint16_t FloatToFp16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to an integer mantissa.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14 + (112 - exp) + 0: brings man to units of 2^-24
    uint32_t q = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15 (in the float bit layout)
  r += 0x0fffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

// Saturating variant for quantisation parameters: finite inputs never become infinity.
KV_HOST_DEVICE uint16_t FloatToFp16Saturate(float f) {
  if (f > 65504.0f) f = 65504.0f;
  if (f < -65504.0f) f = -65504.0f;
  return FloatToFp16(f);
}

KV_HOST_DEVICE float RoundToFp16(float f) { return Fp16ToFloat(FloatToFp16(f)); }

// The 8-bit log2 scale code of the codec format (kernels/history_codec.h, codec_page.h): 0 for
// s <= 0, else round(8·log2 s) + 160 clamped to 1..255, in double on the CPU and the GPU alike,
// so pages demoted on either are the same bytes. LogScaleValue is its inverse.
KV_HOST_DEVICE uint8_t LogScaleCode(float s) {
  if (!(s > 0.0f)) return 0;
  const long long c = llround(8.0 * log2(static_cast<double>(s))) + 160;
  return static_cast<uint8_t>(c < 1 ? 1 : c > 255 ? 255 : c);
}

}  // namespace kvstrata::kernels

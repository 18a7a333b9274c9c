#include "model/dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/numeric.h"
#include "model/load_util.h"

namespace kvstrata::model {
namespace {

using kernels::Bf16ToFloat;
using kernels::FloatToBf16;
using kernels::FloatToFp16;
using kernels::Fp16ToFloat;

constexpr int kBlock = 32;  // elements per block of Q8_0, Q4_0, Q4_1

uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

void StoreU16(uint16_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Block layouts, in bytes: Q8_0 = 2 + 32, Q4_0 = 2 + 16, Q4_1 = 2 + 2 + 16.
void DecodeQ8_0(const uint8_t* src, size_t num_blocks, float* dst) {
  for (size_t b = 0; b < num_blocks; ++b, src += 34, dst += kBlock) {
    const float d = Fp16ToFloat(LoadU16(src));
    const int8_t* qs = reinterpret_cast<const int8_t*>(src + 2);
    for (int j = 0; j < kBlock; ++j) dst[j] = d * static_cast<float>(qs[j]);
  }
}

void DecodeQ4_0(const uint8_t* src, size_t num_blocks, float* dst) {
  for (size_t b = 0; b < num_blocks; ++b, src += 18, dst += kBlock) {
    const float d = Fp16ToFloat(LoadU16(src));
    const uint8_t* qs = src + 2;
    for (int j = 0; j < kBlock / 2; ++j) {
      dst[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
      dst[j + kBlock / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
    }
  }
}

void DecodeQ4_1(const uint8_t* src, size_t num_blocks, float* dst) {
  for (size_t b = 0; b < num_blocks; ++b, src += 20, dst += kBlock) {
    const float d = Fp16ToFloat(LoadU16(src));
    const float m = Fp16ToFloat(LoadU16(src + 2));
    const uint8_t* qs = src + 4;
    for (int j = 0; j < kBlock / 2; ++j) {
      dst[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
      dst[j + kBlock / 2] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  }
}

int RoundClamp(float x, int lo, int hi) {
  const float r = std::nearbyint(x);
  if (!(r >= static_cast<float>(lo))) return lo;  // also catches NaN
  if (r > static_cast<float>(hi)) return hi;
  return static_cast<int>(r);
}

void EncodeQ8_0(const float* src, size_t num_blocks, uint8_t* dst) {
  for (size_t b = 0; b < num_blocks; ++b, src += kBlock, dst += 34) {
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(src[j]));
    const uint16_t d_bits = FloatToFp16(amax / 127.0f);
    const float d = Fp16ToFloat(d_bits);  // quantise against the scale the decoder will see
    StoreU16(d_bits, dst);
    for (int j = 0; j < kBlock; ++j) {
      const int q = d == 0.0f ? 0 : RoundClamp(src[j] / d, -127, 127);
      dst[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
}

void EncodeQ4_0(const float* src, size_t num_blocks, uint8_t* dst) {
  for (size_t b = 0; b < num_blocks; ++b, src += kBlock, dst += 18) {
    // The value of largest magnitude maps to q = 0 (-8 after the offset), keeping its sign.
    float extreme = 0.0f;
    for (int j = 0; j < kBlock; ++j) {
      if (std::fabs(src[j]) > std::fabs(extreme)) extreme = src[j];
    }
    const uint16_t d_bits = FloatToFp16(extreme / -8.0f);
    const float d = Fp16ToFloat(d_bits);
    StoreU16(d_bits, dst);
    for (int j = 0; j < kBlock / 2; ++j) {
      const int lo = d == 0.0f ? 8 : RoundClamp(src[j] / d + 8.0f, 0, 15);
      const int hi = d == 0.0f ? 8 : RoundClamp(src[j + kBlock / 2] / d + 8.0f, 0, 15);
      dst[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void EncodeQ4_1(const float* src, size_t num_blocks, uint8_t* dst) {
  for (size_t b = 0; b < num_blocks; ++b, src += kBlock, dst += 20) {
    const auto [lo_it, hi_it] = std::minmax_element(src, src + kBlock);
    const uint16_t d_bits = FloatToFp16((*hi_it - *lo_it) / 15.0f);
    const uint16_t m_bits = FloatToFp16(*lo_it);
    const float d = Fp16ToFloat(d_bits);
    const float m = Fp16ToFloat(m_bits);
    StoreU16(d_bits, dst);
    StoreU16(m_bits, dst + 2);
    for (int j = 0; j < kBlock / 2; ++j) {
      const int lo = d == 0.0f ? 0 : RoundClamp((src[j] - m) / d, 0, 15);
      const int hi = d == 0.0f ? 0 : RoundClamp((src[j + kBlock / 2] - m) / d, 0, 15);
      dst[4 + j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

// Plain types, in the block-codec shape (a "block" is one element).
void DecodeF32(const uint8_t* src, size_t n, float* dst) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}
void DecodeF16(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(LoadU16(src + 2 * i));
}
void DecodeBF16(const uint8_t* src, size_t n, float* dst) {
  for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(LoadU16(src + 2 * i));
}
void EncodeF32(const float* src, size_t n, uint8_t* dst) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
}
void EncodeF16(const float* src, size_t n, uint8_t* dst) {
  for (size_t i = 0; i < n; ++i) StoreU16(FloatToFp16(src[i]), dst + 2 * i);
}
void EncodeBF16(const float* src, size_t n, uint8_t* dst) {
  for (size_t i = 0; i < n; ++i) StoreU16(FloatToBf16(src[i]), dst + 2 * i);
}

// Converters over whole blocks: (source, number of blocks, destination).
struct Codec {
  void (*decode)(const uint8_t*, size_t, float*) = nullptr;
  void (*encode)(const float*, size_t, uint8_t*) = nullptr;
};

// The one place that says which types this library converts; every type is listed, so a new
// one breaks the build until it is decided here.
Codec CodecFor(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return {DecodeF32, EncodeF32};
    case GgmlType::kF16:
      return {DecodeF16, EncodeF16};
    case GgmlType::kBF16:
      return {DecodeBF16, EncodeBF16};
    case GgmlType::kQ8_0:
      return {DecodeQ8_0, EncodeQ8_0};
    case GgmlType::kQ4_0:
      return {DecodeQ4_0, EncodeQ4_0};
    case GgmlType::kQ4_1:
      return {DecodeQ4_1, EncodeQ4_1};
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_1:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kQ8_K:
    case GgmlType::kIQ2_XXS:
    case GgmlType::kIQ2_XS:
    case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ1_S:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ2_S:
    case GgmlType::kIQ4_XS:
    case GgmlType::kI8:
    case GgmlType::kI16:
    case GgmlType::kI32:
    case GgmlType::kI64:
    case GgmlType::kF64:
    case GgmlType::kIQ1_M:
    case GgmlType::kTQ1_0:
    case GgmlType::kTQ2_0:
    case GgmlType::kMXFP4:
    case GgmlType::kNVFP4:
    case GgmlType::kQ1_0:
      return {};
  }
  return {};
}

}  // namespace

GgmlTypeInfo GetGgmlTypeInfo(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return {"F32", 1, 4};
    case GgmlType::kF16:
      return {"F16", 1, 2};
    case GgmlType::kQ4_0:
      return {"Q4_0", 32, 18};
    case GgmlType::kQ4_1:
      return {"Q4_1", 32, 20};
    case GgmlType::kQ5_0:
      return {"Q5_0", 32, 22};
    case GgmlType::kQ5_1:
      return {"Q5_1", 32, 24};
    case GgmlType::kQ8_0:
      return {"Q8_0", 32, 34};
    case GgmlType::kQ8_1:
      return {"Q8_1", 32, 36};
    case GgmlType::kQ2_K:
      return {"Q2_K", 256, 84};
    case GgmlType::kQ3_K:
      return {"Q3_K", 256, 110};
    case GgmlType::kQ4_K:
      return {"Q4_K", 256, 144};
    case GgmlType::kQ5_K:
      return {"Q5_K", 256, 176};
    case GgmlType::kQ6_K:
      return {"Q6_K", 256, 210};
    case GgmlType::kQ8_K:
      return {"Q8_K", 256, 292};
    case GgmlType::kIQ2_XXS:
      return {"IQ2_XXS", 256, 66};
    case GgmlType::kIQ2_XS:
      return {"IQ2_XS", 256, 74};
    case GgmlType::kIQ3_XXS:
      return {"IQ3_XXS", 256, 98};
    case GgmlType::kIQ1_S:
      return {"IQ1_S", 256, 50};
    case GgmlType::kIQ4_NL:
      return {"IQ4_NL", 32, 18};
    case GgmlType::kIQ3_S:
      return {"IQ3_S", 256, 110};
    case GgmlType::kIQ2_S:
      return {"IQ2_S", 256, 82};
    case GgmlType::kIQ4_XS:
      return {"IQ4_XS", 256, 136};
    case GgmlType::kI8:
      return {"I8", 1, 1};
    case GgmlType::kI16:
      return {"I16", 1, 2};
    case GgmlType::kI32:
      return {"I32", 1, 4};
    case GgmlType::kI64:
      return {"I64", 1, 8};
    case GgmlType::kF64:
      return {"F64", 1, 8};
    case GgmlType::kIQ1_M:
      return {"IQ1_M", 256, 56};
    case GgmlType::kBF16:
      return {"BF16", 1, 2};
    case GgmlType::kTQ1_0:
      return {"TQ1_0", 256, 54};
    case GgmlType::kTQ2_0:
      return {"TQ2_0", 256, 66};
    case GgmlType::kMXFP4:
      return {"MXFP4", 32, 17};
    case GgmlType::kNVFP4:
      return {"NVFP4", 64, 36};
    case GgmlType::kQ1_0:
      return {"Q1_0", 128, 18};
  }
  return {"unknown", 1, 1};  // unreachable for a value GgmlTypeFromId returned
}

std::optional<GgmlType> GgmlTypeFromId(uint32_t id) {
  const GgmlType type = static_cast<GgmlType>(id);
  // Every enumerator is listed, so a new one breaks the build (-Wswitch) until it is added.
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_0:
    case GgmlType::kQ5_1:
    case GgmlType::kQ8_0:
    case GgmlType::kQ8_1:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kQ8_K:
    case GgmlType::kIQ2_XXS:
    case GgmlType::kIQ2_XS:
    case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ1_S:
    case GgmlType::kIQ4_NL:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ2_S:
    case GgmlType::kIQ4_XS:
    case GgmlType::kI8:
    case GgmlType::kI16:
    case GgmlType::kI32:
    case GgmlType::kI64:
    case GgmlType::kF64:
    case GgmlType::kIQ1_M:
    case GgmlType::kBF16:
    case GgmlType::kTQ1_0:
    case GgmlType::kTQ2_0:
    case GgmlType::kMXFP4:
    case GgmlType::kNVFP4:
    case GgmlType::kQ1_0:
      return type;
  }
  return std::nullopt;
}

absl::StatusOr<uint64_t> GgmlTypeBytes(GgmlType type, uint64_t num_elements) {
  const GgmlTypeInfo info = GetGgmlTypeInfo(type);
  const uint64_t block = static_cast<uint64_t>(info.block_elements);
  if (num_elements % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(num_elements, " elements of ", AsAbsl(info.name),
                                                   " are not whole blocks of ", block));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(num_elements / block, static_cast<uint64_t>(info.block_bytes),
                             &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(num_elements, " elements of ", AsAbsl(info.name), " overflow a 64-bit size"));
  }
  return bytes;
}

bool CanDequantize(GgmlType type) { return CodecFor(type).decode != nullptr; }

absl::Status Dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst,
                        std::string_view tensor_name) {
  const GgmlTypeInfo info = GetGgmlTypeInfo(type);
  if (!CanDequantize(type)) {
    return absl::UnimplementedError(absl::StrCat("tensor '", AsAbsl(tensor_name), "' has type ",
                                                 AsAbsl(info.name),
                                                 ", which this loader cannot dequantise (it "
                                                 "reads F32, F16, BF16, Q8_0, Q4_0, Q4_1)"));
  }
  absl::StatusOr<uint64_t> expected = GgmlTypeBytes(type, dst.size());
  if (!expected.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", AsAbsl(tensor_name), "': ", expected.status().message()));
  }
  if (*expected != src.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", AsAbsl(tensor_name), "': ", dst.size(), " elements of ",
                     AsAbsl(info.name), " take ", *expected, " bytes, got ", src.size()));
  }
  const size_t num_blocks = dst.size() / static_cast<size_t>(info.block_elements);
  CodecFor(type).decode(src.data(), num_blocks, dst.data());
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> Quantize(GgmlType type, std::span<const float> src) {
  const GgmlTypeInfo info = GetGgmlTypeInfo(type);
  if (!CanDequantize(type)) {
    return absl::UnimplementedError(absl::StrCat("cannot quantise to ", AsAbsl(info.name),
                                                 " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)"));
  }
  absl::StatusOr<uint64_t> bytes = GgmlTypeBytes(type, src.size());
  if (!bytes.ok()) return bytes.status();
  std::vector<uint8_t> out(*bytes);
  const size_t num_blocks = src.size() / static_cast<size_t>(info.block_elements);
  CodecFor(type).encode(src.data(), num_blocks, out.data());
  return out;
}

}  // namespace kvstrata::model

#pragma once

// ggml tensor types as GGUF files store them, their block sizes, and conversion of tensor data
// to and from fp32.
//
// Block formats decoded here (little-endian, 32 elements per block):
//   Q8_0 {fp16 d; int8 qs[32]}           x[j] = d * qs[j]
//   Q4_0 {fp16 d; uint8 qs[16]}          x[j] = d * (q[j] - 8)
//   Q4_1 {fp16 d; fp16 m; uint8 qs[16]}  x[j] = d * q[j] + m
// where, in the 4-bit formats, q[j] for j < 16 is the low nibble of qs[j] and q[j + 16] its
// high nibble. Computed in fp32, d * q is exact (an fp16 scale has 11 significant bits, q fits
// in 8), so only Q4_1's "+ m" rounds: results are bit-identical to ggml's reference
// dequantisation, fused multiply-add or not.

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvstrata::model {

// The ids ggml assigned. Retired ids (4, 5, 31-33, 36-38) are absent: a file using one is
// rejected as corrupt rather than misread.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
};

struct GgmlTypeInfo {
  std::string_view name;   // as ggml spells it: "Q4_1", "BF16"
  int64_t block_elements;  // elements per block; 1 for the plain types
  int64_t block_bytes;     // bytes per block
};

GgmlTypeInfo GetGgmlTypeInfo(GgmlType type);

// The type with this id, or nullopt for an id ggml never assigned or has retired.
std::optional<GgmlType> GgmlTypeFromId(uint32_t id);

// Bytes taken by `num_elements` values of `type`. InvalidArgument when `num_elements` is not a
// whole number of blocks or the size does not fit in 64 bits.
absl::StatusOr<uint64_t> GgmlTypeBytes(GgmlType type, uint64_t num_elements);

// Whether Dequantize decodes `type`: F32, F16, BF16, Q8_0, Q4_0, Q4_1.
bool CanDequantize(GgmlType type);

// Decodes `src`, which must be exactly GgmlTypeBytes(type, dst.size()) bytes, into `dst`.
// `tensor_name` names the tensor in errors: Unimplemented (naming the type) for a type
// CanDequantize rejects, InvalidArgument for a size mismatch. `src` needs no alignment.
absl::Status Dequantize(GgmlType type, std::span<const uint8_t> src, std::span<float> dst,
                        std::string_view tensor_name);

// Encodes fp32 values as `type` (F32, F16, BF16, Q8_0, Q4_0 or Q4_1), rounding to nearest; the
// inverse of Dequantize up to the format's precision. Writers of test models use it. The
// 32-element formats need src.size() to be a multiple of 32.
absl::StatusOr<std::vector<uint8_t>> Quantize(GgmlType type, std::span<const float> src);

}  // namespace kvstrata::model

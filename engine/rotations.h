#pragma once

// The rotations and clip ratios applied to K and V before they enter the cache, one per
// (layer, KV head): k' = k·R_K, q' = q·R_K, v' = v·R_V, output · R_Vᵀ (docs/kv-format.md §2).
// Loaded from a rotation file (docs/rotation-file.md) or the identity.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvstrata::engine {

struct RotationSet {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  bool identity = true;           // no rotation: the engine skips the multiplies
  std::vector<float> k_rotation;  // [layers][kv_heads][head_dim][head_dim], empty if identity
  std::vector<float> v_rotation;  // same
  std::vector<float> k_clip;      // [layers][kv_heads], ratios in (0, 1]
  std::vector<float> v_clip;      // same
  std::string digest;             // hex SHA-256 of the file, or "identity"
  std::string model_fingerprint;  // the model the file was fitted on ("" for identity)

  const float* k(int layer, int head) const {
    return k_rotation.data() + (int64_t{layer} * num_kv_heads + head) * head_dim * head_dim;
  }
  const float* v(int layer, int head) const {
    return v_rotation.data() + (int64_t{layer} * num_kv_heads + head) * head_dim * head_dim;
  }
  float key_clip(int layer, int head) const { return k_clip[layer * num_kv_heads + head]; }
  float value_clip(int layer, int head) const { return v_clip[layer * num_kv_heads + head]; }
};

// The identity rotation with no clipping.
RotationSet IdentityRotations(int num_layers, int num_kv_heads, int head_dim);

// Metadata stored in a rotation file beside the tensors.
struct RotationFileInfo {
  std::string model_fingerprint;
  std::string options;  // free-form, e.g. calibration options as JSON
};

// Writes a rotation file (safetensors: tensors k_rotation, v_rotation [L][H][d][d] F32 and
// k_clip, v_clip [L][H] F32; metadata format "kvstrata-rotations", version "1").
absl::Status WriteRotationFile(const std::string& path, const RotationSet& rotations,
                               const RotationFileInfo& info);

// Reads and validates a rotation file: shapes must match the model (layers, KV heads,
// head_dim) and, when expected_fingerprint is not empty, the model fingerprint must match.
// Each rotation is checked to be orthogonal (max |RRᵀ - I| <= 1e-3) and each clip ratio to lie
// in (0, 1]. Errors name the file and the field.
absl::StatusOr<RotationSet> ReadRotationFile(const std::string& path, int num_layers,
                                             int num_kv_heads, int head_dim,
                                             const std::string& expected_fingerprint);

}  // namespace kvstrata::engine

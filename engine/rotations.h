#pragma once

// The rotations and clip ratios applied to K and V before they enter the cache, one per
// (layer, KV head): k' = k·R_K, q' = q·R_K, v' = v·R_V, output · R_Vᵀ (docs/kv-format.md §2).
// Loaded from a rotation file (docs/rotation-file.md) or the identity.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/history_codec.h"

namespace kvstrata::engine {

// Metadata stored in a rotation file beside the tensors (docs/rotation-file.md). Every field is
// a string in the safetensors metadata; numbers are written in decimal.
struct RotationFileInfo {
  std::string model_fingerprint;   // hex SHA-256 of the model the rotations were fitted on
  std::string model_name;          // human-readable, e.g. "SmolLM2-135M-Instruct"
  std::string key_objective;       // "qqt": eigenvectors of the query covariance QᵀQ
  std::string value_objective;     // "sst": VᵀSᵀSV with causal softmax; "proxy": OSCAR's
  std::string grouping;            // "head": one rotation per (layer, KV head); "layer": shared
  std::string levels;              // INT2 levels the clip ratios were searched for: "uniform"
                                   // or "lloyd-max"
  int group_size = 0;              // INT2 channels per scale/offset the clips were searched for
  std::string calibration_digest;  // hex SHA-256 of the calibration token ids (int32 LE)
  int64_t calibration_tokens = 0;  // tokens whose q/k/v entered the covariances
  int64_t heldout_tokens = 0;      // further tokens the clip ratios were searched on
  std::string options;             // the calibration options, as JSON
  // Optional: the history codec chosen for these rotations (a spec of kernels/history_codec.h,
  // whose regions live in this file's rotated space), and how it was chosen, as JSON. Empty
  // when none was chosen; written only when set, so files without one keep their bytes.
  std::string history_codec;
  std::string history_codec_source;
};

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
  RotationFileInfo info;          // the file's metadata (empty for identity)

  const float* k(int layer, int head) const {
    return k_rotation.data() + (int64_t{layer} * num_kv_heads + head) * head_dim * head_dim;
  }
  const float* v(int layer, int head) const {
    return v_rotation.data() + (int64_t{layer} * num_kv_heads + head) * head_dim * head_dim;
  }
  float key_clip(int layer, int head) const { return k_clip[layer * num_kv_heads + head]; }
  float value_clip(int layer, int head) const { return v_clip[layer * num_kv_heads + head]; }
};

// For the codec KV format: every (layer, side) whose recipe works in the eigenbasis (`eig`)
// gets its basis folded into the rotation, R ← R·T (kernels::CodecEigenbasis), so the cache's
// rows are in the codec's basis and its regions are plain channel ranges. q·k and the output's
// way back (·R_Vᵀ) are unchanged. InvalidArgument when the codec names a layer the model lacks.
absl::Status FoldCodecBasis(const kernels::HistoryCodec& codec, RotationSet* rotations);

// The identity rotation with no clipping.
RotationSet IdentityRotations(int num_layers, int num_kv_heads, int head_dim);

// Writes a rotation file (safetensors: tensors k_rotation, v_rotation [L][H][d][d] F32 and
// k_clip, v_clip [L][H] F32; metadata format "kvstrata-rotations", version "1", the info
// fields, and data_sha256 = SHA-256 of the tensor bytes). The file is written to path + ".tmp"
// and renamed, so a reader never sees half a file.
absl::Status WriteRotationFile(const std::string& path, const RotationSet& rotations,
                               const RotationFileInfo& info);

// Reads and validates a rotation file: shapes must match the model (layers, KV heads,
// head_dim) and, when expected_fingerprint is not empty, the model fingerprint must match.
// Each rotation is checked to be orthogonal (max |RRᵀ - I| <= 1e-3), each clip ratio to lie
// in (0, 1], and the tensor bytes against data_sha256 (when the file has one). Errors name the
// file and the field; a wrong model is FailedPrecondition, anything else InvalidArgument.
// Only the metadata of a rotation file (no tensor is read or checked).
absl::StatusOr<RotationFileInfo> ReadRotationFileInfo(const std::string& path);

// The rotation file in `dir` (non-recursive, *.safetensors) fitted on the model with this
// fingerprint, whose clip ratios were searched for `levels` ("uniform" or "lloyd-max"; empty:
// any), with a history codec when `with_codec` and without one otherwise, preferring per-head
// files, then the first by name; NotFound naming the directory when there is none. This is how a
// default configuration picks the committed file under rotations/ for the model it loaded.
absl::StatusOr<std::string> FindRotationFile(const std::string& dir,
                                             const std::string& model_fingerprint,
                                             const std::string& levels, bool with_codec = false);

absl::StatusOr<RotationSet> ReadRotationFile(const std::string& path, int num_layers,
                                             int num_kv_heads, int head_dim,
                                             const std::string& expected_fingerprint);

}  // namespace kvstrata::engine

#pragma once

// Helpers shared by the model loaders and writers. Internal to kvstrata_model: other libraries
// use the loaders, not these.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/sha256.h"
#include "model/model.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvstrata::model {

// This Abseil is built with its own string_view, which std::string_view does not convert to.
inline absl::string_view AsAbsl(std::string_view s) {
  return absl::string_view(s.data(), s.size());
}

// The read-only bytes of a whole file (memory-mapped) or of an owned buffer. The bytes stay at
// one address for the object's life, so views into them survive moves of the owner.
class ByteSource {
 public:
  // NotFound when the file does not exist, InvalidArgument when it is not a regular file.
  static absl::StatusOr<std::unique_ptr<ByteSource>> MapFile(const std::string& path);
  static std::unique_ptr<ByteSource> FromString(std::string bytes);

  ~ByteSource();
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  ByteSource() = default;

  void* map_ = nullptr;  // from mmap, when mapped
  size_t map_size_ = 0;
  std::string owned_;  // when built from a buffer
  std::span<const uint8_t> bytes_;
};

using ::kvstrata::Sha256Hex;  // core/sha256.h

// "[576, 49152]"
std::string FormatShape(std::span<const int64_t> shape);

// eos (when set) followed by every control token (type 3) whose text ends a turn in a known
// chat format: <|im_end|>, <|eot_id|>, <|end_of_text|>, <|endoftext|>, <|end|>, <end_of_turn>.
std::vector<int32_t> EndOfGenerationIds(const tokenizer::TokenizerSpec& spec);

struct WeightSlot;

// Carves the fp32 tensors of a model out of one arena: tensors are registered first (with their
// shapes already checked), then Fill sizes the arena once, points each slot into it (a vector's
// pointer, or an F32 WeightMatrix over its span) and runs each tensor's decoder on its own span.
// Matrices a loader keeps in their file's form never pass through here.
class ArenaPlan {
 public:
  using Decoder = std::function<absl::Status(std::span<float>)>;

  // The slot (a vector or a matrix) must outlive Fill.
  void Add(const WeightSlot& slot, Decoder decode);

  // Resizes `weights.arena` to the total, then fills it. Pointers into the arena stay valid as
  // long as the arena is not resized again (moving ModelWeights keeps them).
  absl::Status Fill(ModelWeights& weights);

 private:
  struct Entry {
    const float** vector;
    WeightMatrix* matrix;
    int64_t rows;
    int64_t cols;
    Decoder decode;
  };
  std::vector<Entry> entries_;
};

// The tensors of a model, independent of any file format's names.
enum class WeightRole {
  kTokenEmbedding,
  kOutputNorm,
  kLmHead,
  kAttnNorm,
  kWq,
  kWk,
  kWv,
  kBq,
  kBk,
  kBv,
  kQNorm,
  kKNorm,
  kWo,
  kFfnNorm,
  kWGate,
  kWUp,
  kWDown,
};

struct WeightSlot {
  WeightRole role;
  int layer;                   // -1 for tensors outside the layers
  std::vector<int64_t> shape;  // row-major: {out, in} for a matrix, {n} for a vector
  // Where the tensor goes: exactly one is set, `matrix` when shape has two dimensions.
  const float** vector = nullptr;
  WeightMatrix* matrix = nullptr;

  bool is_matrix() const { return matrix != nullptr; }
};

// Every tensor `config` needs, in load order, with the shape it implies; lm_head only when the
// embeddings are not tied, biases only for Qwen2, q/k norms only for Qwen3. Sizes
// `weights.layers` to config.num_layers (slots point into it).
std::vector<WeightSlot> PlanWeights(const ModelConfig& config, ModelWeights& weights);

// The tensor's name in GGUF files ("blk.3.attn_q.weight") and in Hugging Face checkpoints
// ("model.layers.3.self_attn.q_proj.weight").
std::string GgufTensorName(const WeightSlot& slot);
std::string HfTensorName(const WeightSlot& slot);

// The fp32 values `weights` holds for the slot's tensor (nullptr when unset, or for a matrix
// that is not F32), e.g. to write a model built in memory back out using the slots of
// PlanWeights on a scratch ModelWeights.
const float* WeightOf(const ModelWeights& weights, const WeightSlot& slot);
// The slot's tensor as fp32 values (a matrix dequantised), whatever its type; empty when unset.
std::vector<float> ValuesOf(const ModelWeights& weights, const WeightSlot& slot);

// Checks a model config's internal consistency (positive sizes, GQA divisibility) before any
// allocation depends on it. `source` names the file in errors.
absl::Status ValidateConfig(const ModelConfig& config, std::string_view source);

}  // namespace kvstrata::model

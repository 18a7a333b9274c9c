#pragma once

// A loaded model: its configuration, its weights and the tokenizer description found beside
// them. Loaders (GGUF, Hugging Face safetensors) fill it; the engine only reads it.
//
// Weight matrices are row-major [out][in], so y = x·Wᵀ, and stay in the form their file stores
// them (WeightMatrix: a GGUF block format such as Q4_1, or F32/F16/BF16), pointing into the
// mapped file that ModelWeights keeps alive. A backend reads that form directly (the CPU
// backend's kernels) or asks for a dequantised copy (WeightMatrix::DequantizeRows), which is
// exactly what the file's format defines. Vectors (norm gains, biases) are small and are fp32
// in one arena.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/dequant.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvstrata::model {

enum class Architecture {
  kLlama,  // Llama 2/3, SmolLM2, Mistral-like
  kQwen2,  // Qwen2 / Qwen2.5: bias on q, k, v
  kQwen3,  // Qwen3: RMSNorm on q and k per head before RoPE, no bias
};

// How RoPE pairs the channels of a head.
enum class RopeLayout {
  kInterleaved,  // pairs (2i, 2i+1): GGUF "llama" files (the converter permuted q/k rows)
  kHalfSplit,    // pairs (i, i + d/2): Hugging Face weights, GGUF qwen2/qwen3
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string name;  // human-readable, e.g. "SmolLM2-135M-Instruct"
  int vocab_size = 0;
  int hidden_size = 0;        // d_model
  int intermediate_size = 0;  // SwiGLU hidden width
  int num_layers = 0;
  int num_heads = 0;     // query heads
  int num_kv_heads = 0;  // GQA: num_heads % num_kv_heads == 0
  int head_dim = 0;      // usually hidden_size / num_heads (Qwen3 sets it explicitly)
  float rope_theta = 10000.0f;
  RopeLayout rope_layout = RopeLayout::kHalfSplit;
  float rms_norm_eps = 1e-5f;
  int max_context = 0;  // the model's trained context length
  bool tied_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3
};

// A weight matrix [rows][cols] in its file's form. Block formats (Q8_0, Q4_0, Q4_1: dequant.h)
// hold a row as cols / 32 consecutive blocks; plain formats (F32, F16, BF16) as cols
// little-endian elements. Rows follow each other with no padding. Immutable; copies share the
// bytes, which live as long as the ModelWeights they came from.
struct WeightMatrix {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;  // rows * row_bytes() bytes; no alignment guaranteed

  // An F32 matrix over `values` [rows][cols] (not copied).
  static WeightMatrix F32(const float* values, int64_t rows, int64_t cols);

  bool present() const { return data != nullptr; }
  int64_t row_bytes() const;
  // The values in place for an F32 matrix; nullptr for any other type.
  const float* f32() const;
  // Rows [begin, end) as fp32 into out [(end - begin) * cols]: exactly Dequantize's values, the
  // numbers every backend computes with. The type must be one Dequantize decodes (the loaders
  // accept no other).
  void DequantizeRows(int64_t begin, int64_t end, float* out) const;
  std::vector<float> Dequantized() const;  // the whole matrix, [rows * cols]
};

// Shapes in brackets; nullptr (or a matrix that is not present()) where the architecture has no
// such tensor. Vectors point into ModelWeights::arena.
struct LayerWeights {
  const float* attn_norm = nullptr;  // [hidden]
  WeightMatrix wq;                   // [num_heads * head_dim][hidden]
  WeightMatrix wk;                   // [num_kv_heads * head_dim][hidden]
  WeightMatrix wv;                   // [num_kv_heads * head_dim][hidden]
  const float* bq = nullptr;         // [num_heads * head_dim]      (Qwen2)
  const float* bk = nullptr;         // [num_kv_heads * head_dim]   (Qwen2)
  const float* bv = nullptr;         // [num_kv_heads * head_dim]   (Qwen2)
  const float* q_norm = nullptr;     // [head_dim]                  (Qwen3)
  const float* k_norm = nullptr;     // [head_dim]                  (Qwen3)
  WeightMatrix wo;                   // [hidden][num_heads * head_dim]
  const float* ffn_norm = nullptr;   // [hidden]
  WeightMatrix w_gate;               // [intermediate][hidden]
  WeightMatrix w_up;                 // [intermediate][hidden]
  WeightMatrix w_down;               // [hidden][intermediate]
};

struct ModelWeights {
  // Owns the bytes the matrices point into (the mapped model file or files); null when every
  // matrix is F32 in the arena (models built in memory).
  std::shared_ptr<const void> storage;
  std::vector<float> arena;            // fp32 vectors, and fp32 matrices of models built in memory
  WeightMatrix token_embedding;        // [vocab][hidden]
  std::vector<LayerWeights> layers;    // [num_layers]
  const float* output_norm = nullptr;  // [hidden]
  WeightMatrix lm_head;  // [vocab][hidden]; the same bytes as token_embedding when tied
};

struct LoadedModel {
  ModelConfig config;
  ModelWeights weights;
  tokenizer::TokenizerSpec tokenizer;
  // Hex SHA-256 identifying the weights (of the GGUF file, or of the safetensors files in
  // order); part of the radix-hash namespace, so different weights never share KV pages.
  std::string fingerprint;
  std::string source_path;
};

}  // namespace kvstrata::model

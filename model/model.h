#pragma once

// A loaded model: its configuration, fp32 weights carved from one arena, and the tokenizer
// description found beside them. Loaders (GGUF, Hugging Face safetensors) fill it; the
// engine only reads it. Weight matrices are row-major [out][in], so y = x·Wᵀ.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

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

// Pointers into ModelWeights::arena. Shapes in brackets; nullptr where the architecture has no
// such tensor.
struct LayerWeights {
  const float* attn_norm = nullptr;  // [hidden]
  const float* wq = nullptr;         // [num_heads * head_dim][hidden]
  const float* wk = nullptr;         // [num_kv_heads * head_dim][hidden]
  const float* wv = nullptr;         // [num_kv_heads * head_dim][hidden]
  const float* bq = nullptr;         // [num_heads * head_dim]      (Qwen2)
  const float* bk = nullptr;         // [num_kv_heads * head_dim]   (Qwen2)
  const float* bv = nullptr;         // [num_kv_heads * head_dim]   (Qwen2)
  const float* q_norm = nullptr;     // [head_dim]                  (Qwen3)
  const float* k_norm = nullptr;     // [head_dim]                  (Qwen3)
  const float* wo = nullptr;         // [hidden][num_heads * head_dim]
  const float* ffn_norm = nullptr;   // [hidden]
  const float* w_gate = nullptr;     // [intermediate][hidden]
  const float* w_up = nullptr;       // [intermediate][hidden]
  const float* w_down = nullptr;     // [hidden][intermediate]
};

struct ModelWeights {
  std::vector<float> arena;                // every tensor, dequantised to fp32
  const float* token_embedding = nullptr;  // [vocab][hidden]
  std::vector<LayerWeights> layers;        // [num_layers]
  const float* output_norm = nullptr;      // [hidden]
  const float* lm_head = nullptr;          // [vocab][hidden]; == token_embedding when tied
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

#pragma once

// Tiny models with seeded random weights, written as GGUF or as a Hugging Face folder, for tests
// anywhere in the repository: both files describe the same model, and both load back through
// LoadGgufModel / LoadHfModel.
//
// The tokenizer is byte-level BPE: the 256 byte tokens (ids 0-255, byte b is token b, spelled in
// the GPT-2 byte-to-unicode alphabet, so a space is "Ġ"), ten merges ("Ġ t", "h e", "Ġt he",
// "i n", "e r", "Ġ a", "o n", "r e", "Ġ s", "a t"; ids 256-265), then the control tokens
// <|endoftext|> (266, bos, unk, pad), <|im_start|> (267), <|im_end|> (268, eos), then any
// padding tokens "<|pad_N|>" up to vocab_size. The chat template is ChatML.
//
// Weights: matrices and biases are normal(0, weight_std), norm gains 1 + normal(0, weight_std),
// so activations stay near unit scale for any depth used in tests.

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/dequant.h"
#include "model/model.h"

namespace kvstrata::model {

struct TinyModelOptions {
  Architecture arch = Architecture::kLlama;
  int num_layers = 2;
  int hidden_size = 64;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 0;  // 0: hidden_size / num_heads
  int intermediate_size = 128;
  int vocab_size = 0;  // 0: exactly the 269 tokenizer tokens; more adds padding tokens
  int max_context = 2048;
  float rope_theta = 10000.0f;
  float rms_norm_eps = 1e-5f;
  bool tied_embeddings = false;
  uint64_t seed = 1;
  float weight_std = 0.02f;
  std::string name = "tiny";

  // GGUF: the type of every matrix (embedding, output, layer matrices): F32, F16, BF16, Q8_0,
  // Q4_0 or Q4_1; norms and biases stay F32. The 32-element block types need hidden_size,
  // num_heads * head_dim and intermediate_size to be multiples of 32.
  GgmlType gguf_matrix_type = GgmlType::kF32;
  uint32_t gguf_alignment = 32;  // 32 is the format default and is not written

  // Hugging Face: the dtype of every tensor (F32, F16 or BF16), and the number of safetensors
  // shards (more than 1 also writes model.safetensors.index.json).
  GgmlType hf_dtype = GgmlType::kBF16;
  int hf_shards = 1;
};

// The model both writers serialise: config (RopeLayout::kHalfSplit), fp32 weights (F32 matrices)
// in Hugging Face layout before any rounding to a file type, and the tokenizer. fingerprint and
// source_path are empty. InvalidArgument for inconsistent options.
absl::StatusOr<LoadedModel> MakeTinyModel(const TinyModelOptions& options);

// Writes a GGUF v3 file of MakeTinyModel(options). For the llama architecture the q and k rows
// are permuted as GGUF llama converters do (see HalfSplitToInterleavedRows), so the file loads
// with RopeLayout::kInterleaved and computes the same attention scores.
absl::Status WriteTinyGguf(const std::string& path, const TinyModelOptions& options);

// Writes config.json, model.safetensors (or shards plus index), tokenizer.json and
// tokenizer_config.json of MakeTinyModel(options) into `dir`, creating it if needed.
absl::Status WriteTinyHfModel(const std::string& dir, const TinyModelOptions& options);

// Reorders the rows of a q or k projection, [num_heads * head_dim][cols], from the half-split
// RoPE pairing (i, i + head_dim/2) to the interleaved pairing (2i, 2i + 1): within each head,
// destination row 2i is source row i and row 2i + 1 is source row i + head_dim/2.
// `dst` must not alias `src`; both hold num_heads * head_dim * cols floats.
void HalfSplitToInterleavedRows(std::span<const float> src, int num_heads, int head_dim, int cols,
                                std::span<float> dst);

}  // namespace kvstrata::model

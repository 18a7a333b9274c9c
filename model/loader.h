#pragma once

// Model loaders: a GGUF file, or a Hugging Face folder (see safetensors.h), into a LoadedModel
// whose matrices stay in the file's form (mapped, not copied) and whose vectors are fp32 in one
// arena (model.h).

#include <string>

#include "absl/status/statusor.h"
#include "model/model.h"

namespace kvstrata::model {

// Loads a GGUF model whose general.architecture is "llama" (Llama 2/3, SmolLM2), "qwen2" or
// "qwen3"; any other architecture, a mixture of experts, RoPE scaling or partial rotary
// embeddings is Unimplemented, naming what was found.
//
// Config from `{arch}.*` metadata; every tensor the architecture needs must be present with the
// shape the config implies (an error names the tensor and both shapes; GGUF dims are
// [ne0 = in, ne1 = out], i.e. row-major [out][in]); output.weight absent means tied
// embeddings. Matrices of types F32, F16, BF16, Q8_0, Q4_0 and Q4_1 are kept as the file stores
// them (WeightMatrix), vectors of those types are dequantised; q/k rows stay as the file has them, so llama files get RopeLayout::kInterleaved and qwen files
// kHalfSplit. The tokenizer comes from tokenizer.ggml.* and tokenizer.chat_template; the
// fingerprint is the SHA-256 of the whole file. Prints nothing.
absl::StatusOr<LoadedModel> LoadGgufModel(const std::string& path);

// Only the tokenizer of a model (a .gguf file, or a Hugging Face folder's tokenizer.json and
// tokenizer_config.json), without reading weights: for the router, which tokenises prompts but
// runs no model. Errors as LoadGgufModel's and TokenizerSpecFromJson's.
absl::StatusOr<tokenizer::TokenizerSpec> LoadTokenizerSpec(const std::string& path);

}  // namespace kvstrata::model

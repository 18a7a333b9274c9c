#pragma once

// Hugging Face model folders: config.json, model.safetensors (or shards listed by
// model.safetensors.index.json), tokenizer.json and tokenizer_config.json.
//
// A safetensors file is { u64 header_length N | N bytes of JSON | data }, the JSON mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} with offsets counted from the
// end of the header. Every offset is checked against the file size before use.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/model.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvstrata::model {

class ByteSource;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // as written: "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;  // row-major, outermost first: [out, in] for a matrix
  int64_t num_elements = 0;
  std::span<const uint8_t> data;  // inside the file; no alignment guaranteed
};

// A parsed safetensors file, kept mapped. Move-only; immutable after Open.
class SafetensorsFile {
 public:
  // NotFound if the file does not exist; InvalidArgument naming the file (and the tensor) when
  // the header is malformed or points outside the file.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);
  // Parses an in-memory image; `name` stands for the path in errors.
  static absl::StatusOr<SafetensorsFile> FromBytes(std::string bytes, std::string name);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const;                                     // the whole file
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // header order
  const SafetensorsTensor* FindTensor(std::string_view name) const;           // nullptr when absent

 private:
  SafetensorsFile() = default;
  static absl::StatusOr<SafetensorsFile> Parse(std::unique_ptr<ByteSource> source,
                                               std::string path);

  std::unique_ptr<ByteSource> source_;
  std::string path_;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string_view, size_t> index_;  // views of tensors_[i].name
};

// Converts an F32, F16 or BF16 tensor to fp32 into `out` (exactly num_elements floats);
// Unimplemented naming the tensor and dtype for any other dtype.
absl::Status ConvertSafetensor(const SafetensorsTensor& tensor, std::span<float> out);

// Loads a folder holding config.json (architectures LlamaForCausalLM, Qwen2ForCausalLM or
// Qwen3ForCausalLM), model.safetensors or model.safetensors.index.json with its shards, and
// tokenizer.json (+ tokenizer_config.json). Tensors use the Hugging Face names and must have the
// shapes the config implies (errors name the tensor and both shapes) and dtype F32, F16 or BF16;
// matrices stay mapped in their dtype, vectors are converted to fp32. RoPE is kHalfSplit. A
// field config.json lacks and has no default is an error naming the field. The fingerprint is
// the SHA-256 over the safetensors files' bytes, files in name order.
absl::StatusOr<LoadedModel> LoadHfModel(const std::string& dir);

// Reads a Hugging Face tokenizer.json (byte-level BPE) and, when present beside it,
// tokenizer_config.json (chat template, bos/eos/unk/pad tokens, add_bos_token). The
// pre-tokenizer is classified: Sequence[Digits(individual_digits), ByteLevel] is "smollm", a
// Split regex with (?i:'s|'t|'re|'ve|'m|'ll|'d) and \p{N}{1,3} "llama-bpe", the same with single
// \p{N} "qwen2", ByteLevel alone "gpt2"; anything else is Unimplemented.
absl::StatusOr<tokenizer::TokenizerSpec> TokenizerSpecFromJson(const std::string& path);

}  // namespace kvstrata::model

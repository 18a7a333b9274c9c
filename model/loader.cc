#include "model/loader.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "model/dequant.h"
#include "model/gguf.h"
#include "model/load_util.h"
#include "model/safetensors.h"

namespace kvstrata::model {
namespace {

absl::StatusOr<Architecture> ArchitectureFromGguf(const GgufFile& file, std::string_view name) {
  if (name == "llama") return Architecture::kLlama;
  if (name == "qwen2") return Architecture::kQwen2;
  if (name == "qwen3") return Architecture::kQwen3;
  return absl::UnimplementedError(absl::StrCat("GGUF file '", file.path(), "': architecture '",
                                               AsAbsl(name),
                                               "' is not supported (llama, qwen2, qwen3 are)"));
}

// Metadata access for one file and one architecture prefix, with errors naming the key.
class ConfigReader {
 public:
  ConfigReader(const GgufFile& file, std::string_view arch) : file_(file), arch_(arch) {}

  std::string Key(std::string_view suffix) const {
    return absl::StrCat(AsAbsl(arch_), ".", AsAbsl(suffix));
  }

  absl::StatusOr<int> Int(std::string_view suffix) const {
    const std::string key = Key(suffix);
    KV_ASSIGN_OR_RETURN(const uint64_t value, file_.GetUint(key));
    if (value > static_cast<uint64_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF file '", file_.path(), "': ", key, " = ", value, " is out of range"));
    }
    return static_cast<int>(value);
  }

  absl::StatusOr<int> IntOr(std::string_view suffix, int fallback) const {
    if (!file_.HasKey(Key(suffix))) return fallback;
    return Int(suffix);
  }

  absl::StatusOr<float> FloatOr(std::string_view suffix, float fallback) const {
    const std::string key = Key(suffix);
    if (!file_.HasKey(key)) return fallback;
    KV_ASSIGN_OR_RETURN(const double value, file_.GetFloat(key));
    return static_cast<float>(value);
  }

  absl::Status Unsupported(std::string_view suffix, absl::string_view why) const {
    return absl::UnimplementedError(
        absl::StrCat("GGUF file '", file_.path(), "': ", Key(suffix), " ", why));
  }

 private:
  const GgufFile& file_;
  std::string_view arch_;
};

absl::StatusOr<ModelConfig> ReadConfig(const GgufFile& file, std::string_view arch_name,
                                       Architecture arch, int num_tokens) {
  const ConfigReader r(file, arch_name);
  ModelConfig c;
  c.arch = arch;
  KV_ASSIGN_OR_RETURN(c.num_layers, r.Int("block_count"));
  KV_ASSIGN_OR_RETURN(c.max_context, r.Int("context_length"));
  KV_ASSIGN_OR_RETURN(c.hidden_size, r.Int("embedding_length"));
  KV_ASSIGN_OR_RETURN(c.intermediate_size, r.Int("feed_forward_length"));
  KV_ASSIGN_OR_RETURN(c.num_heads, r.Int("attention.head_count"));
  KV_ASSIGN_OR_RETURN(c.num_kv_heads, r.IntOr("attention.head_count_kv", c.num_heads));
  KV_ASSIGN_OR_RETURN(c.rope_theta, r.FloatOr("rope.freq_base", 10000.0f));
  {
    const std::string key = r.Key("attention.layer_norm_rms_epsilon");
    KV_ASSIGN_OR_RETURN(const double eps, file.GetFloat(key));
    c.rms_norm_eps = static_cast<float>(eps);
  }
  if (c.num_heads > 0 && c.hidden_size % c.num_heads != 0) {
    if (!file.HasKey(r.Key("attention.key_length"))) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF file '", file.path(), "': ", r.Key("embedding_length"), " ",
                       c.hidden_size, " is not a multiple of ", r.Key("attention.head_count"), " ",
                       c.num_heads, " and ", r.Key("attention.key_length"), " is absent"));
    }
  }
  KV_ASSIGN_OR_RETURN(c.head_dim, r.IntOr("attention.key_length",
                                          c.num_heads > 0 ? c.hidden_size / c.num_heads : 0));
  KV_ASSIGN_OR_RETURN(const int value_length, r.IntOr("attention.value_length", c.head_dim));
  if (value_length != c.head_dim) {
    return r.Unsupported("attention.value_length",
                         absl::StrCat(value_length, " differs from the key length ", c.head_dim));
  }
  KV_ASSIGN_OR_RETURN(const int rope_dims, r.IntOr("rope.dimension_count", c.head_dim));
  if (rope_dims != c.head_dim) {
    return r.Unsupported(
        "rope.dimension_count",
        absl::StrCat(rope_dims, " is not head_dim ", c.head_dim, " (partial rotary embeddings)"));
  }
  // Mixtral-style GGUF files say "llama" and add experts; silently loading them would be wrong.
  KV_ASSIGN_OR_RETURN(const int experts, r.IntOr("expert_count", 0));
  if (experts > 0) {
    return r.Unsupported("expert_count", absl::StrCat(experts, ": mixture of experts"));
  }
  if (file.HasKey(r.Key("rope.scaling.type"))) {
    KV_ASSIGN_OR_RETURN(const std::string_view scaling, file.GetString(r.Key("rope.scaling.type")));
    if (scaling != "none") {
      return r.Unsupported("rope.scaling.type", absl::StrCat("'", AsAbsl(scaling), "'"));
    }
  }
  // Llama 3.1+ carries its RoPE frequency scaling as a tensor.
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    return absl::UnimplementedError(absl::StrCat("GGUF file '", file.path(),
                                                 "': tensor 'rope_freqs.weight' (RoPE frequency "
                                                 "scaling) is not supported"));
  }
  KV_ASSIGN_OR_RETURN(c.vocab_size, r.IntOr("vocab_size", num_tokens));
  if (num_tokens > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF file '", file.path(), "': ", "tokenizer.ggml.tokens has ", num_tokens,
                     " entries, more than ", r.Key("vocab_size"), " ", c.vocab_size));
  }
  c.rope_layout = arch == Architecture::kLlama ? RopeLayout::kInterleaved : RopeLayout::kHalfSplit;
  c.tied_embeddings = file.FindTensor("output.weight") == nullptr;
  c.qkv_bias = arch == Architecture::kQwen2;
  c.qk_norm = arch == Architecture::kQwen3;
  if (file.HasKey("general.name")) {
    KV_ASSIGN_OR_RETURN(const std::string_view name, file.GetString("general.name"));
    c.name = std::string(name);
  } else {
    c.name = std::filesystem::path(file.path()).stem().string();
  }
  KV_RETURN_IF_ERROR(ValidateConfig(c, absl::StrCat("GGUF file '", file.path(), "'")));
  return c;
}

// A token id from tokenizer.ggml.<what>_token_id, or -1 when absent.
absl::StatusOr<int32_t> TokenId(const GgufFile& file, std::string_view key, size_t num_tokens) {
  if (!file.HasKey(key)) return -1;
  KV_ASSIGN_OR_RETURN(const int64_t id, file.GetInt(key));
  if (id < 0 || static_cast<uint64_t>(id) >= num_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF file '", file.path(), "': ", AsAbsl(key),
                                                   " = ", id, " is not a token id (", num_tokens,
                                                   " tokens)"));
  }
  return static_cast<int32_t>(id);
}

absl::StatusOr<tokenizer::TokenizerSpec> ReadTokenizer(const GgufFile& file) {
  tokenizer::TokenizerSpec spec;
  KV_ASSIGN_OR_RETURN(const std::string_view model, file.GetString("tokenizer.ggml.model"));
  spec.model = std::string(model);
  if (file.HasKey("tokenizer.ggml.pre")) {
    KV_ASSIGN_OR_RETURN(const std::string_view pre, file.GetString("tokenizer.ggml.pre"));
    spec.pre = std::string(pre);
  }
  KV_ASSIGN_OR_RETURN(const std::span<const std::string_view> tokens,
                      file.GetStringArray("tokenizer.ggml.tokens"));
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF file '", file.path(), "': ", tokens.size(),
                                                   " tokens overflow int32 ids"));
  }
  spec.tokens.assign(tokens.begin(), tokens.end());
  if (file.HasKey("tokenizer.ggml.token_type")) {
    KV_ASSIGN_OR_RETURN(const std::vector<int64_t> types,
                        file.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF file '", file.path(), "': tokenizer.ggml.token_type has ",
                       types.size(), " entries for ", tokens.size(), " tokens"));
    }
    spec.token_types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] < INT32_MIN || types[i] > INT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat("GGUF file '", file.path(),
                                                       "': tokenizer.ggml.token_type[", i,
                                                       "] = ", types[i], " is out of range"));
      }
      spec.token_types.push_back(static_cast<int32_t>(types[i]));
    }
  } else {
    spec.token_types.assign(tokens.size(), 1);
  }
  if (file.HasKey("tokenizer.ggml.merges")) {
    KV_ASSIGN_OR_RETURN(const std::span<const std::string_view> merges,
                        file.GetStringArray("tokenizer.ggml.merges"));
    spec.merges.assign(merges.begin(), merges.end());
  }
  KV_ASSIGN_OR_RETURN(spec.bos_id, TokenId(file, "tokenizer.ggml.bos_token_id", tokens.size()));
  KV_ASSIGN_OR_RETURN(spec.eos_id, TokenId(file, "tokenizer.ggml.eos_token_id", tokens.size()));
  KV_ASSIGN_OR_RETURN(spec.unknown_id,
                      TokenId(file, "tokenizer.ggml.unknown_token_id", tokens.size()));
  KV_ASSIGN_OR_RETURN(spec.padding_id,
                      TokenId(file, "tokenizer.ggml.padding_token_id", tokens.size()));
  if (file.HasKey("tokenizer.ggml.add_bos_token")) {
    KV_ASSIGN_OR_RETURN(spec.add_bos, file.GetBool("tokenizer.ggml.add_bos_token"));
  }
  if (file.HasKey("tokenizer.chat_template")) {
    KV_ASSIGN_OR_RETURN(const std::string_view chat_template,
                        file.GetString("tokenizer.chat_template"));
    spec.chat_template = std::string(chat_template);
  }
  spec.end_of_generation_ids = EndOfGenerationIds(spec);
  return spec;
}

// Finds the slot's tensor and checks its shape and type. A matrix keeps the file's bytes (the
// mapping outlives the model: ModelWeights::storage); a vector is queued for dequantisation
// into the arena.
absl::Status PlanTensor(const GgufFile& file, const WeightSlot& slot, ArenaPlan& plan) {
  const std::string name = GgufTensorName(slot);
  // GGUF lists dims innermost first: row-major [out][in] is {in, out}.
  const std::vector<int64_t> expected(slot.shape.rbegin(), slot.shape.rend());
  const GgufTensor* tensor = file.FindTensor(name);
  if (tensor == nullptr) {
    return absl::NotFoundError(absl::StrCat("GGUF file '", file.path(), "' lacks tensor '", name,
                                            "' (expected shape ", FormatShape(expected),
                                            ", ggml order: ne0 first)"));
  }
  if (tensor->dims != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF file '", file.path(), "': tensor '", name, "' has shape ", FormatShape(tensor->dims),
        ", expected ", FormatShape(expected), " (ggml order: ne0 = in, ne1 = out)"));
  }
  if (!CanDequantize(tensor->type)) {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF file '", file.path(), "': tensor '", name, "' has type ",
        AsAbsl(GetGgmlTypeInfo(tensor->type).name),
        ", which this loader cannot dequantise (it reads F32, F16, BF16, Q8_0, Q4_0, Q4_1)"));
  }
  if (slot.is_matrix()) {
    // The reader checked that the tensor's bytes are exactly its type's size for its dims, and
    // a block type's rows are whole blocks (ne0 is a multiple of the block).
    *slot.matrix = WeightMatrix{tensor->type, slot.shape[0], slot.shape[1], tensor->data.data()};
    return absl::OkStatus();
  }
  plan.Add(slot, [tensor](std::span<float> out) { return DequantizeTensor(*tensor, out); });
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LoadedModel> LoadGgufModel(const std::string& path) {
  KV_ASSIGN_OR_RETURN(GgufFile opened, GgufFile::Open(path));
  // The matrices point into the mapping, which moves with the file object but stays put.
  const auto shared = std::make_shared<const GgufFile>(std::move(opened));
  const GgufFile& file = *shared;
  KV_ASSIGN_OR_RETURN(const std::string_view arch_name, file.GetString("general.architecture"));
  KV_ASSIGN_OR_RETURN(const Architecture arch, ArchitectureFromGguf(file, arch_name));

  LoadedModel model;
  model.source_path = path;
  KV_ASSIGN_OR_RETURN(model.tokenizer, ReadTokenizer(file));
  KV_ASSIGN_OR_RETURN(model.config, ReadConfig(file, arch_name, arch,
                                               static_cast<int>(model.tokenizer.tokens.size())));

  // Every tensor is found and checked before the arena is sized, so a bad file costs no
  // allocation.
  ArenaPlan plan;
  for (const WeightSlot& slot : PlanWeights(model.config, model.weights)) {
    KV_RETURN_IF_ERROR(PlanTensor(file, slot, plan));
  }
  KV_RETURN_IF_ERROR(plan.Fill(model.weights));
  if (model.config.tied_embeddings) model.weights.lm_head = model.weights.token_embedding;
  model.weights.storage = shared;

  const std::span<const uint8_t> whole_file[] = {file.bytes()};
  model.fingerprint = Sha256Hex(whole_file);
  return model;
}

absl::StatusOr<tokenizer::TokenizerSpec> LoadTokenizerSpec(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return TokenizerSpecFromJson((std::filesystem::path(path) / "tokenizer.json").string());
  }
  KV_ASSIGN_OR_RETURN(const GgufFile file, GgufFile::Open(path));
  return ReadTokenizer(file);
}

}  // namespace kvstrata::model

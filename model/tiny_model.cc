#include "model/tiny_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "model/gguf_writer.h"
#include "model/load_util.h"
#include "nlohmann/json.hpp"

namespace kvstrata::model {
namespace {

using nlohmann::json;

constexpr const char* kMerges[] = {"Ġ t", "h e", "Ġt he", "i n", "e r",
                                   "Ġ a", "o n", "r e",   "Ġ s", "a t"};
constexpr const char* kSpecials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
constexpr int kNumBaseTokens = 256 + 10 + 3;
constexpr int32_t kEndOfText = 266;
constexpr int32_t kImEnd = 268;

constexpr char kChatMlTemplate[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// Byte-level BPE spells bytes as printable code points: the printable Latin-1 bytes stand for
// themselves, the rest (controls, space, DEL, NBSP, soft hyphen) take 256, 257, ... in order.
std::string ByteToken(int byte) {
  const bool printable =
      (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || (byte >= 174 && byte <= 255);
  uint32_t code_point = static_cast<uint32_t>(byte);
  if (!printable) {
    int rank = 0;  // how many non-printable bytes come before this one
    for (int b = 0; b < byte; ++b) {
      const bool p = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      if (!p) ++rank;
    }
    code_point = 256 + static_cast<uint32_t>(rank);
  }
  std::string utf8;
  if (code_point < 0x80) {
    utf8.push_back(static_cast<char>(code_point));
  } else {  // everything here is below 0x800: two bytes
    utf8.push_back(static_cast<char>(0xc0 | (code_point >> 6)));
    utf8.push_back(static_cast<char>(0x80 | (code_point & 0x3f)));
  }
  return utf8;
}

std::string_view ArchName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
  }
  return "";
}

std::string HfClassName(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "";
}

tokenizer::TokenizerSpec TinyTokenizer(const TinyModelOptions& options, int vocab_size) {
  tokenizer::TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = options.arch == Architecture::kLlama ? "smollm" : "qwen2";
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(ByteToken(b));
  for (const char* merge : kMerges) {
    spec.merges.push_back(merge);
    std::string merged = merge;
    merged.erase(merged.find(' '), 1);
    spec.tokens.push_back(merged);
  }
  spec.token_types.assign(spec.tokens.size(), 1);
  for (const char* special : kSpecials) {
    spec.tokens.push_back(special);
    spec.token_types.push_back(3);
  }
  for (int id = kNumBaseTokens; id < vocab_size; ++id) {
    spec.tokens.push_back(absl::StrCat("<|pad_", id, "|>"));
    spec.token_types.push_back(4);
  }
  spec.bos_id = kEndOfText;
  spec.eos_id = kImEnd;
  spec.unknown_id = kEndOfText;
  spec.padding_id = kEndOfText;
  spec.add_bos = false;
  spec.chat_template = kChatMlTemplate;
  spec.end_of_generation_ids = EndOfGenerationIds(spec);
  return spec;
}

// splitmix64 with Box-Muller on top: the same numbers on every platform and standard library.
class NormalRng {
 public:
  explicit NormalRng(uint64_t seed) : state_(seed) {}

  float Next() {
    const double u1 = (static_cast<double>(NextBits() >> 11) + 0.5) * 0x1.0p-53;  // (0, 1)
    const double u2 = static_cast<double>(NextBits() >> 11) * 0x1.0p-53;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }

 private:
  uint64_t NextBits() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

bool IsNormGain(WeightRole role) {
  return role == WeightRole::kAttnNorm || role == WeightRole::kFfnNorm ||
         role == WeightRole::kOutputNorm || role == WeightRole::kQNorm ||
         role == WeightRole::kKNorm;
}

absl::Status CheckOptions(const TinyModelOptions& o, const ModelConfig& c) {
  KV_RETURN_IF_ERROR(ValidateConfig(c, "TinyModelOptions"));
  if (c.vocab_size < kNumBaseTokens) {
    return absl::InvalidArgumentError(absl::StrCat("TinyModelOptions.vocab_size ", o.vocab_size,
                                                   " is below the tokenizer's ", kNumBaseTokens,
                                                   " tokens"));
  }
  if (!(o.weight_std >= 0.0f)) {
    return absl::InvalidArgumentError("TinyModelOptions.weight_std must be >= 0");
  }
  if (o.hf_shards < 1) {
    return absl::InvalidArgumentError("TinyModelOptions.hf_shards must be >= 1");
  }
  if (o.gguf_alignment == 0 || (o.gguf_alignment & (o.gguf_alignment - 1)) != 0) {
    return absl::InvalidArgumentError("TinyModelOptions.gguf_alignment must be a power of two");
  }
  return absl::OkStatus();
}

ModelConfig TinyConfig(const TinyModelOptions& o) {
  ModelConfig c;
  c.arch = o.arch;
  c.name = o.name;
  c.vocab_size = o.vocab_size == 0 ? kNumBaseTokens : o.vocab_size;
  c.hidden_size = o.hidden_size;
  c.intermediate_size = o.intermediate_size;
  c.num_layers = o.num_layers;
  c.num_heads = o.num_heads;
  c.num_kv_heads = o.num_kv_heads;
  c.head_dim = o.head_dim != 0 ? o.head_dim : (o.num_heads > 0 ? o.hidden_size / o.num_heads : 0);
  c.rope_theta = o.rope_theta;
  c.rope_layout = RopeLayout::kHalfSplit;
  c.rms_norm_eps = o.rms_norm_eps;
  c.max_context = o.max_context;
  c.tied_embeddings = o.tied_embeddings;
  c.qkv_bias = o.arch == Architecture::kQwen2;
  c.qk_norm = o.arch == Architecture::kQwen3;
  return c;
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

absl::Status WriteBytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  file.close();
  if (!file) return absl::InternalError(absl::StrCat("cannot write '", path.string(), "'"));
  return absl::OkStatus();
}

absl::Status WriteJson(const std::filesystem::path& path, const json& doc) {
  return WriteBytes(path, doc.dump(2, ' ', /*ensure_ascii=*/false));
}

std::string SafetensorsDtype(GgmlType type) {
  return type == GgmlType::kF32 ? "F32" : type == GgmlType::kF16 ? "F16" : "BF16";
}

// One safetensors file holding `names[i]` = `data[i]` (already encoded as `dtype`).
std::string SafetensorsBytes(const std::vector<std::string>& names,
                             const std::vector<std::vector<int64_t>>& shapes,
                             const std::vector<std::vector<uint8_t>>& data,
                             const std::string& dtype) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    header[names[i]] = {{"dtype", dtype},
                        {"shape", shapes[i]},
                        {"data_offsets", json::array({offset, offset + data[i].size()})}};
    offset += data[i].size();
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data starts 8-aligned
  std::string out(8, '\0');
  const uint64_t header_size = header_text.size();
  std::memcpy(out.data(), &header_size, 8);
  out += header_text;
  for (const std::vector<uint8_t>& d : data) out.append(d.begin(), d.end());
  return out;
}

json TokenizerJson(const tokenizer::TokenizerSpec& spec, Architecture arch) {
  json vocab = json::object();
  json added = json::array();
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (spec.token_types[id] == 1) {
      vocab[spec.tokens[id]] = id;
    } else {
      added.push_back({{"id", id},
                       {"content", spec.tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", spec.token_types[id] == 3}});
    }
  }
  json merges = json::array();
  for (const std::string& merge : spec.merges) {
    const size_t space = merge.find(' ');
    merges.push_back(json::array({merge.substr(0, space), merge.substr(space + 1)}));
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", arch == Architecture::kLlama}};
  json pre;
  if (arch == Architecture::kLlama) {  // SmolLM2's: digits one by one, then GPT-2's splitting
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            json::array({{{"type", "Digits"}, {"individual_digits", true}}, byte_level})}};
  } else {  // Qwen2's regex: contractions, letters, single digits, punctuation, spaces
    const std::string regex =
        absl::StrCat(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|)", R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)",
                     R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
    pre = {{"type", "Sequence"},
           {"pretokenizers", json::array({{{"type", "Split"},
                                           {"pattern", {{"Regex", regex}}},
                                           {"behavior", "Isolated"},
                                           {"invert", false}},
                                          byte_level})}};
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

}  // namespace

void HalfSplitToInterleavedRows(std::span<const float> src, int num_heads, int head_dim, int cols,
                                std::span<float> dst) {
  const size_t row = static_cast<size_t>(cols);
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    const size_t base = static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      for (int j = 0; j < 2; ++j) {
        const float* from = src.data() + (base + j * half + i) * row;
        float* to = dst.data() + (base + 2 * i + j) * row;
        std::memcpy(to, from, row * sizeof(float));
      }
    }
  }
}

absl::StatusOr<LoadedModel> MakeTinyModel(const TinyModelOptions& options) {
  LoadedModel model;
  model.config = TinyConfig(options);
  KV_RETURN_IF_ERROR(CheckOptions(options, model.config));
  model.tokenizer = TinyTokenizer(options, model.config.vocab_size);
  ArenaPlan plan;
  const std::vector<WeightSlot> slots = PlanWeights(model.config, model.weights);
  for (size_t i = 0; i < slots.size(); ++i) {
    const WeightRole role = slots[i].role;
    const uint64_t seed = options.seed * 0x100000001b3ull + i;  // one stream per tensor
    plan.Add(slots[i], [role, seed, std = options.weight_std](std::span<float> out) {
      NormalRng rng(seed);
      const float base = IsNormGain(role) ? 1.0f : 0.0f;
      for (float& x : out) x = base + std * rng.Next();
      return absl::OkStatus();
    });
  }
  KV_RETURN_IF_ERROR(plan.Fill(model.weights));
  if (model.config.tied_embeddings) model.weights.lm_head = model.weights.token_embedding;
  return model;
}

absl::Status WriteTinyGguf(const std::string& path, const TinyModelOptions& options) {
  const GgmlType matrix_type = options.gguf_matrix_type;
  if (!CanDequantize(matrix_type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TinyModelOptions.gguf_matrix_type ", AsAbsl(GetGgmlTypeInfo(matrix_type).name),
        " is not one of F32, F16, BF16, Q8_0, Q4_0, Q4_1"));
  }
  KV_ASSIGN_OR_RETURN(const LoadedModel model, MakeTinyModel(options));
  const ModelConfig& c = model.config;
  const tokenizer::TokenizerSpec& tok = model.tokenizer;
  const std::string arch(ArchName(c.arch));
  const auto key = [&](absl::string_view suffix) { return absl::StrCat(arch, ".", suffix); };

  GgufWriter w(options.gguf_alignment);
  w.AddString("general.architecture", arch);
  w.AddString("general.name", c.name);
  w.AddUint32(key("block_count"), static_cast<uint32_t>(c.num_layers));
  w.AddUint32(key("context_length"), static_cast<uint32_t>(c.max_context));
  w.AddUint32(key("embedding_length"), static_cast<uint32_t>(c.hidden_size));
  w.AddUint32(key("feed_forward_length"), static_cast<uint32_t>(c.intermediate_size));
  w.AddUint32(key("attention.head_count"), static_cast<uint32_t>(c.num_heads));
  w.AddUint32(key("attention.head_count_kv"), static_cast<uint32_t>(c.num_kv_heads));
  w.AddFloat32(key("rope.freq_base"), c.rope_theta);
  w.AddFloat32(key("attention.layer_norm_rms_epsilon"), c.rms_norm_eps);
  // Written only where the default (embedding_length / head_count) would be wrong, as
  // converters do; Qwen3 converters always write it.
  if (c.head_dim * c.num_heads != c.hidden_size || c.arch == Architecture::kQwen3) {
    w.AddUint32(key("attention.key_length"), static_cast<uint32_t>(c.head_dim));
    w.AddUint32(key("attention.value_length"), static_cast<uint32_t>(c.head_dim));
  }
  w.AddUint32(key("rope.dimension_count"), static_cast<uint32_t>(c.head_dim));
  w.AddUint32(key("vocab_size"), static_cast<uint32_t>(c.vocab_size));
  w.AddString("tokenizer.ggml.model", tok.model);
  w.AddString("tokenizer.ggml.pre", tok.pre);
  w.AddStringArray("tokenizer.ggml.tokens", tok.tokens);
  w.AddInt32Array("tokenizer.ggml.token_type", tok.token_types);
  w.AddStringArray("tokenizer.ggml.merges", tok.merges);
  w.AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok.bos_id));
  w.AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tok.eos_id));
  w.AddUint32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(tok.unknown_id));
  w.AddUint32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(tok.padding_id));
  w.AddBool("tokenizer.ggml.add_bos_token", tok.add_bos);
  w.AddString("tokenizer.chat_template", tok.chat_template);

  ModelWeights scratch;
  for (const WeightSlot& slot : PlanWeights(c, scratch)) {
    const std::string name = GgufTensorName(slot);
    const size_t n = static_cast<size_t>(NumElements(slot.shape));
    std::span<const float> values(WeightOf(model.weights, slot), n);
    std::vector<float> permuted;
    if (c.arch == Architecture::kLlama &&
        (slot.role == WeightRole::kWq || slot.role == WeightRole::kWk)) {
      permuted.resize(n);
      const int heads = slot.role == WeightRole::kWq ? c.num_heads : c.num_kv_heads;
      HalfSplitToInterleavedRows(values, heads, c.head_dim, c.hidden_size, permuted);
      values = permuted;
    }
    const GgmlType type = slot.shape.size() == 2 ? matrix_type : GgmlType::kF32;
    absl::StatusOr<std::vector<uint8_t>> encoded = Quantize(type, values);
    if (!encoded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' ", FormatShape(slot.shape), ": ", encoded.status().message()));
    }
    KV_RETURN_IF_ERROR(w.AddTensor(name, type, {slot.shape.rbegin(), slot.shape.rend()}, *encoded));
  }
  return w.WriteFile(path);
}

absl::Status WriteTinyHfModel(const std::string& dir_name, const TinyModelOptions& options) {
  const GgmlType dtype = options.hf_dtype;
  if (dtype != GgmlType::kF32 && dtype != GgmlType::kF16 && dtype != GgmlType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("TinyModelOptions.hf_dtype ",
                                                   AsAbsl(GetGgmlTypeInfo(dtype).name),
                                                   " is not one of F32, F16, BF16"));
  }
  KV_ASSIGN_OR_RETURN(const LoadedModel model, MakeTinyModel(options));
  const ModelConfig& c = model.config;
  const std::filesystem::path dir(dir_name);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create '", dir_name, "': ", ec.message()));
  }

  const json config = {
      {"architectures", json::array({HfClassName(c.arch)})},
      {"model_type", std::string(ArchName(c.arch))},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"rope_theta", c.rope_theta},
      {"rms_norm_eps", c.rms_norm_eps},
      {"max_position_embeddings", c.max_context},
      {"vocab_size", c.vocab_size},
      {"tie_word_embeddings", c.tied_embeddings},
      {"hidden_act", "silu"},
      {"bos_token_id", model.tokenizer.bos_id},
      {"eos_token_id", model.tokenizer.eos_id},
      {"torch_dtype", dtype == GgmlType::kF32   ? "float32"
                      : dtype == GgmlType::kF16 ? "float16"
                                                : "bfloat16"},
  };
  KV_RETURN_IF_ERROR(WriteJson(dir / "config.json", config));

  // Tensors go to shards in load order, split as evenly as the count allows.
  ModelWeights scratch;
  const std::vector<WeightSlot> slots = PlanWeights(c, scratch);
  const int num_shards = std::min<int>(options.hf_shards, static_cast<int>(slots.size()));
  json weight_map = json::object();
  uint64_t total_bytes = 0;
  for (int shard = 0; shard < num_shards; ++shard) {
    std::vector<std::string> names;
    std::vector<std::vector<int64_t>> shapes;
    std::vector<std::vector<uint8_t>> data;
    const size_t begin = slots.size() * shard / num_shards;
    const size_t end = slots.size() * (shard + 1) / num_shards;
    for (size_t i = begin; i < end; ++i) {
      const WeightSlot& slot = slots[i];
      const size_t n = static_cast<size_t>(NumElements(slot.shape));
      KV_ASSIGN_OR_RETURN(
          std::vector<uint8_t> encoded,
          Quantize(dtype, std::span<const float>(WeightOf(model.weights, slot), n)));
      total_bytes += encoded.size();
      names.push_back(HfTensorName(slot));
      shapes.push_back(slot.shape);
      data.push_back(std::move(encoded));
    }
    const std::string file_name =
        num_shards == 1 ? "model.safetensors"
                        : absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, num_shards);
    for (const std::string& name : names) weight_map[name] = file_name;
    KV_RETURN_IF_ERROR(WriteBytes(dir / file_name,
                                  SafetensorsBytes(names, shapes, data, SafetensorsDtype(dtype))));
  }
  if (num_shards > 1) {
    KV_RETURN_IF_ERROR(
        WriteJson(dir / "model.safetensors.index.json",
                  {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}}));
  }

  const tokenizer::TokenizerSpec& tok = model.tokenizer;
  KV_RETURN_IF_ERROR(WriteJson(dir / "tokenizer.json", TokenizerJson(tok, c.arch)));
  const json tokenizer_config = {
      {"add_bos_token", tok.add_bos},
      {"bos_token", tok.tokens[static_cast<size_t>(tok.bos_id)]},
      {"eos_token", tok.tokens[static_cast<size_t>(tok.eos_id)]},
      {"unk_token", tok.tokens[static_cast<size_t>(tok.unknown_id)]},
      {"pad_token", tok.tokens[static_cast<size_t>(tok.padding_id)]},
      {"chat_template", tok.chat_template},
      {"model_max_length", c.max_context},
      {"tokenizer_class", "GPT2Tokenizer"},
  };
  return WriteJson(dir / "tokenizer_config.json", tokenizer_config);
}

}  // namespace kvstrata::model

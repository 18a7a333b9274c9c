#include "model/safetensors.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "kernels/numeric.h"
#include "model/load_util.h"
#include "nlohmann/json.hpp"

namespace kvstrata::model {
namespace {

using nlohmann::json;

// The format's own limit: headers above 100 MB are rejected by the reference implementation.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

// Element size of the dtypes safetensors defines with whole-byte elements; nullopt for others
// (whose size this reader does not check, and whose data it never reads).
std::optional<uint64_t> DtypeBytes(std::string_view dtype) {
  static const std::map<std::string_view, uint64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},
  };
  const auto it = kSizes.find(dtype);
  if (it == kSizes.end()) return std::nullopt;
  return it->second;
}

// A non-negative integer that fits in int64, or nullopt.
std::optional<uint64_t> AsCount(const json& j) {
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v <= static_cast<uint64_t>(INT64_MAX)) return v;
    return std::nullopt;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0)
    return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    if (!std::filesystem::exists(path)) {
      return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    }
    return absl::PermissionDeniedError(absl::StrCat("cannot read '", path, "'"));
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("error reading '", path, "'"));
  return std::move(contents).str();
}

// Parses a JSON document without exceptions; InvalidArgument naming `path` when it is not JSON.
absl::StatusOr<json> ParseJson(std::string_view text, const std::string& path) {
  json doc = json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not valid JSON"));
  }
  return doc;
}

absl::StatusOr<json> ReadJsonFile(const std::string& path) {
  KV_ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  return ParseJson(text, path);
}

// A JSON value as short text for error messages; never throws (invalid UTF-8 is replaced).
std::string Brief(const json& j) {
  std::string text = j.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  if (text.size() > 120) text = text.substr(0, 117) + "...";
  return text;
}

// Field access on config.json, with errors naming the file and the field.
class JsonFields {
 public:
  JsonFields(const json& doc, std::string path) : doc_(doc), path_(std::move(path)) {}

  bool Has(const char* field) const {
    return doc_.is_object() && doc_.contains(field) && !doc_.at(field).is_null();
  }

  absl::StatusOr<int> Int(const char* field) const {
    if (!Has(field)) return Missing(field);
    const json& v = doc_.at(field);
    if (!v.is_number_integer() || v.get<int64_t>() < INT_MIN || v.get<int64_t>() > INT_MAX) {
      return Invalid(field, v, "an integer");
    }
    return static_cast<int>(v.get<int64_t>());
  }
  absl::StatusOr<int> IntOr(const char* field, int fallback) const {
    return Has(field) ? Int(field) : fallback;
  }

  absl::StatusOr<float> Float(const char* field) const {
    if (!Has(field)) return Missing(field);
    const json& v = doc_.at(field);
    if (!v.is_number()) return Invalid(field, v, "a number");
    return v.get<float>();
  }
  absl::StatusOr<float> FloatOr(const char* field, float fallback) const {
    return Has(field) ? Float(field) : fallback;
  }

  absl::StatusOr<bool> Bool(const char* field) const {
    if (!Has(field)) return Missing(field);
    const json& v = doc_.at(field);
    if (!v.is_boolean()) return Invalid(field, v, "true or false");
    return v.get<bool>();
  }

  absl::Status Missing(const char* field) const {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path_, "' lacks the field \"", field, "\""));
  }
  absl::Status Invalid(const char* field, const json& value, const char* expected) const {
    return absl::InvalidArgumentError(absl::StrCat("'", path_, "': field \"", field, "\" is ",
                                                   Brief(value), ", expected ", expected));
  }

 private:
  const json& doc_;
  std::string path_;
};

absl::Status ParseHeaderEntry(const std::string& path, const std::string& name, const json& entry,
                              std::span<const uint8_t> data, SafetensorsTensor* out) {
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file '", path, "': tensor '", name, "' ", what));
  };
  if (!entry.is_object()) return bad(absl::StrCat("has header entry ", Brief(entry)));
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) return bad("has no string \"dtype\"");
  if (shape == entry.end() || !shape->is_array()) return bad("has no array \"shape\"");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2) {
    return bad("has no two-element \"data_offsets\"");
  }
  out->name = name;
  out->dtype = dtype->get<std::string>();
  uint64_t num_elements = 1;
  for (const json& dim : *shape) {
    const std::optional<uint64_t> d = AsCount(dim);
    if (!d.has_value() || __builtin_mul_overflow(num_elements, *d, &num_elements) ||
        num_elements > static_cast<uint64_t>(INT64_MAX)) {
      return bad(absl::StrCat("has an invalid shape ", Brief(*shape)));
    }
    out->shape.push_back(static_cast<int64_t>(*d));
  }
  out->num_elements = static_cast<int64_t>(num_elements);
  const std::optional<uint64_t> begin = AsCount((*offsets)[0]);
  const std::optional<uint64_t> end = AsCount((*offsets)[1]);
  if (!begin.has_value() || !end.has_value() || *begin > *end || *end > data.size()) {
    return bad(absl::StrCat("has data_offsets ", Brief(*offsets), " outside the ", data.size(),
                            " data bytes of the file: truncated or corrupt"));
  }
  if (const std::optional<uint64_t> width = DtypeBytes(out->dtype); width.has_value()) {
    uint64_t expected = 0;
    if (__builtin_mul_overflow(num_elements, *width, &expected) || expected != *end - *begin) {
      return bad(absl::StrCat("is ", out->dtype, " ", FormatShape(out->shape), " but spans ",
                              *end - *begin, " bytes"));
    }
  }
  out->data = data.subspan(*begin, *end - *begin);
  return absl::OkStatus();
}

// ---- Model --------------------------------------------------------------------------------

// The safetensors files of a model folder, in name order, with a name -> tensor index.
struct Shards {
  std::vector<SafetensorsFile> files;
  std::map<std::string, const SafetensorsTensor*, std::less<>> tensors;
};

absl::StatusOr<Shards> OpenShards(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  const std::filesystem::path index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index_path)) {
    KV_ASSIGN_OR_RETURN(const json index, ReadJsonFile(index_path.string()));
    const auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
    if (weight_map == index.end() || !weight_map->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", index_path.string(), "' has no object \"weight_map\""));
    }
    std::set<std::string> unique;
    for (const auto& [tensor, file] : weight_map->items()) {
      const std::string file_name = file.is_string() ? file.get<std::string>() : "";
      // Shards live beside the index: a path could point anywhere.
      if (file_name.empty() || file_name.find('/') != std::string::npos || file_name == "." ||
          file_name == "..") {
        return absl::InvalidArgumentError(absl::StrCat("'", index_path.string(), "': tensor '",
                                                       tensor, "' maps to ", Brief(file),
                                                       ", not a file name in the folder"));
      }
      unique.insert(file_name);
    }
    names.assign(unique.begin(), unique.end());  // std::set: already in name order
  } else if (std::filesystem::exists(dir / "model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(absl::StrCat("'", dir.string(), "' holds neither ",
                                            "model.safetensors nor model.safetensors.index.json"));
  }
  Shards shards;
  shards.files.reserve(names.size());
  for (const std::string& name : names) {
    KV_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open((dir / name).string()));
    shards.files.push_back(std::move(file));
  }
  for (const SafetensorsFile& file : shards.files) {
    for (const SafetensorsTensor& tensor : file.tensors()) {
      if (!shards.tensors.emplace(tensor.name, &tensor).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", tensor.name, "' appears in more than one shard of '", dir.string(), "'"));
      }
    }
  }
  return shards;
}

absl::StatusOr<Architecture> ArchitectureFromConfig(const json& config, const std::string& path) {
  const auto archs = config.find("architectures");
  if (archs == config.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' lacks the field \"architectures\" (a list of class names)"));
  }
  const std::string name = (*archs)[0].get<std::string>();
  if (name == "LlamaForCausalLM") return Architecture::kLlama;
  if (name == "Qwen2ForCausalLM") return Architecture::kQwen2;
  if (name == "Qwen3ForCausalLM") return Architecture::kQwen3;
  return absl::UnimplementedError(absl::StrCat("'", path, "': architecture '", name,
                                               "' is not supported (LlamaForCausalLM, ",
                                               "Qwen2ForCausalLM, Qwen3ForCausalLM are)"));
}

absl::StatusOr<ModelConfig> ReadHfConfig(const json& doc, const std::string& path,
                                         const Shards& shards, const std::string& name) {
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a JSON object"));
  }
  const JsonFields f(doc, path);
  ModelConfig c;
  c.name = name;
  KV_ASSIGN_OR_RETURN(c.arch, ArchitectureFromConfig(doc, path));
  KV_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size"));
  KV_ASSIGN_OR_RETURN(c.intermediate_size, f.Int("intermediate_size"));
  KV_ASSIGN_OR_RETURN(c.num_layers, f.Int("num_hidden_layers"));
  KV_ASSIGN_OR_RETURN(c.num_heads, f.Int("num_attention_heads"));
  KV_ASSIGN_OR_RETURN(c.num_kv_heads, f.IntOr("num_key_value_heads", c.num_heads));
  if (!f.Has("head_dim") && (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)) {
    return f.Missing("head_dim");  // hidden_size / num_attention_heads is not whole
  }
  KV_ASSIGN_OR_RETURN(c.head_dim,
                      f.IntOr("head_dim", c.num_heads > 0 ? c.hidden_size / c.num_heads : 0));
  KV_ASSIGN_OR_RETURN(c.rope_theta, f.FloatOr("rope_theta", 10000.0f));
  KV_ASSIGN_OR_RETURN(c.rms_norm_eps, f.Float("rms_norm_eps"));
  KV_ASSIGN_OR_RETURN(c.max_context, f.Int("max_position_embeddings"));
  KV_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size"));
  if (f.Has("rope_scaling")) {
    return absl::UnimplementedError(absl::StrCat(
        "'", path, "': rope_scaling ", Brief(doc.at("rope_scaling")), " is not supported"));
  }
  for (const char* field : {"attention_bias", "mlp_bias"}) {
    if (f.Has(field)) {
      KV_ASSIGN_OR_RETURN(const bool bias, f.Bool(field));
      if (bias && c.arch == Architecture::kLlama) {
        return absl::UnimplementedError(
            absl::StrCat("'", path, "': \"", field, "\": true is not supported"));
      }
    }
  }
  // Absent, it follows the files: a checkpoint without lm_head.weight shares the embedding.
  if (f.Has("tie_word_embeddings")) {
    KV_ASSIGN_OR_RETURN(c.tied_embeddings, f.Bool("tie_word_embeddings"));
  } else {
    c.tied_embeddings = !shards.tensors.contains("lm_head.weight");
  }
  c.rope_layout = RopeLayout::kHalfSplit;
  c.qkv_bias = c.arch == Architecture::kQwen2;
  c.qk_norm = c.arch == Architecture::kQwen3;
  KV_RETURN_IF_ERROR(ValidateConfig(c, absl::StrCat("'", path, "'")));
  return c;
}

absl::Status PlanHfTensor(const Shards& shards, const std::string& dir, const WeightSlot& slot,
                          ArenaPlan& plan) {
  const std::string name = HfTensorName(slot);
  const auto it = shards.tensors.find(name);
  if (it == shards.tensors.end()) {
    return absl::NotFoundError(absl::StrCat("model '", dir, "' lacks tensor '", name,
                                            "' (expected shape ", FormatShape(slot.shape), ")"));
  }
  const SafetensorsTensor& tensor = *it->second;
  if (tensor.shape != slot.shape) {
    return absl::InvalidArgumentError(absl::StrCat("model '", dir, "': tensor '", name,
                                                   "' has shape ", FormatShape(tensor.shape),
                                                   ", expected ", FormatShape(slot.shape)));
  }
  if (tensor.dtype != "F32" && tensor.dtype != "F16" && tensor.dtype != "BF16") {
    return absl::UnimplementedError(absl::StrCat("model '", dir, "': tensor '", name,
                                                 "' has dtype ", tensor.dtype,
                                                 " (supported: F32, F16, BF16)"));
  }
  if (slot.is_matrix()) {  // kept as stored: the shards outlive the model (weights.storage)
    const GgmlType type = tensor.dtype == "F32"   ? GgmlType::kF32
                          : tensor.dtype == "F16" ? GgmlType::kF16
                                                  : GgmlType::kBF16;
    *slot.matrix = WeightMatrix{type, slot.shape[0], slot.shape[1], tensor.data.data()};
    return absl::OkStatus();
  }
  plan.Add(slot, [&tensor](std::span<float> out) { return ConvertSafetensor(tensor, out); });
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> LoadHfModelOrThrow(const std::string& dir_name) {
  const std::filesystem::path dir(dir_name);
  const std::string config_path = (dir / "config.json").string();
  KV_ASSIGN_OR_RETURN(const json config_doc, ReadJsonFile(config_path));
  KV_ASSIGN_OR_RETURN(Shards opened, OpenShards(dir));
  // The matrices point into the mapped files, which stay put when the shards move.
  const auto shared = std::make_shared<const Shards>(std::move(opened));
  const Shards& shards = *shared;

  LoadedModel model;
  model.source_path = dir_name;
  const std::filesystem::path clean = dir.has_filename() ? dir : dir.parent_path();
  KV_ASSIGN_OR_RETURN(model.config,
                      ReadHfConfig(config_doc, config_path, shards, clean.filename().string()));
  KV_ASSIGN_OR_RETURN(model.tokenizer, TokenizerSpecFromJson((dir / "tokenizer.json").string()));
  // tokenizer_config.json may name no eos; config.json usually has its id.
  if (model.tokenizer.eos_id < 0 && config_doc.contains("eos_token_id") &&
      config_doc.at("eos_token_id").is_number_integer()) {
    const int64_t eos = config_doc.at("eos_token_id").get<int64_t>();
    if (eos >= 0 && eos < static_cast<int64_t>(model.tokenizer.tokens.size())) {
      model.tokenizer.eos_id = static_cast<int32_t>(eos);
      model.tokenizer.end_of_generation_ids = EndOfGenerationIds(model.tokenizer);
    }
  }
  if (static_cast<int64_t>(model.tokenizer.tokens.size()) > model.config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", dir_name, "': tokenizer.json has ", model.tokenizer.tokens.size(),
                     " tokens, more than vocab_size ", model.config.vocab_size));
  }

  ArenaPlan plan;
  for (const WeightSlot& slot : PlanWeights(model.config, model.weights)) {
    KV_RETURN_IF_ERROR(PlanHfTensor(shards, dir_name, slot, plan));
  }
  KV_RETURN_IF_ERROR(plan.Fill(model.weights));
  if (model.config.tied_embeddings) model.weights.lm_head = model.weights.token_embedding;
  model.weights.storage = shared;

  std::vector<std::span<const uint8_t>> parts;
  for (const SafetensorsFile& file : shards.files) parts.push_back(file.bytes());
  model.fingerprint = Sha256Hex(parts);
  return model;
}

// ---- Tokenizer ----------------------------------------------------------------------------

// The pre-tokenizers of a tokenizer.json, flattening one level of Sequence.
std::vector<const json*> PreTokenizerSteps(const json& pre) {
  std::vector<const json*> steps;
  if (!pre.is_object()) return steps;
  const auto type = pre.find("type");
  const auto list = pre.find("pretokenizers");
  if (type != pre.end() && *type == "Sequence" && list != pre.end() && list->is_array()) {
    for (const json& step : *list) steps.push_back(&step);
  } else {
    steps.push_back(&pre);
  }
  return steps;
}

absl::StatusOr<std::string> ClassifyPreTokenizer(const json& doc, const std::string& path) {
  const auto pre = doc.find("pre_tokenizer");
  const auto unsupported = [&] {
    return absl::UnimplementedError(
        absl::StrCat("'", path, "': pre_tokenizer ", pre == doc.end() ? "null" : Brief(*pre),
                     " is not one this tokenizer knows (smollm, llama-bpe, qwen2, gpt2)"));
  };
  if (pre == doc.end()) return unsupported();
  bool byte_level = false;
  bool individual_digits = false;
  std::vector<std::string> regexes;
  int others = 0;
  for (const json* step : PreTokenizerSteps(*pre)) {
    if (!step->is_object()) {
      ++others;
      continue;
    }
    const std::string type = step->value("type", "");
    if (type == "ByteLevel") {
      byte_level = true;
    } else if (type == "Digits" && step->value("individual_digits", false)) {
      individual_digits = true;
    } else if (type == "Split" && step->contains("pattern") && step->at("pattern").is_object() &&
               step->at("pattern").contains("Regex") &&
               step->at("pattern").at("Regex").is_string()) {
      regexes.push_back(step->at("pattern").at("Regex").get<std::string>());
    } else {
      ++others;
    }
  }
  if (!byte_level || others > 0) return unsupported();
  if (regexes.empty()) return individual_digits ? "smollm" : "gpt2";
  if (regexes.size() == 1 && !individual_digits) {
    const std::string& re = regexes[0];
    const bool contractions = re.find("(?i:'s|'t|'re|'ve|'m|'ll|'d)") != std::string::npos;
    if (contractions && re.find(R"(\p{N}{1,3})") != std::string::npos) return "llama-bpe";
    if (contractions && re.find(R"(\p{N})") != std::string::npos) return "qwen2";
  }
  return unsupported();
}

// "<s>" or {"content": "<s>", ...} -> "<s>"; anything else -> nullopt.
std::optional<std::string> TokenText(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j.at("content").is_string()) {
    return j.at("content").get<std::string>();
  }
  return std::nullopt;
}

// Whether a post-processor (possibly inside a Sequence) prepends `bos` to single inputs.
bool PostProcessorAddsBos(const json& post, const std::string& bos) {
  if (!post.is_object()) return false;
  if (post.value("type", "") == "Sequence" && post.contains("processors") &&
      post.at("processors").is_array()) {
    for (const json& p : post.at("processors")) {
      if (PostProcessorAddsBos(p, bos)) return true;
    }
    return false;
  }
  if (post.value("type", "") != "TemplateProcessing" || !post.contains("single") ||
      !post.at("single").is_array() || post.at("single").empty()) {
    return false;
  }
  const json& first = post.at("single")[0];
  return first.is_object() && first.contains("SpecialToken") &&
         first.at("SpecialToken").is_object() && first.at("SpecialToken").value("id", "") == bos;
}

absl::StatusOr<tokenizer::TokenizerSpec> TokenizerSpecOrThrow(const std::string& path) {
  KV_ASSIGN_OR_RETURN(const json doc, ReadJsonFile(path));
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", what));
  };
  if (!doc.is_object() || !doc.contains("model") || !doc.at("model").is_object()) {
    return bad("has no \"model\" object");
  }
  const json& model = doc.at("model");
  if (model.contains("type") && model.at("type") != "BPE") {
    return absl::UnimplementedError(absl::StrCat(
        "'", path, "': model type ", Brief(model.at("type")), " is not supported (BPE is)"));
  }
  if (!model.contains("vocab") || !model.at("vocab").is_object()) {
    return bad("has no \"model.vocab\" object");
  }
  const json& vocab = model.at("vocab");
  const json empty_array = json::array();
  const json& added = doc.contains("added_tokens") && doc.at("added_tokens").is_array()
                          ? doc.at("added_tokens")
                          : empty_array;

  // Ids must be dense: 0 .. n-1 with n no more than the entries listed. Checking the bound
  // first keeps a hostile id from sizing the table.
  const uint64_t max_entries = vocab.size() + added.size();
  tokenizer::TokenizerSpec spec;
  spec.model = "gpt2";
  std::vector<bool> assigned;
  const auto place = [&](const std::string& text, const json& id_json, int32_t type,
                         bool may_repeat) -> absl::Status {
    const std::optional<uint64_t> id = AsCount(id_json);
    if (!id.has_value() || *id >= max_entries) {
      return bad(absl::StrCat("token '", text, "' has id ", Brief(id_json), ", not in [0, ",
                              max_entries, ")"));
    }
    if (*id >= spec.tokens.size()) {
      spec.tokens.resize(*id + 1);
      spec.token_types.resize(*id + 1, 0);
      assigned.resize(*id + 1, false);
    }
    if (assigned[*id] && (!may_repeat || spec.tokens[*id] != text)) {
      return bad(
          absl::StrCat("id ", *id, " is given to both '", spec.tokens[*id], "' and '", text, "'"));
    }
    spec.tokens[*id] = text;
    spec.token_types[*id] = type;
    assigned[*id] = true;
    return absl::OkStatus();
  };
  for (const auto& [text, id] : vocab.items()) {
    KV_RETURN_IF_ERROR(place(text, id, /*type=*/1, /*may_repeat=*/false));
  }
  for (const json& token : added) {
    if (!token.is_object() || !token.contains("content") || !token.at("content").is_string() ||
        !token.contains("id")) {
      return bad(absl::StrCat("added token ", Brief(token), " lacks content or id"));
    }
    const bool special = token.value("special", false);
    // Added tokens often repeat a vocab entry (same text, same id) to mark it special.
    KV_RETURN_IF_ERROR(place(token.at("content").get<std::string>(), token.at("id"),
                             /*type=*/special ? 3 : 4, /*may_repeat=*/true));
  }
  for (size_t id = 0; id < assigned.size(); ++id) {
    if (!assigned[id]) return bad(absl::StrCat("no token has id ", id, " (ids must be dense)"));
  }

  if (model.contains("merges")) {
    const json& merges = model.at("merges");
    if (!merges.is_array()) return bad("\"model.merges\" is not a list");
    spec.merges.reserve(merges.size());
    for (const json& merge : merges) {
      if (merge.is_string()) {
        spec.merges.push_back(merge.get<std::string>());
      } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                 merge[1].is_string()) {
        spec.merges.push_back(
            absl::StrCat(merge[0].get<std::string>(), " ", merge[1].get<std::string>()));
      } else {
        return bad(absl::StrCat("merge ", Brief(merge), " is neither \"a b\" nor [\"a\", \"b\"]"));
      }
    }
  }
  KV_ASSIGN_OR_RETURN(spec.pre, ClassifyPreTokenizer(doc, path));

  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(spec.tokens.size());
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    ids.emplace(spec.tokens[id], static_cast<int32_t>(id));
  }
  const auto id_of = [&](const json& j) -> int32_t {
    const std::optional<std::string> text = TokenText(j);
    if (!text.has_value()) return -1;
    const auto it = ids.find(*text);
    return it == ids.end() ? -1 : it->second;
  };
  if (model.contains("unk_token")) spec.unknown_id = id_of(model.at("unk_token"));

  const std::filesystem::path config_path =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::optional<bool> add_bos;
  if (std::filesystem::exists(config_path)) {
    KV_ASSIGN_OR_RETURN(const json config, ReadJsonFile(config_path.string()));
    if (!config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", config_path.string(), "' is not a JSON object"));
    }
    if (config.contains("bos_token")) spec.bos_id = id_of(config.at("bos_token"));
    if (config.contains("eos_token")) spec.eos_id = id_of(config.at("eos_token"));
    if (config.contains("unk_token")) spec.unknown_id = id_of(config.at("unk_token"));
    if (config.contains("pad_token")) spec.padding_id = id_of(config.at("pad_token"));
    if (config.contains("add_bos_token") && config.at("add_bos_token").is_boolean()) {
      add_bos = config.at("add_bos_token").get<bool>();
    }
    if (config.contains("chat_template")) {
      const json& t = config.at("chat_template");
      if (t.is_string()) {
        spec.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // named templates: take "default"
        for (const json& named : t) {
          if (named.is_object() && named.value("name", "") == "default" &&
              named.contains("template") && named.at("template").is_string()) {
            spec.chat_template = named.at("template").get<std::string>();
          }
        }
      }
    }
  }
  if (!add_bos.has_value()) {
    add_bos = spec.bos_id >= 0 && doc.contains("post_processor") &&
              PostProcessorAddsBos(doc.at("post_processor"),
                                   spec.tokens[static_cast<size_t>(spec.bos_id)]);
  }
  spec.add_bos = *add_bos;
  spec.end_of_generation_ids = EndOfGenerationIds(spec);
  return spec;
}

}  // namespace

// ---- SafetensorsFile ----------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  KV_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> source, ByteSource::MapFile(path));
  return Parse(std::move(source), path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::string bytes, std::string name) {
  return Parse(ByteSource::FromString(std::move(bytes)), std::move(name));
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::unique_ptr<ByteSource> source,
                                                       std::string path) {
  SafetensorsFile file;
  file.source_ = std::move(source);
  file.path_ = std::move(path);
  const std::span<const uint8_t> bytes = file.source_->bytes();
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors file '", file.path_, "' ", what));
  };
  if (bytes.size() < 8) return bad(absl::StrCat("is ", bytes.size(), " bytes, too short"));
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), 8);
  if (header_bytes > kMaxHeaderBytes || header_bytes > bytes.size() - 8) {
    return bad(absl::StrCat("declares a ", header_bytes, "-byte header but has ", bytes.size() - 8,
                            " bytes after the length: truncated or corrupt"));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data() + 8), header_bytes);
  const json header = json::parse(header_text.begin(), header_text.end(), /*cb=*/nullptr,
                                  /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return bad("has a header that is not a JSON object");
  }
  const std::span<const uint8_t> data = bytes.subspan(8 + header_bytes);
  try {
    file.tensors_.reserve(header.size());
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      SafetensorsTensor tensor;
      KV_RETURN_IF_ERROR(ParseHeaderEntry(file.path_, name, entry, data, &tensor));
      file.tensors_.push_back(std::move(tensor));
    }
  } catch (const json::exception& e) {
    return bad(absl::StrCat("has a malformed header: ", e.what()));
  }
  // Built last: the views must point at names that will not move again.
  for (size_t i = 0; i < file.tensors_.size(); ++i) {
    file.index_.emplace(file.tensors_[i].name, i);
  }
  return file;
}

std::span<const uint8_t> SafetensorsFile::bytes() const { return source_->bytes(); }

const SafetensorsTensor* SafetensorsFile::FindTensor(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status ConvertSafetensor(const SafetensorsTensor& tensor, std::span<float> out) {
  if (out.size() != static_cast<uint64_t>(tensor.num_elements)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name, "' has ",
                                                   tensor.num_elements, " elements, output holds ",
                                                   out.size()));
  }
  const uint8_t* src = tensor.data.data();
  const size_t n = out.size();
  if (tensor.dtype == "F32") {
    if (n > 0) std::memcpy(out.data(), src, n * sizeof(float));
  } else if (tensor.dtype == "F16" || tensor.dtype == "BF16") {
    const bool bf16 = tensor.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      const uint16_t bits = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
      out[i] = bf16 ? kernels::Bf16ToFloat(bits) : kernels::Fp16ToFloat(bits);
    }
  } else {
    return absl::UnimplementedError(absl::StrCat("tensor '", tensor.name, "' has dtype ",
                                                 tensor.dtype, " (supported: F32, F16, BF16)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LoadedModel> LoadHfModel(const std::string& dir) {
  // nlohmann::json throws on some misuse; nothing below should, but no exception may escape.
  try {
    return LoadHfModelOrThrow(dir);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", dir, "': malformed JSON: ", e.what()));
  }
}

absl::StatusOr<tokenizer::TokenizerSpec> TokenizerSpecFromJson(const std::string& path) {
  try {
    return TokenizerSpecOrThrow(path);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': malformed JSON: ", e.what()));
  }
}

}  // namespace kvstrata::model

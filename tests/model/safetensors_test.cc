// LoadHfModel and TokenizerSpecFromJson on folders written by WriteTinyHfModel or by hand, and
// the errors a wrong or hostile folder must give.

#include "model/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/dequant.h"
#include "model/load_util.h"
#include "model/loader.h"
#include "model/tiny_model.h"
#include "nlohmann/json.hpp"
#include "tests/model/model_test_util.h"

namespace kvstrata::model {
namespace {

using ::kvstrata::model::testing::ReadFile;
using ::kvstrata::model::testing::ScratchDir;
using ::kvstrata::model::testing::WriteFile;
using ::nlohmann::json;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every weight of a loaded model with its HF name, as fp32 values, for comparisons.
std::vector<std::pair<std::string, std::vector<float>>> Weights(const LoadedModel& m) {
  ModelWeights scratch;
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const WeightSlot& slot : PlanWeights(m.config, scratch)) {
    out.emplace_back(HfTensorName(slot), ValuesOf(m.weights, slot));
  }
  return out;
}

std::vector<float> ThroughType(GgmlType type, std::span<const float> x) {
  std::vector<float> y(x.size());
  absl::StatusOr<std::vector<uint8_t>> bytes = Quantize(type, x);
  EXPECT_TRUE(bytes.ok() && Dequantize(type, *bytes, y, "ref").ok());
  return y;
}

void ExpectSameTokenizer(const tokenizer::TokenizerSpec& a, const tokenizer::TokenizerSpec& b) {
  EXPECT_EQ(a.model, b.model);
  EXPECT_EQ(a.pre, b.pre);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.token_types, b.token_types);
  EXPECT_EQ(a.merges, b.merges);
  EXPECT_EQ(a.bos_id, b.bos_id);
  EXPECT_EQ(a.eos_id, b.eos_id);
  EXPECT_EQ(a.unknown_id, b.unknown_id);
  EXPECT_EQ(a.padding_id, b.padding_id);
  EXPECT_EQ(a.end_of_generation_ids, b.end_of_generation_ids);
  EXPECT_EQ(a.add_bos, b.add_bos);
  EXPECT_EQ(a.chat_template, b.chat_template);
}

struct HfCase {
  const char* label;
  Architecture arch;
  GgmlType dtype;
  int shards;
  bool tied;
  int head_dim;
};

class HfRoundTripTest : public ::testing::TestWithParam<HfCase> {};

TEST_P(HfRoundTripTest, LoadsWhatWasWritten) {
  const HfCase& c = GetParam();
  ScratchDir dir;
  TinyModelOptions options;
  options.arch = c.arch;
  options.hf_dtype = c.dtype;
  options.hf_shards = c.shards;
  options.tied_embeddings = c.tied;
  options.head_dim = c.head_dim;
  const std::string folder = dir.File("tiny-hf");
  ASSERT_TRUE(WriteTinyHfModel(folder, options).ok());
  absl::StatusOr<LoadedModel> loaded = LoadHfModel(folder);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<LoadedModel> reference = MakeTinyModel(options);
  ASSERT_TRUE(reference.ok());

  const ModelConfig& got = loaded->config;
  const ModelConfig& want = reference->config;
  EXPECT_EQ(got.arch, want.arch);
  EXPECT_EQ(got.name, "tiny-hf");
  EXPECT_EQ(got.vocab_size, want.vocab_size);
  EXPECT_EQ(got.hidden_size, want.hidden_size);
  EXPECT_EQ(got.intermediate_size, want.intermediate_size);
  EXPECT_EQ(got.num_layers, want.num_layers);
  EXPECT_EQ(got.num_heads, want.num_heads);
  EXPECT_EQ(got.num_kv_heads, want.num_kv_heads);
  EXPECT_EQ(got.head_dim, want.head_dim);
  EXPECT_EQ(got.rope_theta, want.rope_theta);
  EXPECT_EQ(got.rms_norm_eps, want.rms_norm_eps);
  EXPECT_EQ(got.max_context, want.max_context);
  EXPECT_EQ(got.tied_embeddings, c.tied);
  EXPECT_EQ(got.qkv_bias, want.qkv_bias);
  EXPECT_EQ(got.qk_norm, want.qk_norm);
  EXPECT_EQ(got.rope_layout, RopeLayout::kHalfSplit);
  ExpectSameTokenizer(loaded->tokenizer, reference->tokenizer);
  if (c.tied) {
    EXPECT_EQ(loaded->weights.lm_head.data, loaded->weights.token_embedding.data);
  }

  const auto got_weights = Weights(*loaded);
  const auto want_weights = Weights(*reference);
  ASSERT_EQ(got_weights.size(), want_weights.size());
  for (size_t i = 0; i < got_weights.size(); ++i) {
    SCOPED_TRACE(got_weights[i].first);
    ASSERT_FALSE(got_weights[i].second.empty());
    EXPECT_EQ(got_weights[i].second, ThroughType(c.dtype, want_weights[i].second));
  }

  // The fingerprint covers the safetensors files, in name order.
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    if (entry.path().extension() == ".safetensors") names.push_back(entry.path().string());
  }
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), static_cast<size_t>(c.shards));
  std::string all;
  for (const std::string& name : names) all += ReadFile(name);
  const std::span<const uint8_t> parts[] = {
      std::span(reinterpret_cast<const uint8_t*>(all.data()), all.size())};
  EXPECT_EQ(loaded->fingerprint, Sha256Hex(parts));
  EXPECT_EQ(loaded->source_path, folder);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, HfRoundTripTest,
    ::testing::Values(
        HfCase{"LlamaBf16", Architecture::kLlama, GgmlType::kBF16, 1, false, 0},
        HfCase{"LlamaF32ShardedTied", Architecture::kLlama, GgmlType::kF32, 3, true, 0},
        HfCase{"Qwen2F16", Architecture::kQwen2, GgmlType::kF16, 1, false, 0},
        HfCase{"Qwen3Bf16Sharded", Architecture::kQwen3, GgmlType::kBF16, 2, true, 32}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(HfModelTest, GgufAndHfFilesDescribeTheSameModel) {
  ScratchDir dir;
  TinyModelOptions options;
  options.hf_dtype = GgmlType::kF32;
  options.gguf_matrix_type = GgmlType::kF32;
  ASSERT_TRUE(WriteTinyHfModel(dir.File("hf"), options).ok());
  ASSERT_TRUE(WriteTinyGguf(dir.File("m.gguf"), options).ok());
  absl::StatusOr<LoadedModel> hf = LoadHfModel(dir.File("hf"));
  absl::StatusOr<LoadedModel> gguf = LoadGgufModel(dir.File("m.gguf"));
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  ExpectSameTokenizer(hf->tokenizer, gguf->tokenizer);
  EXPECT_EQ(hf->config.rope_layout, RopeLayout::kHalfSplit);
  EXPECT_EQ(gguf->config.rope_layout, RopeLayout::kInterleaved);
  const auto a = Weights(*hf);
  const auto b = Weights(*gguf);
  ASSERT_EQ(a.size(), b.size());
  const int head_dim = hf->config.head_dim;
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    std::vector<float> expected(a[i].second.begin(), a[i].second.end());
    const bool is_q = a[i].first.ends_with("q_proj.weight");
    if (is_q || a[i].first.ends_with("k_proj.weight")) {
      HalfSplitToInterleavedRows(a[i].second, is_q ? 4 : 2, head_dim, 64, expected);
    }
    EXPECT_EQ(std::vector<float>(b[i].second.begin(), b[i].second.end()), expected);
  }
  EXPECT_NE(hf->fingerprint, gguf->fingerprint);
}

// ---- Hand-written tokenizer.json ----------------------------------------------------------

json ByteLevel() { return {{"type", "ByteLevel"}, {"add_prefix_space", false}}; }

json Split(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}};
}

json Sequence(json steps) { return {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}}; }

// A three-token vocabulary plus <s> as an added special token.
json SmallTokenizer(json pre) {
  return {{"added_tokens", json::array({{{"id", 3}, {"content", "<s>"}, {"special", true}},
                                        {{"id", 4}, {"content", "<|user|>"}, {"special", false}}})},
          {"pre_tokenizer", std::move(pre)},
          {"model",
           {{"type", "BPE"},
            {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}},
            {"merges", json::array({"a b"})}}}};
}

absl::StatusOr<tokenizer::TokenizerSpec> ReadTokenizer(const ScratchDir& dir, const json& doc,
                                                       const json* config = nullptr) {
  WriteFile(dir.File("tokenizer.json"), doc.dump());
  if (config != nullptr) WriteFile(dir.File("tokenizer_config.json"), config->dump());
  return TokenizerSpecFromJson(dir.File("tokenizer.json"));
}

TEST(TokenizerJsonTest, ClassifiesPreTokenizers) {
  const std::string contractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|";
  const std::string tail = "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const struct {
    json pre;
    const char* expected;
  } cases[] = {
      {Sequence(json::array({{{"type", "Digits"}, {"individual_digits", true}}, ByteLevel()})),
       "smollm"},
      {Sequence(json::array({Split(contractions + "\\p{N}{1,3}" + tail), ByteLevel()})),
       "llama-bpe"},
      {Sequence(json::array({Split(contractions + "\\p{N}" + tail), ByteLevel()})), "qwen2"},
      {ByteLevel(), "gpt2"},
  };
  for (const auto& c : cases) {
    ScratchDir dir;
    absl::StatusOr<tokenizer::TokenizerSpec> spec = ReadTokenizer(dir, SmallTokenizer(c.pre));
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->pre, c.expected);
  }
  for (const json& pre : {json(nullptr), json{{"type", "Whitespace"}},
                          Sequence(json::array({Split("\\w+"), ByteLevel()}))}) {
    ScratchDir dir;
    const absl::Status status = ReadTokenizer(dir, SmallTokenizer(pre)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << pre.dump();
    EXPECT_THAT(status.message(), HasSubstr("pre_tokenizer"));
  }
}

TEST(TokenizerJsonTest, ReadsVocabMergesAddedTokensAndConfig) {
  ScratchDir dir;
  json doc = SmallTokenizer(ByteLevel());
  doc["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({ByteLevel(),
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}})}};
  doc["model"]["merges"] = json::array({json::array({"a", "b"})});  // the newer pair form
  const json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                       {"eos_token", "<|user|>"},
                       {"unk_token", nullptr},
                       {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                      {{"name", "default"}, {"template", "D"}}})}};
  absl::StatusOr<tokenizer::TokenizerSpec> spec = ReadTokenizer(dir, doc, &config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model, "gpt2");
  EXPECT_THAT(spec->tokens, ElementsAre("a", "b", "ab", "<s>", "<|user|>"));
  EXPECT_THAT(spec->token_types, ElementsAre(1, 1, 1, 3, 4));
  EXPECT_THAT(spec->merges, ElementsAre("a b"));
  EXPECT_EQ(spec->bos_id, 3);
  EXPECT_EQ(spec->eos_id, 4);
  EXPECT_EQ(spec->unknown_id, -1);
  EXPECT_TRUE(spec->add_bos);  // from the TemplateProcessing post-processor
  EXPECT_EQ(spec->chat_template, "D");
  EXPECT_THAT(spec->end_of_generation_ids, ElementsAre(4));  // <|user|> is no control token

  const json explicit_config = {{"bos_token", "<s>"}, {"add_bos_token", false}};
  spec = ReadTokenizer(dir, doc, &explicit_config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->add_bos);  // tokenizer_config.json wins
}

TEST(TokenizerJsonTest, RejectsBadVocabularies) {
  const auto expect_error = [](json doc, const std::string& needle) {
    ScratchDir dir;
    const absl::Status status = ReadTokenizer(dir, doc).status();
    EXPECT_FALSE(status.ok()) << doc.dump();
    EXPECT_THAT(status.message(), HasSubstr(needle)) << doc.dump();
  };
  json hole = SmallTokenizer(ByteLevel());
  hole["model"]["vocab"]["<s>"] = 3;  // repeated by added_tokens: 6 entries, 5 distinct ids
  hole["added_tokens"][1]["id"] = 5;  // ids 0-3 and 5
  expect_error(hole, "no token has id 4");
  json beyond = SmallTokenizer(ByteLevel());
  beyond["model"]["vocab"]["ab"] = 5;  // 5 entries: ids must lie in [0, 5)
  expect_error(beyond, "'ab' has id 5, not in [0, 5)");
  json huge = SmallTokenizer(ByteLevel());
  huge["model"]["vocab"]["ab"] = int64_t{1} << 40;
  expect_error(huge, "1099511627776");
  json negative = SmallTokenizer(ByteLevel());
  negative["model"]["vocab"]["ab"] = -1;
  expect_error(negative, "'ab' has id -1");
  json clash = SmallTokenizer(ByteLevel());
  clash["added_tokens"][0]["id"] = 0;
  expect_error(clash, "id 0 is given to both 'a' and '<s>'");
  json merges = SmallTokenizer(ByteLevel());
  merges["model"]["merges"] = json::array({42});
  expect_error(merges, "merge 42");
  json unigram = SmallTokenizer(ByteLevel());
  unigram["model"]["type"] = "Unigram";
  expect_error(unigram, "\"Unigram\"");
  json no_model = {{"pre_tokenizer", ByteLevel()}};
  expect_error(no_model, "\"model\"");

  ScratchDir dir;
  WriteFile(dir.File("tokenizer.json"), "{\"model\": ");
  EXPECT_THAT(TokenizerSpecFromJson(dir.File("tokenizer.json")).status().message(),
              HasSubstr("not valid JSON"));
  EXPECT_EQ(TokenizerSpecFromJson(dir.File("absent.json")).status().code(),
            absl::StatusCode::kNotFound);
}

// ---- Broken model folders -----------------------------------------------------------------

std::string TinyFolder(const ScratchDir& dir, TinyModelOptions options = {}) {
  const std::string folder = dir.File("m");
  EXPECT_TRUE(WriteTinyHfModel(folder, options).ok());
  return folder;
}

void EditJson(const std::string& path, const std::function<void(json&)>& edit) {
  json doc = json::parse(ReadFile(path));
  edit(doc);
  WriteFile(path, doc.dump());
}

// Rewrites a safetensors file's header, keeping its data.
void EditHeader(const std::string& path, const std::function<void(json&)>& edit) {
  const std::string bytes = ReadFile(path);
  uint64_t header_size;
  std::memcpy(&header_size, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, header_size));
  edit(header);
  const std::string text = header.dump();
  std::string out(8, '\0');
  const uint64_t size = text.size();
  std::memcpy(out.data(), &size, 8);
  WriteFile(path, out + text + bytes.substr(8 + header_size));
}

TEST(HfModelErrorTest, ConfigFieldsAreNamed) {
  for (const char* field :
       {"hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "rms_norm_eps", "max_position_embeddings", "vocab_size", "architectures"}) {
    ScratchDir dir;
    const std::string folder = TinyFolder(dir);
    EditJson(folder + "/config.json", [&](json& c) { c.erase(field); });
    const absl::Status status = LoadHfModel(folder).status();
    EXPECT_FALSE(status.ok()) << field;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(absl::StrCat("\"", field, "\"")), HasSubstr("config.json")));
  }
  ScratchDir dir;
  const std::string folder = TinyFolder(dir);
  EditJson(folder + "/config.json", [](json& c) { c["hidden_size"] = "64"; });
  EXPECT_THAT(LoadHfModel(folder).status().message(),
              AllOf(HasSubstr("\"hidden_size\""), HasSubstr("expected an integer")));
  EditJson(folder + "/config.json", [](json& c) {
    c["hidden_size"] = 64;
    c["architectures"] = json::array({"MistralForCausalLM"});
  });
  EXPECT_EQ(LoadHfModel(folder).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(LoadHfModel(folder).status().message(), HasSubstr("MistralForCausalLM"));
  EditJson(folder + "/config.json", [](json& c) {
    c["architectures"] = json::array({"LlamaForCausalLM"});
    c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}};
  });
  EXPECT_THAT(LoadHfModel(folder).status().message(), HasSubstr("rope_scaling"));
  EditJson(folder + "/config.json", [](json& c) { c.erase("rope_scaling"); });
  EXPECT_TRUE(LoadHfModel(folder).ok());
  WriteFile(folder + "/config.json", "[1, 2");
  EXPECT_THAT(LoadHfModel(folder).status().message(), HasSubstr("not valid JSON"));
}

TEST(HfModelErrorTest, OptionalConfigFieldsHaveDefaults) {
  ScratchDir dir;
  TinyModelOptions options;
  options.tied_embeddings = true;
  options.num_kv_heads = 4;  // what an absent num_key_value_heads means
  const std::string folder = TinyFolder(dir, options);
  EditJson(folder + "/config.json", [](json& c) {
    for (const char* f : {"head_dim", "num_key_value_heads", "rope_theta", "tie_word_embeddings"}) {
      c.erase(f);
    }
  });
  absl::StatusOr<LoadedModel> model = LoadHfModel(folder);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->config.head_dim, 16);     // hidden_size / num_attention_heads
  EXPECT_EQ(model->config.num_kv_heads, 4);  // num_attention_heads
  EXPECT_EQ(model->config.rope_theta, 10000.0f);
  EXPECT_TRUE(model->config.tied_embeddings);  // lm_head.weight is absent
}

TEST(HfModelErrorTest, TensorProblemsAreNamed) {
  ScratchDir dir;
  const std::string folder = TinyFolder(dir);
  const std::string file = folder + "/model.safetensors";
  const std::string original = ReadFile(file);

  EditHeader(file, [](json& h) {
    h["model.layers.1.mlp.up_proj.weightX"] = h["model.layers.1.mlp.up_proj.weight"];
    h.erase("model.layers.1.mlp.up_proj.weight");
  });
  absl::Status status = LoadHfModel(folder).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("'model.layers.1.mlp.up_proj.weight'"), HasSubstr("[128, 64]")));

  WriteFile(file, original);
  EditHeader(file, [](json& h) { h["model.layers.0.mlp.gate_proj.weight"]["shape"] = {64, 128}; });
  status = LoadHfModel(folder).status();
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'model.layers.0.mlp.gate_proj.weight'"),
                                      HasSubstr("has shape [64, 128], expected [128, 64]")));

  WriteFile(file, original);
  EditHeader(file, [](json& h) { h["model.norm.weight"]["dtype"] = "I16"; });
  status = LoadHfModel(folder).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("I16")));

  WriteFile(file, original);
  EditHeader(file, [](json& h) { h["model.norm.weight"]["data_offsets"][1] = 1 << 30; });
  status = LoadHfModel(folder).status();
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("outside")));

  WriteFile(file, original);
  EditHeader(file, [](json& h) { h["model.norm.weight"]["shape"] = {65}; });
  EXPECT_THAT(LoadHfModel(folder).status().message(),
              AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("spans 128 bytes")));

  WriteFile(file, original);
  EditHeader(file, [](json& h) { h["model.norm.weight"]["shape"] = {-64}; });
  EXPECT_THAT(LoadHfModel(folder).status().message(), HasSubstr("invalid shape"));

  WriteFile(file, original);
  EditHeader(file, [](json& h) { h["model.norm.weight"]["shape"] = {int64_t{1} << 40, 1 << 30}; });
  EXPECT_THAT(LoadHfModel(folder).status().message(), HasSubstr("invalid shape"));

  std::filesystem::remove(file);
  EXPECT_EQ(LoadHfModel(folder).status().code(), absl::StatusCode::kNotFound);
}

TEST(HfModelErrorTest, EveryTruncationOfTheWeightsIsAnError) {
  ScratchDir dir;
  const std::string folder = TinyFolder(dir);
  const std::string file = folder + "/model.safetensors";
  const std::string original = ReadFile(file);
  uint64_t header_size;
  std::memcpy(&header_size, original.data(), 8);
  for (size_t cut = 0; cut < original.size(); cut += (cut < 8 + header_size + 64 ? 7 : 997)) {
    WriteFile(file, original.substr(0, cut));
    const absl::Status status = LoadHfModel(folder).status();
    ASSERT_FALSE(status.ok()) << "cut at " << cut;
    EXPECT_THAT(status.message(), HasSubstr("model.safetensors")) << cut << ": " << status;
  }
  std::string huge = original;
  const uint64_t absurd = uint64_t{1} << 62;
  std::memcpy(huge.data(), &absurd, 8);
  WriteFile(file, huge);
  EXPECT_THAT(LoadHfModel(folder).status().message(), HasSubstr("4611686018427387904-byte header"));
  std::string not_json = original;
  not_json[8] = '[';
  WriteFile(file, not_json);
  EXPECT_THAT(LoadHfModel(folder).status().message(), HasSubstr("not a JSON object"));
}

TEST(HfModelErrorTest, ShardIndexMustNameFilesInTheFolder) {
  ScratchDir dir;
  TinyModelOptions options;
  options.hf_shards = 2;
  const std::string folder = TinyFolder(dir, options);
  EditJson(folder + "/model.safetensors.index.json", [](json& index) {
    index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  });
  EXPECT_THAT(LoadHfModel(folder).status().message(),
              AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("elsewhere")));
  EditJson(folder + "/model.safetensors.index.json", [](json& index) {
    index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors";
  });
  EXPECT_EQ(LoadHfModel(folder).status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, ParsesInMemoryImages) {
  const std::string header = R"({"b":{"dtype":"F16","shape":[2],"data_offsets":[4,8]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                             R"("__metadata__":{"format":"pt"}})";
  std::string bytes(8, '\0');
  const uint64_t size = header.size();
  std::memcpy(bytes.data(), &size, 8);
  bytes += header;
  const float one = 1.0f;
  bytes.append(reinterpret_cast<const char*>(&one), 4);
  bytes += std::string("\x00\x3c\x00\xc0", 4);  // fp16 1.0, -2.0
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(bytes, "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), 2u);
  const SafetensorsTensor* b = file->FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_THAT(b->shape, ElementsAre(2));
  std::vector<float> out(2);
  ASSERT_TRUE(ConvertSafetensor(*b, out).ok());
  EXPECT_THAT(out, ElementsAre(1.0f, -2.0f));
  ASSERT_TRUE(ConvertSafetensor(*file->FindTensor("a"), std::span(out).first(1)).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_FALSE(ConvertSafetensor(*b, std::span(out).first(1)).ok());
  EXPECT_EQ(file->FindTensor("__metadata__"), nullptr);
}

}  // namespace
}  // namespace kvstrata::model

// LoadGgufModel on tiny models written by WriteTinyGguf: every matrix type and architecture,
// and the errors a wrong or unsupported file must give.

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/numeric.h"
#include "model/dequant.h"
#include "model/gguf_writer.h"
#include "model/loader.h"
#include "model/tiny_model.h"
#include "tests/model/model_test_util.h"

namespace kvstrata::model {
namespace {

using ::kvstrata::model::testing::FindTensorInfo;
using ::kvstrata::model::testing::GetLe;
using ::kvstrata::model::testing::PutLe;
using ::kvstrata::model::testing::ReadFile;
using ::kvstrata::model::testing::ScratchDir;
using ::kvstrata::model::testing::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

// One tensor of a model: its fp32 values and shape, row-major; for a vector the arena pointer,
// for a matrix the matrix as the model holds it.
struct Tensor {
  std::string name;
  const float* vector = nullptr;
  const WeightMatrix* matrix = nullptr;
  std::vector<int64_t> shape;
  bool is_matrix() const { return shape.size() == 2; }
  bool present() const { return is_matrix() ? matrix->present() : vector != nullptr; }
  size_t size() const {
    size_t n = 1;
    for (const int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
  std::vector<float> values() const {
    if (!is_matrix()) return std::vector<float>(vector, vector + size());
    EXPECT_EQ(matrix->rows, shape[0]);
    EXPECT_EQ(matrix->cols, shape[1]);
    return matrix->Dequantized();
  }
};

std::vector<Tensor> TensorsOf(const LoadedModel& m) {
  const ModelConfig& c = m.config;
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim, f = c.intermediate_size,
                v = c.vocab_size;
  const ModelWeights& w = m.weights;
  const auto vec = [](std::string name, const float* p, int64_t n) {
    return Tensor{std::move(name), p, nullptr, {n}};
  };
  const auto mat = [](std::string name, const WeightMatrix& p, int64_t rows, int64_t cols) {
    return Tensor{std::move(name), nullptr, &p, {rows, cols}};
  };
  std::vector<Tensor> t = {mat("token_embedding", w.token_embedding, v, h),
                           vec("output_norm", w.output_norm, h), mat("lm_head", w.lm_head, v, h)};
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "layer" + std::to_string(l) + ".";
    t.push_back(vec(p + "attn_norm", L.attn_norm, h));
    t.push_back(mat(p + "wq", L.wq, q, h));
    t.push_back(mat(p + "wk", L.wk, kv, h));
    t.push_back(mat(p + "wv", L.wv, kv, h));
    t.push_back(mat(p + "wo", L.wo, h, q));
    t.push_back(vec(p + "ffn_norm", L.ffn_norm, h));
    t.push_back(mat(p + "w_gate", L.w_gate, f, h));
    t.push_back(mat(p + "w_up", L.w_up, f, h));
    t.push_back(mat(p + "w_down", L.w_down, h, f));
    if (c.qkv_bias) {
      t.push_back(vec(p + "bq", L.bq, q));
      t.push_back(vec(p + "bk", L.bk, kv));
      t.push_back(vec(p + "bv", L.bv, kv));
    }
    if (c.qk_norm) {
      t.push_back(vec(p + "q_norm", L.q_norm, c.head_dim));
      t.push_back(vec(p + "k_norm", L.k_norm, c.head_dim));
    }
  }
  return t;
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.max_context, b.max_context);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
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

// The values a GGUF file of `type` holds for reference values `x`: exactly what encoding then
// decoding gives, and within the format's precision of `x`.
std::vector<float> ThroughType(GgmlType type, std::span<const float> x) {
  absl::StatusOr<std::vector<uint8_t>> bytes = Quantize(type, x);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  std::vector<float> y(x.size());
  EXPECT_TRUE(Dequantize(type, *bytes, y, "ref").ok());
  return y;
}

float Tolerance(GgmlType type, std::span<const float> x) {
  float amax = 0.0f;
  for (const float v : x) amax = std::max(amax, std::fabs(v));
  switch (type) {
    case GgmlType::kF32:
      return 0.0f;
    case GgmlType::kF16:
      return amax * 0x1p-11f;
    case GgmlType::kBF16:
      return amax * 0x1p-8f;
    case GgmlType::kQ8_0:
      return amax / 127.0f * 0.6f;
    case GgmlType::kQ4_0:
      return amax / 8.0f * 1.01f;
    default:  // Q4_1: half a step of (max - min) / 15 <= 2 * amax / 15
      return amax * 2.0f / 15.0f * 0.6f;
  }
}

class GgufRoundTripTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgufRoundTripTest, LlamaLoadsWhatWasWritten) {
  const GgmlType type = GetParam();
  ScratchDir dir;
  TinyModelOptions options;
  options.gguf_matrix_type = type;
  options.num_layers = 3;
  options.name = "tiny-llama";
  const std::string path = dir.File("tiny.gguf");
  ASSERT_TRUE(WriteTinyGguf(path, options).ok());
  absl::StatusOr<LoadedModel> loaded = LoadGgufModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  absl::StatusOr<LoadedModel> reference = MakeTinyModel(options);
  ASSERT_TRUE(reference.ok()) << reference.status();

  ExpectSameConfig(loaded->config, reference->config);
  EXPECT_EQ(loaded->config.rope_layout, RopeLayout::kInterleaved);  // GGUF llama: permuted q/k
  ExpectSameTokenizer(loaded->tokenizer, reference->tokenizer);
  EXPECT_EQ(loaded->source_path, path);
  EXPECT_EQ(loaded->fingerprint.size(), 64u);
  EXPECT_EQ(loaded->fingerprint.find_first_not_of("0123456789abcdef"), std::string::npos);

  // Vectors sit inside the one arena; matrices keep the file's type (and bytes).
  const std::vector<float>& arena = loaded->weights.arena;
  const std::vector<Tensor> got = TensorsOf(*loaded);
  const std::vector<Tensor> want = TensorsOf(*reference);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_NE(loaded->weights.storage, nullptr);
  size_t total = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(got[i].name);
    ASSERT_TRUE(got[i].present());
    if (got[i].is_matrix()) {
      EXPECT_EQ(got[i].matrix->type, type);
      EXPECT_EQ(got[i].matrix->f32() != nullptr, type == GgmlType::kF32);
    } else {
      ASSERT_GE(got[i].vector, arena.data());
      ASSERT_LE(got[i].vector + got[i].size(), arena.data() + arena.size());
      total += got[i].size();
    }
    std::vector<float> expected = want[i].values();
    const bool is_q = got[i].name.ends_with(".wq");
    if (is_q || got[i].name.ends_with(".wk")) {
      const int heads = is_q ? options.num_heads : options.num_kv_heads;
      HalfSplitToInterleavedRows(std::vector<float>(expected), heads, reference->config.head_dim,
                                 options.hidden_size, expected);
    }
    const GgmlType stored = got[i].is_matrix() ? type : GgmlType::kF32;
    const std::vector<float> actual = got[i].values();
    EXPECT_EQ(actual, ThroughType(stored, expected));
    const float tolerance = Tolerance(stored, expected);
    for (size_t j = 0; j < actual.size(); ++j) {
      ASSERT_LE(std::fabs(actual[j] - expected[j]), tolerance) << "element " << j;
    }
  }
  EXPECT_EQ(total, arena.size());  // the arena holds the vectors only
}

INSTANTIATE_TEST_SUITE_P(AllTypes, GgufRoundTripTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                           GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1),
                         [](const auto& info) {
                           return std::string(GetGgmlTypeInfo(info.param).name);
                         });

TEST(GgufLoaderTest, QwenArchitecturesKeepHalfSplitAndExtraTensors) {
  for (const Architecture arch : {Architecture::kQwen2, Architecture::kQwen3}) {
    SCOPED_TRACE(arch == Architecture::kQwen2 ? "qwen2" : "qwen3");
    ScratchDir dir;
    TinyModelOptions options;
    options.arch = arch;
    options.gguf_matrix_type = GgmlType::kQ8_0;
    if (arch == Architecture::kQwen3) options.head_dim = 32;  // q width 128 != hidden 64
    ASSERT_TRUE(WriteTinyGguf(dir.File("q.gguf"), options).ok());
    absl::StatusOr<LoadedModel> loaded = LoadGgufModel(dir.File("q.gguf"));
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    absl::StatusOr<LoadedModel> reference = MakeTinyModel(options);
    ASSERT_TRUE(reference.ok());
    ExpectSameConfig(loaded->config, reference->config);
    EXPECT_EQ(loaded->config.rope_layout, RopeLayout::kHalfSplit);
    EXPECT_EQ(loaded->tokenizer.pre, "qwen2");
    const std::vector<Tensor> got = TensorsOf(*loaded);
    const std::vector<Tensor> want = TensorsOf(*reference);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE(got[i].name);
      ASSERT_TRUE(got[i].present());
      const std::vector<float> expected = want[i].values();
      EXPECT_EQ(got[i].values(),
                ThroughType(got[i].is_matrix() ? GgmlType::kQ8_0 : GgmlType::kF32, expected));
    }
    const LayerWeights& layer = loaded->weights.layers[1];
    EXPECT_EQ(layer.bq != nullptr, arch == Architecture::kQwen2);
    EXPECT_EQ(layer.q_norm != nullptr, arch == Architecture::kQwen3);
  }
}

TEST(GgufLoaderTest, TiedEmbeddingsShareTheirBytes) {
  ScratchDir dir;
  TinyModelOptions options;
  options.tied_embeddings = true;
  options.vocab_size = 300;  // padded with unused tokens
  options.gguf_alignment = 64;
  ASSERT_TRUE(WriteTinyGguf(dir.File("t.gguf"), options).ok());
  absl::StatusOr<LoadedModel> loaded = LoadGgufModel(dir.File("t.gguf"));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->config.tied_embeddings);
  EXPECT_EQ(loaded->weights.lm_head.data, loaded->weights.token_embedding.data);
  EXPECT_EQ(loaded->config.vocab_size, 300);
  ASSERT_EQ(loaded->tokenizer.tokens.size(), 300u);
  EXPECT_EQ(loaded->tokenizer.tokens[299], "<|pad_299|>");
  EXPECT_EQ(loaded->tokenizer.token_types[299], 4);
  // <|im_end|> (eos) first, then <|endoftext|>: both control tokens that end a turn.
  EXPECT_EQ(loaded->tokenizer.end_of_generation_ids, (std::vector<int32_t>{268, 266}));
}

TEST(GgufLoaderTest, FingerprintIsThePerFileSha256) {
  ScratchDir dir;
  TinyModelOptions options;
  ASSERT_TRUE(WriteTinyGguf(dir.File("a.gguf"), options).ok());
  ASSERT_TRUE(WriteTinyGguf(dir.File("b.gguf"), options).ok());
  options.seed = 2;
  ASSERT_TRUE(WriteTinyGguf(dir.File("c.gguf"), options).ok());
  const std::string a = LoadGgufModel(dir.File("a.gguf"))->fingerprint;
  EXPECT_EQ(a, LoadGgufModel(dir.File("b.gguf"))->fingerprint);  // same bytes
  EXPECT_NE(a, LoadGgufModel(dir.File("c.gguf"))->fingerprint);
}

// ---- Errors ---------------------------------------------------------------------------------

std::string TinyBytes(TinyModelOptions options = {}) {
  ScratchDir dir;
  EXPECT_TRUE(WriteTinyGguf(dir.File("m.gguf"), options).ok());
  return ReadFile(dir.File("m.gguf"));
}

absl::Status LoadBytes(const std::string& bytes) {
  ScratchDir dir;
  WriteFile(dir.File("bad.gguf"), bytes);
  return LoadGgufModel(dir.File("bad.gguf")).status();
}

TEST(GgufLoaderErrorTest, UnsupportedArchitectureIsNamed) {
  GgufWriter w;
  w.AddString("general.architecture", "gpt2");
  const absl::Status status = LoadBytes(w.Serialize());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("'gpt2'"));
}

TEST(GgufLoaderErrorTest, MissingTensorIsNamed) {
  std::string bytes = TinyBytes();
  const size_t at = FindTensorInfo(bytes, "blk.1.ffn_up.weight").n_dims;
  ASSERT_NE(at, std::string::npos);
  bytes[at - 8] = 'X';  // "blk.1.ffn_Xp.weight"
  const absl::Status status = LoadBytes(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'blk.1.ffn_up.weight'"), HasSubstr("[64, 128]")));
}

TEST(GgufLoaderErrorTest, WrongShapeNamesBothShapes) {
  std::string bytes = TinyBytes();
  const auto at = FindTensorInfo(bytes, "blk.0.ffn_gate.weight");
  ASSERT_NE(at.dims, std::string::npos);
  ASSERT_EQ(GetLe<uint64_t>(bytes, at.dims), 64u);
  PutLe<uint64_t>(bytes, at.dims, 128);  // same element count, transposed
  PutLe<uint64_t>(bytes, at.dims + 8, 64);
  const absl::Status status = LoadBytes(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("'blk.0.ffn_gate.weight'"), HasSubstr("has shape [128, 64]"),
                    HasSubstr("expected [64, 128]")));
}

TEST(GgufLoaderErrorTest, UndecodableTensorTypeIsNamed) {
  TinyModelOptions options;
  options.hidden_size = 256;  // rows of 256: whole Q6_K blocks
  options.num_heads = 4;
  std::string bytes = TinyBytes(options);
  const auto at = FindTensorInfo(bytes, "blk.0.attn_q.weight");
  ASSERT_NE(at.type, std::string::npos);
  PutLe<uint32_t>(bytes, at.type, static_cast<uint32_t>(GgmlType::kQ6_K));  // fewer bytes: fits
  const absl::Status status = LoadBytes(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("'blk.0.attn_q.weight'"), HasSubstr("Q6_K")));
}

TEST(GgufLoaderErrorTest, MissingConfigKeyIsNamed) {
  std::string bytes = TinyBytes();
  const size_t at = bytes.find("llama.block_count");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 12] = 'X';  // "llama.block_Xount"
  const absl::Status status = LoadBytes(bytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("'llama.block_count'"));
}

TEST(GgufLoaderErrorTest, WrongKeyTypeIsNamed) {
  std::string bytes = TinyBytes();
  // The value type of tokenizer.ggml.bos_token_id: uint32 -> float32.
  const size_t at = testing::AfterGgufString(bytes, "tokenizer.ggml.bos_token_id");
  ASSERT_NE(at, std::string::npos);
  PutLe<uint32_t>(bytes, at, static_cast<uint32_t>(GgufValueType::kFloat32));
  const absl::Status status = LoadBytes(bytes);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tokenizer.ggml.bos_token_id"), HasSubstr("float32")));
}

TEST(GgufLoaderErrorTest, UnsupportedVariantsAreRefused) {
  // Metadata a llama file could carry that this engine would silently get wrong.
  const auto with = [](const std::function<void(GgufWriter&)>& extra) {
    GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddUint32("llama.block_count", 1);
    w.AddUint32("llama.context_length", 128);
    w.AddUint32("llama.embedding_length", 64);
    w.AddUint32("llama.feed_forward_length", 128);
    w.AddUint32("llama.attention.head_count", 4);
    w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddStringArray("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
    extra(w);
    return w.Serialize();
  };
  EXPECT_THAT(
      LoadBytes(with([](GgufWriter& w) { w.AddUint32("llama.expert_count", 8); })).message(),
      HasSubstr("llama.expert_count"));
  EXPECT_THAT(LoadBytes(with([](GgufWriter& w) {
                w.AddString("llama.rope.scaling.type", "yarn");
              })).message(),
              HasSubstr("'yarn'"));
  EXPECT_THAT(LoadBytes(with([](GgufWriter& w) {
                w.AddUint32("llama.rope.dimension_count", 8);
              })).message(),
              HasSubstr("partial rotary"));
  EXPECT_THAT(LoadBytes(with([](GgufWriter& w) {
                w.AddUint32("tokenizer.ggml.eos_token_id", 7);
              })).message(),
              AllOf(HasSubstr("tokenizer.ggml.eos_token_id"), HasSubstr("2 tokens")));
  EXPECT_THAT(LoadBytes(with([](GgufWriter& w) {
                w.AddUint32("llama.attention.head_count_kv", 3);
              })).message(),
              HasSubstr("not a multiple of num_kv_heads 3"));
  EXPECT_THAT(LoadBytes(with([](GgufWriter& w) { w.AddUint32("llama.vocab_size", 1); })).message(),
              HasSubstr("more than llama.vocab_size 1"));
  // Everything consistent, but no tensors at all: the first one needed is named.
  EXPECT_THAT(LoadBytes(with([](GgufWriter&) {})).message(), HasSubstr("'token_embd.weight'"));
}

TEST(GgufLoaderErrorTest, RandomCorruptionNeverCrashes) {
  TinyModelOptions options;
  options.num_layers = 1;
  options.gguf_matrix_type = GgmlType::kQ4_1;
  const std::string full = TinyBytes(options);
  // Corrupt the metadata and tensor descriptions (the first 6 KB, where structure lives) and,
  // less often, anywhere.
  const size_t header_end = full.find("token_embd.weight") + 64;
  ScratchDir dir;
  std::mt19937 rng(7);
  int loaded = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bytes = full;
    for (int f = 0; f < 3; ++f) {
      const size_t at = rng() % (trial % 4 == 0 ? bytes.size() : header_end);
      if (rng() % 2 == 0) {
        bytes[at] = static_cast<char>(rng());
      } else if (at + 8 <= bytes.size()) {
        PutLe<uint64_t>(bytes, at, ~uint64_t{0} >> (rng() % 48));
      }
    }
    WriteFile(dir.File("fuzz.gguf"), bytes);
    const absl::StatusOr<LoadedModel> model = LoadGgufModel(dir.File("fuzz.gguf"));
    if (model.ok()) {
      ++loaded;
      EXPECT_EQ(model->weights.layers.size(), 1u);
    } else {
      EXPECT_FALSE(model.status().message().empty());
    }
  }
  EXPECT_LT(loaded, 400);
}

TEST(GgufLoaderErrorTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadGgufModel("/nonexistent/model.gguf").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvstrata::model

// The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) loaded by LoadGgufModel, checked against
// an independent implementation: the `gguf` Python package's reader and dequantiser, run by
// tests/model/gguf_reference.py with the interpreter in KVSTRATA_TEST_PYTHON. Values must agree
// bit for bit; the fingerprint must be the file's SHA-256 as hashlib computes it.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/load_util.h"
#include "model/loader.h"

#ifndef KVSTRATA_SOURCE_DIR
#error "KVSTRATA_SOURCE_DIR must name the repository root"
#endif

namespace kvstrata::model {
namespace {

using ::testing::Contains;

// What gguf_reference.py printed for one tensor.
struct Reference {
  std::string type;
  std::string shape;
  size_t count = 0;
  std::string sha256;
  std::vector<std::pair<size_t, uint32_t>> samples;  // index, fp32 bits
};

struct ReferenceRun {
  std::string file_sha256;
  std::map<std::string, Reference> tensors;
  std::string raw_output;
};

std::string ShellQuote(const std::string& s) {
  std::string quoted = "'";
  for (const char c : s) {
    if (c == '\'') {
      quoted.append("'\\''");  // close, escaped quote, reopen
    } else {
      quoted.push_back(c);
    }
  }
  quoted.push_back('\'');
  return quoted;
}

// Runs the reference script; on failure returns a message saying why.
std::string RunReference(const std::string& python, const std::string& model,
                         const std::vector<std::string>& names, ReferenceRun* run) {
  const std::string script = absl::StrCat(KVSTRATA_SOURCE_DIR, "/tests/model/gguf_reference.py");
  std::string command =
      absl::StrCat(ShellQuote(python), " ", ShellQuote(script), " ", ShellQuote(model));
  for (const std::string& name : names) absl::StrAppend(&command, " ", ShellQuote(name));
  absl::StrAppend(&command, " 2>&1");
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed: " + std::string(std::strerror(errno));
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) run->raw_output.append(buffer, n);
  const int rc = ::pclose(pipe);
  if (rc != 0) {
    return "the reference script failed (status " + std::to_string(rc) + "):\n" + run->raw_output;
  }
  std::istringstream lines(run->raw_output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "file") {
      fields >> run->file_sha256;
    } else if (kind == "tensor") {
      std::string name;
      Reference ref;
      fields >> name >> ref.type >> ref.shape >> ref.count >> ref.sha256;
      std::string sample;
      while (fields >> sample) {
        const size_t colon = sample.find(':');
        ref.samples.emplace_back(
            std::stoull(sample.substr(0, colon)),
            static_cast<uint32_t>(std::stoul(sample.substr(colon + 1), nullptr, 16)));
      }
      run->tensors[name] = ref;
    }
  }
  return "";
}

std::string HashFloats(const float* data, size_t count) {
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data),
                                       count * sizeof(float));
  const std::span<const uint8_t> parts[] = {bytes};
  return Sha256Hex(parts);
}

class GgufReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* model = std::getenv("KVSTRATA_MODEL");
    const char* python = std::getenv("KVSTRATA_TEST_PYTHON");
    if (model == nullptr || !std::filesystem::is_regular_file(model)) {
      setup_error_ = std::string("the default model is missing (KVSTRATA_MODEL=") +
                     (model ? model : "<unset>") + "); run scripts/fetch-model.sh";
      return;
    }
    if (python == nullptr || !std::filesystem::exists(python)) {
      setup_error_ = std::string("the test Python is missing (KVSTRATA_TEST_PYTHON=") +
                     (python ? python : "<unset>") + "); run scripts/python-env.sh";
      return;
    }
    model_path_ = new std::string(model);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<LoadedModel> loaded = LoadGgufModel(model);
    load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!loaded.ok()) {
      setup_error_ = "LoadGgufModel failed: " + std::string(loaded.status().message());
      return;
    }
    model_ = new LoadedModel(std::move(*loaded));
    reference_ = new ReferenceRun();
    std::vector<std::string> names;
    for (const auto& [name, pointer] : Checked()) names.push_back(name);
    setup_error_ = RunReference(python, model, names, reference_);
  }

  static void TearDownTestSuite() {
    delete model_;
    delete reference_;
    delete model_path_;
  }

  void SetUp() override { ASSERT_TRUE(setup_error_.empty()) << setup_error_; }

  // The tensors compared, with the fp32 values the model gives: the Q8_0 embedding and Q4_1
  // matrices from the first, a middle and the last layer (kept as stored, dequantised here as
  // every backend sees them), and F32 norms.
  static std::vector<std::pair<std::string, std::vector<float>>> Checked() {
    const ModelWeights& w = model_->weights;
    const size_t h = 576;
    const auto vec = [](const float* p, size_t n) { return std::vector<float>(p, p + n); };
    return {
        {"token_embd.weight", w.token_embedding.Dequantized()},
        {"blk.0.attn_q.weight", w.layers[0].wq.Dequantized()},
        {"blk.0.attn_k.weight", w.layers[0].wk.Dequantized()},
        {"blk.13.ffn_gate.weight", w.layers[13].w_gate.Dequantized()},
        {"blk.29.ffn_down.weight", w.layers[29].w_down.Dequantized()},
        {"blk.29.attn_output.weight", w.layers[29].wo.Dequantized()},
        {"blk.0.attn_norm.weight", vec(w.layers[0].attn_norm, h)},
        {"blk.17.ffn_norm.weight", vec(w.layers[17].ffn_norm, h)},
        {"output_norm.weight", vec(w.output_norm, h)},
    };
  }

  static std::string* model_path_;
  static LoadedModel* model_;
  static ReferenceRun* reference_;
  static std::string setup_error_;
  static double load_seconds_;
};

std::string* GgufReferenceTest::model_path_ = nullptr;
LoadedModel* GgufReferenceTest::model_ = nullptr;
ReferenceRun* GgufReferenceTest::reference_ = nullptr;
std::string GgufReferenceTest::setup_error_;
double GgufReferenceTest::load_seconds_ = 0.0;

TEST_F(GgufReferenceTest, ConfigAndTokenizerAreSmolLm2) {
  std::cout << "LoadGgufModel took " << load_seconds_ << " s\n";
  const ModelConfig& c = model_->config;
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_context, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_layout, RopeLayout::kInterleaved);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(model_->weights.lm_head.data, model_->weights.token_embedding.data);
  EXPECT_EQ(model_->weights.token_embedding.type, GgmlType::kQ8_0);  // kept as the file has it
  EXPECT_EQ(model_->weights.layers[0].wq.type, GgmlType::kQ4_1);
  EXPECT_EQ(model_->weights.layers.size(), 30u);

  const tokenizer::TokenizerSpec& t = model_->tokenizer;
  EXPECT_EQ(t.model, "gpt2");
  EXPECT_EQ(t.pre, "smollm");
  ASSERT_EQ(t.tokens.size(), 49152u);
  EXPECT_EQ(t.token_types.size(), 49152u);
  EXPECT_EQ(t.merges.size(), 48900u);
  EXPECT_EQ(t.tokens[1], "<|im_start|>");
  EXPECT_EQ(t.tokens[2], "<|im_end|>");
  EXPECT_EQ(t.bos_id, 1);
  EXPECT_EQ(t.eos_id, 2);
  EXPECT_EQ(t.unknown_id, 0);
  EXPECT_EQ(t.padding_id, 2);
  EXPECT_FALSE(t.add_bos);
  ASSERT_FALSE(t.end_of_generation_ids.empty());
  EXPECT_EQ(t.end_of_generation_ids[0], 2);           // eos first
  EXPECT_THAT(t.end_of_generation_ids, Contains(0));  // <|endoftext|>, a control token
  EXPECT_NE(t.chat_template.find("<|im_start|>"), std::string::npos);
}

TEST_F(GgufReferenceTest, FingerprintIsHashlibSha256OfTheFile) {
  ASSERT_EQ(reference_->file_sha256.size(), 64u) << reference_->raw_output;
  EXPECT_EQ(model_->fingerprint, reference_->file_sha256);
  EXPECT_EQ(model_->source_path, *model_path_);
}

TEST_F(GgufReferenceTest, TensorsMatchTheGgufPythonPackageBitForBit) {
  std::map<std::string, int> types_seen;
  for (const auto& [name, where] : Checked()) {
    SCOPED_TRACE(name);
    const auto it = reference_->tensors.find(name);
    ASSERT_NE(it, reference_->tensors.end()) << reference_->raw_output;
    const Reference& ref = it->second;
    ++types_seen[ref.type];
    const float* data = where.data();
    const size_t count = where.size();
    ASSERT_NE(data, nullptr);
    ASSERT_EQ(ref.count, count);
    ASSERT_GE(ref.samples.size(), 20u);
    int mismatches = 0;
    for (const auto& [index, bits] : ref.samples) {
      uint32_t ours;
      std::memcpy(&ours, data + index, sizeof(ours));
      if (ours != bits && ++mismatches <= 5) {
        ADD_FAILURE() << name << "[" << index << "]: ours 0x" << std::hex << ours
                      << ", gguf package 0x" << bits << std::dec;
      }
    }
    EXPECT_EQ(HashFloats(data, count), ref.sha256)
        << name << " (" << ref.type << ", " << ref.shape << ") differs from the gguf package";
  }
  // The comparison covers every type the file uses.
  EXPECT_EQ(types_seen["Q8_0"], 1);
  EXPECT_EQ(types_seen["Q4_1"], 5);
  EXPECT_EQ(types_seen["F32"], 3);
}

}  // namespace
}  // namespace kvstrata::model

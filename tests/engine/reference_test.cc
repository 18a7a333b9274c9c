// The engine's forward pass on the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF),
// checked against an independent implementation: tests/engine/reference_forward.py, a numpy
// forward pass over the `gguf` package's own dequantisation, run with the interpreter in
// KVSTRATA_TEST_PYTHON on the same token ids. Both use BF16-KV semantics: keys (after RoPE)
// and values rounded to bfloat16, everything else float32.
//
// Why not "identical logits up to float noise": float32 noise alone (summation order, 1e-7)
// stays at ~3e-6 of the logit range through all 30 layers when K/V are kept in float32, but
// with BF16 K/V an occasional noise-sized difference flips a bfloat16 rounding, and the flips
// cascade: the reference run in float64 differs from itself in float32 by as much as the
// engine differs from either (measured on these prompts: max |Δlogit| / range 6.6e-3 vs 8.8e-3,
// mean KL 2.6e-5 vs 2.6e-5 nats, 1-3 top-1 flips, all at near-ties). So the tolerance is set
// at that noise floor, per prompt:
//   * mean over positions of KL(P_reference || P_engine) <= kMeanKl (4e-5 nats; measured
//     0.7e-5 .. 2.8e-5), the llama.cpp KL-divergence measure, which is the sharpest one here;
//   * max over positions of max_v |Δlogit_v| / (max_v r_v - min_v r_v) <= kMaxRelative (2e-2;
//     measured <= 8.8e-3);
//   * identical top-1 token at every position where the reference's top-2 margin exceeds
//     kTieMargin (2e-3) of the range; flips at closer ties are reported, not failed.
// It can fail: the same comparison against the reference with float32 K/V (--fp32-kv), a
// subtly different cache semantics, exceeds kMeanKl (measured 6.5e-5 .. 9.3e-5), and the
// ToleranceSeparatesBf16FromFp32Kv test checks that it does.
//
// The prompts are real text: a chat question (< 1 page), a chat message of > 64 tokens (two
// pages), and > 400 tokens of the GPL-3 licence text (8 pages), prefilled in chunks of 100
// tokens so chunk edges fall inside pages.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "gtest/gtest.h"

#ifndef KVSTRATA_SOURCE_DIR
#error "KVSTRATA_SOURCE_DIR must name the repository root"
#endif

namespace kvstrata::engine {
namespace {

constexpr double kMeanKl = 4e-5;       // nats, mean over the positions of a prompt
constexpr double kMaxRelative = 2e-2;  // of the logit range at each position
constexpr double kTieMargin = 2e-3;    // top-2 margin, of the range, below which top-1 may flip
constexpr int kChunk = 100;            // prefill chunk: not a divisor of the page size
constexpr char kLicence[] = "/usr/share/common-licenses/GPL-3";

struct Prompt {
  std::string name;
  std::vector<int32_t> ids;
};

struct Comparison {
  double mean_kl = 0.0;  // nats, KL(P_reference || P_engine) averaged over positions
  double max_kl = 0.0;
  double worst_relative = 0.0;  // max over positions of max|Δ| / range
  int worst_position = -1;
  int top1_mismatches = 0;  // where the reference's top-2 margin > kTieMargin
  int first_mismatch = -1;
  int near_tie_flips = 0;  // top-1 differs but the reference's margin <= kTieMargin
};

// engine, reference: [n][vocab] logits.
Comparison Compare(const float* engine, const float* reference, int n, int vocab) {
  Comparison c;
  for (int t = 0; t < n; ++t) {
    const float* e = engine + static_cast<int64_t>(t) * vocab;
    const float* r = reference + static_cast<int64_t>(t) * vocab;
    double lo = r[0], diff = 0.0;
    int arg_e = 0, arg_r = 0;
    for (int v = 0; v < vocab; ++v) {
      lo = std::min<double>(lo, r[v]);
      diff = std::max(diff, std::fabs(double{e[v]} - r[v]));
      if (e[v] > e[arg_e]) arg_e = v;
      if (r[v] > r[arg_r]) arg_r = v;
    }
    const double range = std::max(r[arg_r] - lo, 1e-30);
    double second = lo, z_e = 0.0, z_r = 0.0;
    for (int v = 0; v < vocab; ++v) {
      if (v != arg_r) second = std::max<double>(second, r[v]);
      z_e += std::exp(double{e[v]} - e[arg_e]);
      z_r += std::exp(double{r[v]} - r[arg_r]);
    }
    // KL(P_r || P_e) = sum_v p_r(v) (log p_r(v) - log p_e(v)), in float64.
    const double log_z_e = e[arg_e] + std::log(z_e), log_z_r = r[arg_r] + std::log(z_r);
    double kl = 0.0;
    for (int v = 0; v < vocab; ++v) {
      const double log_p_r = r[v] - log_z_r;
      kl += std::exp(log_p_r) * (log_p_r - (e[v] - log_z_e));
    }
    c.mean_kl += kl / n;
    c.max_kl = std::max(c.max_kl, kl);
    if (diff / range > c.worst_relative) c.worst_relative = diff / range, c.worst_position = t;
    if (arg_e != arg_r) {
      if ((r[arg_r] - second) / range > kTieMargin) {
        if (c.top1_mismatches++ == 0) c.first_mismatch = t;
      } else {
        ++c.near_tie_flips;
      }
    }
  }
  return c;
}

std::string ShellQuote(const std::string& s) {
  std::string quoted = "'";
  for (const char c : s) {
    if (c == '\'') {
      quoted.append("'\\''");
    } else {
      quoted.push_back(c);
    }
  }
  return quoted + "'";
}

// Runs reference_forward.py on every prompt; returns "" or why it failed.
std::string RunReference(const std::string& python, const std::string& model,
                         const std::vector<Prompt>& prompts, bool fp32_kv, int64_t floats,
                         std::vector<float>* logits) {
  const std::string out =
      absl::StrCat(::testing::TempDir(), "/reference_logits", fp32_kv ? "_fp32kv" : "", ".f32");
  std::string command = absl::StrCat(
      ShellQuote(python), " ", ShellQuote(KVSTRATA_SOURCE_DIR "/tests/engine/reference_forward.py"),
      fp32_kv ? " --fp32-kv " : " ", ShellQuote(model), " ", ShellQuote(out));
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i > 0) command += " --";
    for (int32_t id : prompts[i].ids) absl::StrAppend(&command, " ", id);
  }
  command += " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string output;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  if (const int rc = ::pclose(pipe); rc != 0) {
    return absl::StrCat("reference_forward.py failed (status ", rc, "):\n", output);
  }
  std::ifstream in(out, std::ios::binary);
  logits->assign(floats, 0.0f);
  in.read(reinterpret_cast<char*>(logits->data()), floats * static_cast<int64_t>(sizeof(float)));
  if (in.gcount() != floats * static_cast<int64_t>(sizeof(float)) || in.peek() != EOF) {
    return absl::StrCat("reference_forward.py wrote ", std::filesystem::file_size(out),
                        " bytes, expected ", floats * sizeof(float));
  }
  std::filesystem::remove(out);
  return "";
}

class ReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_error_ = new std::string();
    const char* model = std::getenv("KVSTRATA_MODEL");
    const char* python = std::getenv("KVSTRATA_TEST_PYTHON");
    if (model == nullptr || !std::filesystem::is_regular_file(model)) {
      *setup_error_ =
          absl::StrCat("the default model is missing (KVSTRATA_MODEL=", model ? model : "<unset>",
                       "); run scripts/fetch-model.sh");
      return;
    }
    if (python == nullptr || !std::filesystem::exists(python)) {
      *setup_error_ = absl::StrCat("the test Python is missing (KVSTRATA_TEST_PYTHON=",
                                   python ? python : "<unset>", "); run scripts/python-env.sh");
      return;
    }
    EngineOptions options;
    options.model_path = model;
    options.kv_cache.format = KvCacheFormat::kBf16;
    options.kv_cache.capacity_bytes = int64_t{64} << 20;  // 43 pages: 1 + 2 + 8 needed
    options.kv_cache.max_sequences = 1;
    options.scheduler.max_running = 1;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Load(options);
    if (!engine.ok()) {
      *setup_error_ = absl::StrCat("Engine::Load: ", engine.status().message());
      return;
    }
    Engine& e = **engine;

    std::ifstream licence_file(kLicence);
    const std::string licence((std::istreambuf_iterator<char>(licence_file)),
                              std::istreambuf_iterator<char>());
    if (licence.size() < 3000) {
      *setup_error_ = absl::StrCat(kLicence, " is missing (Debian's base-files ships it)");
      return;
    }
    prompts_ = new std::vector<Prompt>();
    const std::vector<tokenizer::ChatMessage> question = {
        {"user", "What is the capital of France?"}};
    const std::vector<tokenizer::ChatMessage> summary = {
        {"system", "You are a careful assistant who answers in one paragraph."},
        {"user", absl::StrCat("Summarise this in plain words:\n\n", licence.substr(0, 420))}};
    prompts_->push_back({"chat question", *e.EncodeChat(question)});
    prompts_->push_back({"chat summary", *e.EncodeChat(summary)});
    prompts_->push_back({"GPL-3 text", e.EncodeText(licence.substr(0, 2200))});

    // Engine logits, every position, prefilled in chunks through the CPU backend.
    vocab_ = e.config().vocab_size;
    engine_logits_ = new std::vector<float>();
    int64_t rows = 0;
    for (const Prompt& p : *prompts_) {
      SequenceKv seq;
      if (absl::Status s = e.cache().Reserve(seq, static_cast<int64_t>(p.ids.size())); !s.ok()) {
        *setup_error_ = absl::StrCat("Reserve: ", s.message());
        return;
      }
      seq.tokens = p.ids;
      for (size_t pos = 0; pos < p.ids.size(); pos += kChunk) {
        const int n = static_cast<int>(std::min<size_t>(kChunk, p.ids.size() - pos));
        std::vector<float> chunk;
        if (absl::Status s = e.backend().Forward(
                {{&seq, static_cast<int64_t>(pos), n, /*all_logits=*/true}}, &chunk);
            !s.ok()) {
          *setup_error_ = absl::StrCat("Forward: ", s.message());
          return;
        }
        engine_logits_->insert(engine_logits_->end(), chunk.begin(), chunk.end());
      }
      e.cache().Release(seq);
      rows += static_cast<int64_t>(p.ids.size());
    }
    if (static_cast<int64_t>(engine_logits_->size()) != rows * vocab_) {
      *setup_error_ = "the engine returned the wrong number of logits";
      return;
    }
    reference_ = new std::vector<float>();
    reference_fp32kv_ = new std::vector<float>();
    *setup_error_ =
        RunReference(python, model, *prompts_, /*fp32_kv=*/false, rows * vocab_, reference_);
    if (setup_error_->empty()) {
      *setup_error_ = RunReference(python, model, *prompts_, /*fp32_kv=*/true, rows * vocab_,
                                   reference_fp32kv_);
    }
  }

  static void TearDownTestSuite() {
    delete setup_error_;
    delete prompts_;
    delete engine_logits_;
    delete reference_;
    delete reference_fp32kv_;
  }

  void SetUp() override { ASSERT_TRUE(setup_error_->empty()) << *setup_error_; }

  static std::string* setup_error_;
  static std::vector<Prompt>* prompts_;
  static std::vector<float>* engine_logits_;
  static std::vector<float>* reference_;
  static std::vector<float>* reference_fp32kv_;
  static int vocab_;
};

std::string* ReferenceTest::setup_error_ = nullptr;
std::vector<Prompt>* ReferenceTest::prompts_ = nullptr;
std::vector<float>* ReferenceTest::engine_logits_ = nullptr;
std::vector<float>* ReferenceTest::reference_ = nullptr;
std::vector<float>* ReferenceTest::reference_fp32kv_ = nullptr;
int ReferenceTest::vocab_ = 0;

TEST_F(ReferenceTest, PromptsSpanOneToSeveralPages) {
  ASSERT_EQ(prompts_->size(), 3u);
  EXPECT_LT((*prompts_)[0].ids.size(), 64u);
  EXPECT_GT((*prompts_)[1].ids.size(), 64u);
  EXPECT_GT((*prompts_)[2].ids.size(), 400u);
}

TEST_F(ReferenceTest, LogitsMatchTheNumpyReference) {
  int64_t row = 0;
  for (const Prompt& p : *prompts_) {
    const int n = static_cast<int>(p.ids.size());
    const Comparison c = Compare(engine_logits_->data() + row * vocab_,
                                 reference_->data() + row * vocab_, n, vocab_);
    std::cout << absl::StrFormat(
        "%-13s %3d tokens: mean KL %.2e nats (max %.2e), max |Δlogit| / range %.2e "
        "(position %d), top-1 mismatches %d, flips at near-ties %d\n",
        p.name, n, c.mean_kl, c.max_kl, c.worst_relative, c.worst_position, c.top1_mismatches,
        c.near_tie_flips);
    EXPECT_LE(c.mean_kl, kMeanKl) << p.name;
    EXPECT_LE(c.worst_relative, kMaxRelative) << p.name << ", position " << c.worst_position;
    EXPECT_EQ(c.top1_mismatches, 0) << p.name << ", first at position " << c.first_mismatch;
    row += n;
  }
}

// The tolerance is tight enough to see a cache kept in float32 instead of BF16: compared with
// the --fp32-kv reference, the engine's mean KL over all prompts must exceed kMeanKl.
TEST_F(ReferenceTest, ToleranceSeparatesBf16FromFp32Kv) {
  int64_t row = 0;
  double kl_sum = 0.0;
  for (const Prompt& p : *prompts_) {
    const int n = static_cast<int>(p.ids.size());
    const Comparison c = Compare(engine_logits_->data() + row * vocab_,
                                 reference_fp32kv_->data() + row * vocab_, n, vocab_);
    std::cout << absl::StrFormat("%-13s vs the float32-KV reference: mean KL %.2e nats\n", p.name,
                                 c.mean_kl);
    kl_sum += c.mean_kl * n;
    row += n;
  }
  EXPECT_GT(kl_sum / static_cast<double>(row), kMeanKl);
}

}  // namespace
}  // namespace kvstrata::engine

// GPU test: the CUDA engine against the CPU engine on the real default model (KVSTRATA_MODEL),
// both KV formats: next-token distributions (mean KL over every position of prompts of 37, 500
// and 4,000+ tokens), greedy text on 20 chat prompts, batches decoded together, and pages moved
// between a CPU and a GPU engine. Prints the figures (docs/benchmarks/engine-gpu.md quotes them).
// Skips itself without a CUDA device.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/page_digest.h"
#include "engine/cuda/device_page_memory.h"
#include "engine/engine.h"
#include "engine/rotations.h"
#include "model/loader.h"

namespace kvstrata::engine {
namespace {

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string Licence(const char* name) {
  std::ifstream in(std::string("/usr/share/common-licenses/") + name);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class CudaEngineTest : public ::testing::TestWithParam<KvCacheFormat> {
 protected:
  static void SetUpTestSuite() {
    const char* path = std::getenv("KVSTRATA_MODEL");
    if (path == nullptr || !HaveGpu()) return;
    absl::StatusOr<model::LoadedModel> m = model::LoadGgufModel(path);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = new std::shared_ptr<const model::LoadedModel>(
        std::make_shared<const model::LoadedModel>(*std::move(m)));
    // The same weights with every attention norm scaled by 1 + N(0, 1e-6): what rounding one
    // part in a million differently does to each KV format on the CPU engine itself.
    absl::StatusOr<model::LoadedModel> p = model::LoadGgufModel(path);
    ASSERT_TRUE(p.ok()) << p.status();
    std::mt19937 gen(5);
    std::normal_distribution<float> noise(0.0f, 1e-6f);
    for (model::LayerWeights& w : p->weights.layers) {
      float* norm = const_cast<float*>(w.attn_norm);
      for (int i = 0; i < p->config.hidden_size; ++i) norm[i] *= 1.0f + noise(gen);
    }
    perturbed_ = new std::shared_ptr<const model::LoadedModel>(
        std::make_shared<const model::LoadedModel>(*std::move(p)));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete perturbed_;
    model_ = perturbed_ = nullptr;
  }
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_NE(model_, nullptr) << "KVSTRATA_MODEL must name the default model";
  }

  std::unique_ptr<Engine> Make(bool cuda, GpuWeights weights = GpuWeights::kAuto,
                               bool graphs = true, bool gpu_sampling = true,
                               bool perturbed = false,
                               std::optional<KvCacheFormat> format = std::nullopt,
                               bool fused_layer_ops = true,
                               const std::function<void(EngineOptions&)>& tweak = {}) {
    EngineOptions o;
    o.gpu_fused_layer_ops = fused_layer_ops;
    o.device.cuda = cuda;
    o.gpu_weights = weights;
    o.cuda_graphs = graphs;
    o.gpu_sampling = gpu_sampling;
    o.default_rotations_dir = "rotations";  // tests run in the source folder
    o.kv_cache.format = format.value_or(GetParam());
    o.kv_cache.capacity_bytes = int64_t{1} << 30;
    o.kv_cache.max_chunk_tokens = 512;
    o.scheduler.max_running = 8;
    o.scheduler.max_step_tokens = 512;
    o.scheduler.prefill_chunk = 256;
    if (tweak) tweak(o);
    absl::StatusOr<std::unique_ptr<Engine>> e =
        Engine::Create(perturbed ? *perturbed_ : *model_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? *std::move(e) : nullptr;
  }

  // Logits at every position of `ids`, prefilled in chunks of 256.
  static std::vector<float> AllLogits(Engine& e, const std::vector<int32_t>& ids) {
    SequenceKv seq;
    EXPECT_TRUE(e.cache().Reserve(seq, static_cast<int64_t>(ids.size())).ok());
    seq.tokens = ids;
    std::vector<float> all;
    for (size_t pos = 0; pos < ids.size(); pos += 256) {
      const int n = static_cast<int>(std::min<size_t>(256, ids.size() - pos));
      std::vector<float> chunk;
      const absl::Status s =
          e.backend().Forward({{&seq, static_cast<int64_t>(pos), n, /*all_logits=*/true}}, &chunk);
      EXPECT_TRUE(s.ok()) << s;
      all.insert(all.end(), chunk.begin(), chunk.end());
    }
    e.cache().Release(seq);
    return all;
  }

  GenerationRequest Greedy(Engine& e, std::vector<int32_t> prompt, int max_tokens) {
    GenerationRequest r;
    r.request_id = "cuda-test";
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0.0f;
    r.stop.max_tokens = max_tokens;
    r.namespace_key = *e.PageNamespace("");
    return r;
  }

  // What a batch of greedy requests generated, per request: (token, logprob) in order.
  using Generated = std::vector<std::vector<std::pair<int32_t, float>>>;

  // The texts' prompts decoded greedily as one batch by the scheduler, max_tokens each (EOS
  // ignored, so every request runs its length).
  Generated DecodeTogether(Engine& e, const std::vector<std::string>& texts, int max_tokens) {
    std::vector<uint64_t> ids;
    for (const std::string& text : texts) {
      GenerationRequest r = Greedy(e, e.EncodeText(text), max_tokens);
      r.stop.ignore_eos = true;
      ids.push_back(*e.Submit(r));
    }
    return StepUntilIdle(e, ids);
  }

  // The scheduler stepped until idle; what the requests `ids` (submitted) generated.
  static Generated StepUntilIdle(Engine& e, const std::vector<uint64_t>& ids) {
    Generated out(ids.size());
    std::vector<GenerationEvent> events;
    while (!e.scheduler().idle()) {
      events.clear();
      EXPECT_TRUE(e.scheduler().Step(&events).ok());
      for (const GenerationEvent& ev : events) {
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i] == ev.sequence_id && ev.token >= 0) out[i].push_back({ev.token, ev.logprob});
        }
      }
    }
    return out;
  }

  static std::vector<std::vector<int32_t>> TokensOf(const Generated& g) {
    std::vector<std::vector<int32_t>> tokens(g.size());
    for (size_t i = 0; i < g.size(); ++i) {
      for (const auto& [token, logprob] : g[i]) tokens[i].push_back(token);
    }
    return tokens;
  }

  static std::shared_ptr<const model::LoadedModel>* model_;
  static std::shared_ptr<const model::LoadedModel>* perturbed_;
};

std::shared_ptr<const model::LoadedModel>* CudaEngineTest::model_ = nullptr;
std::shared_ptr<const model::LoadedModel>* CudaEngineTest::perturbed_ = nullptr;

// Mean KL(P_cpu || P_gpu) per position, and how often the argmax agrees.
struct Divergence {
  double mean_kl = 0;
  double max_kl = 0;
  double top1_agreement = 0;
};

Divergence Compare(const std::vector<float>& cpu, const std::vector<float>& gpu, int vocab) {
  Divergence d;
  const size_t rows = cpu.size() / vocab;
  int agree = 0;
  for (size_t r = 0; r < rows; ++r) {
    const float* a = cpu.data() + r * vocab;
    const float* b = gpu.data() + r * vocab;
    const float ma = *std::max_element(a, a + vocab), mb = *std::max_element(b, b + vocab);
    double za = 0, zb = 0;
    for (int i = 0; i < vocab; ++i) {
      za += std::exp(double{a[i]} - ma);
      zb += std::exp(double{b[i]} - mb);
    }
    double kl = 0;
    for (int i = 0; i < vocab; ++i) {
      const double la = a[i] - ma - std::log(za), lb = b[i] - mb - std::log(zb);
      kl += std::exp(la) * (la - lb);
    }
    d.mean_kl += kl;
    d.max_kl = std::max(d.max_kl, kl);
    agree += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
  }
  d.mean_kl /= rows;
  d.top1_agreement = static_cast<double>(agree) / rows;
  return d;
}

// The default (auto: fp32 weights for this model) must match the CPU; bf16 and fp16 weights are
// measured beside it. INT2 amplifies any difference in the values it quantises (a value near a
// code boundary flips a whole level, and the flip moves the next layers' values), so over
// thousands of tokens two engines that round differently drift apart by about as much as the
// CPU engine drifts from itself when its weights move by one part in a million. There the GPU
// must stay within that drift and be as faithful to the BF16 cache as the CPU engine is.
TEST_P(CudaEngineTest, NextTokenDistributionsMatchTheCpuEngine) {
  const bool int2 = GetParam() != KvCacheFormat::kBf16;  // INT2 or the codec: quantised
  std::unique_ptr<Engine> cpu = Make(false);
  std::unique_ptr<Engine> drifted = Make(false, GpuWeights::kAuto, true, true, /*perturbed=*/true);
  std::unique_ptr<Engine> bf16 = Make(false, GpuWeights::kAuto, true, true, false,
                                      KvCacheFormat::kBf16);
  ASSERT_TRUE(cpu && drifted && bf16);
  const int vocab = cpu->config().vocab_size;
  const std::string text = Licence("GPL-3") + Licence("Apache-2.0");
  std::vector<int32_t> all = cpu->EncodeText(text);
  ASSERT_GT(all.size(), 4200u);
  const size_t lengths[] = {37, 500, 4100};
  std::vector<std::vector<float>> cpu_logits, bf16_logits;
  std::vector<Divergence> drift, cpu_vs_bf16;
  for (size_t n : lengths) {
    const std::vector<int32_t> ids(all.begin(), all.begin() + n);
    cpu_logits.push_back(AllLogits(*cpu, ids));
    bf16_logits.push_back(AllLogits(*bf16, ids));
    drift.push_back(Compare(cpu_logits.back(), AllLogits(*drifted, ids), vocab));
    cpu_vs_bf16.push_back(Compare(bf16_logits.back(), cpu_logits.back(), vocab));
    fprintf(stderr,
            "%s, cpu with weights moved by 1e-6, %zu tokens: mean KL %.2e, same top token "
            "%.2f%%; cpu against a bf16 cache: mean KL %.2e\n",
            KvCacheFormatName(GetParam()), n, drift.back().mean_kl,
            100 * drift.back().top1_agreement, cpu_vs_bf16.back().mean_kl);
  }
  for (GpuWeights w : {GpuWeights::kAuto, GpuWeights::kBf16, GpuWeights::kFp16}) {
    std::unique_ptr<Engine> gpu = Make(true, w);
    ASSERT_TRUE(gpu);
    for (size_t i = 0; i < 3; ++i) {
      const size_t n = lengths[i];
      const std::vector<int32_t> ids(all.begin(), all.begin() + n);
      const std::vector<float> gpu_logits = AllLogits(*gpu, ids);
      const Divergence d = Compare(cpu_logits[i], gpu_logits, vocab);
      const Divergence faithful = Compare(bf16_logits[i], gpu_logits, vocab);
      fprintf(stderr,
              "%s, %s (%s), %zu tokens: mean KL %.2e, max %.2e, same top token %.2f%%; "
              "against a bf16 cache: mean KL %.2e (cpu %.2e)\n",
              KvCacheFormatName(GetParam()), GpuWeightsName(w), gpu->backend().Describe().c_str(),
              n, d.mean_kl, d.max_kl, 100 * d.top1_agreement, faithful.mean_kl,
              cpu_vs_bf16[i].mean_kl);
      if (w != GpuWeights::kAuto) continue;
      if (!int2 || n <= 500) {
        EXPECT_LE(d.mean_kl, 1e-3) << n << " tokens";
        EXPECT_GE(d.top1_agreement, 0.97) << n << " tokens";
      } else {
        EXPECT_LE(d.mean_kl, 2 * drift[i].mean_kl + 1e-3) << n << " tokens";
        EXPECT_LE(faithful.mean_kl, 1.1 * cpu_vs_bf16[i].mean_kl) << n << " tokens";
      }
    }
  }
}

// A codec on uniform levels (u) is stored as codec fragment blocks: the GPU's demotion writes
// them, its prefill (chunk attention) and decode (split decode) read them, and the logits follow
// the CPU engine's on the same rotation file. Prefill in chunks of 256 up to 700 tokens, then
// one token per pass (decode steps, replayed as CUDA graphs) to 760, past the sink and window
// so that pages demote.
TEST_P(CudaEngineTest, CodecFragmentBlocksMatchTheCpuEngine) {
  if (GetParam() != KvCacheFormat::kCodec) GTEST_SKIP() << "a codec format test";
  const model::ModelConfig& c = (*model_)->config;
  RotationFileInfo info{.model_fingerprint = (*model_)->fingerprint};
  // Regions in whole steps of 16 channels; layer 1 with a recipe of its own.
  info.history_codec =
      "4x16+3x16+2x32:eig:s8:pr:u|2x32+1x32:eig:s8:pr:u;"
      "1=3x32+2x16+1x16:s8:pr:u|3x16+2x16+1x32:s8:pr:u";
  const std::string path = ::testing::TempDir() + "/kvstrata-codec-fragment.safetensors";
  ASSERT_TRUE(WriteRotationFile(path, IdentityRotations(c.num_layers, c.num_kv_heads, c.head_dim),
                                info)
                  .ok());
  const auto rotations = [&](EngineOptions& o) { o.rotations_path = path; };
  std::unique_ptr<Engine> cpu = Make(false, GpuWeights::kAuto, true, true, false, std::nullopt,
                                     true, rotations);
  std::unique_ptr<Engine> drifted = Make(false, GpuWeights::kAuto, true, true,
                                         /*perturbed=*/true, std::nullopt, true, rotations);
  std::unique_ptr<Engine> gpu = Make(true, GpuWeights::kAuto, true, true, false, std::nullopt,
                                     true, rotations);
  ASSERT_TRUE(cpu && drifted && gpu);
  ASSERT_EQ(gpu->cache().int2_encoding(), kernels::PageEncoding::kCodecFragment);
  const int vocab = cpu->config().vocab_size;
  std::vector<int32_t> ids = cpu->EncodeText(Licence("GPL-3"));
  ASSERT_GT(ids.size(), 760u);
  ids.resize(760);
  const auto logits = [&](Engine& e) {
    SequenceKv seq;
    EXPECT_TRUE(e.cache().Reserve(seq, static_cast<int64_t>(ids.size())).ok());
    seq.tokens = ids;
    std::vector<float> prefill, decode;
    for (int64_t pos = 0; pos < static_cast<int64_t>(ids.size());) {
      const int n = pos < 700 ? static_cast<int>(std::min<int64_t>(256, 700 - pos)) : 1;
      std::vector<float> out;
      // A one-token pass returns its one row either way; without all_logits it is a graph.
      const absl::Status s = e.backend().Forward({{&seq, pos, n, /*all_logits=*/n > 1}}, &out);
      EXPECT_TRUE(s.ok()) << s;
      (pos < 700 ? prefill : decode).insert((pos < 700 ? prefill : decode).end(), out.begin(),
                                             out.end());
      pos += n;
    }
    e.cache().Release(seq);
    return std::make_pair(prefill, decode);
  };
  const auto want = logits(*cpu);
  const auto drift = logits(*drifted);
  const auto got = logits(*gpu);
  const char* part[2] = {"prefill (0-700)", "decode (700-760)"};
  for (int i = 0; i < 2; ++i) {
    const std::vector<float>& w = i == 0 ? want.first : want.second;
    const Divergence d = Compare(w, i == 0 ? got.first : got.second, vocab);
    const Divergence moved = Compare(w, i == 0 ? drift.first : drift.second, vocab);
    fprintf(stderr,
            "codec fragment blocks, %s: mean KL %.2e, max %.2e, same top token %.2f%%; cpu with "
            "weights moved by 1e-6: mean KL %.2e\n",
            part[i], d.mean_kl, d.max_kl, 100 * d.top1_agreement, moved.mean_kl);
    EXPECT_LE(d.mean_kl, 2 * moved.mean_kl + 1e-3) << part[i];
    EXPECT_GE(d.top1_agreement, 0.9) << part[i];
  }
}

// Decode steps replayed as CUDA graphs compute what the same steps launched kernel by kernel
// do: several sequences of different lengths, long enough to demote pages on the way.
TEST_P(CudaEngineTest, GraphReplayedDecodeStepsMatchLaunchedOnes) {
  std::unique_ptr<Engine> graphs = Make(true, GpuWeights::kAuto, true);
  std::unique_ptr<Engine> eager = Make(true, GpuWeights::kAuto, false);
  ASSERT_TRUE(graphs && eager);
  const std::string text = Licence("GPL-2");
  std::vector<std::string> texts;
  for (int i = 0; i < 5; ++i) texts.push_back(text.substr(i * 500, 150 + i * 300));
  auto run = [&](Engine& e) { return TokensOf(DecodeTogether(e, texts, 150)); };
  EXPECT_EQ(run(*graphs), run(*eager));
}

// Decode steps of 1-2 sequences with the launches that overlap the kernel before them (the RMS
// norms inside the GEMVs after them, attention launched while its query gather runs) give the
// tokens plain launches give, bit for bit, with bf16 weights (what the fused norm needs) and
// sequences long enough to demote pages on the way.
TEST_P(CudaEngineTest, OverlappedLaunchesDecodeAsPlainOnes) {
  std::unique_ptr<Engine> overlapped = Make(true, GpuWeights::kBf16);
  std::unique_ptr<Engine> plain =
      Make(true, GpuWeights::kBf16, true, true, false, std::nullopt, true, [](EngineOptions& o) {
        o.gpu_gemv_fused_norm = false;
        o.gpu_early_launches = false;
      });
  ASSERT_TRUE(overlapped && plain);
  const std::string text = Licence("GPL-2");
  const std::vector<std::string> texts = {text.substr(0, 300), text.substr(700, 700)};
  auto run = [&](Engine& e) { return TokensOf(DecodeTogether(e, texts, 200)); };
  const std::vector<std::vector<int32_t>> a = run(*overlapped), b = run(*plain);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].size(), 200u);
  EXPECT_EQ(a, b);
}

// Decode steps that write the cache with fewer launches (the per-head launch writing K/V into
// the pages and attention's queries; every layer's INT2 demotion in one launch at the step's
// start) give the tokens and logprobs the separate launches give, bit for bit, through
// demotions: with identity rotations (both folds) and, for INT2, the fitted rotation file (the
// demotion's only: the append then rotates).
TEST_P(CudaEngineTest, FusedKvWritesDecodeAsSeparateLaunches) {
  if (GetParam() == KvCacheFormat::kCodec) GTEST_SKIP() << "codec keeps a launch for each";
  const std::string text = Licence("LGPL-2.1");
  const std::vector<std::string> texts = {text.substr(0, 1200), text.substr(1500, 2000)};
  for (const bool identity : {true, false}) {
    if (!identity && GetParam() == KvCacheFormat::kBf16) continue;  // no rotation file for BF16
    auto tweak = [&](bool fused) {
      return [identity, fused](EngineOptions& o) {
        if (identity) o.default_rotations_dir = "";
        o.gpu_fused_kv_writes = fused;
      };
    };
    std::unique_ptr<Engine> fused =
        Make(true, GpuWeights::kAuto, true, true, false, std::nullopt, true, tweak(true));
    std::unique_ptr<Engine> apart =
        Make(true, GpuWeights::kAuto, true, true, false, std::nullopt, true, tweak(false));
    ASSERT_TRUE(fused && apart);
    const Generated a = DecodeTogether(*fused, texts, 160), b = DecodeTogether(*apart, texts, 160);
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(a[1].size(), 160u);
    EXPECT_EQ(a, b) << (identity ? "identity rotations" : "the fitted rotations");
  }
}

// In a pass of one sequence, the per-head launch, attention's history and its merge letting the
// launch after them begin at their start (EngineOptions::gpu_launch_ahead_at_batch_1) change
// only when work starts, never what it reads: the same tokens and logprobs, bit for bit, through
// demotions and graph replays.
TEST_P(CudaEngineTest, LaunchingAheadDecodesAsBefore) {
  const std::string text = Licence("LGPL-2.1").substr(0, 1500);
  auto tweak = [](bool ahead) {
    return [ahead](EngineOptions& o) { o.gpu_launch_ahead_at_batch_1 = ahead; };
  };
  std::unique_ptr<Engine> ahead =
      Make(true, GpuWeights::kAuto, true, true, false, std::nullopt, true, tweak(true));
  std::unique_ptr<Engine> before =
      Make(true, GpuWeights::kAuto, true, true, false, std::nullopt, true, tweak(false));
  ASSERT_TRUE(ahead && before);
  const Generated a = DecodeTogether(*ahead, {text}, 200), b = DecodeTogether(*before, {text}, 200);
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].size(), 200u);
  EXPECT_EQ(a, b);
}

// One GEMM for q/k/v and one for gate/up with the per-head steps in one launch compute what a
// launch per step does. With bf16 weights every product is the same (cuBLAS and the GEMV sum
// each output alike at any width): the same logits, bit for bit, and the same greedy tokens.
// With fp32 weights cuBLAS picks other kernels for the wider GEMMs, and the summation order
// moves the logits as far as weights moved by 1e-6 do (NextTokenDistributionsMatchTheCpuEngine):
// held to the GPU-vs-CPU bounds.
TEST_P(CudaEngineTest, FusedLayerOpsComputeWhatALaunchPerStepDoes) {
  const std::string text = Licence("LGPL-2.1") + Licence("GPL-2");
  for (GpuWeights w : {GpuWeights::kBf16, GpuWeights::kAuto}) {
    std::unique_ptr<Engine> fused = Make(true, w, true, true, false, std::nullopt, true);
    std::unique_ptr<Engine> apart = Make(true, w, true, true, false, std::nullopt, false);
    ASSERT_TRUE(fused && apart);
    std::vector<int32_t> ids = fused->EncodeText(text);
    ASSERT_GT(ids.size(), 600u);
    ids.resize(600);
    const int vocab = fused->config().vocab_size;
    const std::vector<float> a = AllLogits(*apart, ids), f = AllLogits(*fused, ids);
    const Divergence d = Compare(a, f, vocab);
    fprintf(stderr, "%s, %s weights: fused against a launch per step, mean KL %.2e, max %.2e, "
            "same top token %.2f%%\n", KvCacheFormatName(GetParam()), GpuWeightsName(w),
            d.mean_kl, d.max_kl, 100 * d.top1_agreement);
    if (w == GpuWeights::kAuto) {
      EXPECT_LE(d.mean_kl, 1e-3);
      EXPECT_GE(d.top1_agreement, 0.97);
      continue;
    }
    ASSERT_EQ(a.size(), f.size());
    size_t differing = 0;
    for (size_t i = 0; i < a.size(); ++i) differing += a[i] != f[i];
    EXPECT_EQ(differing, 0u) << "of " << a.size() << " logits";
    auto run = [&](Engine& e) {
      std::vector<std::vector<int32_t>> tokens;
      for (int i = 0; i < 3; ++i) {
        GenerationRequest r = Greedy(e, e.EncodeText(text.substr(i * 400, 200 + i * 200)), 120);
        r.stop.ignore_eos = true;
        const uint64_t id = *e.Submit(r);
        std::vector<int32_t> got;
        std::vector<GenerationEvent> events;
        while (!e.scheduler().idle()) {
          events.clear();
          EXPECT_TRUE(e.scheduler().Step(&events).ok());
          for (const GenerationEvent& ev : events) {
            if (ev.sequence_id == id && ev.token >= 0) got.push_back(ev.token);
          }
        }
        tokens.push_back(got);
      }
      return tokens;
    };
    EXPECT_EQ(run(*fused), run(*apart));
  }
}

// Tokens drawn on the GPU are the host sampler's: seeded tempered requests, greedy ones with
// penalties and a top-k one (sampled on the host, in the same batch) give the same tokens with
// GPU sampling on and off.
TEST_P(CudaEngineTest, GpuSamplingDrawsTheHostSamplersTokens) {
  std::unique_ptr<Engine> device = Make(true, GpuWeights::kAuto, true, true);
  std::unique_ptr<Engine> host = Make(true, GpuWeights::kAuto, true, false);
  ASSERT_TRUE(device && host);
  const std::string text = Licence("LGPL-2.1");
  auto run = [&](Engine& e) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < 6; ++i) {
      GenerationRequest r = Greedy(e, e.EncodeText(text.substr(i * 400, 120 + i * 200)), 64);
      r.stop.ignore_eos = true;
      r.sampling.seed = 77 + i;
      if (i < 3) r.sampling.temperature = 0.5f + 0.4f * i;
      if (i == 3) r.sampling.repetition_penalty = 1.3f;
      if (i == 4) {
        r.sampling.temperature = 0.9f;
        r.sampling.frequency_penalty = 0.5f;
        r.sampling.presence_penalty = 0.5f;
      }
      if (i == 5) {
        r.sampling.temperature = 1.0f;
        r.sampling.top_k = 20;
      }
      ids.push_back(*e.Submit(r));
    }
    return StepUntilIdle(e, ids);
  };
  const Generated on_device = run(*device), on_host = run(*host);
  ASSERT_EQ(on_device.size(), on_host.size());
  const auto device_tokens = TokensOf(on_device), host_tokens = TokensOf(on_host);
  for (size_t i = 0; i < on_device.size(); ++i) {
    EXPECT_EQ(device_tokens[i], host_tokens[i]) << "request " << i;
    ASSERT_EQ(on_device[i].size(), on_host[i].size());
    for (size_t t = 0; t < on_device[i].size(); ++t) {
      EXPECT_NEAR(on_device[i][t].second, on_host[i][t].second, 1e-4) << "request " << i;
    }
  }
}

TEST_P(CudaEngineTest, GreedyTextMatchesOnTwentyChatPrompts) {
  std::unique_ptr<Engine> cpu = Make(false), gpu = Make(true);
  ASSERT_TRUE(cpu && gpu);
  const char* questions[] = {
      "What is the capital of France?", "Name three primary colours.",
      "What is 12 times 12?", "Who wrote Hamlet?", "What is the boiling point of water?",
      "Give me a synonym for happy.", "What is the largest planet?",
      "Translate 'thank you' into Spanish.", "What do bees make?", "How many legs has a spider?",
      "What is photosynthesis?", "Name a famous painter.", "What is the speed of light?",
      "Why is the sky blue?", "What is a prime number?", "Name the longest river.",
      "What language is spoken in Brazil?", "What is the freezing point of water?",
      "Who painted the Mona Lisa?", "What is the chemical symbol for gold?"};
  int same = 0;
  for (const char* q : questions) {
    const std::vector<tokenizer::ChatMessage> chat = {{"user", q}};
    absl::StatusOr<GenerationStats> a = cpu->Generate(Greedy(*cpu, *cpu->EncodeChat(chat), 24));
    absl::StatusOr<GenerationStats> b = gpu->Generate(Greedy(*gpu, *gpu->EncodeChat(chat), 24));
    ASSERT_TRUE(a.ok() && b.ok());
    if (a->text == b->text) {
      ++same;
    } else {
      fprintf(stderr, "%s: differs\n  cpu: %s\n  gpu: %s\n", q, a->text.c_str(), b->text.c_str());
    }
  }
  fprintf(stderr, "%s: %d of 20 greedy answers identical (%s)\n", KvCacheFormatName(GetParam()),
          same, gpu->backend().Describe().c_str());
  EXPECT_GE(same, 19);
}

// Several requests decoded together on the GPU (split decode with a batch, prefill chunks beside
// decode tokens) give each request the text it gets alone.
TEST_P(CudaEngineTest, ABatchDecodesAsEachRequestAlone) {
  std::unique_ptr<Engine> gpu = Make(true);
  ASSERT_TRUE(gpu);
  const std::string text = Licence("MPL-2.0");
  std::vector<GenerationRequest> requests;
  std::vector<std::string> alone;
  for (int i = 0; i < 6; ++i) {
    const std::vector<int32_t> prompt =
        gpu->EncodeText(text.substr(i * 700, 200 + i * 250));  // 40 .. 400 tokens
    GenerationRequest r = Greedy(*gpu, prompt, 20 + i);
    absl::StatusOr<GenerationStats> s = gpu->Generate(r);
    ASSERT_TRUE(s.ok()) << s.status();
    alone.push_back(s->text);
    requests.push_back(r);
  }
  Scheduler& sched = gpu->scheduler();
  std::vector<uint64_t> ids;
  for (GenerationRequest& r : requests) ids.push_back(*gpu->Submit(r));
  std::vector<std::string> together(ids.size());
  std::vector<GenerationEvent> events;
  while (!sched.idle()) {
    events.clear();
    ASSERT_TRUE(sched.Step(&events).ok());
    for (const GenerationEvent& e : events) {
      for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == e.sequence_id) together[i] += e.text;
      }
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(together[i], alone[i]) << "request " << i;
}

// Next-token logits at positions [from, ids.size()) of `ids`, the K/V of the first pages imported
// from `pages` (none: computed here too), the rest computed in chunks of 256.
std::vector<float> LogitsFrom(Engine& e, const std::vector<int32_t>& ids,
                              const std::vector<std::string>& pages, int64_t from) {
  const int vocab = e.config().vocab_size;
  SequenceKv seq;
  seq.namespace_key = *e.PageNamespace("");
  EXPECT_TRUE(e.cache().Reserve(seq, static_cast<int64_t>(ids.size())).ok());
  seq.tokens = ids;
  if (!pages.empty()) {
    absl::StatusOr<int64_t> imported = e.cache().ImportPrefix(seq, pages);
    EXPECT_TRUE(imported.ok()) << imported.status();
  }
  EXPECT_LE(seq.num_tokens, from);
  std::vector<float> out;
  for (int64_t pos = seq.num_tokens; pos < static_cast<int64_t>(ids.size());) {
    const int n = static_cast<int>(std::min<int64_t>(256, static_cast<int64_t>(ids.size()) - pos));
    std::vector<float> chunk;
    const absl::Status s = e.backend().Forward({{&seq, pos, n, /*all_logits=*/true}}, &chunk);
    EXPECT_TRUE(s.ok()) << s;
    for (int t = 0; t < n; ++t) {
      if (pos + t < from) continue;
      out.insert(out.end(), chunk.begin() + static_cast<int64_t>(t) * vocab,
                 chunk.begin() + static_cast<int64_t>(t + 1) * vocab);
    }
    pos += n;
  }
  e.cache().Release(seq);
  return out;
}

// Pages the GPU engine exports, imported by the CPU engine, mean to it what they mean to the GPU
// engine; and the other way round. Teacher-forced over the prompt's uncached tail and the
// exporter's 16 greedy tokens: the importer's next-token distributions match the exporter's
// (mean KL <= 1e-3) and pick the exporter's greedy token wherever the exporter's top two are
// more than 0.1 nats apart. (Free-running greedy text is not compared: this prompt reaches a
// four-way near tie, 0.03 nats wide, where any rounding picks a different word.)
TEST_P(CudaEngineTest, PagesMoveBetweenCpuAndGpuEngines) {
  std::unique_ptr<Engine> cpu = Make(false), gpu = Make(true);
  ASSERT_TRUE(cpu && gpu);
  ASSERT_EQ(*cpu->PageNamespace(""), *gpu->PageNamespace(""));
  const int vocab = cpu->config().vocab_size;
  const std::vector<int32_t> prompt = cpu->EncodeText(Licence("GPL-3").substr(0, 3600));
  ASSERT_GT(prompt.size(), 600u);
  for (bool from_gpu : {true, false}) {
    Engine& exporter = from_gpu ? *gpu : *cpu;
    Engine& importer = from_gpu ? *cpu : *gpu;
    const char* direction = from_gpu ? "gpu -> cpu" : "cpu -> gpu";
    GenerationRequest publish = Greedy(exporter, prompt, 1);
    publish.publish_pages = true;
    absl::StatusOr<GenerationStats> exported = exporter.Generate(publish);
    ASSERT_TRUE(exported.ok()) << exported.status();
    const int64_t cacheable = (static_cast<int64_t>(prompt.size()) - 1) / 64;
    std::vector<std::string> pages;
    for (const ExportedPage& p : exported->published_pages) {
      if (p.page_index < cacheable) pages.push_back(p.bytes);
    }
    ASSERT_EQ(static_cast<int64_t>(pages.size()), cacheable);
    // The exporter's greedy continuation, through its scheduler.
    std::vector<int32_t> ids = prompt;
    {
      GenerationRequest r = Greedy(exporter, prompt, 16);
      r.stop.ignore_eos = true;
      const uint64_t id = *exporter.Submit(r);
      std::vector<GenerationEvent> events;
      while (!exporter.scheduler().idle()) {
        events.clear();
        ASSERT_TRUE(exporter.scheduler().Step(&events).ok());
        for (const GenerationEvent& e : events) {
          if (e.sequence_id == id && e.token >= 0) ids.push_back(e.token);
        }
      }
    }
    ASSERT_EQ(ids.size(), prompt.size() + 16);
    const int64_t from = cacheable * 64;
    const std::vector<float> want = LogitsFrom(exporter, ids, {}, from);
    const std::vector<float> got = LogitsFrom(importer, ids, pages, from);
    ASSERT_EQ(want.size(), got.size());
    const Divergence d = Compare(want, got, vocab);
    int compared = 0, ties = 0, differ = 0;
    for (size_t r = 0; r + 1 < want.size() / vocab; ++r) {
      const float* w = want.data() + r * vocab;
      const float* g = got.data() + r * vocab;
      std::vector<float> sorted(w, w + vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] < 0.1f) {
        ++ties;
        continue;
      }
      ++compared;
      differ += std::max_element(w, w + vocab) - w != std::max_element(g, g + vocab) - g;
    }
    fprintf(stderr,
            "%s, %s: %zu pages imported; over %zu positions mean KL %.2e, max %.2e; greedy "
            "token differs at %d of %d positions (%d near ties left out)\n",
            KvCacheFormatName(GetParam()), direction, pages.size(), want.size() / vocab,
            d.mean_kl, d.max_kl, differ, compared, ties);
    EXPECT_LE(d.mean_kl, 1e-3) << direction;
    EXPECT_EQ(differ, 0) << direction;
  }
}

// A GPU kvstore's pool stands here as a second allocation, exported and mapped back through the
// engine's device page access as a worker maps the store's (MapShared: in the address room of
// the cache's page memory, within its page tables' reach). A prefix in it, imported once by
// copying and once read in place, gives bit for bit the same greedy tokens: the kernels read
// the same bytes either way. A page changed in the pool is a miss (its digest), never used.
TEST_P(CudaEngineTest, PagesReadInPlaceFromAnotherPoolDecodeAsTheirCopies) {
  std::unique_ptr<Engine> gpu = Make(true);
  ASSERT_TRUE(gpu);
  const std::vector<int32_t> prompt = gpu->EncodeText(Licence("GPL-3").substr(0, 5000));
  GenerationRequest publish = Greedy(*gpu, prompt, 1);
  publish.publish_pages = true;
  absl::StatusOr<GenerationStats> exported = gpu->Generate(publish);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const int64_t cacheable = (static_cast<int64_t>(prompt.size()) - 1) / 64;
  // The pool: pages at 256-byte aligned offsets, as the store's range allocator places them.
  std::vector<const ExportedPage*> pages;
  std::vector<int64_t> offsets;
  int64_t bytes = 4096;
  for (const ExportedPage& p : exported->published_pages) {
    if (p.page_index >= cacheable) continue;
    pages.push_back(&p);
    offsets.push_back(bytes);
    bytes += (static_cast<int64_t>(p.bytes.size()) + 255) / 256 * 256;
  }
  ASSERT_EQ(static_cast<int64_t>(pages.size()), cacheable);
  absl::StatusOr<std::unique_ptr<DevicePageMemory>> store = DevicePageMemory::Allocate(0, bytes);
  ASSERT_TRUE(store.ok()) << store.status();
  for (size_t i = 0; i < pages.size(); ++i) {
    ASSERT_TRUE((*store)
                    ->Write(offsets[i], pages[i]->bytes.data(),
                            static_cast<int64_t>(pages[i]->bytes.size()))
                    .ok());
  }
  absl::StatusOr<int> fd = (*store)->ExportHandle();
  ASSERT_TRUE(fd.ok()) << fd.status();
  DevicePageAccess* access = gpu->backend().device_page_access();
  ASSERT_NE(access, nullptr);
  absl::StatusOr<std::unique_ptr<SharedPageMemory>> mapped = access->MapShared(*fd, bytes);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  std::shared_ptr<SharedPageMemory> pool = *std::move(mapped);
  const PageKey ns = *gpu->PageNamespace("");
  std::vector<DevicePage> device;
  int reachable = 0;
  for (size_t i = 0; i < pages.size(); ++i) {
    const ExportedPage& p = *pages[i];
    device.push_back({.key = p.key,
                      .parent_key = i == 0 ? ns : pages[i - 1]->key,
                      .page_index = p.page_index,
                      .encoding = p.encoding,
                      .bytes = pool->data() + offsets[i],
                      .byte_length = static_cast<int64_t>(p.bytes.size()),
                      .digest64 = PageDigest64(p.bytes.data(), p.bytes.size())});
    reachable += access->CanReadInPlace(device.back());
  }
  const int history = GetParam() == KvCacheFormat::kBf16
                          ? 0
                          : static_cast<int>(gpu->cache().DemotedPagesEnd(cacheable * 64)) - 1;
  EXPECT_EQ(reachable, history) << "every history page of the mapped pool is in reach";
  // Greedy continuations: copied, then read in place (and a batch of both at once).
  std::vector<int> cached;
  auto run = [&](std::vector<GenerationRequest> requests, std::vector<int>* in_place) {
    std::vector<uint64_t> ids;
    for (GenerationRequest& r : requests) ids.push_back(*gpu->Submit(std::move(r)));
    std::vector<std::vector<int32_t>> tokens(ids.size());
    in_place->assign(ids.size(), -1);
    cached.assign(ids.size(), -1);
    std::vector<GenerationEvent> events;
    while (!gpu->scheduler().idle()) {
      events.clear();
      EXPECT_TRUE(gpu->scheduler().Step(&events).ok());
      for (const GenerationEvent& e : events) {
        for (size_t i = 0; i < ids.size(); ++i) {
          if (e.sequence_id != ids[i]) continue;
          if (e.token >= 0) tokens[i].push_back(e.token);
          (*in_place)[i] = e.in_place_pages;
          cached[i] = e.cached_tokens;
        }
      }
    }
    return tokens;
  };
  auto request = [&](bool in_place) {
    GenerationRequest r = Greedy(*gpu, prompt, 32);
    r.stop.ignore_eos = true;
    r.device_cached_pages = device;
    if (in_place) r.in_place_hold = pool;
    return r;
  };
  std::vector<int> in_place;
  const auto copied = run({request(false)}, &in_place);
  EXPECT_EQ(in_place[0], 0);
  EXPECT_EQ(cached[0], cacheable * 64);
  const auto read = run({request(true)}, &in_place);
  EXPECT_EQ(in_place[0], history);
  EXPECT_EQ(cached[0], cacheable * 64);
  ASSERT_EQ(read[0].size(), 32u);
  EXPECT_EQ(read[0], copied[0]) << "in place and copied pages decode the same tokens";
  const auto both = run({request(true), request(false)}, &in_place);
  EXPECT_EQ(in_place, (std::vector<int>{history, 0}));
  EXPECT_EQ(both[0], copied[0]);
  EXPECT_EQ(both[1], copied[0]);
  fprintf(stderr, "%s: %lld cached pages, %d read in place; greedy tokens equal to the copy's\n",
          KvCacheFormatName(GetParam()), static_cast<long long>(cacheable), history);
  if (history == 0) return;
  // A history page changed in the pool after the store checked it: a miss.
  const int64_t corrupt_at = offsets[2] + 4096;
  const uint8_t flip = 0x5a;
  uint8_t byte = 0;
  ASSERT_TRUE((*store)->Read(corrupt_at, &byte, 1).ok());
  byte ^= flip;
  ASSERT_TRUE((*store)->Write(corrupt_at, &byte, 1).ok());
  const auto missed = run({request(true)}, &in_place);
  EXPECT_EQ(in_place[0], 0);
  EXPECT_EQ(cached[0], 0) << "a page that fails its digest is a miss";
  EXPECT_EQ(missed[0].size(), 32u);
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaEngineTest,
                         ::testing::Values(KvCacheFormat::kInt2, KvCacheFormat::kBf16,
                                           KvCacheFormat::kCodec),
                         [](const ::testing::TestParamInfo<KvCacheFormat>& info) {
                           return std::string(info.param == KvCacheFormat::kInt2   ? "Int2"
                                              : info.param == KvCacheFormat::kBf16 ? "Bf16"
                                                                                   : "Codec");
                         });

}  // namespace
}  // namespace kvstrata::engine

// GPU test: the CUDA engine against the CPU engine on the real default model (KVSTRATA_MODEL),
// both KV formats: next-token distributions (mean KL over every position of prompts of 37, 500
// and 4,000+ tokens), greedy text on 20 chat prompts, batches decoded together, and pages moved
// between a CPU and a GPU engine. Prints the figures (docs/benchmarks.md quotes them). Skips
// itself without a CUDA device.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
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
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    ASSERT_NE(model_, nullptr) << "KVSTRATA_MODEL must name the default model";
  }

  std::unique_ptr<Engine> Make(bool cuda, GpuWeights weights = GpuWeights::kAuto,
                               bool graphs = true) {
    EngineOptions o;
    o.device.cuda = cuda;
    o.gpu_weights = weights;
    o.cuda_graphs = graphs;
    o.default_rotations_dir = "rotations";  // tests run in the source folder
    o.kv_cache.format = GetParam();
    o.kv_cache.capacity_bytes = int64_t{1} << 30;
    o.kv_cache.max_chunk_tokens = 512;
    o.scheduler.max_running = 8;
    o.scheduler.max_step_tokens = 512;
    o.scheduler.prefill_chunk = 256;
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(*model_, o);
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

  static std::shared_ptr<const model::LoadedModel>* model_;
};

std::shared_ptr<const model::LoadedModel>* CudaEngineTest::model_ = nullptr;

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
// code boundary flips a whole level), so at long contexts only fp32 arithmetic stays close.
TEST_P(CudaEngineTest, NextTokenDistributionsMatchTheCpuEngine) {
  std::unique_ptr<Engine> cpu = Make(false);
  ASSERT_TRUE(cpu);
  const std::string text = Licence("GPL-3") + Licence("Apache-2.0");
  std::vector<int32_t> all = cpu->EncodeText(text);
  ASSERT_GT(all.size(), 4200u);
  std::vector<std::vector<float>> cpu_logits;
  const size_t lengths[] = {37, 500, 4100};
  for (size_t n : lengths) {
    cpu_logits.push_back(AllLogits(*cpu, std::vector<int32_t>(all.begin(), all.begin() + n)));
  }
  for (GpuWeights w : {GpuWeights::kAuto, GpuWeights::kBf16, GpuWeights::kFp16}) {
    std::unique_ptr<Engine> gpu = Make(true, w);
    ASSERT_TRUE(gpu);
    for (size_t i = 0; i < 3; ++i) {
      const size_t n = lengths[i];
      const Divergence d =
          Compare(cpu_logits[i], AllLogits(*gpu, std::vector<int32_t>(all.begin(), all.begin() + n)),
                  gpu->config().vocab_size);
      fprintf(stderr, "%s, %s (%s), %zu tokens: mean KL %.2e, max %.2e, same top token %.2f%%\n",
              KvCacheFormatName(GetParam()), GpuWeightsName(w), gpu->backend().Describe().c_str(),
              n, d.mean_kl, d.max_kl, 100 * d.top1_agreement);
      if (w == GpuWeights::kAuto) {
        EXPECT_LE(d.mean_kl, 1e-3) << n << " tokens";
        EXPECT_GE(d.top1_agreement, 0.97) << n << " tokens";
      }
    }
  }
}

// Decode steps replayed as CUDA graphs compute what the same steps launched kernel by kernel
// do: several sequences of different lengths, long enough to demote pages on the way.
TEST_P(CudaEngineTest, GraphReplayedDecodeStepsMatchLaunchedOnes) {
  std::unique_ptr<Engine> graphs = Make(true, GpuWeights::kAuto, true);
  std::unique_ptr<Engine> eager = Make(true, GpuWeights::kAuto, false);
  ASSERT_TRUE(graphs && eager);
  const std::string text = Licence("GPL-2");
  auto run = [&](Engine& e) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < 5; ++i) {
      GenerationRequest r = Greedy(e, e.EncodeText(text.substr(i * 500, 150 + i * 300)), 150);
      r.stop.ignore_eos = true;
      ids.push_back(*e.Submit(r));
    }
    std::vector<std::vector<int32_t>> tokens(ids.size());
    std::vector<GenerationEvent> events;
    while (!e.scheduler().idle()) {
      events.clear();
      EXPECT_TRUE(e.scheduler().Step(&events).ok());
      for (const GenerationEvent& ev : events) {
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ids[i] == ev.sequence_id && ev.token >= 0) tokens[i].push_back(ev.token);
        }
      }
    }
    return tokens;
  };
  EXPECT_EQ(run(*graphs), run(*eager));
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

// Pages the GPU engine exports, imported by the CPU engine, continue with the CPU engine's own
// greedy tokens; and the other way round.
TEST_P(CudaEngineTest, PagesMoveBetweenCpuAndGpuEngines) {
  std::unique_ptr<Engine> cpu = Make(false), gpu = Make(true);
  ASSERT_TRUE(cpu && gpu);
  ASSERT_EQ(*cpu->PageNamespace(""), *gpu->PageNamespace(""));
  const std::vector<int32_t> prompt = cpu->EncodeText(Licence("GPL-3").substr(0, 3600));
  ASSERT_GT(prompt.size(), 600u);
  for (bool from_gpu : {true, false}) {
    Engine& exporter = from_gpu ? *gpu : *cpu;
    Engine& importer = from_gpu ? *cpu : *gpu;
    GenerationRequest publish = Greedy(exporter, prompt, 1);
    publish.publish_pages = true;
    absl::StatusOr<GenerationStats> exported = exporter.Generate(publish);
    ASSERT_TRUE(exported.ok()) << exported.status();
    const int64_t cacheable = (static_cast<int64_t>(prompt.size()) - 1) / 64;
    std::vector<std::string> pages;
    for (const ExportedPage& p : exported->published_pages) {
      if (p.page_index < cacheable) pages.push_back(p.bytes);
    }
    ASSERT_FALSE(pages.empty());
    GenerationRequest scratch = Greedy(importer, prompt, 16);
    absl::StatusOr<GenerationStats> own = importer.Generate(scratch);
    GenerationRequest cached = Greedy(importer, prompt, 16);
    cached.cached_pages = pages;
    absl::StatusOr<GenerationStats> reused = importer.Generate(cached);
    ASSERT_TRUE(own.ok() && reused.ok()) << reused.status();
    EXPECT_EQ(reused->cached_tokens, cacheable * 64) << (from_gpu ? "gpu -> cpu" : "cpu -> gpu");
    EXPECT_EQ(reused->text, own->text) << (from_gpu ? "gpu -> cpu" : "cpu -> gpu");
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaEngineTest,
                         ::testing::Values(KvCacheFormat::kInt2, KvCacheFormat::kBf16),
                         [](const ::testing::TestParamInfo<KvCacheFormat>& info) {
                           return std::string(info.param == KvCacheFormat::kInt2 ? "Int2" : "Bf16");
                         });

}  // namespace
}  // namespace kvstrata::engine

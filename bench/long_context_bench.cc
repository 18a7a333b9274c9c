// kvstrata_bench_long_context: whole decode steps of the CUDA engine at long contexts, INT2
// against BF16, beside the physical floor, on any model (the 8B study: bench/long_context.sh).
//
// A decode step here is exactly the engine's: CudaBackend::ForwardAndSample over every layer,
// replayed as the CUDA graph captured for the batch size, with greedy tokens drawn on the GPU.
// Only the contexts are synthetic: filling 32 sequences of 128K tokens by prefill would take
// hours, so each sequence gets its pages through the cache's own bookkeeping (the slots, page
// keys and headers a prefill would leave; KvCache::BeginAppend/EndAppend in prefill-sized
// chunks) with zeroed K/V data. The kernels read every byte of those pages whatever they hold,
// so the step time is that of a real context of that length.
//
// Per (format, context, batch): the step's wall time (median of --steps, after warm-up), its
// device time, and with --profile-steps a CUPTI breakdown of the kernels (GEMMs, attention,
// append and demotion, sampling, the rest) and the gaps between them (wall minus kernels). The
// physical floor is (matrix weight bytes + KV bytes of the batch) / the copy bandwidth measured in
// the same run (cudaMemcpy device to device, read + write). With --budget-context, the most
// sequences of that context whose pages fit in --kv-cache-gb are decoded together: the
// same-memory throughput. --prefill-contexts times one real prompt of each length through the
// scheduler (chunked prefill, TTFT).

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/copy_bandwidth.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "a Hugging Face model folder or a .gguf file (required)");
ABSL_FLAG(std::string, kv_formats, "int2,bf16", "KV formats to compare, the first is the base");
ABSL_FLAG(std::string, contexts, "8192,32768,65536,102400,131072",
          "context lengths of the decode steps, in tokens (empty: none)");
ABSL_FLAG(std::string, batch_sizes, "1,8,32", "decode batch sizes");
ABSL_FLAG(int, steps, 10, "timed decode steps per point (after 3 untimed)");
ABSL_FLAG(int, profile_steps, 3, "decode steps traced with CUPTI per point for the breakdown; 0 = none");
ABSL_FLAG(double, kv_cache_gb, 100.0, "KV page memory of each engine, GB (1e9 bytes)");
ABSL_FLAG(int, budget_context, 102400, "context of the same-memory throughput run; 0 = none");
ABSL_FLAG(std::string, prefill_contexts, "8192,32768", "prompt lengths timed by real prefill");
ABSL_FLAG(std::string, gpu_weights, "auto", "weights on the GPU: auto, bf16, fp16, fp32");
ABSL_FLAG(int, device, 0, "CUDA device");
ABSL_FLAG(int, graph_history_buckets, 16,
          "decode graphs per batch size (EngineOptions::cuda_graph_history_buckets; 1: one "
          "graph planned for the whole context)");
ABSL_FLAG(bool, gpu_gemv, true,
          "passes of 1..4 tokens multiply weights with kernels::Gemv (false: cuBLAS); "
          "EngineOptions::gpu_gemv");
ABSL_FLAG(bool, gpu_gemv_overlap, true,
          "the GEMV streams its first weights while the kernel before it finishes "
          "(programmatic dependent launch); EngineOptions::gpu_gemv_overlap");
ABSL_FLAG(bool, gpu_gemv_fused_norm, true,
          "at 1-2 rows, the layers' RMS norms inside the GEMVs after them and SwiGLU inside "
          "gate/up's (three launches fewer per layer); EngineOptions::gpu_gemv_fused_norm");
ABSL_FLAG(bool, gpu_gemv_normed_one_wave, true,
          "the GEMVs that normalise their input in one wave of CTAs, each warp taking several "
          "rows; EngineOptions::gpu_gemv_normed_one_wave");
ABSL_FLAG(bool, gpu_fused_kv_writes, true,
          "decode steps write the cache in fewer launches: K/V rows and attention's queries "
          "by the per-head launch, INT2 demotion of every layer in one launch at the step's "
          "start; EngineOptions::gpu_fused_kv_writes");
ABSL_FLAG(bool, gpu_gemv_normed_paired_rows, true,
          "at 2 tokens, the normed GEMVs' warps stream two rows at once (gate and up for SwiGLU); "
          "EngineOptions::gpu_gemv_normed_paired_rows");
ABSL_FLAG(bool, gpu_early_launches, true,
          "a layer's kernels between its GEMVs launched as programmatic dependents of the one "
          "before, attention asking for its pages while the query gather runs; "
          "EngineOptions::gpu_early_launches");
ABSL_FLAG(bool, gpu_int2_quick_start, true,
          "the INT2 history kernel's quick start (one page per warp before the queries, 16-byte "
          "query loads); EngineOptions::gpu_int2_quick_start");
ABSL_FLAG(bool, gpu_int2_slots_ahead, true,
          "each warp of the INT2 history kernel reads the slot of the page it asks for next "
          "as soon as it has asked for one; EngineOptions::gpu_int2_slots_ahead");
ABSL_FLAG(int, gpu_window_pages_per_cta, 0,
          "window pages per CTA of attention's launch (0: the plan chooses, 1: a CTA per "
          "page); EngineOptions::gpu_window_pages_per_cta");
ABSL_FLAG(bool, gpu_merge_early_loads, true,
          "attention's merge loads its partial outputs beside their weights' lse; "
          "EngineOptions::gpu_merge_early_loads");
ABSL_FLAG(bool, gpu_int2_int8_keys, true,
          "the INT2 history's keys multiplied on integer tensor cores in page ranges of 32 "
          "pages or more (Q as two 8-bit integers); false: fp16 pairs everywhere; "
          "EngineOptions::gpu_int2_int8_keys");
ABSL_FLAG(bool, gpu_launch_ahead_at_batch_1, true,
          "in decode passes of one sequence, the per-head launch, attention's INT2 history and "
          "its merge let the launch after them begin at their start; "
          "EngineOptions::gpu_launch_ahead_at_batch_1");
ABSL_FLAG(bool, gpu_fused_layer_ops, true,
          "one GEMM for q/k/v and one for gate/up per layer, the per-head steps in one launch "
          "(false: a launch per step); EngineOptions::gpu_fused_layer_ops");
ABSL_FLAG(std::string, json, "", "write the results as JSON to this file");

namespace kvstrata {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kvstrata_bench_long_context: %s\n", what.c_str());
  std::exit(1);
}

std::vector<int> Ints(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) Die(absl::StrCat("--", flag, ": bad value '", part, "'"));
    out.push_back(v);
  }
  return out;
}

// ---- CUPTI: kernel durations by category ----

const char* const kCategories[] = {"gemm", "attention", "append_demote", "sampling", "other"};
constexpr int kNumCategories = 5;

int Category(const char* name) {
  const std::string n = name ? name : "";
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  // kvstrata's own kernels first: their mangled names may mention GemmType.
  if (has("HistoryKernel") || has("HistoryMmaKernel") || has("PageKernel") ||
      has("WindowKernel") || has("MergeKernel") || has("MergeParallelKernel") ||
      has("ChunkAttention")) {
    return 1;
  }
  if (has("AppendKernel") || has("DemoteKernel")) return 2;
  if (has("SampleKernel")) return 3;
  if (has("GemvKernel") || has("GemvNormedKernel")) return 0;  // the latter with its RMS norm
  if (has("kvstrata")) return 4;
  if (has("gemm") || has("Gemm") || has("nvjet") || has("cutlass") || has("xmma") ||
      has("splitKreduce")) {
    return 0;  // cuBLAS
  }
  return 4;
}

// Kernel records CUPTI delivers; a point sums those inside its profiled steps' time window.
struct KernelRecord {
  int category;
  uint64_t start, end;
  std::string name;
  int grid = 0;  // CTAs
};
std::mutex g_records_mu;
std::vector<KernelRecord> g_records;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{16} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(g_records_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    g_records.push_back({Category(k->name), k->start, k->end, k->name ? k->name : "?",
                         static_cast<int>(k->gridX * k->gridY * k->gridZ)});
  }
  std::free(buffer);
}

void CheckCupti(CUptiResult r, const char* what) {
  if (r != CUPTI_SUCCESS) {
    const char* s = nullptr;
    cuptiGetResultString(r, &s);
    Die(absl::StrCat(what, ": ", s ? s : "CUPTI error"));
  }
}

// A kernel's name without its namespaces, template arguments and parameters (CUPTI gives the
// mangled name).
std::string ShortName(const std::string& mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  for (size_t at; (at = name.find("(anonymous namespace)::")) != std::string::npos;) {
    name.erase(at, 23);
  }
  std::string n = name.substr(0, name.find_first_of("<("));
  const size_t colon = n.rfind("::");
  if (colon != std::string::npos) n = n.substr(colon + 2);
  const size_t space = n.rfind(' ');
  return space == std::string::npos ? n : n.substr(space + 1);
}

// What each kernel adds to the step's time: the records in end order, each credited with the
// time from the previous end (or its own start, if later) to its own end; the time between a
// record's start and the previous end is a gap ("(gap) after" the kernel before it; the one
// after a step's last kernel is the host's time between steps). The shares and gaps sum to the
// span, so with launches that overlap the one before (programmatic dependent launch) a kernel is
// charged only for the time the step waited on it, not for the time it spent waiting itself.
// Keys: the short name, the grid, and the kernel before (which tells a layer's GEMVs of one
// shape apart).
std::map<std::string, double> CriticalPath(std::vector<KernelRecord> records, double* gaps_ns) {
  std::sort(records.begin(), records.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.end < b.end; });
  std::map<std::string, double> share;
  *gaps_ns = 0;
  uint64_t frontier = 0;
  std::string before = "start";
  for (const KernelRecord& r : records) {
    const std::string name = ShortName(r.name);
    if (frontier != 0 && r.start > frontier) {
      *gaps_ns += static_cast<double>(r.start - frontier);
      share["(gap) after " + before] += static_cast<double>(r.start - frontier);
    }
    const uint64_t from = frontier == 0 ? r.start : std::max(frontier, r.start);
    if (r.end > from) {
      share[absl::StrCat(name, " [", r.grid, " CTAs] after ", before)] +=
          static_cast<double>(r.end - from);
    }
    frontier = std::max(frontier, r.end);
    before = name;
  }
  return share;
}

// ---- the device ----

// Bytes of the matrices a decode step reads once (embedding rows are a gather, not counted).
double WeightBytes(const model::ModelConfig& c, int element_bytes) {
  const double H = c.hidden_size, q = 1.0 * c.num_heads * c.head_dim,
               kv = 1.0 * c.num_kv_heads * c.head_dim, inter = c.intermediate_size;
  const double per_layer = H * (q + 2 * kv) + q * H + 3 * H * inter;
  return element_bytes * (c.num_layers * per_layer + 1.0 * c.vocab_size * H);
}

// ---- one engine, one format ----

struct Point {
  int context = 0, batch = 0;
  std::string skipped;  // why, when it did not run
  double step_ms = 0, device_ms = 0, kv_gb = 0, floor_ms = 0;
  double category_ms[kNumCategories] = {}, kernels_ms = 0, profiled_wall_ms = 0;
  std::map<std::string, double> critical_ms;  // CriticalPath, ms per step
  double critical_gaps_ms = 0;
  double tokens_per_s() const { return step_ms > 0 ? 1e3 * batch / step_ms : 0; }
};

class Runner {
 public:
  Runner(engine::Engine* e, double copy_bw, double weight_bytes, uint64_t seed)
      : e_(e), copy_bw_(copy_bw), weight_bytes_(weight_bytes), rng_(seed) {}

  // Sequences of `context` tokens whose pages are allocated and headed as a prefill leaves them.
  bool Fill(int context, int batch, int steps, std::vector<engine::SequenceKv>* seqs,
            std::string* why) {
    engine::KvCache& cache = e_->cache();
    absl::StatusOr<PageKey> ns = e_->PageNamespace("");
    if (!ns.ok()) Die(std::string(ns.status().message()));
    std::uniform_int_distribution<int32_t> token(0, e_->config().vocab_size - 1);
    seqs->resize(batch);
    for (int b = 0; b < batch; ++b) {
      engine::SequenceKv& s = (*seqs)[b];
      s.namespace_key = *ns;
      s.tokens.resize(context);
      for (int32_t& t : s.tokens) t = token(rng_);
      if (absl::Status r = cache.Reserve(s, context + steps + 1); !r.ok()) {
        *why = std::string(r.message());
        for (int i = 0; i < b; ++i) cache.Release((*seqs)[i]);
        seqs->clear();
        return false;
      }
      for (int64_t n = 0; n < context;) {
        const int64_t end = std::min<int64_t>(context, n + 512);
        if (absl::Status r = cache.BeginAppend(s, end); !r.ok()) Die(std::string(r.message()));
        if (absl::Status r = cache.EndAppend(s, end); !r.ok()) Die(std::string(r.message()));
        n = end;
      }
      s.tokens.push_back(token(rng_));  // the first step's input
    }
    return true;
  }

  // One decode step of every sequence; returns its wall seconds.
  double Step(std::vector<engine::SequenceKv>& seqs) {
    std::vector<engine::ForwardItem> items;
    std::vector<engine::DeviceDraw> draw_storage(seqs.size());  // greedy
    std::vector<const engine::DeviceDraw*> draws;
    for (size_t i = 0; i < seqs.size(); ++i) {
      items.push_back({&seqs[i], seqs[i].num_tokens, 1, false});
      draws.push_back(&draw_storage[i]);
    }
    std::vector<float> logits;
    std::vector<engine::DeviceSampled> sampled;
    const Clock::time_point t0 = Clock::now();
    absl::Status s = e_->backend().ForwardAndSample(items, draws, false, &logits, &sampled);
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) Die(absl::StrCat("decode step: ", s.message()));
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].tokens.push_back(sampled[i].token);
    return wall;
  }

  Point Run(int context, int batch, int steps, int profile_steps) {
    Point p;
    p.context = context;
    p.batch = batch;
    std::vector<engine::SequenceKv> seqs;
    if (!Fill(context, batch, 3 + steps + profile_steps, &seqs, &p.skipped)) return p;
    double kv = 0;
    for (const engine::SequenceKv& s : seqs) kv += e_->cache().SequenceBytes(s);
    p.kv_gb = kv / 1e9;
    for (int i = 0; i < 3; ++i) Step(seqs);
    std::vector<double> wall, device;
    for (int i = 0; i < steps; ++i) {
      wall.push_back(Step(seqs));
      device.push_back(e_->backend().last_timing().device_seconds);
    }
    std::sort(wall.begin(), wall.end());
    std::sort(device.begin(), device.end());
    p.step_ms = 1e3 * wall[wall.size() / 2];
    p.device_ms = 1e3 * device[device.size() / 2];
    p.floor_ms = 1e3 * (weight_bytes_ + kv) / copy_bw_;
    if (profile_steps > 0) {
      uint64_t t0 = 0, t1 = 0;
      cuptiGetTimestamp(&t0);
      double w = 0;
      for (int i = 0; i < profile_steps; ++i) w += Step(seqs);
      cuptiGetTimestamp(&t1);
      CheckCupti(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
      std::map<std::string, double> by_name;  // ns
      std::vector<KernelRecord> inside;
      std::lock_guard<std::mutex> lock(g_records_mu);
      for (const KernelRecord& r : g_records) {
        if (r.start < t0 || r.end > t1) continue;
        p.category_ms[r.category] += (r.end - r.start) * 1e-6 / profile_steps;
        by_name[r.name] += static_cast<double>(r.end - r.start);
        inside.push_back(r);
      }
      g_records.clear();
      double gaps_ns = 0;
      for (const auto& [key, ns] : CriticalPath(std::move(inside), &gaps_ns)) {
        p.critical_ms[key] = ns * 1e-6 / profile_steps;
      }
      p.critical_gaps_ms = gaps_ns * 1e-6 / profile_steps;
      std::vector<std::pair<double, std::string>> order;
      for (const auto& [key, ms] : p.critical_ms) order.push_back({ms, key});
      std::sort(order.rbegin(), order.rend());
      std::fprintf(stderr, "    critical path, ms per step (%d x %d; gaps %.3f ms):\n", context,
                   batch, p.critical_gaps_ms);
      for (const auto& [ms, key] : order) {
        if (ms >= 0.005) std::fprintf(stderr, "      %8.3f  %s\n", ms, key.c_str());
      }
      for (int c = 0; c < kNumCategories; ++c) p.kernels_ms += p.category_ms[c];
      p.profiled_wall_ms = 1e3 * w / profile_steps;
      if (by_name.empty()) std::fprintf(stderr, "    (CUPTI recorded no kernels)\n");
      if (!printed_kernels_) {  // the names behind the categories, once per engine
        printed_kernels_ = true;
        for (const auto& [name, ns] : by_name) {
          std::fprintf(stderr, "    %-14s %9.3f ms  %s\n", kCategories[Category(name.c_str())],
                       ns * 1e-6 / profile_steps, name.substr(0, 90).c_str());
        }
      }
    }
    for (engine::SequenceKv& s : seqs) e_->cache().Release(s);
    return p;
  }

  // The most sequences of `context` tokens that fit at once (at most `limit`).
  int MostThatFit(int context, int steps, int limit) {
    engine::KvCache& cache = e_->cache();
    std::vector<engine::SequenceKv> seqs(limit);
    int n = 0;
    for (; n < limit; ++n) {
      if (!cache.Reserve(seqs[n], context + steps + 1).ok()) break;
    }
    for (int i = 0; i < n; ++i) cache.Release(seqs[i]);
    return n;
  }

 private:
  engine::Engine* e_;
  double copy_bw_, weight_bytes_;
  std::mt19937_64 rng_;
  bool printed_kernels_ = false;
};

json PointJson(const Point& p) {
  json j = {{"context", p.context}, {"batch", p.batch}};
  if (!p.skipped.empty()) {
    j["skipped"] = p.skipped;
    return j;
  }
  j["step_ms"] = p.step_ms;
  j["device_ms"] = p.device_ms;
  j["tokens_per_s"] = p.tokens_per_s();
  j["kv_gb"] = p.kv_gb;
  j["floor_ms"] = p.floor_ms;
  j["step_over_floor"] = p.step_ms / p.floor_ms;
  if (p.profiled_wall_ms > 0) {
    json b;
    for (int c = 0; c < kNumCategories; ++c) b[kCategories[c]] = p.category_ms[c];
    b["gaps"] = std::max(0.0, p.profiled_wall_ms - p.kernels_ms);
    b["profiled_step_ms"] = p.profiled_wall_ms;
    j["breakdown_ms"] = b;
    json c = p.critical_ms;
    c["gaps"] = p.critical_gaps_ms;
    j["critical_path_ms"] = c;
  }
  return j;
}

int Main() {
  const std::string model_path = absl::GetFlag(FLAGS_model);
  if (model_path.empty()) Die("--model is required (a Hugging Face folder or a .gguf file)");
  const std::vector<int> contexts = Ints("contexts", absl::GetFlag(FLAGS_contexts));
  const std::vector<int> batches = Ints("batch_sizes", absl::GetFlag(FLAGS_batch_sizes));
  const std::vector<int> prefills = Ints("prefill_contexts", absl::GetFlag(FLAGS_prefill_contexts));
  const int steps = absl::GetFlag(FLAGS_steps), profile_steps = absl::GetFlag(FLAGS_profile_steps);
  const int budget_context = absl::GetFlag(FLAGS_budget_context);
  if (steps < 1) Die("--steps must be >= 1");
  std::vector<engine::KvCacheFormat> formats;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_kv_formats), ',')) {
    absl::StatusOr<engine::KvCacheFormat> f = engine::ParseKvCacheFormat(std::string(part));
    if (!f.ok()) Die(absl::StrCat("--kv_formats: ", f.status().message()));
    formats.push_back(*f);
  }
  absl::StatusOr<engine::GpuWeights> weights = engine::ParseGpuWeights(absl::GetFlag(FLAGS_gpu_weights));
  if (!weights.ok()) Die(absl::StrCat("--gpu_weights: ", weights.status().message()));

  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, absl::GetFlag(FLAGS_device)) != cudaSuccess) {
    Die(absl::StrCat("no CUDA device ", absl::GetFlag(FLAGS_device)));
  }
  cudaSetDevice(absl::GetFlag(FLAGS_device));
  if (profile_steps > 0) {  // from the start, so kernels of graphs instantiated later are seen
    CheckCupti(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted),
               "cuptiActivityRegisterCallbacks");
    CheckCupti(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
  }
  const double copy_bw = bench::CopyBandwidth();
  if (copy_bw <= 0) Die("cudaMalloc for the copy bandwidth");
  std::fprintf(stderr, "%s: copy bandwidth %.2f TB/s\n", prop.name, copy_bw / 1e12);

  const Clock::time_point load0 = Clock::now();
  absl::StatusOr<model::LoadedModel> loaded = std::filesystem::is_directory(model_path)
                                                  ? model::LoadHfModel(model_path)
                                                  : model::LoadGgufModel(model_path);
  if (!loaded.ok()) Die(std::string(loaded.status().message()));
  auto model = std::make_shared<const model::LoadedModel>(std::move(*loaded));
  const model::ModelConfig& cfg = model->config;
  std::fprintf(stderr, "model %s loaded in %.0f s: %d layers, hidden %d, %d/%d heads of %d\n",
               cfg.name.c_str(), std::chrono::duration<double>(Clock::now() - load0).count(),
               cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);

  const int max_batch =
      std::max(64, batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end()));
  const std::string json_path = absl::GetFlag(FLAGS_json);
  auto write_json = [&json_path](const json& j) {  // after every format, so a cut run keeps some
    if (json_path.empty()) return;
    std::ofstream file(json_path);
    file << j.dump(2) << "\n";
    if (!file) Die(absl::StrCat("cannot write --json ", json_path));
  };
  json out;
  out["device"] = prop.name;
  out["copy_tb_per_s"] = copy_bw / 1e12;
  out["model"] = cfg.name;
  out["config"] = {{"layers", cfg.num_layers},      {"hidden", cfg.hidden_size},
                   {"heads", cfg.num_heads},        {"kv_heads", cfg.num_kv_heads},
                   {"head_dim", cfg.head_dim},      {"intermediate", cfg.intermediate_size},
                   {"vocab", cfg.vocab_size},       {"max_context", cfg.max_context}};
  out["steps"] = steps;
  out["kv_cache_gb"] = absl::GetFlag(FLAGS_kv_cache_gb);
  out["note"] =
      "decode steps: the engine's CUDA graph per batch size, greedy sampling on the GPU, "
      "synthetic contexts (pages allocated as prefill leaves them, zeroed data), CUPTI kernel "
      "tracing on throughout when breakdowns are asked for; floor = "
      "(matrix weight bytes + KV bytes) / copy bandwidth; breakdown from CUPTI kernel records";

  for (engine::KvCacheFormat format : formats) {
    engine::EngineOptions o;
    o.device.cuda = true;
    o.device.index = absl::GetFlag(FLAGS_device);
    o.gpu_weights = *weights;
    o.cuda_graphs = true;
    o.cuda_graph_history_buckets = absl::GetFlag(FLAGS_graph_history_buckets);
    o.gpu_gemv = absl::GetFlag(FLAGS_gpu_gemv);
    o.gpu_fused_layer_ops = absl::GetFlag(FLAGS_gpu_fused_layer_ops);
    o.gpu_gemv_overlap = absl::GetFlag(FLAGS_gpu_gemv_overlap);
    o.gpu_gemv_fused_norm = absl::GetFlag(FLAGS_gpu_gemv_fused_norm);
    o.gpu_gemv_normed_one_wave = absl::GetFlag(FLAGS_gpu_gemv_normed_one_wave);
    o.gpu_gemv_normed_paired_rows = absl::GetFlag(FLAGS_gpu_gemv_normed_paired_rows);
    o.gpu_int2_quick_start = absl::GetFlag(FLAGS_gpu_int2_quick_start);
    o.gpu_int2_slots_ahead = absl::GetFlag(FLAGS_gpu_int2_slots_ahead);
    o.gpu_early_launches = absl::GetFlag(FLAGS_gpu_early_launches);
    o.gpu_window_pages_per_cta = absl::GetFlag(FLAGS_gpu_window_pages_per_cta);
    o.gpu_merge_early_loads = absl::GetFlag(FLAGS_gpu_merge_early_loads);
    o.gpu_int2_int8_keys = absl::GetFlag(FLAGS_gpu_int2_int8_keys);
    o.gpu_launch_ahead_at_batch_1 = absl::GetFlag(FLAGS_gpu_launch_ahead_at_batch_1);
    o.gpu_fused_kv_writes = absl::GetFlag(FLAGS_gpu_fused_kv_writes);
    o.gpu_sampling = true;
    o.kv_cache.format = format;
    o.kv_cache.capacity_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_kv_cache_gb) * 1e9);
    o.kv_cache.max_sequences = max_batch;
    o.kv_cache.max_chunk_tokens = 512;
    o.scheduler.max_running = max_batch;
    o.scheduler.prefill_chunk = 512;
    o.scheduler.max_step_tokens = std::max(512, max_batch);
    const Clock::time_point c0 = Clock::now();
    absl::StatusOr<std::unique_ptr<engine::Engine>> made = engine::Engine::Create(model, o);
    if (!made.ok()) Die(std::string(made.status().message()));
    engine::Engine& e = **made;
    const std::string describe = e.backend().Describe();
    const int element_bytes = describe.find("fp32 weights") != std::string::npos ? 4 : 2;
    std::fprintf(stderr, "== %s on %s (%.0f s to create)\n", e.KvFormatString().c_str(),
                 describe.c_str(), std::chrono::duration<double>(Clock::now() - c0).count());
    // Zeroed page data: finite values whatever the kernels read.
    for (const engine::PagePool* pool : {&e.cache().bf16_pool(), e.cache().int2_pool()}) {
      if (pool && cudaMemset(const_cast<uint8_t*>(pool->base()), 0,
                             static_cast<size_t>(pool->num_slots() * pool->slot_bytes())) !=
                      cudaSuccess) {
        Die("cudaMemset of the page pools");
      }
    }
    Runner runner(&e, copy_bw, WeightBytes(cfg, element_bytes), 0x6b7673747261);
    json f;
    f["kv_format"] = e.KvFormatString();
    f["backend"] = describe;
    f["weight_gb"] = WeightBytes(cfg, element_bytes) / 1e9;
    for (int context : contexts) {
      for (int batch : batches) {
        const Point p = runner.Run(context, batch, steps, profile_steps);
        if (!p.skipped.empty()) {
          std::fprintf(stderr, "  %6d x %2d: does not fit (%s)\n", context, batch,
                       p.skipped.substr(0, 100).c_str());
        } else {
          std::fprintf(stderr,
                       "  %6d x %2d: step %8.3f ms (device %8.3f), floor %8.3f ms (%.2fx), KV "
                       "%.1f GB, %7.0f tok/s; gemm %.2f attn %.2f append %.2f sample %.2f other "
                       "%.2f gaps %.2f ms\n",
                       context, batch, p.step_ms, p.device_ms, p.floor_ms, p.step_ms / p.floor_ms,
                       p.kv_gb, p.tokens_per_s(), p.category_ms[0], p.category_ms[1],
                       p.category_ms[2], p.category_ms[3], p.category_ms[4],
                       std::max(0.0, p.profiled_wall_ms - p.kernels_ms));
        }
        f["decode"].push_back(PointJson(p));
      }
    }
    if (budget_context > 0) {
      const int n = runner.MostThatFit(budget_context, 3 + steps, 64);
      if (n > 0) {
        const Point p = runner.Run(budget_context, n, steps, 0);
        std::fprintf(stderr, "  same memory: %d sequences of %d fit, %.0f tok/s\n", n,
                     budget_context, p.tokens_per_s());
        f["same_memory"] = PointJson(p);
      }
    }
    for (int prompt : prefills) {
      engine::GenerationRequest r;
      std::mt19937_64 rng(prompt);
      std::uniform_int_distribution<int32_t> token(0, cfg.vocab_size - 1);
      for (int i = 0; i < prompt; ++i) r.prompt.push_back(token(rng));
      r.stop.max_tokens = 1;
      r.stop.ignore_eos = true;
      r.namespace_key = *e.PageNamespace("");
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<engine::GenerationStats> s = e.Generate(std::move(r), [](const engine::GenerationEvent&) {});
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!s.ok()) Die(absl::StrCat("prefill of ", prompt, " tokens: ", s.status().message()));
      std::fprintf(stderr, "  prefill %6d tokens: TTFT %.2f s, %.0f tok/s\n", prompt, secs,
                   prompt / secs);
      f["prefill"].push_back({{"prompt_tokens", prompt}, {"ttft_s", secs},
                              {"tokens_per_s", prompt / secs}});
    }
    out["formats"].push_back(f);
    write_json(out);
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace kvstrata

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "whole decode steps of the CUDA engine at long contexts, INT2 vs BF16, beside the physical "
      "floor (bench/long_context.sh runs the 8B study)");
  absl::ParseCommandLine(argc, argv);
  return kvstrata::Main();
}

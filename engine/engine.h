#pragma once

// The engine facade: one model, its tokenizer and chat template, the rotation set, the paged
// KV cache, the CPU backend and the scheduler, built and validated together from one options
// struct. The decode service and the command-line tools use the engine through this class.
//
//   EngineOptions o;
//   o.model_path = "/path/SmolLM2-135M-Instruct.Q4_1.gguf";
//   KV_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Load(o));
//   GenerationRequest r;
//   KV_ASSIGN_OR_RETURN(r.prompt, engine->EncodeChat({{"user", "Hi"}}));
//   KV_ASSIGN_OR_RETURN(r.namespace_key, engine->PageNamespace(/*cache_salt=*/""));
//   KV_ASSIGN_OR_RETURN(GenerationStats s, engine->Generate(std::move(r), on_event));
//
// Ownership: the engine owns everything it builds; the model may be shared (read-only) with
// other engines, e.g. one per KV format in a benchmark. Thread-compatible: one thread drives
// an engine (the decode service's engine loop).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/radix_hash.h"
#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/rotations.h"
#include "engine/scheduler.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/prompt_encoder.h"
#include "tokenizer/tokenizer.h"

namespace kvstrata::engine {

// Where the forward pass runs.
struct Device {
  bool cuda = false;
  int index = 0;                 // the CUDA device (cuda only)
  std::string ToString() const;  // "cpu", "cuda:1"
};
// "cpu", "cuda" (device 0) or "cuda:N"; InvalidArgument otherwise.
absl::StatusOr<Device> ParseDevice(std::string_view text);

// The type of the weights (and of the activations multiplied by them) on a GPU. auto: fp32 when
// the model's weights take at most 2 GiB that way (the CPU engine's arithmetic, for small models
// such as the default one), BF16 otherwise.
enum class GpuWeights { kAuto, kBf16, kFp16, kFp32 };
const char* GpuWeightsName(GpuWeights w);
absl::StatusOr<GpuWeights> ParseGpuWeights(std::string_view text);

struct EngineOptions {
  std::string model_path;  // a .gguf file or a Hugging Face model folder (Load only)
  // cpu: the CPU backend, KV pages in host memory. cuda: the CUDA backend on that GPU, KV pages
  // in device memory (Create answers Unavailable, naming the device, when there is no such GPU
  // or the build has no CUDA).
  Device device;
  GpuWeights gpu_weights = GpuWeights::kAuto;
  // cuda: decode steps replay a CUDA graph captured once per batch size (false: every kernel is
  // launched each step; the same arithmetic, for debugging and comparison).
  bool cuda_graphs = true;
  // cuda: a graph is captured per batch size and history bucket (the batch's longest history
  // rounded up to 1/buckets of the model's context), so short histories are not planned as
  // long ones. 1: one graph per batch size, planned for the whole context.
  int cuda_graph_history_buckets = 16;
  // cuda: a request without top-k, top-p or min-p filters and top_logprobs has its tokens drawn
  // on the GPU (the host's arithmetic; only the token is copied back). false: every row of
  // logits is copied to the host and sampled there.
  bool gpu_sampling = true;
  // cuda: forward passes of 1..4 tokens (decode of a small batch) multiply bf16 or fp16 weights
  // with a matrix-vector kernel that streams them near the copy bandwidth; false: cuBLAS.
  bool gpu_gemv = true;
  // cuda: at 1-2 tokens that kernel is launched as a programmatic dependent of the one before
  // it, so it streams its first weights while that one finishes (-0.25 ms a step of the 8B
  // model at batch 1, docs/benchmarks/engine-gpu.md); false: after it, as a plain launch.
  bool gpu_gemv_overlap = true;
  // cuda: at 1-2 tokens, with the two options above and gpu_fused_layer_ops, each layer's two
  // RMS norms run inside the GEMV after them (its CTAs normalise the row into shared memory)
  // and gate/up's GEMV writes silu(gate)·up itself: three launches fewer per layer, the same
  // results bit for bit on rows of 4,096 (kernels::GemvRmsNormed); false: separate launches.
  bool gpu_gemv_fused_norm = true;
  // cuda: those GEMVs that normalise their input run one wave of CTAs, each warp taking several
  // rows, so each CTA computes the norm once and no later wave starts with it
  // (kernels::GemvVariant::one_wave; 1-3 % off an 8B decode step at batch 1-2,
  // docs/benchmarks/engine-gpu.md). The same results; false: a CTA per 8 rows.
  bool gpu_gemv_normed_one_wave = true;
  // cuda: in passes of 2 tokens, those GEMVs' warps stream two rows of the matrix at once
  // (kernels::GemvVariant::paired_rows): twice the bytes in flight per warp (3-4 % off an 8B
  // decode step of 2 sequences; at 1 sequence it cost 1 %, so it is not used there). The same
  // results; false: one row after the other.
  bool gpu_gemv_normed_paired_rows = true;
  // cuda: each layer multiplies [wq; wk; wv] and [w_gate; w_up] as one matrix each, and does
  // the biases, q/k norms and RoPE in one launch (and a few format conversions inside the
  // launches next to them); false: one launch per step (the same arithmetic; for comparison).
  bool gpu_fused_layer_ops = true;
  // cuda: the INT2 history kernel asks for one page per warp before it reads the queries (the
  // second once they are in) and reads them in 16-byte loads (kernels::SplitDecodeVariant::
  // int2_quick_start; 7-14 % off a batch-1 layer of the 8B shape); false: the former start.
  bool gpu_int2_quick_start = true;
  // cuda: each warp of the INT2 history kernel reads the slot of the page it asks for next as
  // soon as it has asked for one (kernels::SplitDecodeVariant::int2_slots_ahead; 1-6 % off an
  // attention layer); false: when it asks. The same results.
  bool gpu_int2_slots_ahead = true;
  // cuda: the kernels of a layer between its GEMVs (the per-head steps, KV append and demotion,
  // the row moves around attention, attention's merge) are launched as programmatic dependents
  // of the kernel before them, so each launch overlaps that kernel's end, and attention's
  // history CTAs ask for their pages while the query gather in front of them runs (kernels::
  // SplitDecodeVariant::early_launch, both formats). The same results; false: plain launches.
  bool gpu_early_launches = true;
  // cuda: window pages (sink and recent) per CTA of attention's launch, both formats; 0: the
  // plan chooses (several at long contexts, so the history gets more of the wave; kernels::
  // SplitDecodeVariant::window_pages_per_cta); 1: a CTA per page, as before.
  int gpu_window_pages_per_cta = 0;
  // cuda: attention's merge loads the partial outputs beside their weights' lse rather than
  // after the weights (kernels::SplitDecodeVariant::merge_early_loads). The same results.
  bool gpu_merge_early_loads = true;
  // cuda: the INT2 history's keys multiplied on integer tensor cores where attention's page
  // ranges are long (32 pages or more), four codes a logic op, Q as two 8-bit integers
  // (kernels::SplitDecodeVariant::int2_int8_keys_min_pages); false: fp16 pairs everywhere.
  bool gpu_int2_int8_keys = true;
  // cuda: in decode passes of one sequence, the per-head launch, attention's INT2 history and its
  // merge let the launch after them begin at their start instead of once they have waited
  // (kernels::QkvHeadsParams and kernels::SplitDecodeVariant::dependents_at_start): attention's
  // CTAs take the multiprocessors the q/k/v GEMV leaves as it ends and ask for pages then, and
  // Wo's GEMV asks for its first weights while attention ends (1-3 % off an 8B step at batch 1;
  // at batch 2 it cost ~1 %, so it is not used there). The same results; false: as before.
  bool gpu_launch_ahead_at_batch_1 = true;
  // cuda: decode steps write the cache in fewer launches: with identity rotations, each layer's
  // per-head launch (biases, q/k norms, RoPE) writes the new K/V rows into their BF16 pages and
  // the queries in attention's BF16 operand itself (no append or query-gather launch); and
  // INT2 pages leaving the window are demoted for all layers in one launch at the step's start
  // instead of one per layer. The same results; false: a launch for each, as before.
  bool gpu_fused_kv_writes = true;
  std::string rotations_path;  // a rotation file (engine/rotations.h); "" = see below
  // When rotations_path is empty and the format is INT2: the rotation file in this folder
  // fitted on the loaded model (FindRotationFile), else identity rotations with a warning.
  // For codec: the file fitted on the model that carries a history codec, else an error.
  // Empty: identity. The CLI points it at the repository's rotations/ folder.
  std::string default_rotations_dir;
  KvCacheOptions kv_cache;     // format, layout, group size, capacity, sizing of the pools
  SchedulerOptions scheduler;  // batching, chunked prefill, default sampling seed
  // Threads of the CPU backend's math, the engine thread included; 0 = DefaultCpuThreads()
  // (engine/thread_pool.h).
  int cpu_threads = 0;
};

// Checks the options against each other and against the model, before anything is allocated.
// InvalidArgument whose message names the option (e.g. "scheduler.prefill_chunk=1024 must be in
// [1, kv_cache.max_chunk_tokens=512] ..."). model_path is not checked here (Load does).
absl::Status ValidateEngineOptions(const EngineOptions& options, const model::ModelConfig& config);

// Figures of one Generate call.
struct GenerationStats {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  FinishReason finish = FinishReason::kNone;
  std::string text;                           // everything streamed, in order
  int cached_tokens = 0;                      // prompt tokens imported from request.cached_pages
  int recent_window_from_int2_pages = 0;      // see GenerationEvent
  std::vector<ExportedPage> published_pages;  // when request.publish_pages
  double prefill_seconds = 0.0;  // Submit until the first generated token (prefill + 1 sample)
  double decode_seconds = 0.0;   // first generated token until the end
  // The sequence's KV cache after its last forward pass, before the scheduler freed it: tokens
  // whose K/V were held, the page slots holding them (headers and unused rows of partial pages
  // included), and bits per element = kv_bytes * 8 / (kv_tokens * layers * 2 * kv_heads * dim).
  int64_t kv_tokens = 0;
  int64_t kv_bytes = 0;
  int64_t kv_bf16_pages = 0;
  int64_t kv_int2_pages = 0;
  double kv_bits_per_element = 0.0;

  double prefill_tokens_per_second() const;
  double decode_tokens_per_second() const;  // (generated_tokens - 1) / decode_seconds
};

class Engine {
 public:
  using EventCallback = std::function<void(const GenerationEvent&)>;

  // Loads options.model_path (a directory: LoadHfModel; a file: LoadGgufModel) and builds the
  // engine. NotFound when the model or rotation file does not exist; the loaders' and
  // ValidateEngineOptions' errors otherwise.
  static absl::StatusOr<std::unique_ptr<Engine>> Load(const EngineOptions& options);
  // Builds an engine over an already loaded model (options.model_path is ignored).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      std::shared_ptr<const model::LoadedModel> model, const EngineOptions& options);

  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The stored KV format, exactly: every parameter that changes the bytes of a page.
  //   bf16 → "bf16-p64"; int2 → "int2-g64-sink64-recent256-p64";
  //   int2-lloyd-max → "int2-lloyd-max-g64-sink64-recent256-p64";
  //   codec → "codec-sink64-recent256-p64" (its recipes: the rotation file, whose digest the
  //   namespace holds)
  // (g = INT2 channels per scale/offset, p = tokens per page).
  std::string KvFormatString() const;

  // The radix-hash root for a tenant: NamespaceKey{model fingerprint, KvFormatString(),
  // rotation digest, page tokens, cache_salt} (core/radix_hash.h). Requests submitted to this
  // engine must carry a key made here (Submit checks), so their pages are keyed under this
  // model, format and rotation set.
  absl::StatusOr<PageKey> PageNamespace(std::string_view cache_salt) const;

  // Prompt token ids for a conversation or plain text: tokenizer::PromptEncoder's EncodeChat
  // and EncodeText on this model's tokenizer (FailedPrecondition naming the model when it has
  // no chat template).
  absl::StatusOr<std::vector<int32_t>> EncodeChat(std::span<const tokenizer::ChatMessage> messages,
                                                  bool add_generation_prompt = true) const;
  std::vector<int32_t> EncodeText(std::string_view text) const;

  // Queues a request on the scheduler after the engine-level checks: the namespace key was made
  // by PageNamespace, and prompt + max_tokens fits the model's trained context.
  absl::StatusOr<uint64_t> Submit(GenerationRequest request);

  // Runs one request to completion on an idle engine (FailedPrecondition otherwise), calling
  // on_event (may be empty) for each event as it happens. Blocking; for the CLI and tests.
  absl::StatusOr<GenerationStats> Generate(GenerationRequest request,
                                           const EventCallback& on_event = {});

  const model::LoadedModel& model() const { return *model_; }
  const model::ModelConfig& config() const { return model_->config; }
  const tokenizer::Tokenizer& tokenizer() const { return encoder_.tokenizer(); }
  // nullptr when the model ships no (recognised) chat template.
  const tokenizer::ChatTemplate* chat_template() const { return encoder_.chat_template(); }
  const tokenizer::PromptEncoder& prompt_encoder() const { return encoder_; }
  const RotationSet& rotations() const { return rotations_; }
  const EngineOptions& options() const { return options_; }
  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }
  Backend& backend();
  Scheduler& scheduler() { return *scheduler_; }

  // Bytes of the page slots in use now, both pools.
  int64_t KvBytesInUse() const;

 private:
  class MeteredBackend;

  Engine(std::shared_ptr<const model::LoadedModel> model, tokenizer::PromptEncoder encoder,
         const EngineOptions& options);

  EngineOptions options_;
  std::shared_ptr<const model::LoadedModel> model_;
  tokenizer::PromptEncoder encoder_;
  RotationSet rotations_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<MeteredBackend> backend_;
  std::unique_ptr<Scheduler> scheduler_;
  mutable std::set<PageKey> namespaces_;  // keys PageNamespace has made
};

}  // namespace kvstrata::engine

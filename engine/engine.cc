#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/page_format.h"
#include "core/status_macros.h"
#include "engine/cpu_backend.h"
#include "engine/thread_pool.h"
#ifdef KVSTRATA_HAVE_CUDA
#include "engine/cuda/cuda_backend.h"
#include "engine/cuda/device_page_memory.h"
#endif
#include "model/loader.h"
#include "model/safetensors.h"

namespace kvstrata::engine {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The checks that need no model: run before a model is loaded, so a bad option fails fast.
absl::Status ValidateOptionsAlone(const EngineOptions& o) {
  const KvCacheOptions& kv = o.kv_cache;
  const SchedulerOptions& s = o.scheduler;
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (kv.capacity_bytes <= 0) {
    return bad("kv_cache.capacity_bytes=", kv.capacity_bytes, " must be positive");
  }
  if (kv.max_sequences < 1) {
    return bad("kv_cache.max_sequences=", kv.max_sequences, " must be >= 1");
  }
  if (kv.max_chunk_tokens < 1) {
    return bad("kv_cache.max_chunk_tokens=", kv.max_chunk_tokens, " must be >= 1");
  }
  if (kv.layout.page_tokens != 64) {
    return bad("kv_cache.layout.page_tokens=", kv.layout.page_tokens,
               " must be 64 (the page format's page size)");
  }
  if (kv.layout.sink_tokens < 0 || kv.layout.sink_tokens % kv.layout.page_tokens != 0) {
    return bad("kv_cache.layout.sink_tokens=", kv.layout.sink_tokens,
               " must be a non-negative multiple of the page size (64)");
  }
  if (kv.layout.recent_tokens < 1) {
    return bad("kv_cache.layout.recent_tokens=", kv.layout.recent_tokens, " must be >= 1");
  }
  if (kv.group_size < 0) return bad("kv_cache.group_size=", kv.group_size, " must be >= 0");
  if (o.cpu_threads < 0 || o.cpu_threads > 1024) {
    return bad("cpu_threads=", o.cpu_threads, " must be in [0, 1024] (0: the default)");
  }
  if (s.max_running < 1 || s.max_running > kv.max_sequences) {
    return bad("scheduler.max_running=", s.max_running,
               " must be in [1, kv_cache.max_sequences=", kv.max_sequences,
               "] (the BF16 page pool is sized for max_sequences)");
  }
  if (s.max_waiting < 1) return bad("scheduler.max_waiting=", s.max_waiting, " must be >= 1");
  if (s.prefill_chunk < 1 || s.prefill_chunk > kv.max_chunk_tokens) {
    return bad("scheduler.prefill_chunk=", s.prefill_chunk,
               " must be in [1, kv_cache.max_chunk_tokens=", kv.max_chunk_tokens,
               "] (each sequence's BF16 working set is sized for max_chunk_tokens)");
  }
  if (s.max_step_tokens < s.max_running) {
    return bad("scheduler.max_step_tokens=", s.max_step_tokens,
               " must be >= scheduler.max_running=", s.max_running,
               " so prefill advances while the others decode");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateEngineOptions(const EngineOptions& o, const model::ModelConfig& config) {
  KV_RETURN_IF_ERROR(ValidateOptionsAlone(o));
  if (config.head_dim != 64 && config.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's head_dim=", config.head_dim,
                     " is not supported by the KV page format (64 or 128)"));
  }
  const int g = o.kv_cache.group_size;
  if (g != 0 && (g % 16 != 0 || config.head_dim % g != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache.group_size=", g,
                                                   " must be 0 (= head_dim) or a multiple of 16 "
                                                   "dividing the model's head_dim=",
                                                   config.head_dim));
  }
  return absl::OkStatus();
}

double GenerationStats::prefill_tokens_per_second() const {
  return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0;
}

double GenerationStats::decode_tokens_per_second() const {
  return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0.0;
}

// The CPU backend plus a record of each sequence's cache after the last forward pass, taken
// before the scheduler can free it (Generate reports it as the KV actually held).
class Engine::MeteredBackend final : public Backend {
 public:
  struct ItemKv {
    int64_t tokens = 0;
    int64_t bytes = 0;
    int64_t bf16_pages = 0;
    int64_t int2_pages = 0;
  };

  MeteredBackend(std::unique_ptr<Backend> inner, const KvCache* cache)
      : inner_(std::move(inner)), cache_(cache) {}

  absl::Status Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                       ForwardObserver* observer) override {
    KV_RETURN_IF_ERROR(inner_->Forward(batch, logits, observer));
    Record(batch);
    return absl::OkStatus();
  }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  absl::Status ForwardAndSample(const std::vector<ForwardItem>& batch,
                                const std::vector<const DeviceDraw*>& draws, bool host_logits,
                                std::vector<float>* logits,
                                std::vector<DeviceSampled>* sampled) override {
    KV_RETURN_IF_ERROR(inner_->ForwardAndSample(batch, draws, host_logits, logits, sampled));
    Record(batch);
    return absl::OkStatus();
  }
  int vocab_size() const override { return inner_->vocab_size(); }
  ForwardTiming last_timing() const override { return inner_->last_timing(); }
  DevicePageAccess* device_page_access() override { return inner_->device_page_access(); }
  std::string Describe() const override { return inner_->Describe(); }
  const std::vector<ItemKv>& last() const { return last_; }
  void ForgetLast() { last_.clear(); }

 private:
  void Record(const std::vector<ForwardItem>& batch) {
    last_.clear();
    for (const ForwardItem& item : batch) {
      ItemKv kv;
      kv.tokens = item.seq->num_tokens;
      kv.bytes = cache_->SequenceBytes(*item.seq);
      for (int32_t s : item.seq->bf16_slot) kv.bf16_pages += s >= 0;
      for (int32_t s : item.seq->int2_slot) kv.int2_pages += s >= 0;
      last_.push_back(kv);
    }
  }

  std::unique_ptr<Backend> inner_;
  const KvCache* cache_;
  std::vector<ItemKv> last_;
};

std::string Device::ToString() const { return cuda ? absl::StrCat("cuda:", index) : "cpu"; }

absl::StatusOr<Device> ParseDevice(std::string_view text_view) {
  const absl::string_view text(text_view.data(), text_view.size());
  Device d;
  if (text == "cpu") return d;
  if (text == "cuda") {
    d.cuda = true;
    return d;
  }
  if (absl::StartsWith(text, "cuda:") && absl::SimpleAtoi(text.substr(5), &d.index) &&
      d.index >= 0) {
    d.cuda = true;
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device \"", text, "\" is not cpu, cuda or cuda:N"));
}

const char* GpuWeightsName(GpuWeights w) {
  switch (w) {
    case GpuWeights::kAuto:
      return "auto";
    case GpuWeights::kBf16:
      return "bf16";
    case GpuWeights::kFp16:
      return "fp16";
    case GpuWeights::kFp32:
      return "fp32";
  }
  return "auto";
}

absl::StatusOr<GpuWeights> ParseGpuWeights(std::string_view text) {
  for (GpuWeights w :
       {GpuWeights::kAuto, GpuWeights::kBf16, GpuWeights::kFp16, GpuWeights::kFp32}) {
    if (text == GpuWeightsName(w)) return w;
  }
  return absl::InvalidArgumentError(absl::StrCat("GPU weight type \"",
                                                 absl::string_view(text.data(), text.size()),
                                                 "\" is not auto, bf16, fp16 or fp32"));
}

Engine::Engine(std::shared_ptr<const model::LoadedModel> model, tokenizer::PromptEncoder encoder,
               const EngineOptions& options)
    : options_(options), model_(std::move(model)), encoder_(std::move(encoder)) {}

Engine::~Engine() = default;

Backend& Engine::backend() { return *backend_; }

absl::StatusOr<std::unique_ptr<Engine>> Engine::Load(const EngineOptions& options) {
  KV_RETURN_IF_ERROR(ValidateOptionsAlone(options));
  if (options.model_path.empty()) return absl::InvalidArgumentError("model_path is empty");
  std::error_code ec;
  const std::filesystem::file_status model_status = std::filesystem::status(options.model_path, ec);
  if (!std::filesystem::exists(model_status)) {
    return absl::NotFoundError(absl::StrCat("model_path ", options.model_path, " does not exist"));
  }
  if (!options.rotations_path.empty() && !std::filesystem::exists(options.rotations_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat("rotations_path ", options.rotations_path, " does not exist"));
  }
  absl::StatusOr<model::LoadedModel> loaded = std::filesystem::is_directory(model_status)
                                                  ? model::LoadHfModel(options.model_path)
                                                  : model::LoadGgufModel(options.model_path);
  if (!loaded.ok()) return loaded.status();
  return Create(std::make_shared<const model::LoadedModel>(std::move(*loaded)), options);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    std::shared_ptr<const model::LoadedModel> model, const EngineOptions& options) {
  if (model == nullptr) return absl::InvalidArgumentError("no model");
  const model::ModelConfig& c = model->config;
  KV_RETURN_IF_ERROR(ValidateEngineOptions(options, c));
  KV_ASSIGN_OR_RETURN(tokenizer::PromptEncoder encoder,
                      tokenizer::PromptEncoder::Create(model->tokenizer));
  std::unique_ptr<Engine> e(new Engine(model, std::move(encoder), options));

  std::string rotations_path = options.rotations_path;
  const bool int2 = options.kv_cache.format == KvCacheFormat::kInt2 ||
                    options.kv_cache.format == KvCacheFormat::kInt2LloydMax;
  const bool codec = options.kv_cache.format == KvCacheFormat::kCodec;
  if (rotations_path.empty() && (int2 || codec) && !options.default_rotations_dir.empty()) {
    absl::StatusOr<std::string> found = FindRotationFile(
        options.default_rotations_dir, model->fingerprint,
        codec ? ""
              : (options.kv_cache.format == KvCacheFormat::kInt2LloydMax ? "lloyd-max" : "uniform"),
        codec);
    if (found.ok()) {
      rotations_path = *found;
    } else if (codec) {
      return absl::FailedPreconditionError(
          absl::StrCat("kv_format codec: ", found.status().message(),
                       "; or name one with rotations_path (--rotations)"));
    } else {
      std::fprintf(stderr,
                   "kvstrata: warning: no rotation file for this model in %s; using identity "
                   "rotations, which cost INT2 a lot of accuracy (run kvstrata calibrate)\n",
                   options.default_rotations_dir.c_str());
    }
  }
  if (rotations_path.empty()) {
    if (codec) {
      return absl::InvalidArgumentError(
          "kv_format codec needs a rotation file carrying a history codec (rotations_path)");
    }
    e->rotations_ = IdentityRotations(c.num_layers, c.num_kv_heads, c.head_dim);
  } else {
    KV_ASSIGN_OR_RETURN(e->rotations_,
                        ReadRotationFile(rotations_path, c.num_layers, c.num_kv_heads, c.head_dim,
                                         model->fingerprint));
  }
  KvCacheOptions cache_options = options.kv_cache;
  if (codec) {
    // The history codec travels in the rotation file, whose digest is in the namespace.
    const std::string& spec = e->rotations_.info.history_codec;
    if (spec.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_format codec: rotation file ", rotations_path,
          " carries no history_codec (kvstrata eval --allocate-bits --rotations-out writes one)"));
    }
    auto parsed = std::make_shared<kernels::HistoryCodec>();
    std::string error;
    if (!kernels::ParseHistoryCodec(spec, c.head_dim, parsed.get(), &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("rotation file ", rotations_path, ": history_codec: ", error));
    }
    if (absl::Status s = FoldCodecBasis(*parsed, &e->rotations_); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rotation file ", rotations_path, ": ", s.message()));
    }
    cache_options.codec = std::move(parsed);
  }
  kernels::KvGeometry geometry;
  geometry.num_layers = c.num_layers;
  geometry.num_kv_heads = c.num_kv_heads;
  geometry.head_dim = c.head_dim;
  geometry.group_size = options.kv_cache.group_size;
  geometry.page_tokens = options.kv_cache.layout.page_tokens;
  cache_options.demotion_key_clip = e->rotations_.k_clip;
  cache_options.demotion_value_clip = e->rotations_.v_clip;
  std::unique_ptr<Backend> backend;
  if (options.device.cuda) {
#ifdef KVSTRATA_HAVE_CUDA
    const int gpu = options.device.index;
    if (absl::StatusOr<std::string> d = DescribeCudaDevice(gpu); !d.ok()) {
      return absl::UnavailableError(
          absl::StrCat("device ", options.device.ToString(), ": ", d.status().message()));
    }
    // Address space up to the history page tables' reach, where the pools of GPU kvstores on
    // this GPU are mapped, so that their pages can be read in place.
    cache_options.allocate_page_memory = DevicePageMemoryAllocator(gpu, kHistoryReachBytes);
    absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::Create(geometry, cache_options);
    if (!cache.ok()) {
      if (cache.status().code() == absl::StatusCode::kResourceExhausted) {
        return absl::ResourceExhaustedError(absl::StrCat(
            cache.status().message(), ": lower kv_cache.capacity_bytes (--kv-cache-mb)"));
      }
      return cache.status();
    }
    e->cache_ = *std::move(cache);
    CudaBackendOptions cuda;
    cuda.device = gpu;
    cuda.weights = options.gpu_weights;
    cuda.decode_graphs = options.cuda_graphs;
    cuda.graph_history_buckets = std::max(1, options.cuda_graph_history_buckets);
    cuda.small_batch_gemv = options.gpu_gemv;
    cuda.gemv_overlap = options.gpu_gemv_overlap;
    cuda.gemv_fused_norm = options.gpu_gemv_fused_norm;
    cuda.gemv_normed_one_wave = options.gpu_gemv_normed_one_wave;
    cuda.gemv_normed_paired_rows = options.gpu_gemv_normed_paired_rows;
    cuda.fused_layer_ops = options.gpu_fused_layer_ops;
    cuda.int2_quick_start = options.gpu_int2_quick_start;
    cuda.int2_slots_ahead = options.gpu_int2_slots_ahead;
    cuda.early_launches = options.gpu_early_launches;
    cuda.window_pages_per_cta = std::max(0, options.gpu_window_pages_per_cta);
    cuda.merge_early_loads = options.gpu_merge_early_loads;
    cuda.int2_int8_keys = options.gpu_int2_int8_keys;
    cuda.fused_kv_writes = options.gpu_fused_kv_writes;
    cuda.launch_ahead_at_batch_1 = options.gpu_launch_ahead_at_batch_1;
    cuda.device_sampling = options.gpu_sampling;
    cuda.max_step_tokens = options.scheduler.max_step_tokens;
    cuda.max_items = options.scheduler.max_running;
    KV_ASSIGN_OR_RETURN(backend,
                        CreateCudaBackend(*e->model_, e->rotations_, e->cache_.get(), cuda));
#else
    return absl::UnavailableError(
        absl::StrCat("device ", options.device.ToString(),
                     ": this build of kvstrata has no CUDA support (it was built without nvcc)"));
#endif
  } else {
    KV_ASSIGN_OR_RETURN(e->cache_, KvCache::Create(geometry, cache_options));
    backend = CreateCpuBackend(*e->model_, e->rotations_, e->cache_.get(),
                               options.cpu_threads > 0 ? options.cpu_threads : DefaultCpuThreads());
  }
  e->backend_ = std::make_unique<MeteredBackend>(std::move(backend), e->cache_.get());
  const tokenizer::Tokenizer* t = &e->encoder_.tokenizer();
  e->scheduler_ = std::make_unique<Scheduler>(
      e->backend_.get(), e->cache_.get(),
      // Control tokens (<|im_start|>, ...) are structure, not text: they are never streamed.
      [t](int32_t id) { return t->IsControl(id) ? std::string() : std::string(t->TokenBytes(id)); },
      [t](int32_t id) { return t->IsEndOfGeneration(id); }, options.scheduler);
  return e;
}

std::string Engine::KvFormatString() const {
  const kernels::SplitLayout& l = cache_->options().layout;
  const KvCacheFormat format = cache_->options().format;
  // BF16 keeps every page whole: neither the group size nor the window changes its bytes.
  if (format == KvCacheFormat::kBf16) return absl::StrCat("bf16-p", l.page_tokens);
  // The codec's recipes are in the rotation file, whose digest the namespace holds beside this;
  // the page encoding (codec or codec fragment blocks) follows from them, and is named too.
  if (format == KvCacheFormat::kCodec) {
    return absl::StrCat(PageEncodingName(cache_->int2_encoding()), "-sink", l.sink_tokens,
                        "-recent", l.recent_tokens, "-p", l.page_tokens);
  }
  return absl::StrCat(KvCacheFormatName(format), "-g", cache_->geometry().group_size, "-sink",
                      l.sink_tokens, "-recent", l.recent_tokens, "-p", l.page_tokens);
}

absl::StatusOr<PageKey> Engine::PageNamespace(std::string_view cache_salt) const {
  HashNamespace ns;
  ns.model_fingerprint = model_->fingerprint;
  ns.kv_format = KvFormatString();
  ns.rotation_digest = rotations_.digest;
  ns.page_tokens = static_cast<uint32_t>(cache_->options().layout.page_tokens);
  ns.cache_salt = std::string(cache_salt);
  KV_ASSIGN_OR_RETURN(PageKey key, NamespaceKey(ns));
  namespaces_.insert(key);
  return key;
}

absl::StatusOr<std::vector<int32_t>> Engine::EncodeChat(
    std::span<const tokenizer::ChatMessage> messages, bool add_generation_prompt) const {
  if (encoder_.chat_template() == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", model_->config.name, " has no recognised chat template"));
  }
  return encoder_.EncodeChat(messages, add_generation_prompt);
}

std::vector<int32_t> Engine::EncodeText(std::string_view text) const {
  return encoder_.EncodeText(text);
}

absl::StatusOr<uint64_t> Engine::Submit(GenerationRequest request) {
  if (!namespaces_.contains(request.namespace_key)) {
    return absl::InvalidArgumentError(
        absl::StrCat("namespace_key ", request.namespace_key.ToHex(),
                     " was not made by this engine's PageNamespace; its pages would be keyed "
                     "under another model, KV format or rotation set"));
  }
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.stop.max_tokens;
  if (model_->config.max_context > 0 && total > model_->config.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", request.prompt.size(), " tokens) + max_tokens (", request.stop.max_tokens,
        ") exceeds the model's context length (", model_->config.max_context, ")"));
  }
  return scheduler_->Submit(std::move(request));
}

absl::StatusOr<GenerationStats> Engine::Generate(GenerationRequest request,
                                                 const EventCallback& on_event) {
  if (!scheduler_->idle()) {
    return absl::FailedPreconditionError(absl::StrCat("Generate needs an idle engine (",
                                                      scheduler_->running(), " running, ",
                                                      scheduler_->waiting(), " waiting)"));
  }
  GenerationStats stats;
  stats.prompt_tokens = static_cast<int>(request.prompt.size());
  const Clock::time_point start = Clock::now();
  KV_ASSIGN_OR_RETURN(const uint64_t id, Submit(std::move(request)));
  backend_->ForgetLast();
  std::optional<Clock::time_point> first_token;
  MeteredBackend::ItemKv kv;
  std::vector<GenerationEvent> events;
  bool done = false;
  while (!done) {
    events.clear();
    if (absl::Status step = scheduler_->Step(&events); !step.ok()) {
      // Free the sequence (a cancelled sequence needs no forward pass), then report.
      scheduler_->Cancel(id, FinishReason::kError);
      std::vector<GenerationEvent> ignored;
      scheduler_->Step(&ignored).IgnoreError();
      return step;
    }
    if (backend_->last().size() == 1) kv = backend_->last()[0];  // the only sequence: ours
    for (const GenerationEvent& e : events) {
      if (e.sequence_id != id) continue;
      if (e.token >= 0 && !first_token) first_token = Clock::now();
      stats.text += e.text;
      stats.generated_tokens = e.generated_tokens;
      stats.cached_tokens = e.cached_tokens;
      stats.recent_window_from_int2_pages = e.recent_window_from_int2_pages;
      if (!e.published_pages.empty()) stats.published_pages = e.published_pages;
      if (e.finish != FinishReason::kNone) stats.finish = e.finish, done = true;
      if (on_event) on_event(e);
    }
    if (!done && scheduler_->idle()) {
      return absl::InternalError("the scheduler went idle before the request finished");
    }
  }
  const Clock::time_point end = Clock::now();
  stats.prefill_seconds = Seconds(first_token.value_or(end) - start);
  stats.decode_seconds = first_token ? Seconds(end - *first_token) : 0.0;
  stats.kv_tokens = kv.tokens;
  stats.kv_bytes = kv.bytes;
  stats.kv_bf16_pages = kv.bf16_pages;
  stats.kv_int2_pages = kv.int2_pages;
  const kernels::KvGeometry& g = cache_->geometry();
  const double elements =
      static_cast<double>(kv.tokens) * g.num_layers * 2 * g.num_kv_heads * g.head_dim;
  stats.kv_bits_per_element = elements > 0 ? kv.bytes * 8.0 / elements : 0.0;
  return stats;
}

int64_t Engine::KvBytesInUse() const {
  const PagePool& bf16 = cache_->bf16_pool();
  int64_t bytes = (bf16.num_slots() - bf16.free_slots()) * bf16.slot_bytes();
  if (const PagePool* int2 = cache_->int2_pool()) {
    bytes += (int2->num_slots() - int2->free_slots()) * int2->slot_bytes();
  }
  return bytes;
}

}  // namespace kvstrata::engine

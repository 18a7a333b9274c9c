#include "services/decode/decode_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <future>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/radix_hash.h"
#include "rpc/status.h"
#include "services/common/generate_input.h"
#include "services/decode/decode_internal.h"

#ifdef KVSTRATA_HAVE_CUDA
#include "engine/cuda/device_page_memory.h"
#endif

namespace kvstrata::decode {

namespace {

constexpr int kMaxStopStrings = 16;
constexpr char kServerVersion[] = "0.1.0";

v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case engine::FinishReason::kEndOfGeneration:
    case engine::FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case engine::FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case engine::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kCancelled:
      return v1::FINISH_REASON_ABORT;
    case engine::FinishReason::kDeadline:
      return v1::FINISH_REASON_DEADLINE;
    case engine::FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

// True when lo <= v <= hi (false for NaN).
bool InRange(float v, float lo, float hi) { return v >= lo && v <= hi; }

absl::Status RangeError(const char* field, float v, const char* range) {
  return absl::InvalidArgumentError(absl::StrCat(field, "=", v, " must be in ", range));
}

// Field checks of the proto contract that need no engine.
absl::Status ValidateRequest(const v1::GenerateRequest& r, int max_logprobs_top_n) {
  if (absl::Status s = ValidateRequestEnvelope(r); !s.ok()) return s;
  if (absl::Status s = ValidateRoutingHints(r.routing()); !s.ok()) return s;
  const v1::SamplingParams& s = r.sampling();
  if (s.has_temperature() && !InRange(s.temperature(), 0, 100)) {
    return RangeError("sampling.temperature", s.temperature(), "[0, 100]");
  }
  if (!InRange(s.top_p(), 0, 1)) return RangeError("sampling.top_p", s.top_p(), "[0, 1]");
  if (!InRange(s.min_p(), 0, 1)) return RangeError("sampling.min_p", s.min_p(), "[0, 1]");
  if (!InRange(s.repetition_penalty(), 0, 10)) {
    return RangeError("sampling.repetition_penalty", s.repetition_penalty(), "(0, 10]");
  }
  if (!InRange(s.frequency_penalty(), -2, 2)) {
    return RangeError("sampling.frequency_penalty", s.frequency_penalty(), "[-2, 2]");
  }
  if (!InRange(s.presence_penalty(), -2, 2)) {
    return RangeError("sampling.presence_penalty", s.presence_penalty(), "[-2, 2]");
  }
  if (s.n() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.n=", s.n(), " exceeds max_n=1 of this server"));
  }
  if (r.stop().stop_strings_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop.stop_strings: at most ", kMaxStopStrings, " strings"));
  }
  for (const std::string& s : r.stop().stop_strings()) {
    if (s.empty()) return absl::InvalidArgumentError("stop.stop_strings: empty string");
  }
  if (r.has_logprobs()) {
    if (r.logprobs().top_n() > static_cast<uint32_t>(max_logprobs_top_n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logprobs.top_n=", r.logprobs().top_n(),
                       " exceeds max_logprobs_top_n=", max_logprobs_top_n));
    }
    if (r.logprobs().prompt_logprobs()) {
      return absl::InvalidArgumentError("logprobs.prompt_logprobs: not supported by this server");
    }
  }
  if (r.priority() < -100 || r.priority() > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("priority=", r.priority(), " must be in [-100, 100]"));
  }
  return absl::OkStatus();
}

v1::KvQuantization Quantization(engine::KvCacheFormat format) {
  switch (format) {
    case engine::KvCacheFormat::kBf16:
      return v1::KV_QUANTIZATION_BF16;
    case engine::KvCacheFormat::kInt2:
      return v1::KV_QUANTIZATION_INT2_UNIFORM;
    case engine::KvCacheFormat::kInt2LloydMax:
      return v1::KV_QUANTIZATION_INT2_LLOYD_MAX;
    case engine::KvCacheFormat::kEvalFp8:
    case engine::KvCacheFormat::kEvalInt4:
    case engine::KvCacheFormat::kEvalKivi2:
    case engine::KvCacheFormat::kEvalTurbo3:
    case engine::KvCacheFormat::kEvalCodec:
      return v1::KV_QUANTIZATION_UNSPECIFIED;
  }
  return v1::KV_QUANTIZATION_UNSPECIFIED;
}

// Every KvFormat field the engine knows. rotation_digest: the namespace binds the digest's hex
// form (or "identity"); the wire carries the 32 raw bytes (or nothing for identity).
v1::KvFormat DescribeKvFormat(const engine::Engine& engine) {
  const engine::KvCache& cache = engine.cache();
  const kernels::KvGeometry& g = cache.geometry();
  const kernels::SplitLayout& layout = cache.options().layout;
  const engine::KvCacheFormat format = cache.options().format;
  v1::KvFormat f;
  f.set_name(engine.KvFormatString());
  f.set_quantization(Quantization(format));
  f.set_page_size_tokens(static_cast<uint32_t>(layout.page_tokens));
  f.set_num_layers(static_cast<uint32_t>(g.num_layers));
  f.set_num_kv_heads(static_cast<uint32_t>(g.num_kv_heads));
  f.set_head_dim(static_cast<uint32_t>(g.head_dim));
  f.set_bf16_page_bytes(static_cast<uint64_t>(kernels::PageBytes(g, kernels::PageEncoding::kBf16)));
  f.set_history_bits_per_element(engine::HistoryBitsPerElement(format, g));
  if (format == engine::KvCacheFormat::kInt2 || format == engine::KvCacheFormat::kInt2LloydMax) {
    f.set_sink_tokens(static_cast<uint32_t>(layout.sink_tokens));
    f.set_recent_window_tokens(static_cast<uint32_t>(layout.recent_tokens));
    f.set_group_size(static_cast<uint32_t>(g.group_size));
    f.set_int2_page_bytes(static_cast<uint64_t>(kernels::PageBytes(
        g, format == engine::KvCacheFormat::kInt2 ? kernels::PageEncoding::kInt2Uniform
                                                  : kernels::PageEncoding::kInt2LloydMax)));
  }
  const std::string& digest = engine.rotations().digest;
  if (!digest.empty() && digest != "identity")
    f.set_rotation_digest(absl::HexStringToBytes(digest));
  return f;
}

uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

absl::Time ClientDeadline(const grpc::ServerContext& context) {
  if (context.deadline() == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(context.deadline());
}

}  // namespace

DecodeService::DecodeService(std::unique_ptr<engine::Engine> engine,
                             const DecodeServiceOptions& options, MetricsRegistry* registry)
    : engine_(std::move(engine)),
      options_(options),
      metrics_(std::make_unique<DecodeMetrics>(registry)),
      page_tokens_(engine_->cache().geometry().page_tokens),
      max_context_(engine_->config().max_context),
      vocab_size_(engine_->config().vocab_size),
      has_chat_template_(engine_->chat_template() != nullptr),
      tokenizer_identity_(engine_->prompt_encoder().identity()),
      model_fingerprint_(engine_->model().fingerprint),
      eos_token_ids_(engine_->model().tokenizer.end_of_generation_ids),
      max_running_(engine_->options().scheduler.max_running),
      kv_format_proto_(DescribeKvFormat(*engine_)) {
  if (options_.local_cache_bytes > 0) {
    local_pages_ = std::make_unique<LocalPageCache>(
        LocalPageCacheOptions{.capacity_bytes = options_.local_cache_bytes});
  }
  metrics_->local_cache_capacity_bytes.Get().Set(
      static_cast<double>(std::max<int64_t>(0, options_.local_cache_bytes)));
  UpdateLocalGauges(local_pages_.get(), *metrics_);
  {
    const engine::KvCache& cache = engine_->cache();
    const bool split = cache.int2_pool() != nullptr;
    total_pages_.store(split ? cache.int2_pool()->num_slots() : cache.bf16_pool().num_slots());
    free_pages_.store(split ? cache.free_int2_slots() : cache.free_bf16_slots());
    metrics_->kv_cache_capacity_bytes.Get().Set(
        static_cast<double>(cache.options().capacity_bytes));
    metrics_->kv_cache_pages.Get().Set(static_cast<double>(total_pages_.load()));
    metrics_->kv_cache_free_pages.Get().Set(static_cast<double>(free_pages_.load()));
    metrics_->kv_cache_used_bytes.Get().Set(0);
    metrics_->running.Get().Set(0);
    metrics_->waiting.Get().Set(0);
  }
  if (!options_.kvstore_addresses.empty()) {
    ring_ = std::make_unique<kvstore::KvStoreRing>(options_.kvstore_client);
    for (const std::string& a : options_.kvstore_addresses) ring_->AddStore(a);
    // With page MACs the worker checks every page's MAC on the host before using it; pages
    // read from a same-GPU pool are checked by their digest only, which an adversary who can
    // write the pool could forge, so the same-GPU transport is off then, unless the operator
    // trusts the store on this GPU (same_gpu_with_page_macs).
    const bool macs = options_.kvstore_client.page_mac_keys != nullptr;
    const bool same_gpu_off = macs && !options_.same_gpu_with_page_macs;
    same_gpu_ = std::make_unique<SameGpuPools>(same_gpu_off ? -1 : options_.same_gpu_device,
                                               engine_->cache().int2_encoding());
    if (options_.nccl_runtime != nullptr && options_.nccl_device >= 0 && !macs) {
      std::string uuid = options_.nccl_gpu_uuid;
#ifdef KVSTRATA_HAVE_CUDA
      if (uuid.empty()) {
        absl::StatusOr<std::pair<std::string, std::string>> id =
            engine::GpuUuidAndName(options_.nccl_device);
        if (id.ok()) uuid = id->first;
      }
#endif
      if (uuid.empty()) {
        fprintf(stderr, "kvstrata-decode: WARNING: cuda:%d has no GPU id; NCCL is not offered\n",
                options_.nccl_device);
      } else {
        nccl_ = std::make_unique<NcclPeers>(
            options_.nccl_runtime,
            NcclPeersOptions{.device = options_.nccl_device,
                             .gpu_uuid = uuid,
                             .client_id = options_.worker_id,
                             .receive_bytes = options_.nccl_receive_bytes,
                             .max_receive_wait = options_.nccl_receive_timeout,
                             // No prompt is longer than the context, so no fetch has more pages.
                             .max_transfer_pages = static_cast<size_t>(
                                 std::max(1, max_context_ / page_tokens_)),
                             .int2_encoding = engine_->cache().int2_encoding()});
      }
    }
    if (same_gpu_off && options_.same_gpu_device >= 0) {
      fprintf(stderr,
              "kvstrata-decode: page MACs are on: cached pages come by gRPC and are checked on "
              "the host (the same-GPU transport does not check MACs)\n");
    } else if (macs && options_.same_gpu_device >= 0) {
      fprintf(stderr,
              "kvstrata-decode: page MACs are on, but pages from a kvstore's pool on this GPU "
              "are taken on their digest alone (--same_gpu_with_page_macs): that kvstore is "
              "trusted not to alter them; pages by gRPC are MAC-checked\n");
    }
  }
  engine_thread_ = std::thread([this] { EngineLoop(); });
  publish_thread_ = std::thread([this] { PublishLoop(); });
}

DecodeService::~DecodeService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  engine_cv_.notify_all();
  engine_thread_.join();
  {
    std::lock_guard<std::mutex> lock(publish_mu_);
    publish_stopping_ = true;
  }
  publish_cv_.notify_all();
  publish_thread_.join();
}

void DecodeService::RequestCancel(uint64_t sequence_id, engine::FinishReason reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back({sequence_id, reason});
  }
  engine_cv_.notify_all();
}

void DecodeService::EngineLoop() {
  engine::Scheduler& scheduler = engine_->scheduler();
  std::vector<engine::GenerationEvent> events;
  for (;;) {
    std::deque<PendingSubmit> submits;
    std::deque<PendingCancel> cancels;
    std::deque<std::function<void()>> tasks;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      engine_cv_.wait(lock, [&] {
        return stopping_ || !tasks_.empty() || !submits_.empty() || !cancels_.empty() ||
               !scheduler.idle();
      });
      tasks.swap(tasks_);
      stopping = stopping_;
      if (stopping && scheduler.idle() && submits_.empty() && tasks.empty()) break;
      submits.swap(submits_);
      cancels.swap(cancels_);
      if (stopping) {
        for (const auto& [id, channel] : running_) {
          cancels.push_back({id, engine::FinishReason::kCancelled});
        }
      }
    }
    for (std::function<void()>& task : tasks) task();
    for (PendingSubmit& s : submits) {
      absl::StatusOr<uint64_t> id = absl::UnavailableError("the server is shutting down");
      bool rejected = false;
      if (!stopping) {
        engine::GenerationRequest fallback;
        const bool had_cache =
            !s.request.cached_pages.empty() || !s.request.device_cached_pages.empty();
        if (had_cache) {
          fallback = s.request;
          fallback.cached_pages.clear();
          fallback.device_cached_pages.clear();
          fallback.cached_pages_owner.reset();  // let go with the refused request
        }
        id = engine_->Submit(std::move(s.request));
        if (!id.ok() && had_cache && id.status().code() == absl::StatusCode::kInvalidArgument) {
          fprintf(stderr,
                  "kvstrata-decode: request %s: engine rejected the cached pages (%s); "
                  "prefilling the whole prompt\n",
                  fallback.request_id.c_str(), std::string(id.status().message()).c_str());
          metrics_->kvstore_errors.With({"import"}).Increment();
          rejected = true;
          id = engine_->Submit(std::move(fallback));
        }
      }
      if (id.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        running_[*id] = s.channel;
      }
      {
        std::lock_guard<std::mutex> lock(s.channel->mu);
        s.channel->submitted = true;
        s.channel->submit_status = id.status();
        if (id.ok()) s.channel->sequence_id = *id;
        s.channel->cache_rejected = rejected;
      }
      s.channel->cv.notify_all();
    }
    for (const PendingCancel& c : cancels) scheduler.Cancel(c.sequence_id, c.reason);

    events.clear();
    if (!scheduler.idle()) {
      const absl::Time step_start = absl::Now();
      const absl::Status status = scheduler.Step(&events);
      const int64_t micros = absl::ToInt64Microseconds(absl::Now() - step_start);
      const int64_t before = step_micros_.load(std::memory_order_relaxed);
      step_micros_.store(before == 0 ? micros : (4 * before + micros) / 5,
                         std::memory_order_relaxed);
      if (!status.ok()) {
        // The step's sequences are in an unknown state: end them all with an error.
        fprintf(stderr, "kvstrata-decode: engine step failed: %s\n", status.ToString().c_str());
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, channel] : running_) {
          scheduler.Cancel(id, engine::FinishReason::kError);
        }
      }
    }
    for (engine::GenerationEvent& e : events) {
      std::shared_ptr<RequestChannel> channel;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = running_.find(e.sequence_id);
        if (it == running_.end()) continue;
        channel = it->second;
        if (e.finish != engine::FinishReason::kNone) running_.erase(it);
      }
      if (e.token >= 0) generated_tokens_.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(channel->mu);
        channel->events.push_back(std::move(e));
      }
      channel->cv.notify_all();
    }
    kv_bytes_in_use_.store(engine_->KvBytesInUse());
    active_sequences_.store(scheduler.running() + scheduler.waiting());
    scheduler_waiting_.store(scheduler.waiting());
    scheduler_running_.store(scheduler.running());
    {
      // Free pages of the pool that bounds how many tokens fit: INT2 history for split
      // formats, BF16 otherwise.
      const engine::KvCache& cache = engine_->cache();
      free_pages_.store(cache.int2_pool() != nullptr ? cache.free_int2_slots()
                                                     : cache.free_bf16_slots());
    }
    metrics_->kv_cache_used_bytes.Get().Set(static_cast<double>(kv_bytes_in_use_.load()));
    metrics_->kv_cache_free_pages.Get().Set(static_cast<double>(free_pages_.load()));
    metrics_->running.Get().Set(scheduler.running());
    {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_->waiting.Get().Set(scheduler.waiting() + static_cast<double>(submits_.size()));
    }
  }
}

v1::RegisterWorkerRequest DecodeService::WorkerDescription(const std::string& address) const {
  v1::RegisterWorkerRequest r;
  r.set_worker_id(options_.worker_id);
  r.set_address(address);
  r.set_model(options_.model_name);
  r.set_model_fingerprint(model_fingerprint_);
  *r.mutable_kv_format() = kv_format_proto_;
  r.set_capacity_pages(static_cast<uint64_t>(std::max<int64_t>(1, total_pages_.load())));
  r.set_max_running_requests(static_cast<uint32_t>(max_running_));
  r.set_server_version(kServerVersion);
  r.set_tokenizer(tokenizer_identity_);
  r.set_local_page_capacity_bytes(
      static_cast<uint64_t>(local_pages_ != nullptr ? options_.local_cache_bytes : 0));
  *r.mutable_limits() = Limits();
  // Only when this worker asks kvstores for their pool: otherwise a store on its GPU would
  // still send pages by gRPC, and the router must not count them as near.
  if (same_gpu_ != nullptr && same_gpu_->enabled()) r.set_same_gpu_uuid(same_gpu_->gpu_uuid());
  return r;
}

v1::RequestLimits DecodeService::Limits() const {
  v1::RequestLimits l;
  l.set_max_context_tokens(static_cast<uint32_t>(max_context_));
  l.set_max_n(1);
  l.set_max_stop_strings(kMaxStopStrings);
  l.set_max_logprobs_top_n(static_cast<uint32_t>(options_.max_logprobs_top_n));
  for (int32_t id : eos_token_ids_) l.add_eos_token_ids(static_cast<uint32_t>(id));
  return l;
}

WorkerLoadSample DecodeService::LoadSample() const {
  WorkerLoadSample s;
  s.running_requests = scheduler_running_.load();
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.waiting_requests = scheduler_waiting_.load() + static_cast<int>(submits_.size());
  }
  s.free_pages = free_pages_.load();
  s.total_pages = total_pages_.load();
  s.generated_tokens = generated_tokens_.load();
  s.prefilled_tokens = prefilled_tokens_.load();
  return s;
}

struct DecodeService::Call {
  Call(const v1::GenerateRequest& r, absl::Time deadline) : request(r), deadline(deadline) {}

  const v1::GenerateRequest& request;
  const absl::Time start = absl::Now();
  const absl::Time deadline;  // the client's; InfiniteFuture when it set none
  std::string request_id;
  engine::GenerationRequest engine_request;  // moved to the engine at submit
  int prompt_tokens = 0;
  PageKey namespace_key;
  std::vector<PageKey> keys;  // the prompt's cacheable pages
  int local_pages = 0;        // leading pages taken from the local tier
  int kvstore_pages = 0;      // the pages after them fetched from the kvstore
  absl::Duration fetch_time;
  std::shared_ptr<RequestChannel> channel;
  std::shared_ptr<Prefilling> prefilling;
  // Holds the kvstore lease of pages the engine reads from a same-GPU pool, for the call's life.
  std::shared_ptr<void> kvstore_lease;
  uint64_t sequence_id = 0;
  absl::Time submitted;
  // What has been streamed so far.
  int generated = 0;
  int cached_tokens = 0;  // as the engine's events report it
  int recent_window_from_int2_pages = 0;
  int64_t prompt_pages_shared = 0;  // prompt pages published right after prefill
  absl::Time first_token = absl::InfiniteFuture();
  absl::Time last_token = absl::InfinitePast();
};

absl::Status DecodeService::BuildEngineRequest(Call& call) const {
  const v1::GenerateRequest& request = call.request;
  if (absl::Status s = ValidateRequest(request, options_.max_logprobs_top_n); !s.ok()) return s;
  if (!request.model().empty() && request.model() != options_.model_name) {
    return absl::NotFoundError(absl::StrCat("model: '", request.model(),
                                            "' is not served here (serving '",
                                            options_.model_name, "')"));
  }
  // Tokenise. The tokenizer and chat template are immutable (safe beside the engine thread).
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptTokens(request, engine_->prompt_encoder(), vocab_size_);
  if (!prompt.ok()) return prompt.status();
  call.prompt_tokens = static_cast<int>(prompt->size());
  if (absl::Status s =
          CheckContextLimit(call.prompt_tokens, request.stop().max_tokens(), max_context_);
      !s.ok()) {
    return s;
  }
  engine::GenerationRequest& g = call.engine_request;
  g.prompt = *std::move(prompt);
  const v1::SamplingParams& sp = request.sampling();
  g.sampling.temperature = sp.has_temperature() ? sp.temperature() : 1.0f;
  g.sampling.top_p = sp.top_p() == 0 ? 1.0f : sp.top_p();
  g.sampling.top_k = static_cast<int>(sp.top_k());
  g.sampling.min_p = sp.min_p();
  g.sampling.repetition_penalty = sp.repetition_penalty() == 0 ? 1.0f : sp.repetition_penalty();
  g.sampling.frequency_penalty = sp.frequency_penalty();
  g.sampling.presence_penalty = sp.presence_penalty();
  if (sp.has_seed()) g.sampling.seed = sp.seed();
  if (request.has_logprobs()) {
    g.sampling.top_logprobs = static_cast<int>(request.logprobs().top_n());
  }
  const int max_tokens = static_cast<int>(request.stop().max_tokens());
  g.stop.max_tokens = max_tokens == 0 ? max_context_ - call.prompt_tokens : max_tokens;
  g.stop.min_tokens = static_cast<int>(request.stop().min_tokens());
  g.stop.ignore_eos = request.stop().ignore_eos();
  g.stop.include_stop_string = request.stop().include_stop_str_in_output();
  for (const std::string& s : request.stop().stop_strings()) g.stop.stop_strings.push_back(s);
  for (int i = 0; i < request.stop().stop_token_ids_size(); ++i) {
    const uint32_t id = request.stop().stop_token_ids(i);
    if (id >= static_cast<uint32_t>(vocab_size_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop.stop_token_ids[", i, "]=", id, " is outside the vocabulary"));
    }
    g.stop.stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  if (absl::Status s = engine::ValidateSamplingOptions(g.sampling); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", s.message()));
  }
  if (absl::Status s = engine::ValidateStopOptions(g.stop, vocab_size_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("stop: ", s.message()));
  }
  g.publish_pages = ring_ != nullptr || local_pages_ != nullptr;
  return absl::OkStatus();
}

absl::StatusOr<PageKey> DecodeService::NamespaceKey(const std::string& cache_salt) {
  // Made on the engine thread: PageNamespace is not safe beside Step.
  auto promise = std::make_shared<std::promise<absl::StatusOr<PageKey>>>();
  std::future<absl::StatusOr<PageKey>> future = promise->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    tasks_.push_back(
        [this, promise, cache_salt] { promise->set_value(engine_->PageNamespace(cache_salt)); });
  }
  engine_cv_.notify_all();
  return future.get();
}

std::vector<PageKey> DecodeService::PromptPageKeys(const Call& call) const {
  // At most (prompt - 1) / P full pages: one token is left to prefill so the first token has
  // logits.
  const int cacheable_pages = (call.prompt_tokens - 1) / page_tokens_;
  std::vector<PageKey> keys;
  const v1::RoutingHints& routing = call.request.routing();
  if (routing.prefix_page_keys_size() > 0) {
    for (int i = 0; i < routing.prefix_page_keys_size() && i < cacheable_pages; ++i) {
      keys.push_back(*PageKey::FromBytes(routing.prefix_page_keys(i)));  // validated
    }
    return keys;
  }
  const std::vector<int32_t>& prompt = call.engine_request.prompt;
  PageKey parent = call.namespace_key;
  std::vector<uint32_t> page(page_tokens_);
  for (int p = 0; p < cacheable_pages; ++p) {
    for (int t = 0; t < page_tokens_; ++t) {
      page[t] = static_cast<uint32_t>(prompt[p * page_tokens_ + t]);
    }
    parent = ChainPageKey(parent, page);
    keys.push_back(parent);
  }
  return keys;
}

void DecodeService::TakeCachedPrefix(Call& call, const std::function<bool()>& cancelled) {
  // The leading run held locally (after waiting for a request on this worker that is computing
  // more of it), then the kvstore for the pages right after it. A page held only as BF16 (it was
  // in a recent window) that is history at the imported length is demoted by the engine on
  // import, exactly as the sequence would have done.
  std::vector<std::string>& pages = call.engine_request.cached_pages;
  for (LocalPage& page : LocalPrefix(call.request_id, call.keys, call.deadline, cancelled,
                                     &call.prefilling)) {
    pages.push_back(std::move(page.bytes));
  }
  call.local_pages = static_cast<int>(pages.size());
  const absl::Time fetch_start = absl::Now();
  FetchedPrefix fetched = FetchCachedPrefix(call.request_id, call.namespace_key, call.keys,
                                            pages.size(), call.deadline);
  call.kvstore_pages = static_cast<int>(fetched.size());
  for (std::string& page : fetched.pages) pages.push_back(std::move(page));
  call.engine_request.device_cached_pages = std::move(fetched.device_pages);
  call.engine_request.cached_pages_owner = std::move(fetched.device_pages_owner);
  call.kvstore_lease = std::move(fetched.lease);
  call.fetch_time = absl::Now() - fetch_start;
}

absl::Status DecodeService::SubmitAndWait(Call& call) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int>(submits_.size()) + scheduler_waiting_.load() >=
        options_.max_queued_requests) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the queue is full (max_queued_requests=", options_.max_queued_requests, ")"));
    }
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    submits_.push_back({std::move(call.engine_request), call.channel});
  }
  engine_cv_.notify_all();
  std::unique_lock<std::mutex> lock(call.channel->mu);
  call.channel->cv.wait(lock, [&] { return call.channel->submitted; });
  if (!call.channel->submit_status.ok()) return call.channel->submit_status;
  call.submitted = absl::Now();
  call.sequence_id = call.channel->sequence_id;
  metrics_->queue_time.Get().Observe(
      absl::ToDoubleSeconds(call.submitted - call.start - call.fetch_time));
  return absl::OkStatus();
}

void DecodeService::FillUsage(const Call& call, v1::GenerateResponse& m) const {
  // The engine imports the pages in order, local run first; when it refused them it imported
  // none and cached is 0.
  const int cached = call.cached_tokens;
  const int fetched_tokens = (call.local_pages + call.kvstore_pages) * page_tokens_;
  const int cached_local = std::min(cached, call.local_pages * page_tokens_);
  const int recomputed = std::max(0, fetched_tokens - cached);
  v1::Usage* usage = m.mutable_usage();
  usage->set_prompt_tokens(call.prompt_tokens);
  usage->set_completion_tokens(call.generated);
  usage->set_cached_local_tokens(cached_local);
  usage->set_cached_kvstore_tokens(cached - cached_local);
  usage->set_recomputed_tokens(recomputed);
  usage->set_uncached_tokens(std::max(0, call.prompt_tokens - cached - recomputed));
  usage->set_inexact_recent_window_tokens(call.recent_window_from_int2_pages * page_tokens_);
  usage->set_predicted_cached_tokens(call.request.routing().predicted_local_cached_tokens() +
                                     call.request.routing().predicted_kvstore_cached_tokens());
  const absl::Time end = absl::Now();
  v1::Timings* t = m.mutable_timings();
  t->set_queue_us(Micros(call.submitted - call.start - call.fetch_time));
  t->set_kvstore_fetch_us(Micros(call.fetch_time));
  if (call.first_token != absl::InfiniteFuture()) {
    t->set_prefill_us(Micros(call.first_token - call.submitted));
    t->set_time_to_first_token_us(Micros(call.first_token - call.start));
    t->set_decode_us(Micros(call.last_token - call.first_token));
  }
  t->set_total_us(Micros(end - call.start));
  m.set_worker_id(options_.worker_id);
}

void DecodeService::CountFinished(const Call& call, v1::FinishReason reason) {
  const int cached_local = std::min(call.cached_tokens, call.local_pages * page_tokens_);
  metrics_->requests.With({v1::FinishReason_Name(reason)}).Increment();
  metrics_->prompt_tokens.With({"local"}).Increment(cached_local);
  metrics_->prompt_tokens.With({"kvstore"}).Increment(call.cached_tokens - cached_local);
  metrics_->prompt_tokens.With({"none"}).Increment(call.prompt_tokens - call.cached_tokens);
  metrics_->generated_tokens.Get().Increment(call.generated);
  prefilled_tokens_.fetch_add(std::max(0, call.prompt_tokens - call.cached_tokens));
  metrics_->e2e.Get().Observe(absl::ToDoubleSeconds(absl::Now() - call.start));
}

grpc::Status DecodeService::ServeGenerate(grpc::ServerContext* context,
                                          const v1::GenerateRequest& request,
                                          GenerateWriter* writer) {
  if (options_.authorizer != nullptr) {
    if (grpc::Status s = options_.authorizer->Require(*context, "Generate", rpc::PeerRole::kRouter);
        !s.ok()) {
      return s;
    }
  }
  auto reject = [&](const absl::Status& status) {
    metrics_->rejected.With({absl::StatusCodeToString(status.code())}).Increment();
    return rpc::ToGrpcStatus(status);
  };
  Call call(request, ClientDeadline(*context));
  if (absl::Status s = BuildEngineRequest(call); !s.ok()) return reject(s);

  // Register the request id (ALREADY_EXISTS for a duplicate in flight).
  call.channel = std::make_shared<RequestChannel>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    call.request_id = request.request_id().empty()
                          ? absl::StrCat(options_.worker_id, "-", next_request_number_++)
                          : request.request_id();
    if (!in_flight_.emplace(call.request_id, call.channel).second) {
      return reject(absl::AlreadyExistsError(
          absl::StrCat("request_id: '", call.request_id, "' is in flight")));
    }
  }
  call.channel->request_id = call.request_id;
  call.engine_request.request_id = call.request_id;
  struct Unregister {
    DecodeService* service;
    Call* call;
    ~Unregister() {
      service->EndPrefilling(call->prefilling);
      std::lock_guard<std::mutex> lock(service->mu_);
      service->in_flight_.erase(call->request_id);
    }
  } unregister{this, &call};

  absl::StatusOr<PageKey> ns = NamespaceKey(request.cache_salt());
  if (!ns.ok()) return reject(ns.status());
  call.namespace_key = call.engine_request.namespace_key = *ns;
  call.keys = PromptPageKeys(call);
  TakeCachedPrefix(call, [context] { return context->IsCancelled(); });
  // A client that left while the prefix was gathered gets nothing computed.
  if (context->IsCancelled()) return reject(absl::CancelledError("the client went away"));
  if (absl::Status s = SubmitAndWait(call); !s.ok()) return reject(s);
  return Stream(context, call, writer);
}

grpc::Status DecodeService::Stream(grpc::ServerContext* context, Call& call,
                                   GenerateWriter* writer) {
  const v1::GenerateRequest& request = call.request;
  const uint32_t interval = std::max<uint32_t>(1, request.stream_interval());
  v1::GenerateResponse pending;
  pending.set_request_id(call.request_id);
  pending.set_worker_id(options_.worker_id);
  int pending_tokens = 0;
  bool client_gone = false;
  bool cancel_sent = false, deadline_cancel = false;
  auto write = [&](v1::GenerateResponse& m) {
    if (!client_gone && !writer->Write(m)) client_gone = true;
    m.Clear();
    m.set_request_id(call.request_id);
    pending_tokens = 0;
  };
  // The final message must leave deadline_margin before the client's deadline. The engine is
  // asked to stop early enough for the step in progress and the next to finish; if its final
  // event is still missing at the margin, the stream ends here with what was streamed.
  const absl::Duration step = std::min(absl::Seconds(1), StepEstimate());
  const absl::Time give_up_at = call.deadline - options_.deadline_margin;
  const absl::Time cancel_at = give_up_at - 2 * step;
  for (;;) {
    std::deque<engine::GenerationEvent> events;
    {
      const absl::Time wake =
          std::min(absl::Now() + absl::Milliseconds(20), cancel_sent ? give_up_at : cancel_at);
      std::unique_lock<std::mutex> lock(call.channel->mu);
      call.channel->cv.wait_until(lock, absl::ToChronoTime(wake),
                                  [&] { return !call.channel->events.empty(); });
      events.swap(call.channel->events);
    }
    for (engine::GenerationEvent& e : events) {
      call.cached_tokens = e.cached_tokens;
      call.recent_window_from_int2_pages = e.recent_window_from_int2_pages;
      if (e.token >= 0) {
        const absl::Time now = absl::Now();
        if (call.first_token == absl::InfiniteFuture()) {
          call.first_token = now;
          metrics_->ttft.Get().Observe(absl::ToDoubleSeconds(now - call.start));
        } else {
          metrics_->inter_token.Get().Observe(absl::ToDoubleSeconds(now - call.last_token));
        }
        call.last_token = now;
        ++call.generated;
        pending.add_token_ids(static_cast<uint32_t>(e.token));
        if (request.has_logprobs()) {
          v1::TokenLogprob* lp = pending.add_logprobs();
          lp->set_token_id(static_cast<uint32_t>(e.token));
          lp->set_logprob(e.logprob);
          for (const auto& [id, logprob] : e.top_logprobs) {
            v1::TopLogprob* t = lp->add_top();
            t->set_token_id(static_cast<uint32_t>(id));
            t->set_logprob(logprob);
          }
        }
        ++pending_tokens;
      }
      if (!e.prompt_pages.empty()) {
        // Prefill is done: share the prompt's pages now, with requests waiting on this worker
        // and through the kvstore, rather than when this one finishes.
        StoreLocal(call.request_id, e.prompt_pages);
        EndPrefilling(call.prefilling);
        for (const engine::ExportedPage& p : e.prompt_pages) {
          call.prompt_pages_shared = std::max(call.prompt_pages_shared, p.page_index + 1);
        }
        if (ring_ != nullptr) {
          QueuePublish({call.request_id, call.namespace_key, std::move(e.prompt_pages)});
        }
      }
      pending.mutable_text()->append(e.text);
      if (e.finish == engine::FinishReason::kNone) {
        if (pending_tokens >= static_cast<int>(interval)) write(pending);
        continue;
      }
      // The engine's last event for the sequence.
      StoreLocal(call.request_id, e.published_pages);
      EndPrefilling(call.prefilling);
      if (!e.published_pages.empty() && ring_ != nullptr) {
        QueuePublish({call.request_id, call.namespace_key, std::move(e.published_pages),
                      call.prompt_pages_shared});
      }
      if (e.finish == engine::FinishReason::kDeadline && call.generated == 0) {
        return EndBeforeFirstToken(call);
      }
      pending.set_finish_reason(ToProto(e.finish));
      if (e.finish == engine::FinishReason::kStopString) pending.set_matched_stop(e.matched_stop);
      if (e.finish == engine::FinishReason::kError) {
        pending.mutable_error()->set_code(grpc::StatusCode::INTERNAL);
        pending.mutable_error()->set_message("the engine failed while generating");
      }
      FillUsage(call, pending);
      write(pending);
      CountFinished(call, ToProto(e.finish));
      if (client_gone || context->IsCancelled()) return grpc::Status::CANCELLED;
      if (e.finish == engine::FinishReason::kError) {
        return grpc::Status(grpc::StatusCode::INTERNAL, "the engine failed while generating");
      }
      return grpc::Status::OK;
    }
    const absl::Time now = absl::Now();
    if (deadline_cancel && now >= give_up_at) {
      // The engine is still in a step: end the stream without its final event.
      if (call.generated == 0) return EndBeforeFirstToken(call);
      fprintf(stderr,
              "kvstrata-decode: request %s (sequence %llu): the engine had not stopped by the "
              "deadline margin; ending the stream after %d tokens\n",
              call.request_id.c_str(), static_cast<unsigned long long>(call.sequence_id),
              call.generated);
      pending.set_finish_reason(v1::FINISH_REASON_DEADLINE);
      FillUsage(call, pending);
      write(pending);
      CountFinished(call, v1::FINISH_REASON_DEADLINE);
      return client_gone ? grpc::Status::CANCELLED : grpc::Status::OK;
    }
    if (cancel_sent) continue;
    if (now >= cancel_at) {
      RequestCancel(call.sequence_id, engine::FinishReason::kDeadline);
      cancel_sent = deadline_cancel = true;
    } else if (client_gone || context->IsCancelled()) {
      fprintf(stderr, "kvstrata-decode: request %s (sequence %llu): client went away, cancelling\n",
              call.request_id.c_str(), static_cast<unsigned long long>(call.sequence_id));
      client_gone = true;
      RequestCancel(call.sequence_id, engine::FinishReason::kCancelled);
      cancel_sent = true;
    } else if (call.channel->abort_requested.load()) {
      RequestCancel(call.sequence_id, engine::FinishReason::kCancelled);
      cancel_sent = true;
    }
  }
}

grpc::Status DecodeService::EndBeforeFirstToken(const Call& call) {
  metrics_->rejected.With({absl::StatusCodeToString(absl::StatusCode::kDeadlineExceeded)})
      .Increment();
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      absl::StrCat("the deadline passed before the first token (prompt ",
                                   call.prompt_tokens, " tokens, ",
                                   call.prompt_tokens - call.cached_tokens, " to prefill)"));
}

grpc::Status DecodeService::RejectUnparseable(grpc::ServerContext* context,
                                              const absl::Status& status) {
  metrics_->rejected.With({absl::StatusCodeToString(status.code())}).Increment();
  fprintf(stderr, "kvstrata-decode: refused a Generate request from %s: %s\n",
          context->peer().c_str(), std::string(status.message()).c_str());
  return rpc::ToGrpcStatus(status);
}

grpc::Status DecodeService::Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) {
  if (options_.authorizer != nullptr) {
    if (grpc::Status s = options_.authorizer->Require(*context, "Abort", rpc::PeerRole::kRouter);
        !s.ok()) {
      return s;
    }
  }
  if (request->request_id().empty()) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("request_id: must not be empty"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find(request->request_id());
  if (it == in_flight_.end()) {
    response->set_found(false);
    return grpc::Status::OK;
  }
  fprintf(stderr, "kvstrata-decode: request %s: abort (%s)\n", request->request_id().c_str(),
          request->reason().c_str());
  response->set_found(!it->second->abort_requested.exchange(true));
  return grpc::Status::OK;
}

grpc::Status DecodeService::GetServerInfo(grpc::ServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) {
  response->set_role("worker");
  response->set_server_version(kServerVersion);
  response->set_tokenizer(tokenizer_identity_);
  response->set_api_version("kvstrata.v1");
  response->set_model(options_.model_name);
  response->set_model_fingerprint(model_fingerprint_);
  response->set_vocab_size(static_cast<uint32_t>(vocab_size_));
  response->set_has_chat_template(has_chat_template_);
  *response->mutable_kv_format() = kv_format_proto_;
  const v1::RequestLimits limits = Limits();
  response->set_max_context_tokens(limits.max_context_tokens());
  response->set_max_n(limits.max_n());
  response->set_max_stop_strings(limits.max_stop_strings());
  response->set_max_logprobs_top_n(limits.max_logprobs_top_n());
  *response->mutable_eos_token_ids() = limits.eos_token_ids();
  response->set_max_request_bytes(
      static_cast<uint32_t>(std::min<int64_t>(options_.max_request_bytes, UINT32_MAX)));
  response->set_max_queued_requests(static_cast<uint32_t>(options_.max_queued_requests));
  return grpc::Status::OK;
}

}  // namespace kvstrata::decode

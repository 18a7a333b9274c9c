// DecodeService itself: construction (the kvstore ring, the same-GPU and NCCL transports, the
// engine and publisher threads), shutdown, and what the worker reports about itself
// (registration, load, limits, GetServerInfo). Generate and Abort are in decode_generate.cc,
// the stream in decode_stream.cc, the engine thread in decode_engine_loop.cc and the page paths
// in decode_pages.cc.

#include "services/decode/decode_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/escaping.h"
#include "services/decode/decode_internal.h"
#include "services/decode/request_validation.h"

#ifdef KVSTRATA_HAVE_CUDA
#include "engine/cuda/device_page_memory.h"
#endif

namespace kvstrata::decode {

namespace {

constexpr char kServerVersion[] = "0.1.0";

v1::KvQuantization Quantization(engine::KvCacheFormat format) {
  switch (format) {
    case engine::KvCacheFormat::kBf16:
      return v1::KV_QUANTIZATION_BF16;
    case engine::KvCacheFormat::kInt2:
      return v1::KV_QUANTIZATION_INT2_UNIFORM;
    case engine::KvCacheFormat::kInt2LloydMax:
      return v1::KV_QUANTIZATION_INT2_LLOYD_MAX;
    case engine::KvCacheFormat::kCodec:
      return v1::KV_QUANTIZATION_CODEC;
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
  f.set_history_bits_per_element(
      engine::HistoryBitsPerElement(format, g, cache.options().codec.get()));
  if (cache.split()) {
    f.set_sink_tokens(static_cast<uint32_t>(layout.sink_tokens));
    f.set_recent_window_tokens(static_cast<uint32_t>(layout.recent_tokens));
    if (format != engine::KvCacheFormat::kCodec) {
      f.set_group_size(static_cast<uint32_t>(g.group_size));
    }
    f.set_int2_page_bytes(static_cast<uint64_t>(cache.history_page_bytes()));
  }
  const std::string& digest = engine.rotations().digest;
  if (!digest.empty() && digest != "identity")
    f.set_rotation_digest(absl::HexStringToBytes(digest));
  return f;
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
    engine::DevicePageAccess* access = engine_->backend().device_page_access();
    SameGpuPools::MapShared map;
    if (access != nullptr) {
      map = [access](int fd, int64_t bytes) { return access->MapShared(fd, bytes); };
    }
    same_gpu_ = std::make_unique<SameGpuPools>(same_gpu_off ? -1 : options_.same_gpu_device,
                                               engine_->cache().int2_encoding(), std::move(map),
                                               /*hold=*/options_.same_gpu_in_place);
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
        // A communicator with every store of the ring, made now in the background rather than
        // when a request first finds a prefix there (a store on this GPU declines).
        for (kvstore::KvStoreClient* client : ring_->Clients()) nccl_->Prepare(client);
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

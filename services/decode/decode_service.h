#pragma once

// kvstrata.v1.Generation (proto/kvstrata/v1/generate.proto) on one Engine, with the sync gRPC
// API. One engine thread owns the Engine and runs Scheduler::Step in a loop; RPC handler threads
// never touch it: they hand requests and cancellations to the engine thread through a queue and
// receive their events through a per-request channel (mutex + condition variable).
//
// Per Generate: validate (INVALID_ARGUMENT naming the field), tokenise, compute the prompt's page
// keys in the request's namespace, take the leading run of them held in the local page tier
// (LocalPageCache, host memory), then ask the kvstore (if any) for the longest cached prefix and
// fetch the pages beyond the local run within the client's deadlines (any store error is a
// miss, never a failed request), submit with those pages (resubmitting without them if the
// engine rejects them), stream tokens, and end with finish reason, Usage (cached tokens split by
// tier) and Timings. The finished sequence's pages go into the local tier, and are published to
// the kvstore from a background thread so the stream is not delayed.
//
// Thread-safety: gRPC calls the handlers concurrently; everything shared is behind mu_, in the
// (internally locked) local tier, or in the engine thread. Limits: n = 1, no prompt logprobs.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "core/metrics.h"
#include "engine/engine.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "rpc/peer_auth.h"
#include "services/common/generation_service.h"
#include "services/decode/local_pages.h"
#include "services/decode/registration.h"
#include "services/decode/nccl_peers.h"
#include "services/decode/same_gpu_pools.h"
#include "services/kvstore/client.h"

namespace kvstrata::decode {

struct DecodeServiceOptions {
  // Reported as worker_id; also the model's name when model_name is empty ("" = "kvstrata").
  std::string worker_id = "decode-0";
  // The model name GenerateRequest.model must match (empty in a request: this model).
  std::string model_name = "default";
  // kvstore addresses behind a consistent-hash ring; empty = no kvstore (every prefix a miss).
  std::vector<std::string> kvstore_addresses;
  kvstore::KvStoreClientOptions kvstore_client;
  // The CUDA device the engine runs on, or -1: with a device, kvstores on the same GPU are asked
  // for the same-GPU transport (their HBM pool mapped here, pages copied GPU to GPU).
  int same_gpu_device = -1;
  // With page MACs (kvstore_client.page_mac_keys) the same-GPU transport is off: its pages are
  // checked by digest, which whoever can write the store's pool could forge. True keeps it on,
  // trusting the kvstore on this GPU (one that shares this host and a socket folder with the
  // worker: in Kubernetes, the one in the worker's pod); pages by gRPC are MAC-checked still.
  bool same_gpu_with_page_macs = false;
  // Same-GPU prefixes: INT2 history pages read where they lie in the store's pool for the whole
  // request (the lease held by the worker's pool connection), else copied into the engine's
  // own cache (--same_gpu_pages).
  bool same_gpu_in_place = true;
  // TRANSPORT_NCCL to kvstores on other GPUs: the runtime (borrowed; transport::SystemNccl(),
  // or a fake in tests) and this worker's GPU; null or -1: not offered. Off with page MACs,
  // like the same-GPU transport (digests, not MACs, check its pages).
  transport::NcclRuntime* nccl_runtime = nullptr;
  int nccl_device = -1;
  // The worker GPU's "GPU-..." id; empty: asked of CUDA for nccl_device.
  std::string nccl_gpu_uuid;
  // Per kvstore: the receive slab on the worker's GPU, the largest prefix taken over NCCL.
  uint64_t nccl_receive_bytes = uint64_t{1} << 30;
  // The longest a fetch waits for an NCCL transfer's bytes, whatever the store says (the
  // request's deadline may end it sooner); past it the transfer is a miss.
  absl::Duration nccl_receive_timeout = absl::Seconds(5);
  // Capacity of the local page tier in bytes; 0 = no local tier.
  int64_t local_cache_bytes = int64_t{256} << 20;
  // Requests waiting for the engine (queued here plus waiting in the scheduler) before Generate
  // answers RESOURCE_EXHAUSTED.
  int max_queued_requests = 64;
  // Largest LogprobOptions.top_n accepted.
  int max_logprobs_top_n = 20;
  // A stream's final message leaves at least this long before the client's deadline (finish
  // reason DEADLINE once output began, DEADLINE_EXCEEDED before).
  absl::Duration deadline_margin = absl::Milliseconds(30);
  // Largest request message accepted (the gRPC server's receive limit, set by main); reported in
  // GetServerInfo.
  int64_t max_request_bytes = int64_t{64} << 20;
  // Who may call: Generate and Abort need the router role (rpc/peer_auth.h), so tenants are
  // bound by the router and no client reaches a worker directly. Borrowed; null: anyone.
  const rpc::PeerAuthorizer* authorizer = nullptr;
};

class DecodeMetrics;
struct RequestChannel;

class DecodeService final : public GenerationService {
 public:
  // Takes the engine; `registry` is borrowed and must outlive the service. Starts the engine and
  // publisher threads.
  DecodeService(std::unique_ptr<engine::Engine> engine, const DecodeServiceOptions& options,
                MetricsRegistry* registry);
  // Cancels what is running, then stops the threads (pending publishes are finished first).
  ~DecodeService() override;

  grpc::Status ServeGenerate(grpc::ServerContext* context, const v1::GenerateRequest& request,
                             GenerateWriter* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

  // Bytes of KV page slots in use, as of the engine thread's last step (thread-safe snapshot).
  int64_t KvBytesInUse() const { return kv_bytes_in_use_.load(); }
  // Sequences running or waiting in the scheduler, as of the last step.
  int ActiveSequences() const { return active_sequences_.load(); }
  // Blocks until every publish queued so far has been sent (or failed). For tests and shutdown.
  void WaitForPublishes();

  // The local page tier; null when local_cache_bytes is 0.
  LocalPageCache* local_pages() { return local_pages_.get(); }
  // The load reported to the router (thread-safe; as of the engine thread's last step).
  WorkerLoadSample LoadSample() const;
  // What registration and GetServerInfo say about this worker's KV cache: every KvFormat field
  // the engine knows, rotation_digest as 32 raw bytes (empty for identity rotations). With the
  // model fingerprint it lets a router reproduce Engine::PageNamespace (docs/hashing.md).
  const v1::KvFormat& kv_format() const { return kv_format_proto_; }
  const std::string& model_fingerprint() const { return model_fingerprint_; }
  int64_t capacity_pages() const { return total_pages_.load(); }
  int max_running_requests() const { return max_running_; }
  // RegisterWorker's fields for this worker served at `address` (all but incarnation and
  // local_page_keys, which RouterRegistration fills).
  v1::RegisterWorkerRequest WorkerDescription(const std::string& address) const;
  // The limits this worker enforces, as GetServerInfo and the registration report them.
  v1::RequestLimits Limits() const;

 protected:
  grpc::Status RejectUnparseable(grpc::ServerContext* context,
                                 const absl::Status& status) override;

 private:
  struct Call;
  // The steps of a Generate call, in order.
  // Validates the request (INVALID_ARGUMENT naming the field), tokenises it, checks the context
  // limit and fills call.engine_request.
  absl::Status BuildEngineRequest(Call& call) const;
  // The radix-hash root for a cache salt, made on the engine thread.
  absl::StatusOr<PageKey> NamespaceKey(const std::string& cache_salt);
  // The router's page keys, or the prompt's hashed here.
  std::vector<PageKey> PromptPageKeys(const Call& call) const;
  // The cached prefix: the local tier's leading run, then the kvstore's pages after it. Stops
  // waiting for another request's pages once `cancelled` says the client went away.
  void TakeCachedPrefix(Call& call, const std::function<bool()>& cancelled);
  absl::Status SubmitAndWait(Call& call);
  // Relays the engine's events until the sequence ends (or the deadline margin is reached).
  grpc::Status Stream(grpc::ServerContext* context, Call& call, GenerateWriter* writer);
  void FillUsage(const Call& call, v1::GenerateResponse& m) const;
  void CountFinished(const Call& call, v1::FinishReason reason);
  grpc::Status EndBeforeFirstToken(const Call& call);
  // Recent engine step time (an exponential average), for ending streams before deadlines.
  absl::Duration StepEstimate() const {
    return absl::Microseconds(step_micros_.load(std::memory_order_relaxed));
  }

  struct PendingSubmit {
    engine::GenerationRequest request;
    std::shared_ptr<RequestChannel> channel;
  };
  struct PendingCancel {
    uint64_t sequence_id;
    engine::FinishReason reason;
  };
  struct PublishJob {
    std::string request_id;
    PageKey namespace_key;
    std::vector<engine::ExportedPage> pages;
    // Pages with a smaller index were published already (with the prompt's pages right after
    // prefill): they only give the parent links.
    int64_t skip_before_index = 0;
  };
  // A request computing prompt pages beyond what it found cached: requests on this worker that
  // need the same pages wait for them instead of computing them again.
  struct Prefilling {
    std::vector<PageKey> keys;  // the request's cacheable page keys
  };

  void EngineLoop();
  void PublishLoop();
  // The pages keys[skip..n) where keys[0..n) is the longest prefix the kvstore holds, fetched;
  // empty on a miss, a store error or n <= skip. The lookup is always of the whole list: a
  // chain lives on the node chosen by its first key and is anchored at page 0.
  struct FetchedPrefix {
    std::vector<std::string> pages;                // by gRPC
    std::vector<engine::DevicePage> device_pages;  // or in a same-GPU kvstore's pool, or NCCL's
    std::shared_ptr<void> lease;                   // released when the last holder lets go
    // NCCL: the lane whose receive slab device_pages lie in, for the engine to let go of once
    // it has copied them into the sequence's slots (GenerationRequest::cached_pages_owner).
    std::shared_ptr<void> device_pages_owner;
    // Same-GPU pool pages the engine may read in place (GenerationRequest::in_place_hold): the
    // lease, held by this worker's pool connection, and the pool's mapping.
    std::shared_ptr<void> in_place_hold;
    size_t size() const { return pages.size() + device_pages.size(); }
  };
  // `deadline` is the request's: no wait for the bytes goes past it.
  FetchedPrefix FetchCachedPrefix(const std::string& request_id, const PageKey& namespace_key,
                                  const std::vector<PageKey>& keys, size_t skip,
                                  absl::Time deadline);
  // The same-GPU pool's pages for `keys` (primary forms, consecutive pages of one chain), under
  // `lease_id`; nullopt when the store answers another transport or anything fails (then
  // Fetch). `first_parent` is the parent of keys[0]'s page, whose index is `first_index`.
  // With `lane`, TRANSPORT_NCCL is offered too (after the pool, before the byte stream), and
  // `used` tells which transport the pages came by; an NCCL transfer that fails, or whose bytes
  // are not in by `deadline` (the request's) or the worker's --nccl_receive_timeout_ms, sets
  // *miss (the caller then fetches nothing: the prefix is computed).
  // A same-GPU answer whose lease the store holds by this worker's pool connection leaves its
  // pool's mapping in *in_place_mapping (for GenerationRequest::in_place_hold).
  std::optional<std::vector<engine::DevicePage>> OpenSameGpuTransfer(
      kvstore::KvStoreClient* client, const std::string& request_id, std::span<const PageKey> keys,
      const PageKey& first_parent, int64_t first_index, uint64_t lease_id, absl::Time deadline,
      NcclPeers::Lane* lane = nullptr, v1::Transport* used = nullptr, bool* miss = nullptr,
      std::shared_ptr<void>* in_place_mapping = nullptr);
  // Copies NcclPeers' totals into the kvstrata_decode_nccl_* counters.
  void SyncNcclMetrics();
  // Puts a finished sequence's pages (primary forms) into the local tier.
  void StoreLocal(const std::string& request_id, const std::vector<engine::ExportedPage>& pages);
  void Publish(const PublishJob& job);
  void QueuePublish(PublishJob job);
  // Lets go of `held` on the publisher thread (a kvstore lease's Release, say), not on the
  // calling one; here once the publisher has stopped.
  void DropLater(std::shared_ptr<void> held);
  // Tells the ring how a call to a kvstore went (it ejects a node that keeps failing).
  void ReportStoreResult(const std::string& address, const absl::Status& status);
  // Takes the leading run of `keys` from the local tier; when another request on this worker is
  // computing more of these pages, first waits (until `deadline`) for it to share them. Registers
  // this request in prefilling_ (returned; null when it computes nothing others could wait for).
  std::vector<LocalPage> LocalPrefix(const std::string& request_id,
                                     const std::vector<PageKey>& keys, absl::Time deadline,
                                     const std::function<bool()>& cancelled,
                                     std::shared_ptr<Prefilling>* registered);
  // Removes a request from prefilling_ (it shared its pages, or ended) and wakes the waiters.
  void EndPrefilling(const std::shared_ptr<Prefilling>& p);
  void RequestCancel(uint64_t sequence_id, engine::FinishReason reason);

  std::unique_ptr<engine::Engine> engine_;  // touched only by the engine thread after start
  const DecodeServiceOptions options_;
  std::unique_ptr<DecodeMetrics> metrics_;
  // Read-only copies of engine facts, so handlers need not touch the engine.
  const int page_tokens_;
  const int max_context_;
  const int vocab_size_;
  const bool has_chat_template_;
  const std::string tokenizer_identity_;
  const std::string model_fingerprint_;
  const std::vector<int32_t> eos_token_ids_;
  const int max_running_;
  v1::KvFormat kv_format_proto_;

  std::unique_ptr<LocalPageCache> local_pages_;  // null without a local tier

  std::mutex ring_mu_;
  std::unique_ptr<kvstore::KvStoreRing> ring_;  // null without a kvstore
  std::unique_ptr<SameGpuPools> same_gpu_;
  std::unique_ptr<NcclPeers> nccl_;  // null without NCCL; before ring_ in destruction
  std::mutex nccl_metrics_mu_;
  NcclPeersCounts nccl_synced_;
  std::atomic<bool> chain_fallback_logged_{false};

  mutable std::mutex mu_;
  std::condition_variable engine_cv_;
  std::deque<std::function<void()>> tasks_;  // run on the engine thread (PageNamespace)
  std::deque<PendingSubmit> submits_;
  std::deque<PendingCancel> cancels_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<RequestChannel>> running_;       // by sequence id
  absl::flat_hash_map<std::string, std::shared_ptr<RequestChannel>> in_flight_;  // by request id
  uint64_t next_request_number_ = 1;
  bool stopping_ = false;

  std::mutex publish_mu_;
  std::condition_variable publish_cv_;
  std::deque<PublishJob> publishes_;
  std::vector<std::shared_ptr<void>> drops_;  // DropLater's, let go of on the publisher thread

  std::mutex prefill_mu_;
  std::condition_variable prefill_cv_;
  std::vector<std::shared_ptr<Prefilling>> prefilling_;  // guarded by prefill_mu_
  int publishes_in_progress_ = 0;
  bool publish_stopping_ = false;

  std::atomic<int64_t> kv_bytes_in_use_{0};
  std::atomic<int> active_sequences_{0};
  std::atomic<int> scheduler_waiting_{0};
  std::atomic<int> scheduler_running_{0};
  std::atomic<int64_t> free_pages_{0};
  std::atomic<int64_t> total_pages_{0};
  std::atomic<int64_t> generated_tokens_{0};
  std::atomic<int64_t> prefilled_tokens_{0};
  std::atomic<int64_t> step_micros_{0};

  std::thread engine_thread_;
  std::thread publish_thread_;
};

}  // namespace kvstrata::decode

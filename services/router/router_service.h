#pragma once

// The router: the public kvstrata.v1.Generation endpoint and the kvstrata.v1.WorkerRegistry the
// decode workers register with.
//
// Per Generate: tokenise once (text or chat, with the same PromptEncoder the workers use), hash
// the prompt's full pages in the request's namespace, pick a worker with the routing policy over
// the live workers and the prefix index, and forward the request as token ids with RoutingHints
// (the page keys and the predicted cached tokens). The worker's stream is relayed as it comes.
// A worker that fails before any message reached the client (it is down, full, draining) is
// retried on another worker, up to max_attempts in all. After output began a failure is not
// retried: the client gets a final message with finish_reason ERROR and `error`, then the same
// status. The router forwards the client's deadline less deadline_margin, and if the worker has
// not ended the stream by then it ends it itself with finish_reason DEADLINE (output began) or
// DEADLINE_EXCEEDED (none did), so the client hears the end before its deadline.
//
// Limits: the pool's (the smallest over its live workers, as they registered them) are what
// GetServerInfo reports; a prompt beyond the pool's max_context_tokens is refused here with
// OUT_OF_RANGE, before any worker is involved.
//
// What the prefix index learns, and from where:
//   - workers: the local page keys in RegisterWorker (a snapshot) and Heartbeat (net changes);
//     and, for a worker with a local tier (local_page_capacity_bytes > 0, or one that reported
//     keys or local hits), the prompt's pages as soon as a request is routed to it (it will
//     hold them once it has prefilled; a request with the same prefix meanwhile waits there for
//     them), withdrawn if that attempt fails before output;
//   - the kvstore: each node's WatchEvents stream (a snapshot, then live stored/removed events),
//     kept per node; and each node's GPU (StatsResponse.gpu_uuid, read whenever its stream
//     opens), which a worker that registered the same same_gpu_uuid shares: that worker fetches
//     the node's pages by the same-GPU transport, and routing counts them cheaper for it
//     (WorkerInfo::colocated_kvstore, docs/routing.md#co-located-kvstore).
// The pool identity (model, fingerprint, KV format, rotation digest, page size) comes from the
// first worker that registers, or answers GetServerInfo when it was given by flag; a worker
// with another identity is refused, since its page keys would not match. Until the identity is
// known the router forwards without page keys (the worker hashes itself) and routes on load.
//
// Thread-safety: gRPC calls the handlers concurrently; shared state is behind mutexes, the
// worker table and the prefix index lock themselves. Three background threads: maintenance
// (expiry, static-worker probes, gauges), cancellation (client cancellations reach the worker at
// once, not at its next token), and one watcher per kvstore node.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/metrics.h"
#include "core/tenant_keys.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "kvstrata/v1/worker.grpc.pb.h"
#include "rpc/peer_auth.h"
#include "services/common/generation_service.h"
#include "services/router/policy.h"
#include "services/router/prefix_index.h"
#include "services/router/worker_table.h"
#include "tokenizer/prompt_encoder.h"

namespace grpc {
class ClientContext;
class ServerContext;
}  // namespace grpc

namespace kvstrata::router {

struct StaticWorker {
  std::string id;
  std::string address;
};

struct RouterOptions {
  std::string router_id = "router-0";
  std::string policy = "prefix-affinity";
  RoutingPolicyOptions policy_options;
  WorkerTableOptions worker_table;
  PrefixIndexOptions prefix_index;
  std::vector<StaticWorker> static_workers;
  // kvstore nodes whose WatchEvents feed the prefix index; empty: no kvstore events.
  std::vector<std::string> kvstore_addresses;
  // A node whose event stream has been down this long has its pages forgotten by the prefix
  // index (a dead node's pages would keep drawing requests that then miss); zero: kept until
  // the stream is back. A stream that comes back replaces them with its snapshot either way.
  absl::Duration kvstore_forget_after = absl::Seconds(10);
  // Workers tried per request (the first plus retries).
  int max_attempts = 3;
  // Requests in flight at the router before Generate answers RESOURCE_EXHAUSTED.
  int max_in_flight_requests = 1024;
  // One line per finished request on stderr: worker, routing reason, predicted and actual
  // cached tokens.
  bool log_requests = true;
  // How long before the client's deadline the router ends a stream: the worker is given the
  // client's deadline less this, and the router's own final message needs the rest to arrive.
  absl::Duration deadline_margin = absl::Milliseconds(50);
  // Largest request message accepted (the gRPC server's receive limit, set by main); reported in
  // GetServerInfo.
  int64_t max_request_bytes = int64_t{64} << 20;
  // API keys to tenants (core/tenant_keys.h). Set: every Generate needs a key ("authorization:
  // Bearer <key>" metadata) and its tenant is bound into the cache namespace
  // (TenantCacheSalt); null: no tenants, a request's cache_salt is used as sent. Borrowed.
  TenantKeys* tenant_keys = nullptr;
  // Who may register as a worker (rpc/peer_auth.h); borrowed; null: anyone.
  const rpc::PeerAuthorizer* authorizer = nullptr;
  // Makes the channels to workers and kvstores (rpc::TransportSecurity::Dial); empty:
  // plaintext.
  std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> dial;
};

// What every worker of the pool must share for page keys to match.
struct PoolIdentity {
  std::string model;
  std::string model_fingerprint;
  std::string kv_format;
  std::string rotation_digest;  // lowercase hex, or "identity"
  uint32_t page_tokens = 0;

  friend bool operator==(const PoolIdentity&, const PoolIdentity&) = default;
  std::string ToString() const;
};

class RouterMetrics;
struct InFlight;

// The state both services share.
class Router {
 public:
  // `encoder` tokenises prompts; `registry` is borrowed and must outlive the router. Starts the
  // background threads. InvalidArgument for an unknown policy or a bad option.
  static absl::StatusOr<std::unique_ptr<Router>> Create(tokenizer::PromptEncoder encoder,
                                                        const RouterOptions& options,
                                                        MetricsRegistry* registry,
                                                        const Clock* clock = nullptr);
  ~Router();

  const RouterOptions& options() const { return options_; }
  std::optional<PoolIdentity> identity() const;
  // The workers in the pool, after dropping (and forgetting) the silent ones.
  // Each carries its co-located kvstore node, if one is known (WorkerInfo::colocated_kvstore).
  std::vector<WorkerInfo> LiveWorkers();
  // The limits every worker that stated its own can honour: the smallest of each, and the EOS
  // ids of one of them (they share the model). nullopt while no worker has stated any.
  std::optional<v1::RequestLimits> PoolLimits() const;
  PrefixIndex& prefix_index() { return index_; }

 private:
  friend class RouterService;
  friend class RegistryService;

  struct WorkerState {
    uint64_t incarnation = 0;
    bool identity_checked = false;  // registered, or a static worker that answered
    bool keeps_local_pages = false;  // has reported local page keys or local hits
    std::optional<v1::RequestLimits> limits;  // as registered (or read from a static worker)
  };

  Router(tokenizer::PromptEncoder encoder, const RouterOptions& options,
         std::unique_ptr<RoutingPolicy> policy, MetricsRegistry* registry, const Clock* clock);

  // Adopts `id` as the pool identity if none is set; FailedPrecondition naming the differing
  // field otherwise.
  absl::Status CheckIdentity(const PoolIdentity& id);
  // OK when a worker's tokenizer identity is the router's (or not given); FailedPrecondition
  // naming both otherwise.
  absl::Status CheckTokenizer(const std::string& tokenizer) const;
  std::shared_ptr<v1::Generation::Stub> StubFor(const std::string& address);
  // The first --kvstore node (in flag order) whose HBM pool is on GPU `gpu_uuid`; empty for an
  // empty uuid or when none is.
  std::string ColocatedKvStoreLocked(const std::string& gpu_uuid) const;
  // Reads node `address`'s GPU from its Stats (a short deadline) into kvstore_gpus_; a failed
  // call keeps what was known.
  void LearnKvStoreGpu(const std::string& address, v1::KvStore::Stub& stub);
  void ForgetWorker(const std::string& id);

  void MaintenanceLoop();
  void CancellationLoop();
  void WatchKvStore(const std::string& address);
  void ProbeStaticWorkers();
  bool SleepUnlessStopping(absl::Duration d);

  const RouterOptions options_;
  const tokenizer::PromptEncoder encoder_;
  const std::unique_ptr<RoutingPolicy> policy_;
  SystemClock system_clock_;
  WorkerTable workers_;
  PrefixIndex index_;
  std::unique_ptr<RouterMetrics> metrics_;

  mutable std::mutex mu_;
  std::optional<PoolIdentity> identity_;                              // guarded by mu_
  absl::flat_hash_map<std::string, WorkerState> worker_states_;       // guarded by mu_
  // kvstore node (its --kvstore address) -> the GPU its HBM pool is on; absent or empty: none.
  absl::flat_hash_map<std::string, std::string> kvstore_gpus_;  // guarded by mu_
  absl::flat_hash_map<std::string, std::shared_ptr<v1::Generation::Stub>> stubs_;  // by address
  absl::flat_hash_map<std::string, std::shared_ptr<InFlight>> in_flight_;  // by request id
  // Requests this router has in flight on each worker. Heartbeats report a worker's queue up to
  // an interval late; the router's own count is exact at once, so policies see the larger.
  absl::flat_hash_map<std::string, int64_t> requests_on_worker_;  // guarded by mu_
  // Requests this router saw end on each worker since the worker's last heartbeat: the report
  // still counts them, so they are taken off it.
  absl::flat_hash_map<std::string, int64_t> ended_since_heartbeat_;  // guarded by mu_
  uint64_t next_request_number_ = 1;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::mutex watch_mu_;
  std::vector<grpc::ClientContext*> active_watches_;  // guarded by watch_mu_

  std::thread maintenance_thread_;
  std::thread cancellation_thread_;
  std::vector<std::thread> watch_threads_;
};

// kvstrata.v1.Generation, public side.
class RouterService final : public GenerationService {
 public:
  explicit RouterService(Router* router) : router_(router) {}

  grpc::Status ServeGenerate(grpc::ServerContext* context, const v1::GenerateRequest& request,
                             GenerateWriter* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

 protected:
  grpc::Status RejectUnparseable(grpc::ServerContext* context,
                                 const absl::Status& status) override;

 private:
  struct Prepared;
  struct Attempt;
  // Validation, tokenisation, the context limit and the prompt's page keys.
  absl::StatusOr<Prepared> Prepare(const v1::GenerateRequest& request) const;
  // One worker's stream relayed to the client; says whether another worker may be tried.
  Attempt RelayFrom(const RouteDecision& decision, grpc::ServerContext* context, const v1::GenerateRequest& forward,
                    const Prepared& prepared, InFlight& flight, GenerateWriter* writer);

  Router* const router_;
};

// kvstrata.v1.WorkerRegistry, called by the decode workers.
class RegistryService final : public v1::WorkerRegistry::Service {
 public:
  explicit RegistryService(Router* router) : router_(router) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;

 private:
  Router* const router_;
};

}  // namespace kvstrata::router

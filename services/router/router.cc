// The router's shared state: the worker pool and its identity, the prefix index and the
// background loops that keep them (maintenance, cancellation, kvstore event watchers).

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "services/router/router_internal.h"

namespace kvstrata::router {

uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

bool RetryableOnAnotherWorker(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::UNIMPLEMENTED:
      return true;
    default:
      return false;
  }
}

std::string CodeString(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

absl::StatusOr<std::vector<PageKey>> KeysFromBytes(
    const google::protobuf::RepeatedPtrField<std::string>& field, const char* name) {
  std::vector<PageKey> keys;
  keys.reserve(field.size());
  for (int i = 0; i < field.size(); ++i) {
    absl::StatusOr<PageKey> key = PageKey::FromBytes(field[i]);
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", i, "]: ", key.status().message()));
    }
    keys.push_back(*key);
  }
  return keys;
}

absl::StatusOr<PoolIdentity> IdentityFrom(const std::string& model,
                                          const std::string& model_fingerprint,
                                          const v1::KvFormat& format) {
  PoolIdentity id;
  id.model = model;
  id.model_fingerprint = model_fingerprint;
  id.kv_format = format.name();
  id.page_tokens = format.page_size_tokens();
  if (format.rotation_digest().empty()) {
    id.rotation_digest = "identity";
  } else if (format.rotation_digest().size() == 32) {
    id.rotation_digest = absl::BytesToHexString(format.rotation_digest());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_format.rotation_digest: must be 32 bytes (SHA-256) or empty, got ",
        format.rotation_digest().size()));
  }
  if (id.model_fingerprint.empty()) {
    return absl::InvalidArgumentError("model_fingerprint: must not be empty");
  }
  if (id.kv_format.empty()) return absl::InvalidArgumentError("kv_format.name: must not be empty");
  if (id.page_tokens == 0) {
    return absl::InvalidArgumentError("kv_format.page_size_tokens: must be > 0");
  }
  return id;
}

std::string PoolIdentity::ToString() const {
  return absl::StrCat("model ", model, ", fingerprint ", model_fingerprint.substr(0, 16),
                      ", kv format ", kv_format, ", rotations ", rotation_digest.substr(0, 16),
                      ", page ", page_tokens, " tokens");
}

absl::StatusOr<std::unique_ptr<Router>> Router::Create(tokenizer::PromptEncoder encoder,
                                                       const RouterOptions& options,
                                                       MetricsRegistry* registry,
                                                       const Clock* clock) {
  if (options.max_attempts < 1) return absl::InvalidArgumentError("max_attempts: must be >= 1");
  if (options.max_in_flight_requests < 1) {
    return absl::InvalidArgumentError("max_in_flight_requests: must be >= 1");
  }
  absl::StatusOr<std::unique_ptr<RoutingPolicy>> policy =
      MakeRoutingPolicy(options.policy, options.policy_options);
  if (!policy.ok()) return policy.status();
  std::unique_ptr<Router> router(
      new Router(std::move(encoder), options, *std::move(policy), registry, clock));
  for (const StaticWorker& w : options.static_workers) {
    if (absl::Status s = router->workers_.AddStatic(w.id, w.address); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(router->mu_);
    router->worker_states_[w.id] = {};
  }
  Router* r = router.get();
  r->maintenance_thread_ = std::thread([r] { r->MaintenanceLoop(); });
  r->cancellation_thread_ = std::thread([r] { r->CancellationLoop(); });
  for (const std::string& a : options.kvstore_addresses) {
    r->watch_threads_.emplace_back([r, a] { r->WatchKvStore(a); });
  }
  return router;
}

Router::Router(tokenizer::PromptEncoder encoder, const RouterOptions& options,
               std::unique_ptr<RoutingPolicy> policy, MetricsRegistry* registry,
               const Clock* clock)
    : options_(options),
      encoder_(std::move(encoder)),
      policy_(std::move(policy)),
      workers_(options.worker_table, clock != nullptr ? clock : &system_clock_),
      index_(options.prefix_index),
      metrics_(std::make_unique<RouterMetrics>(registry)) {}

Router::~Router() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    for (grpc::ClientContext* c : active_watches_) c->TryCancel();
  }
  for (std::thread& t : watch_threads_) t.join();
  maintenance_thread_.join();
  cancellation_thread_.join();
}

bool Router::SleepUnlessStopping(absl::Duration d) {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stop_cv_.wait_for(lock, absl::ToChronoMicroseconds(d), [&] { return stopping_; });
  return !stopping_;
}

std::optional<PoolIdentity> Router::identity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return identity_;
}

absl::Status Router::CheckIdentity(const PoolIdentity& id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!identity_) {
    identity_ = id;
    fprintf(stderr, "kvstrata-router: pool identity: %s\n", id.ToString().c_str());
    return absl::OkStatus();
  }
  auto differ = [](const char* field, const std::string& ours, const std::string& theirs) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, " '", theirs, "' differs from the pool's '", ours,
                     "': this worker's page keys would not match the others'"));
  };
  if (id.model != identity_->model) return differ("model", identity_->model, id.model);
  if (id.model_fingerprint != identity_->model_fingerprint) {
    return differ("model_fingerprint", identity_->model_fingerprint, id.model_fingerprint);
  }
  if (id.kv_format != identity_->kv_format) {
    return differ("kv_format.name", identity_->kv_format, id.kv_format);
  }
  if (id.rotation_digest != identity_->rotation_digest) {
    return differ("kv_format.rotation_digest", identity_->rotation_digest, id.rotation_digest);
  }
  if (id.page_tokens != identity_->page_tokens) {
    return differ("kv_format.page_size_tokens", absl::StrCat(identity_->page_tokens),
                  absl::StrCat(id.page_tokens));
  }
  return absl::OkStatus();
}

absl::Status Router::CheckTokenizer(const std::string& tokenizer) const {
  // Empty: a worker that does not say; its prompts are still tokenised here, so accept it.
  if (tokenizer.empty() || tokenizer == encoder_.identity()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "tokenizer '", tokenizer, "' differs from the router's '", encoder_.identity(),
      "' (--model): the token ids the router sends would mean other text to this worker"));
}

std::shared_ptr<v1::Generation::Stub> Router::StubFor(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<v1::Generation::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    stub = v1::Generation::NewStub(
        options_.dial ? options_.dial(address)
                      : grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  }
  return stub;
}

void Router::ForgetWorker(const std::string& id) {
  index_.ForgetWorker(id);
  metrics_->worker_requests.With({id}).Set(0);
  metrics_->worker_free_pages.With({id}).Set(0);
  metrics_->worker_total_pages.With({id}).Set(0);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = worker_states_.find(id);
  if (it != worker_states_.end()) it->second.keeps_local_pages = false;
}

std::optional<v1::RequestLimits> Router::PoolLimits() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<v1::RequestLimits> pool;
  auto smaller = [](uint32_t a, uint32_t b) { return a == 0 ? b : b == 0 ? a : std::min(a, b); };
  for (const auto& [id, state] : worker_states_) {
    if (!state.limits) continue;
    if (!pool) {
      pool = *state.limits;
      continue;
    }
    pool->set_max_context_tokens(
        smaller(pool->max_context_tokens(), state.limits->max_context_tokens()));
    pool->set_max_n(smaller(pool->max_n(), state.limits->max_n()));
    pool->set_max_stop_strings(smaller(pool->max_stop_strings(), state.limits->max_stop_strings()));
    pool->set_max_logprobs_top_n(
        smaller(pool->max_logprobs_top_n(), state.limits->max_logprobs_top_n()));
  }
  return pool;
}

std::vector<WorkerInfo> Router::LiveWorkers() {
  // Expire here rather than inside Snapshot, so a dropped worker is always logged, counted and
  // forgotten by the index.
  for (const std::string& id : workers_.ExpireStale()) {
    fprintf(stderr, "kvstrata-router: worker %s missed %d heartbeats; dropped from the pool\n",
            id.c_str(), options_.worker_table.max_missed_heartbeats);
    metrics_->dropped.With({"silent"}).Increment();
    ForgetWorker(id);
    std::lock_guard<std::mutex> lock(mu_);
    worker_states_.erase(id);
  }
  std::vector<WorkerInfo> live = workers_.Snapshot();
  std::lock_guard<std::mutex> lock(mu_);
  for (WorkerInfo& w : live) w.colocated_kvstore = ColocatedKvStoreLocked(w.same_gpu_uuid);
  return live;
}

std::string Router::ColocatedKvStoreLocked(const std::string& gpu_uuid) const {
  if (gpu_uuid.empty()) return "";
  for (const std::string& node : options_.kvstore_addresses) {
    auto it = kvstore_gpus_.find(node);
    if (it != kvstore_gpus_.end() && it->second == gpu_uuid) return node;
  }
  return "";
}

void Router::LearnKvStoreGpu(const std::string& address, v1::KvStore::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  {
    // Cancellable as the watches are, so a stopping router does not wait for the deadline.
    std::lock_guard<std::mutex> lock(watch_mu_);
    {
      std::lock_guard<std::mutex> stop(stop_mu_);
      if (stopping_) return;
    }
    active_watches_.push_back(&context);
  }
  v1::StatsResponse stats;
  const grpc::Status status = stub.Stats(&context, v1::StatsRequest(), &stats);
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    active_watches_.erase(std::find(active_watches_.begin(), active_watches_.end(), &context));
  }
  if (!status.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  std::string& gpu = kvstore_gpus_[address];
  if (gpu == stats.gpu_uuid()) return;
  gpu = stats.gpu_uuid();
  if (gpu.empty()) {
    fprintf(stderr, "kvstrata-router: kvstore %s: no HBM pool; no worker is co-located with it\n",
            address.c_str());
  } else {
    fprintf(stderr,
            "kvstrata-router: kvstore %s: HBM pool on %s; workers registered on that GPU are "
            "preferred for its pages\n",
            address.c_str(), gpu.c_str());
  }
}

void Router::MaintenanceLoop() {
  const absl::Duration tick = options_.worker_table.heartbeat_interval;
  do {
    ProbeStaticWorkers();
    const std::vector<WorkerInfo> live = LiveWorkers();
    metrics_->workers.Get().Set(static_cast<double>(live.size()));
    metrics_->colocated_workers.Get().Set(static_cast<double>(std::count_if(
        live.begin(), live.end(), [](const WorkerInfo& w) { return !w.colocated_kvstore.empty(); })));
    for (const WorkerInfo& w : live) {
      metrics_->worker_requests.With({w.id}).Set(static_cast<double>(w.load.requests()));
      metrics_->worker_free_pages.With({w.id}).Set(static_cast<double>(w.load.free_pages));
      metrics_->worker_total_pages.With({w.id}).Set(static_cast<double>(w.load.total_pages));
    }
    metrics_->index_keys.Get().Set(static_cast<double>(index_.size()));
  } while (SleepUnlessStopping(tick));
}

// Static workers never register, so their identity is read from GetServerInfo.
void Router::ProbeStaticWorkers() {
  for (const StaticWorker& w : options_.static_workers) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = worker_states_.find(w.id);
      if (it != worker_states_.end() && it->second.identity_checked) continue;
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    v1::ServerInfo info;
    const grpc::Status status =
        StubFor(w.address)->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (!status.ok()) continue;  // not up yet; routing still tries it
    absl::StatusOr<PoolIdentity> id =
        IdentityFrom(info.model(), info.model_fingerprint(), info.kv_format());
    absl::Status check = CheckTokenizer(info.tokenizer());
    if (check.ok()) check = id.ok() ? CheckIdentity(*id) : id.status();
    if (!check.ok()) {
      fprintf(stderr, "kvstrata-router: static worker %s (%s) removed: %s\n", w.id.c_str(),
              w.address.c_str(), std::string(check.message()).c_str());
      workers_.Remove(w.id);
      metrics_->dropped.With({"identity"}).Increment();
    }
    std::lock_guard<std::mutex> lock(mu_);
    WorkerState& state = worker_states_[w.id];
    state.identity_checked = true;
    if (check.ok() && info.max_context_tokens() > 0) {
      v1::RequestLimits limits;
      limits.set_max_context_tokens(info.max_context_tokens());
      limits.set_max_n(info.max_n());
      limits.set_max_stop_strings(info.max_stop_strings());
      limits.set_max_logprobs_top_n(info.max_logprobs_top_n());
      *limits.mutable_eos_token_ids() = info.eos_token_ids();
      state.limits = limits;
    }
  }
}

void Router::CancellationLoop() {
  do {
    std::vector<std::shared_ptr<InFlight>> running;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running.reserve(in_flight_.size());
      for (const auto& [id, f] : in_flight_) running.push_back(f);
    }
    for (const std::shared_ptr<InFlight>& f : running) {
      // Under f->mu: a handler that has returned has cleared server_context first.
      std::lock_guard<std::mutex> lock(f->mu);
      if (f->server_context == nullptr || f->worker_call == nullptr) continue;
      if (f->server_context->IsCancelled()) f->worker_call->TryCancel();
    }
  } while (SleepUnlessStopping(absl::Milliseconds(20)));
}

void Router::WatchKvStore(const std::string& address) {
  std::unique_ptr<v1::KvStore::Stub> stub = v1::KvStore::NewStub(
      options_.dial ? options_.dial(address)
                    : grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  bool was_connected = true, ever_connected = false, forgotten = false;
  absl::Time down_since = absl::Now();
  for (;;) {
    // Before the stream, so a node that restarted on another GPU is seen again.
    LearnKvStoreGpu(address, *stub);
    grpc::ClientContext context;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      {
        std::lock_guard<std::mutex> stop(stop_mu_);
        if (stopping_) return;
      }
      active_watches_.push_back(&context);
    }
    v1::WatchEventsRequest request;
    request.set_include_snapshot(true);
    std::unique_ptr<grpc::ClientReader<v1::WatchEventsResponse>> reader =
        stub->WatchEvents(&context, request);
    v1::WatchEventsResponse response;
    bool got_any = false;
    while (reader->Read(&response)) {
      if (!got_any && !was_connected) {
        fprintf(stderr, "kvstrata-router: kvstore %s: watching page events again\n",
                address.c_str());
      }
      if (!got_any) {
        // A stream opens with the node's snapshot: it replaces what the index believed, so pages
        // a restart lost, or evicted while the stream was down, do not linger.
        index_.ForgetStoreNode(address);
        if (ever_connected && !forgotten) metrics_->kvstore_index_resets.With({"resync"}).Increment();
        forgotten = false;
      }
      got_any = was_connected = ever_connected = true;
      std::vector<PageKey> stored, removed;
      for (const v1::PageEvent& e : response.events()) {
        const std::string& key = e.has_stored() ? e.stored().key() : e.removed().key();
        absl::StatusOr<PageKey> k = PageKey::FromBytes(key);
        if (!k.ok()) continue;
        (e.has_stored() ? stored : removed).push_back(*k);
      }
      if (!stored.empty()) index_.OnStoreStored(address, stored);
      if (!removed.empty()) index_.OnStoreRemoved(address, removed);
      metrics_->kvstore_events.With({"stored"}).Increment(static_cast<double>(stored.size()));
      metrics_->kvstore_events.With({"removed"}).Increment(static_cast<double>(removed.size()));
    }
    const grpc::Status status = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      active_watches_.erase(std::find(active_watches_.begin(), active_watches_.end(), &context));
    }
    metrics_->kvstore_watch_errors.Get().Increment();
    if (got_any) down_since = absl::Now();
    if (was_connected) {
      fprintf(stderr,
              "kvstrata-router: kvstore %s: event stream ended (%s: %s); its pages stay in the "
              "prefix index %s; retrying every second\n",
              address.c_str(), CodeString(status.error_code()).c_str(),
              status.error_message().c_str(),
              options_.kvstore_forget_after > absl::ZeroDuration()
                  ? absl::StrCat("for ", absl::FormatDuration(options_.kvstore_forget_after),
                                 " unless the stream is back")
                        .c_str()
                  : "until the stream is back");
      was_connected = false;
    }
    if (!forgotten && options_.kvstore_forget_after > absl::ZeroDuration() &&
        absl::Now() - down_since >= options_.kvstore_forget_after) {
      index_.ForgetStoreNode(address);
      forgotten = true;
      if (ever_connected) {
        metrics_->kvstore_index_resets.With({"unreachable"}).Increment();
        fprintf(stderr,
                "kvstrata-router: kvstore %s: unreachable for %s; its pages are forgotten until "
                "its stream is back\n",
                address.c_str(), absl::FormatDuration(absl::Now() - down_since).c_str());
      }
    }
    if (!SleepUnlessStopping(absl::Seconds(1))) return;
  }
}

}  // namespace kvstrata::router

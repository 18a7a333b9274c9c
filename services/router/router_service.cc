#include "services/router/router_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "core/radix_hash.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/status.h"
#include "services/common/generate_input.h"

namespace kvstrata::router {

class RouterMetrics {
 public:
  explicit RouterMetrics(MetricsRegistry* r)
      : requests(r->AddCounter("kvstrata_router_requests_total",
                               "Generate requests finished, by finish reason.", {"finish_reason"})),
        rejected(r->AddCounter("kvstrata_router_rejected_requests_total",
                               "Generate requests that ended with an error status, by gRPC code.",
                               {"code"})),
        decisions(r->AddCounter("kvstrata_router_routing_decisions_total",
                                "Workers chosen, by policy and by what decided the choice.",
                                {"policy", "reason"})),
        retries(r->AddCounter("kvstrata_router_retries_total",
                              "Requests sent to another worker after one failed before its first "
                              "message, by the failed attempt's gRPC code.",
                              {"code"})),
        prompt_tokens(r->AddCounter("kvstrata_router_prompt_tokens_total",
                                    "Prompt tokens, by the cache tier the serving worker found them "
                                    "in (none: prefilled, recomputed included).",
                                    {"tier"})),
        predicted_cached_tokens(
            r->AddCounter("kvstrata_router_predicted_cached_tokens_total",
                          "Prompt tokens the router predicted would be cached (local + kvstore) "
                          "on the worker it chose.")),
        mispredictions(r->AddCounter("kvstrata_router_cache_mispredictions_total",
                                     "Requests whose actual cached tokens differed from the "
                                     "prediction by a page or more, by direction.",
                                     {"direction"})),
        generated_tokens(
            r->AddCounter("kvstrata_router_generated_tokens_total", "Tokens generated.")),
        ttft(r->AddHistogram("kvstrata_router_time_to_first_token_seconds",
                             "RPC accepted until the first token was relayed to the client.",
                             LatencyBucketsSeconds())),
        inter_token(r->AddHistogram("kvstrata_router_inter_token_latency_seconds",
                                    "Time between consecutive relayed messages carrying tokens.",
                                    TokenLatencyBucketsSeconds())),
        e2e(r->AddHistogram("kvstrata_router_request_duration_seconds",
                            "RPC accepted until the last message was relayed.",
                            LatencyBucketsSeconds())),
        running(r->AddGauge("kvstrata_router_running_requests",
                            "Generate requests in flight at the router.")),
        workers(r->AddGauge("kvstrata_router_workers", "Live workers in the routing pool.")),
        worker_requests(r->AddGauge("kvstrata_router_worker_requests",
                                    "A live worker's running + waiting requests, as last reported.",
                                    {"worker"})),
        worker_free_pages(r->AddGauge("kvstrata_router_worker_free_pages",
                                      "A live worker's free KV pages, as last reported.",
                                      {"worker"})),
        worker_total_pages(r->AddGauge("kvstrata_router_worker_total_pages",
                                       "A live worker's KV page capacity, as last reported.",
                                       {"worker"})),
        registrations(r->AddCounter("kvstrata_router_worker_registrations_total",
                                    "RegisterWorker calls accepted.")),
        dropped(r->AddCounter("kvstrata_router_workers_dropped_total",
                              "Workers removed from the pool, by reason.", {"reason"})),
        index_keys(r->AddGauge("kvstrata_router_prefix_index_keys",
                               "Page keys in the router's prefix index.")),
        kvstore_events(r->AddCounter("kvstrata_router_kvstore_events_total",
                                     "kvstore page events applied to the prefix index, by kind.",
                                     {"event"})),
        kvstore_watch_errors(r->AddCounter(
            "kvstrata_router_kvstore_watch_errors_total",
            "kvstore WatchEvents streams that ended with an error (then reopened).")) {
    // Series that exist from the start read as 0 rather than as missing.
    for (grpc::StatusCode code :
         {grpc::StatusCode::UNAVAILABLE, grpc::StatusCode::RESOURCE_EXHAUSTED,
          grpc::StatusCode::INTERNAL, grpc::StatusCode::UNKNOWN, grpc::StatusCode::ABORTED,
          grpc::StatusCode::UNIMPLEMENTED}) {
      retries.With({absl::StatusCodeToString(static_cast<absl::StatusCode>(code))});
    }
    for (const char* tier : {"local", "kvstore", "none"}) prompt_tokens.With({tier});
    for (const char* direction : {"over", "under"}) mispredictions.With({direction});
    for (const char* reason : {"silent", "draining", "identity"}) dropped.With({reason});
    for (const char* event : {"stored", "removed"}) kvstore_events.With({event});
    predicted_cached_tokens.Get();
    generated_tokens.Get();
    kvstore_watch_errors.Get();
  }

  Family<Counter>& requests;
  Family<Counter>& rejected;
  Family<Counter>& decisions;
  Family<Counter>& retries;
  Family<Counter>& prompt_tokens;
  Family<Counter>& predicted_cached_tokens;
  Family<Counter>& mispredictions;
  Family<Counter>& generated_tokens;
  Family<Histogram>& ttft;
  Family<Histogram>& inter_token;
  Family<Histogram>& e2e;
  Family<Gauge>& running;
  Family<Gauge>& workers;
  Family<Gauge>& worker_requests;
  Family<Gauge>& worker_free_pages;
  Family<Gauge>& worker_total_pages;
  Family<Counter>& registrations;
  Family<Counter>& dropped;
  Family<Gauge>& index_keys;
  Family<Counter>& kvstore_events;
  Family<Counter>& kvstore_watch_errors;
};

// A request in flight: the cancellation thread and Abort reach the worker call through it.
struct InFlight {
  grpc::ServerContext* server_context = nullptr;
  std::mutex mu;
  grpc::ClientContext* worker_call = nullptr;  // guarded by mu; null between attempts
  std::string worker_address;                  // guarded by mu
  bool aborted = false;                        // guarded by mu
};

namespace {


uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

// Errors after which another worker may succeed: the worker is down, full, draining or broke.
// Errors about the request itself (invalid, too long, duplicate id, deadline) would repeat.
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

// Keys of 16 bytes from a repeated bytes field; InvalidArgument naming the field otherwise.
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

}  // namespace

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
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
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
  return workers_.Snapshot();
}

void Router::MaintenanceLoop() {
  const absl::Duration tick = options_.worker_table.heartbeat_interval;
  do {
    ProbeStaticWorkers();
    const std::vector<WorkerInfo> live = LiveWorkers();
    metrics_->workers.Get().Set(static_cast<double>(live.size()));
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
    worker_states_[w.id].identity_checked = true;
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
      if (!f->server_context->IsCancelled()) continue;
      std::lock_guard<std::mutex> lock(f->mu);
      if (f->worker_call != nullptr) f->worker_call->TryCancel();
    }
  } while (SleepUnlessStopping(absl::Milliseconds(20)));
}

void Router::WatchKvStore(const std::string& address) {
  std::unique_ptr<v1::KvStore::Stub> stub =
      v1::KvStore::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  bool was_connected = true;
  for (;;) {
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
      got_any = was_connected = true;
      std::vector<PageKey> stored, removed;
      for (const v1::PageEvent& e : response.events()) {
        const std::string& key = e.has_stored() ? e.stored().key() : e.removed().key();
        absl::StatusOr<PageKey> k = PageKey::FromBytes(key);
        if (!k.ok()) continue;
        (e.has_stored() ? stored : removed).push_back(*k);
      }
      if (!stored.empty()) index_.OnStoreStored(stored);
      if (!removed.empty()) index_.OnStoreRemoved(removed);
      metrics_->kvstore_events.With({"stored"}).Increment(static_cast<double>(stored.size()));
      metrics_->kvstore_events.With({"removed"}).Increment(static_cast<double>(removed.size()));
    }
    const grpc::Status status = reader->Finish();
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      active_watches_.erase(std::find(active_watches_.begin(), active_watches_.end(), &context));
    }
    metrics_->kvstore_watch_errors.Get().Increment();
    if (was_connected) {
      fprintf(stderr,
              "kvstrata-router: kvstore %s: event stream ended (%s: %s); its pages stay in the "
              "prefix index until evicted there or forgotten here; retrying every second\n",
              address.c_str(), CodeString(status.error_code()).c_str(), status.error_message().c_str());
      was_connected = false;
    }
    if (!SleepUnlessStopping(absl::Seconds(1))) return;
  }
}

// ---- Generation ----------------------------------------------------------------------------

grpc::Status RouterService::Generate(grpc::ServerContext* context,
                                     const v1::GenerateRequest* request,
                                     grpc::ServerWriter<v1::GenerateResponse>* writer) {
  Router& r = *router_;
  RouterMetrics& m = *r.metrics_;
  const absl::Time start = absl::Now();
  auto fail = [&](const absl::Status& status) {
    m.rejected.With({absl::StatusCodeToString(status.code())}).Increment();
    return rpc::ToGrpcStatus(status);
  };
  if (absl::Status s = ValidateRequestEnvelope(*request); !s.ok()) return fail(s);
  const std::optional<PoolIdentity> identity = r.identity();
  if (identity && !request->model().empty() && request->model() != identity->model) {
    return fail(absl::NotFoundError(absl::StrCat("model: '", request->model(),
                                                 "' is not served here (serving '",
                                                 identity->model, "')")));
  }

  // Tokenise once; the workers get token ids.
  absl::StatusOr<std::vector<int32_t>> tokens =
      PromptTokens(*request, r.encoder_, r.encoder_.tokenizer().vocab_size());
  if (!tokens.ok()) return fail(tokens.status());
  const std::vector<int32_t> prompt = *std::move(tokens);

  // The prompt's cacheable pages (one token is always left to prefill), in its namespace.
  std::vector<PageKey> keys;
  int64_t page_tokens = 64;
  if (identity) {
    page_tokens = identity->page_tokens;
    const int64_t pages = (static_cast<int64_t>(prompt.size()) - 1) / page_tokens;
    HashNamespace ns{.model_fingerprint = identity->model_fingerprint,
                     .kv_format = identity->kv_format,
                     .rotation_digest = identity->rotation_digest,
                     .page_tokens = identity->page_tokens,
                     .cache_salt = request->cache_salt()};
    absl::StatusOr<std::vector<PageKey>> k =
        PrefixPageKeys(ns, std::span<const int32_t>(prompt).first(pages * page_tokens));
    if (!k.ok()) return fail(k.status());
    keys = *std::move(k);
  }

  // Register the request (ALREADY_EXISTS for a duplicate in flight, RESOURCE_EXHAUSTED when full).
  auto flight = std::make_shared<InFlight>();
  flight->server_context = context;
  std::string request_id = request->request_id();
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    if (static_cast<int>(r.in_flight_.size()) >= r.options_.max_in_flight_requests) {
      return fail(absl::ResourceExhaustedError(
          absl::StrCat("the router is full (max_in_flight_requests=",
                       r.options_.max_in_flight_requests, "); retry with backoff")));
    }
    if (request_id.empty()) {
      request_id = absl::StrCat(r.options_.router_id, "-", r.next_request_number_++);
    }
    if (!r.in_flight_.emplace(request_id, flight).second) {
      return fail(absl::AlreadyExistsError(
          absl::StrCat("request_id: '", request_id, "' is in flight")));
    }
  }
  m.running.Get().Add(1);
  struct Unregister {
    Router* router;
    std::string id;
    ~Unregister() {
      router->metrics_->running.Get().Add(-1);
      std::lock_guard<std::mutex> lock(router->mu_);
      router->in_flight_.erase(id);
    }
  } unregister{&r, request_id};

  v1::GenerateRequest forward = *request;
  forward.set_request_id(request_id);
  forward.mutable_token_ids()->mutable_ids()->Reserve(static_cast<int>(prompt.size()));
  for (int32_t id : prompt) forward.mutable_token_ids()->add_ids(static_cast<uint32_t>(id));
  v1::RoutingHints* hints = forward.mutable_routing();
  hints->Clear();
  hints->set_router_id(r.options_.router_id);
  for (const PageKey& k : keys) hints->add_prefix_page_keys(k.ToBytes());

  absl::flat_hash_set<std::string> tried;
  grpc::Status last_error(grpc::StatusCode::UNAVAILABLE,
                          "no healthy worker can serve the model; retry with backoff");
  for (int attempt = 0; attempt < r.options_.max_attempts; ++attempt) {
    std::vector<WorkerInfo> workers = r.LiveWorkers();
    std::erase_if(workers, [&](const WorkerInfo& w) { return tried.contains(w.id); });
    if (workers.empty()) break;
    {
      std::lock_guard<std::mutex> lock(r.mu_);
      for (WorkerInfo& w : workers) {
        auto own_it = r.requests_on_worker_.find(w.id);
        const int64_t own = own_it == r.requests_on_worker_.end() ? 0 : own_it->second;
        auto ended_it = r.ended_since_heartbeat_.find(w.id);
        const int64_t ended = ended_it == r.ended_since_heartbeat_.end() ? 0 : ended_it->second;
        const int64_t queue = std::max(own, w.load.requests() - ended);
        w.load.waiting = std::min(w.load.waiting, queue);
        w.load.running = queue - w.load.waiting;
      }
    }
    RouteRequest route{.page_keys = keys,
                       .prompt_tokens = static_cast<int64_t>(prompt.size()),
                       .page_tokens = page_tokens};
    absl::StatusOr<RouteDecision> decision = r.policy_->Route(route, workers, r.index_);
    if (!decision.ok()) return fail(decision.status());
    tried.insert(decision->worker_id);
    m.decisions.With({std::string(r.policy_->name()), RouteReasonName(decision->reason)})
        .Increment();
    const int64_t predicted_local = decision->local_pages * page_tokens;
    const int64_t predicted_store = decision->store_pages * page_tokens;
    hints->set_predicted_local_cached_tokens(static_cast<uint32_t>(predicted_local));
    hints->set_predicted_kvstore_cached_tokens(static_cast<uint32_t>(predicted_store));
    const absl::Time routed = absl::Now();
    // A worker with a local tier will hold the prompt's pages once it has prefilled them: count
    // them as its own now, so a request with the same prefix arriving meanwhile goes to the same
    // worker (which lets it wait for those pages rather than compute them again elsewhere).
    bool claimed = false;
    {
      std::lock_guard<std::mutex> lock(r.mu_);
      auto it = r.worker_states_.find(decision->worker_id);
      claimed = it != r.worker_states_.end() && it->second.keeps_local_pages && !keys.empty();
    }
    if (claimed) r.index_.OnWorkerStored(decision->worker_id, keys);
    // Pages the worker did not hold before: withdrawn again if this attempt fails.
    const std::span<const PageKey> claimed_keys =
        claimed ? std::span<const PageKey>(keys).subspan(
                      std::min<size_t>(keys.size(), static_cast<size_t>(decision->local_pages)))
                : std::span<const PageKey>();

    struct CountOnWorker {
      Router* router;
      std::string worker;
      CountOnWorker(Router* r, std::string w) : router(r), worker(std::move(w)) {
        std::lock_guard<std::mutex> lock(router->mu_);
        ++router->requests_on_worker_[worker];
      }
      ~CountOnWorker() {
        std::lock_guard<std::mutex> lock(router->mu_);
        if (--router->requests_on_worker_[worker] <= 0) router->requests_on_worker_.erase(worker);
        ++router->ended_since_heartbeat_[worker];
      }
    } count_on_worker(&r, decision->worker_id);

    grpc::ClientContext call;
    if (context->deadline() != std::chrono::system_clock::time_point::max()) {
      call.set_deadline(context->deadline());
    }
    {
      std::lock_guard<std::mutex> lock(flight->mu);
      if (flight->aborted) return fail(absl::CancelledError("aborted before it was routed"));
      flight->worker_call = &call;
      flight->worker_address = decision->address;
    }
    struct Detach {
      InFlight* flight;
      ~Detach() {
        std::lock_guard<std::mutex> lock(flight->mu);
        flight->worker_call = nullptr;
      }
    } detach{flight.get()};
    if (context->IsCancelled()) call.TryCancel();

    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        r.StubFor(decision->address)->Generate(&call, forward);
    v1::GenerateResponse message;
    bool relayed = false, client_gone = false;
    absl::Time last_token = absl::InfinitePast();
    while (reader->Read(&message)) {
      const absl::Time now = absl::Now();
      if (message.token_ids_size() > 0) {
        if (last_token == absl::InfinitePast()) {
          m.ttft.Get().Observe(absl::ToDoubleSeconds(now - start));
        } else {
          m.inter_token.Get().Observe(absl::ToDoubleSeconds(now - last_token));
        }
        last_token = now;
      }
      if (message.has_usage()) {
        const v1::Usage& u = message.usage();
        message.mutable_usage()->set_predicted_cached_tokens(
            static_cast<uint32_t>(predicted_local + predicted_store));
        v1::Timings* t = message.mutable_timings();
        t->set_routing_us(Micros(routed - start));
        t->set_queue_us(t->queue_us() + Micros(routed - start));
        if (t->time_to_first_token_us() > 0) {
          t->set_time_to_first_token_us(t->time_to_first_token_us() + Micros(routed - start));
        }
        t->set_total_us(Micros(now - start));
        const int64_t actual = int64_t{u.cached_local_tokens()} + u.cached_kvstore_tokens();
        m.prompt_tokens.With({"local"}).Increment(u.cached_local_tokens());
        m.prompt_tokens.With({"kvstore"}).Increment(u.cached_kvstore_tokens());
        m.prompt_tokens.With({"none"}).Increment(u.uncached_tokens() + u.recomputed_tokens());
        m.predicted_cached_tokens.Get().Increment(
            static_cast<double>(predicted_local + predicted_store));
        m.generated_tokens.Get().Increment(u.completion_tokens());
        const int64_t error = actual - (predicted_local + predicted_store);
        if (error >= page_tokens) m.mispredictions.With({"under"}).Increment();
        if (-error >= page_tokens) m.mispredictions.With({"over"}).Increment();
        if (r.options_.log_requests) {
          fprintf(stderr,
                  "kvstrata-router: request %s -> %s (%s): prompt %u tokens, predicted cached "
                  "%lld (local %lld, kvstore %lld), actual %lld (local %u, kvstore %u), "
                  "generated %u, %.0f ms\n",
                  request_id.c_str(), decision->worker_id.c_str(),
                  RouteReasonName(decision->reason), u.prompt_tokens(),
                  static_cast<long long>(predicted_local + predicted_store),
                  static_cast<long long>(predicted_local), static_cast<long long>(predicted_store),
                  static_cast<long long>(actual), u.cached_local_tokens(),
                  u.cached_kvstore_tokens(), u.completion_tokens(),
                  absl::ToDoubleMilliseconds(now - start));
        }
        // A local hit shows the worker keeps a local tier though it did not say so: from now on
        // its requests claim their pages at routing time (above). This one's pages were not
        // claimed; the worker holds them now.
        if (!claimed && u.cached_local_tokens() > 0) {
          {
            std::lock_guard<std::mutex> lock(r.mu_);
            r.worker_states_[decision->worker_id].keeps_local_pages = true;
          }
          if (!keys.empty()) r.index_.OnWorkerStored(decision->worker_id, keys);
        }
      }
      if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
        m.requests.With({v1::FinishReason_Name(message.finish_reason())}).Increment();
      }
      if (!writer->Write(message)) {
        client_gone = true;
        call.TryCancel();
        break;
      }
      relayed = true;
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok() && !relayed && !claimed_keys.empty()) {
      r.index_.OnWorkerRemoved(decision->worker_id, claimed_keys);
    }
    if (relayed || client_gone || status.ok()) {
      m.e2e.Get().Observe(absl::ToDoubleSeconds(absl::Now() - start));
      if (!status.ok()) m.rejected.With({CodeString(status.error_code())}).Increment();
      return client_gone ? grpc::Status::CANCELLED : status;
    }
    if (context->IsCancelled()) return fail(absl::CancelledError("the client went away"));
    if (!RetryableOnAnotherWorker(status.error_code())) {
      m.rejected.With({CodeString(status.error_code())}).Increment();
      return status;
    }
    fprintf(stderr, "kvstrata-router: request %s: worker %s (%s) failed before output (%s: %s)%s\n",
            request_id.c_str(), decision->worker_id.c_str(), decision->address.c_str(),
            CodeString(status.error_code()).c_str(), status.error_message().c_str(),
            attempt + 1 < r.options_.max_attempts ? "; trying another worker" : "");
    m.retries.With({CodeString(status.error_code())}).Increment();
    last_error = grpc::Status(status.error_code(),
                              absl::StrCat("worker ", decision->worker_id, ": ",
                                           status.error_message()));
  }
  m.rejected.With({CodeString(last_error.error_code())}).Increment();
  return last_error;
}

grpc::Status RouterService::Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                                  v1::AbortResponse* response) {
  if (request->request_id().empty()) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("request_id: must not be empty"));
  }
  std::shared_ptr<InFlight> flight;
  {
    std::lock_guard<std::mutex> lock(router_->mu_);
    auto it = router_->in_flight_.find(request->request_id());
    if (it != router_->in_flight_.end()) flight = it->second;
  }
  if (flight == nullptr) {
    response->set_found(false);
    return grpc::Status::OK;
  }
  std::string address;
  {
    std::lock_guard<std::mutex> lock(flight->mu);
    flight->aborted = true;
    address = flight->worker_address;
  }
  response->set_found(true);
  if (address.empty()) return grpc::Status::OK;
  // The worker ends the stream with finish_reason ABORT and usage, which the router relays.
  grpc::ClientContext call;
  call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::AbortResponse ignored;
  const grpc::Status status = router_->StubFor(address)->Abort(&call, *request, &ignored);
  if (!status.ok()) {
    fprintf(stderr, "kvstrata-router: request %s: forwarding abort to %s failed: %s\n",
            request->request_id().c_str(), address.c_str(), status.error_message().c_str());
  }
  return grpc::Status::OK;
}

grpc::Status RouterService::GetServerInfo(grpc::ServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) {
  response->set_role("router");
  response->set_server_version("0.1.0");
  response->set_api_version("kvstrata.v1");
  const tokenizer::PromptEncoder& encoder = router_->encoder_;
  response->set_vocab_size(static_cast<uint32_t>(encoder.tokenizer().vocab_size()));
  response->set_tokenizer(encoder.identity());
  response->set_has_chat_template(encoder.chat_template() != nullptr);
  if (const std::optional<PoolIdentity> id = router_->identity()) {
    response->set_model(id->model);
    response->set_model_fingerprint(id->model_fingerprint);
    response->mutable_kv_format()->set_name(id->kv_format);
    response->mutable_kv_format()->set_page_size_tokens(id->page_tokens);
    if (id->rotation_digest != "identity") {
      response->mutable_kv_format()->set_rotation_digest(
          absl::HexStringToBytes(id->rotation_digest));
    }
  }
  response->set_max_queued_requests(
      static_cast<uint32_t>(router_->options_.max_in_flight_requests));
  response->set_available_workers(static_cast<uint32_t>(router_->LiveWorkers().size()));
  return grpc::Status::OK;
}

// ---- WorkerRegistry ------------------------------------------------------------------------

grpc::Status RegistryService::RegisterWorker(grpc::ServerContext* context,
                                             const v1::RegisterWorkerRequest* request,
                                             v1::RegisterWorkerResponse* response) {
  Router& r = *router_;
  if (request->worker_id().empty()) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("worker_id: must not be empty"));
  }
  if (request->address().empty()) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("address: must not be empty"));
  }
  if (request->capacity_pages() == 0) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("capacity_pages: must be > 0"));
  }
  if (absl::Status s = r.CheckTokenizer(request->tokenizer()); !s.ok()) {
    fprintf(stderr, "kvstrata-router: refused worker %s (%s): %s\n",
            request->worker_id().c_str(), request->address().c_str(),
            std::string(s.message()).c_str());
    return rpc::ToGrpcStatus(s);
  }
  absl::StatusOr<PoolIdentity> id =
      IdentityFrom(request->model(), request->model_fingerprint(), request->kv_format());
  if (!id.ok()) return rpc::ToGrpcStatus(id.status());
  if (absl::Status s = r.CheckIdentity(*id); !s.ok()) {
    fprintf(stderr, "kvstrata-router: refused worker %s (%s): %s\n",
            request->worker_id().c_str(), request->address().c_str(),
            std::string(s.message()).c_str());
    return rpc::ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<PageKey>> keys =
      KeysFromBytes(request->local_page_keys(), "local_page_keys");
  if (!keys.ok()) return rpc::ToGrpcStatus(keys.status());

  WorkerLoad load;
  load.total_pages = static_cast<int64_t>(request->capacity_pages());
  load.free_pages = load.total_pages;
  if (absl::Status s = r.workers_.Register(request->worker_id(), request->address(), load);
      !s.ok()) {
    return rpc::ToGrpcStatus(s);
  }
  // A registration carries the worker's whole local tier: replace what the index believed.
  r.index_.ForgetWorker(request->worker_id());
  if (!keys->empty()) r.index_.OnWorkerStored(request->worker_id(), *keys);
  bool known;
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    auto [it, inserted] = r.worker_states_.try_emplace(request->worker_id());
    known = !inserted && it->second.incarnation == request->incarnation();
    it->second.incarnation = request->incarnation();
    it->second.identity_checked = true;
    it->second.keeps_local_pages = request->local_page_capacity_bytes() > 0 || !keys->empty();
  }
  r.metrics_->registrations.Get().Increment();
  fprintf(stderr,
          "kvstrata-router: worker %s %s at %s (incarnation %016llx, %llu pages, %d local page "
          "keys)\n",
          request->worker_id().c_str(), known ? "registered again" : "joined",
          request->address().c_str(), static_cast<unsigned long long>(request->incarnation()),
          static_cast<unsigned long long>(request->capacity_pages()),
          static_cast<int>(keys->size()));
  response->set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(r.options_.worker_table.heartbeat_interval)));
  response->set_max_missed_heartbeats(
      static_cast<uint32_t>(r.options_.worker_table.max_missed_heartbeats));
  response->set_router_id(r.options_.router_id);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  Router& r = *router_;
  const std::string& worker = request->worker_id();
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    auto it = r.worker_states_.find(worker);
    if (it == r.worker_states_.end() || it->second.incarnation != request->incarnation()) {
      return rpc::ToGrpcStatus(absl::NotFoundError(
          absl::StrCat("worker_id: '", worker,
                       "' with this incarnation is not registered; call RegisterWorker")));
    }
  }
  absl::StatusOr<std::vector<PageKey>> stored =
      KeysFromBytes(request->stored_page_keys(), "stored_page_keys");
  if (!stored.ok()) return rpc::ToGrpcStatus(stored.status());
  absl::StatusOr<std::vector<PageKey>> removed =
      KeysFromBytes(request->removed_page_keys(), "removed_page_keys");
  if (!removed.ok()) return rpc::ToGrpcStatus(removed.status());

  if (request->load().draining()) {
    if (r.workers_.Remove(worker)) {
      fprintf(stderr, "kvstrata-router: worker %s is draining; no new requests go to it\n",
              worker.c_str());
      r.metrics_->dropped.With({"draining"}).Increment();
      r.ForgetWorker(worker);
    }
    std::lock_guard<std::mutex> lock(r.mu_);
    r.worker_states_.erase(worker);
    response->set_heartbeat_interval_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(r.options_.worker_table.heartbeat_interval)));
    return grpc::Status::OK;
  }
  WorkerLoad load;
  load.running = request->load().running_requests();
  load.waiting = request->load().waiting_requests();
  load.free_pages = static_cast<int64_t>(request->load().free_pages());
  load.total_pages = static_cast<int64_t>(request->load().total_pages());
  if (absl::Status s = r.workers_.Heartbeat(worker, load); !s.ok()) {
    return rpc::ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "worker_id: '", worker, "' was dropped from the pool; call RegisterWorker")));
  }
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    r.ended_since_heartbeat_.erase(worker);
  }
  if (!stored->empty()) {
    r.index_.OnWorkerStored(worker, *stored);
    std::lock_guard<std::mutex> lock(r.mu_);
    r.worker_states_[worker].keeps_local_pages = true;
  }
  if (!removed->empty()) r.index_.OnWorkerRemoved(worker, *removed);
  response->set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(r.options_.worker_table.heartbeat_interval)));
  return grpc::Status::OK;
}

}  // namespace kvstrata::router

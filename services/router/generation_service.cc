// kvstrata.v1.Generation at the router: Generate (tokenise, hash, route, relay, retry before
// output), Abort and GetServerInfo.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <span>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/radix_hash.h"
#include "core/status_macros.h"
#include "core/tenant_keys.h"
#include "rpc/status.h"
#include "services/common/generate_input.h"
#include "services/router/router_internal.h"

namespace kvstrata::router {

namespace {

// A request's deadline as the worker is given it: the client's less the router's margin.
// InfiniteFuture when the client set none.
absl::Time WorkerDeadline(const grpc::ServerContext& context, absl::Duration margin) {
  if (context.deadline() == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(context.deadline()) - margin;
}

}  // namespace

// What Prepare makes of a request: the prompt and its page keys in the request's namespace.
struct RouterService::Prepared {
  absl::Time accepted;  // when the router took the request
  std::vector<int32_t> prompt;
  std::vector<PageKey> keys;  // the prompt's cacheable full pages
  int64_t page_tokens = 64;
};

// How one worker's attempt ended.
struct RouterService::Attempt {
  bool retry = false;  // nothing reached the client and another worker may succeed
  grpc::Status status;
};

absl::StatusOr<RouterService::Prepared> RouterService::Prepare(
    const v1::GenerateRequest& request) const {
  const Router& r = *router_;
  if (absl::Status s = ValidateRequestEnvelope(request); !s.ok()) return s;
  const std::optional<PoolIdentity> identity = r.identity();
  if (identity && !request.model().empty() && request.model() != identity->model) {
    return absl::NotFoundError(absl::StrCat("model: '", request.model(),
                                            "' is not served here (serving '", identity->model,
                                            "')"));
  }
  Prepared p;
  p.accepted = absl::Now();
  // Tokenise once; the workers get token ids.
  absl::StatusOr<std::vector<int32_t>> tokens =
      PromptTokens(request, r.encoder_, r.encoder_.tokenizer().vocab_size());
  if (!tokens.ok()) return tokens.status();
  p.prompt = *std::move(tokens);
  if (const std::optional<v1::RequestLimits> limits = r.PoolLimits()) {
    if (absl::Status s = CheckContextLimit(static_cast<int64_t>(p.prompt.size()),
                                           request.stop().max_tokens(),
                                           limits->max_context_tokens());
        !s.ok()) {
      return s;
    }
  }
  // The prompt's cacheable pages (one token is always left to prefill), in its namespace.
  if (identity) {
    p.page_tokens = identity->page_tokens;
    const int64_t pages = (static_cast<int64_t>(p.prompt.size()) - 1) / p.page_tokens;
    HashNamespace ns{.model_fingerprint = identity->model_fingerprint,
                     .kv_format = identity->kv_format,
                     .rotation_digest = identity->rotation_digest,
                     .page_tokens = identity->page_tokens,
                     .cache_salt = request.cache_salt()};
    absl::StatusOr<std::vector<PageKey>> k =
        PrefixPageKeys(ns, std::span<const int32_t>(p.prompt).first(pages * p.page_tokens));
    if (!k.ok()) return k.status();
    p.keys = *std::move(k);
  }
  return p;
}

namespace {

// The request with its tenant's cache salt (TenantCacheSalt), the tenant found from the API key
// in the "authorization" metadata. UNAUTHENTICATED without a known key.
absl::StatusOr<v1::GenerateRequest> BindTenant(TenantKeys& keys, const grpc::ServerContext& context,
                                               const v1::GenerateRequest& request) {
  std::string api_key;
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    api_key = BearerToken(absl::string_view(it->second.data(), it->second.size()));
  }
  KV_ASSIGN_OR_RETURN(std::string tenant, keys.TenantFor(api_key));
  if (request.cache_salt().size() + kTenantSaltPrefixBytes >
      static_cast<size_t>(kMaxCacheSaltBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_salt: at most ", kMaxCacheSaltBytes - kTenantSaltPrefixBytes,
                     " bytes (the router adds the tenant's ", kTenantSaltPrefixBytes, ")"));
  }
  v1::GenerateRequest bound = request;
  bound.set_cache_salt(TenantCacheSalt(tenant, request.cache_salt()));
  return bound;
}

}  // namespace

grpc::Status RouterService::RejectUnparseable(grpc::ServerContext* context,
                                              const absl::Status& status) {
  router_->metrics_->rejected.With({absl::StatusCodeToString(status.code())}).Increment();
  fprintf(stderr, "kvstrata-router: refused a Generate request from %s: %s\n",
          context->peer().c_str(), std::string(status.message()).c_str());
  return rpc::ToGrpcStatus(status);
}

grpc::Status RouterService::ServeGenerate(grpc::ServerContext* context,
                                          const v1::GenerateRequest& client_request,
                                          GenerateWriter* writer) {
  Router& r = *router_;
  RouterMetrics& m = *r.metrics_;
  auto fail = [&](const absl::Status& status) {
    m.rejected.With({absl::StatusCodeToString(status.code())}).Increment();
    return rpc::ToGrpcStatus(status);
  };
  // With tenants, the request goes on with its tenant's salt: what the router hashes for
  // routing and what the worker hashes for pages.
  std::optional<v1::GenerateRequest> tenant_request;
  if (r.options_.tenant_keys != nullptr) {
    absl::StatusOr<v1::GenerateRequest> bound =
        BindTenant(*r.options_.tenant_keys, *context, client_request);
    if (!bound.ok()) return fail(bound.status());
    tenant_request = *std::move(bound);
  }
  const v1::GenerateRequest& request = tenant_request ? *tenant_request : client_request;
  absl::StatusOr<Prepared> prepared = Prepare(request);
  if (!prepared.ok()) return fail(prepared.status());

  // Register the request (ALREADY_EXISTS for a duplicate in flight, RESOURCE_EXHAUSTED when full).
  auto flight = std::make_shared<InFlight>();
  flight->server_context = context;
  std::string request_id = request.request_id();
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
  m.running.Get().Increment();
  struct Unregister {
    Router* router;
    InFlight* flight;
    std::string id;
    ~Unregister() {
      {
        // gRPC frees the context once the handler returns.
        std::lock_guard<std::mutex> lock(flight->mu);
        flight->server_context = nullptr;
      }
      router->metrics_->running.Get().Decrement();
      std::lock_guard<std::mutex> lock(router->mu_);
      router->in_flight_.erase(id);
    }
  } unregister{&r, flight.get(), request_id};

  v1::GenerateRequest forward = request;
  forward.set_request_id(request_id);
  // The prompt as token ids, whatever form the client sent (token ids are copied, not appended).
  v1::TokenIds* ids = forward.mutable_token_ids();
  ids->clear_ids();
  ids->mutable_ids()->Reserve(static_cast<int>(prepared->prompt.size()));
  for (int32_t id : prepared->prompt) ids->add_ids(static_cast<uint32_t>(id));
  v1::RoutingHints* hints = forward.mutable_routing();
  hints->Clear();
  hints->set_router_id(r.options_.router_id);
  for (const PageKey& k : prepared->keys) hints->add_prefix_page_keys(k.ToBytes());

  absl::flat_hash_set<std::string> tried;
  grpc::Status last_error(grpc::StatusCode::UNAVAILABLE,
                          "no healthy worker can serve the model; retry with backoff");
  for (int attempt = 0; attempt < r.options_.max_attempts; ++attempt) {
    if (absl::Now() >= WorkerDeadline(*context, r.options_.deadline_margin)) {
      return fail(absl::DeadlineExceededError(
          "the deadline passed before a worker could start on the request"));
    }
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
    RouteRequest route{.page_keys = prepared->keys,
                       .prompt_tokens = static_cast<int64_t>(prepared->prompt.size()),
                       .page_tokens = prepared->page_tokens};
    absl::StatusOr<RouteDecision> decision = r.policy_->Route(route, workers, r.index_);
    if (!decision.ok()) return fail(decision.status());
    tried.insert(decision->worker_id);
    m.decisions.With({std::string(r.policy_->name()), RouteReasonName(decision->reason)})
        .Increment();
    hints->set_predicted_local_cached_tokens(
        static_cast<uint32_t>(decision->local_pages * prepared->page_tokens));
    hints->set_predicted_kvstore_cached_tokens(
        static_cast<uint32_t>(decision->store_pages * prepared->page_tokens));

    Attempt a = RelayFrom(*decision, context, forward, *prepared, *flight, writer);
    if (!a.retry) return a.status;
    fprintf(stderr, "kvstrata-router: request %s: worker %s (%s) failed before output (%s: %s)%s\n",
            request_id.c_str(), decision->worker_id.c_str(), decision->address.c_str(),
            CodeString(a.status.error_code()).c_str(), a.status.error_message().c_str(),
            attempt + 1 < r.options_.max_attempts ? "; trying another worker" : "");
    m.retries.With({CodeString(a.status.error_code())}).Increment();
    last_error = grpc::Status(a.status.error_code(), absl::StrCat("worker ", decision->worker_id,
                                                                  ": ", a.status.error_message()));
  }
  m.rejected.With({CodeString(last_error.error_code())}).Increment();
  return last_error;
}

RouterService::Attempt RouterService::RelayFrom(const RouteDecision& decision,
                                                grpc::ServerContext* context,
                                                const v1::GenerateRequest& forward,
                                                const Prepared& prepared, InFlight& flight,
                                                GenerateWriter* writer) {
  Router& r = *router_;
  RouterMetrics& m = *r.metrics_;
  const std::string& request_id = forward.request_id();
  const std::vector<PageKey>& keys = prepared.keys;
  const int64_t page_tokens = prepared.page_tokens;
  const int64_t predicted_local = decision.local_pages * page_tokens;
  const int64_t predicted_store = decision.store_pages * page_tokens;
  const int64_t predicted = predicted_local + predicted_store;
  const absl::Time start = prepared.accepted;
  const absl::Time routed = absl::Now();
  // A worker with a local tier will hold the prompt's pages once it has prefilled them: count
  // them as its own now, so a request with the same prefix arriving meanwhile goes to the same
  // worker (which lets it wait for those pages rather than compute them again elsewhere).
  bool claimed = false;
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    auto it = r.worker_states_.find(decision.worker_id);
    claimed = it != r.worker_states_.end() && it->second.keeps_local_pages && !keys.empty();
  }
  if (claimed) r.index_.OnWorkerStored(decision.worker_id, keys);
  // Pages the worker did not hold before: withdrawn again if this attempt fails.
  const std::span<const PageKey> claimed_keys =
      claimed ? std::span<const PageKey>(keys).subspan(
                    std::min<size_t>(keys.size(), static_cast<size_t>(decision.local_pages)))
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
  } count_on_worker(&r, decision.worker_id);

  grpc::ClientContext call;
  const absl::Time worker_deadline = WorkerDeadline(*context, r.options_.deadline_margin);
  if (worker_deadline != absl::InfiniteFuture()) call.set_deadline(absl::ToChronoTime(worker_deadline));
  {
    std::lock_guard<std::mutex> lock(flight.mu);
    if (flight.aborted) {
      // As the worker would: finish_reason ABORT with usage, and OK.
      v1::GenerateResponse last;
      last.set_request_id(request_id);
      last.set_finish_reason(v1::FINISH_REASON_ABORT);
      last.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(prepared.prompt.size()));
      last.mutable_usage()->set_uncached_tokens(static_cast<uint32_t>(prepared.prompt.size()));
      last.mutable_timings()->set_total_us(Micros(absl::Now() - start));
      m.requests.With({v1::FinishReason_Name(v1::FINISH_REASON_ABORT)}).Increment();
      writer->Write(last);
      return {.status = grpc::Status::OK};
    }
    flight.worker_call = &call;
    flight.worker_address = decision.address;
  }
  struct Detach {
    InFlight* flight;
    ~Detach() {
      std::lock_guard<std::mutex> lock(flight->mu);
      flight->worker_call = nullptr;
    }
  } detach{&flight};
  if (context->IsCancelled()) call.TryCancel();

  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      r.StubFor(decision.address)->Generate(&call, forward);
  v1::GenerateResponse message;
  bool relayed = false, client_gone = false, finished = false;
  uint32_t relayed_tokens = 0;
  absl::Time last_token = absl::InfinitePast();
  absl::Time touched = absl::InfinitePast();
  while (reader->Read(&message)) {
    const absl::Time now = absl::Now();
    if (now - touched > absl::Milliseconds(100)) {  // the worker is alive: as good as a heartbeat
      r.workers_.Touch(decision.worker_id);
      touched = now;
    }
    if (message.token_ids_size() > 0) {
      if (last_token == absl::InfinitePast()) {
        m.ttft.Get().Observe(absl::ToDoubleSeconds(now - start));
      } else {
        m.inter_token.Get().Observe(absl::ToDoubleSeconds(now - last_token));
      }
      last_token = now;
      relayed_tokens += static_cast<uint32_t>(message.token_ids_size());
    }
    if (message.has_usage()) {
      finished = true;
      const v1::Usage& u = message.usage();
      message.mutable_usage()->set_predicted_cached_tokens(static_cast<uint32_t>(predicted));
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
      m.predicted_cached_tokens.Get().Increment(static_cast<double>(predicted));
      m.predicted_colocated_tokens.Get().Increment(
          static_cast<double>(decision.colocated_store_pages * page_tokens));
      m.generated_tokens.Get().Increment(u.completion_tokens());
      const int64_t error = actual - predicted;
      if (error >= page_tokens) m.mispredictions.With({"under"}).Increment();
      if (-error >= page_tokens) m.mispredictions.With({"over"}).Increment();
      if (r.options_.log_requests) {
        fprintf(stderr,
                "kvstrata-router: request %s -> %s (%s): prompt %u tokens, predicted cached "
                "%lld (local %lld, kvstore %lld of which co-located %lld), actual %lld (local "
                "%u, kvstore %u), generated %u, %.0f ms\n",
                request_id.c_str(), decision.worker_id.c_str(), RouteReasonName(decision.reason),
                u.prompt_tokens(), static_cast<long long>(predicted),
                static_cast<long long>(predicted_local), static_cast<long long>(predicted_store),
                static_cast<long long>(decision.colocated_store_pages * page_tokens),
                static_cast<long long>(actual), u.cached_local_tokens(), u.cached_kvstore_tokens(),
                u.completion_tokens(), absl::ToDoubleMilliseconds(now - start));
      }
      // A local hit shows the worker keeps a local tier though it did not say so: from now on
      // its requests claim their pages at routing time (above). This one's pages were not
      // claimed; the worker holds them now.
      if (!claimed && u.cached_local_tokens() > 0) {
        {
          std::lock_guard<std::mutex> lock(r.mu_);
          r.worker_states_[decision.worker_id].keeps_local_pages = true;
        }
        if (!keys.empty()) r.index_.OnWorkerStored(decision.worker_id, keys);
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
  const bool client_cancelled = client_gone || context->IsCancelled();
  if (!status.ok() && !relayed && !claimed_keys.empty()) {
    r.index_.OnWorkerRemoved(decision.worker_id, claimed_keys);
  }
  auto end = [&](grpc::Status s) {
    m.e2e.Get().Observe(absl::ToDoubleSeconds(absl::Now() - start));
    if (!s.ok()) m.rejected.With({CodeString(s.error_code())}).Increment();
    return Attempt{.status = std::move(s)};
  };
  if (client_cancelled) {
    return end(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the request"));
  }
  if (status.ok() && finished) return end(grpc::Status::OK);
  if (!relayed) {
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return end(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              absl::StrCat("the deadline passed before the first token (worker ",
                                           decision.worker_id, ": ", status.error_message(), ")")));
    }
    grpc::Status failed = status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL,
                                                     "the worker ended its stream without output")
                                      : status;
    if (RetryableOnAnotherWorker(failed.error_code())) return {.retry = true, .status = failed};
    return end(failed);
  }

  // Output began and the worker's stream did not end with its final message: the router ends
  // it. Past the deadline that is finish_reason DEADLINE and OK, as the worker itself would have
  // done; otherwise a final ERROR message, then the same status.
  v1::GenerateResponse last;
  last.set_request_id(request_id);
  last.set_worker_id(decision.worker_id);
  v1::Usage* u = last.mutable_usage();
  u->set_prompt_tokens(static_cast<uint32_t>(prepared.prompt.size()));
  u->set_completion_tokens(relayed_tokens);
  u->set_uncached_tokens(u->prompt_tokens());
  u->set_predicted_cached_tokens(static_cast<uint32_t>(predicted));
  v1::Timings* t = last.mutable_timings();
  t->set_routing_us(Micros(routed - start));
  t->set_total_us(Micros(absl::Now() - start));
  grpc::Status result = grpc::Status::OK;
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    last.set_finish_reason(v1::FINISH_REASON_DEADLINE);
    fprintf(stderr,
            "kvstrata-router: request %s: worker %s had not finished by the deadline; ended the "
            "stream after %u tokens\n",
            request_id.c_str(), decision.worker_id.c_str(), relayed_tokens);
  } else {
    // A worker process that went away mid-stream can look cancelled from here; to the client it
    // is a worker that became unavailable.
    const grpc::StatusCode code =
        status.ok() ? grpc::StatusCode::INTERNAL
        : status.error_code() == grpc::StatusCode::CANCELLED ? grpc::StatusCode::UNAVAILABLE
                                                              : status.error_code();
    const std::string what =
        status.ok() ? "ended its stream without a final message" : status.error_message();
    result = grpc::Status(code, absl::StrCat("worker ", decision.worker_id,
                                             " failed after output began: ", what));
    last.set_finish_reason(v1::FINISH_REASON_ERROR);
    last.mutable_error()->set_code(static_cast<int>(code));
    last.mutable_error()->set_message(result.error_message());
    fprintf(stderr, "kvstrata-router: request %s: %s\n", request_id.c_str(),
            result.error_message().c_str());
  }
  m.requests.With({v1::FinishReason_Name(last.finish_reason())}).Increment();
  m.generated_tokens.Get().Increment(relayed_tokens);
  writer->Write(last);
  return end(result);
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
  if (address.empty()) return grpc::Status::OK;  // not routed yet: it ends when it would be
  // The worker ends the stream with finish_reason ABORT and usage, which the router relays. It
  // may not know the request yet (still in transit): ask again for a short while.
  for (int attempt = 0; attempt < 10; ++attempt) {
    grpc::ClientContext call;
    call.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::AbortResponse answer;
    const grpc::Status status = router_->StubFor(address)->Abort(&call, *request, &answer);
    if (!status.ok()) {
      fprintf(stderr, "kvstrata-router: request %s: forwarding abort to %s failed: %s\n",
              request->request_id().c_str(), address.c_str(), status.error_message().c_str());
      break;
    }
    if (answer.found()) break;
    {
      std::lock_guard<std::mutex> lock(router_->mu_);
      auto it = router_->in_flight_.find(request->request_id());
      if (it == router_->in_flight_.end() || it->second != flight) break;  // it ended meanwhile
    }
    absl::SleepFor(absl::Milliseconds(20));
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
  if (const std::optional<v1::RequestLimits> limits = router_->PoolLimits()) {
    response->set_max_context_tokens(limits->max_context_tokens());
    response->set_max_n(limits->max_n());
    response->set_max_stop_strings(limits->max_stop_strings());
    response->set_max_logprobs_top_n(limits->max_logprobs_top_n());
    *response->mutable_eos_token_ids() = limits->eos_token_ids();
  }
  response->set_max_request_bytes(static_cast<uint32_t>(
      std::min<int64_t>(router_->options_.max_request_bytes, UINT32_MAX)));
  response->set_max_queued_requests(
      static_cast<uint32_t>(router_->options_.max_in_flight_requests));
  response->set_available_workers(static_cast<uint32_t>(router_->LiveWorkers().size()));
  return grpc::Status::OK;
}

}  // namespace kvstrata::router

// The Generate and Abort RPCs. ServeGenerate reads as the steps of a request, in order: check
// the caller, build the engine request (validate, tokenise), register the request id, compute
// the prompt's page keys, take the cached prefix, submit and wait for the engine, then stream
// (decode_stream.cc). RejectUnparseable answers a Generate whose message did not parse.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/radix_hash.h"
#include "rpc/status.h"
#include "services/common/generate_input.h"
#include "services/decode/decode_call.h"
#include "services/decode/decode_internal.h"
#include "services/decode/decode_service.h"
#include "services/decode/request_validation.h"

namespace kvstrata::decode {

namespace {

absl::Time ClientDeadline(const grpc::ServerContext& context) {
  if (context.deadline() == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(context.deadline());
}

}  // namespace

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
  call.engine_request.in_place_hold = std::move(fetched.in_place_hold);
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

}  // namespace kvstrata::decode

#pragma once

// What the router's translation units share and nothing else includes: its metrics, the record
// of a request in flight, and small conversions between the wire and the router's types.

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/metrics.h"
#include "core/radix_hash.h"
#include "services/router/router_service.h"

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
        predicted_colocated_tokens(r->AddCounter(
            "kvstrata_router_predicted_colocated_kvstore_tokens_total",
            "Of the predicted kvstore tokens, those on the kvstore node on the chosen worker's "
            "GPU (fetched by the same-GPU transport).")),
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
        colocated_workers(r->AddGauge(
            "kvstrata_router_colocated_workers",
            "Live workers sharing their GPU with a kvstore node's HBM pool (same_gpu_uuid "
            "equal to the node's GPU).")),
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
            "kvstore WatchEvents streams that ended with an error (then reopened).")),
        kvstore_index_resets(r->AddCounter(
            "kvstrata_router_kvstore_index_resets_total",
            "Times a kvstore node's pages were dropped from the prefix index: resync (its stream "
            "came back and its snapshot replaced them), unreachable (its stream was down longer "
            "than --kvstore_forget_after_ms).",
            {"reason"})) {
    // Labelled series that exist from the start read as 0 rather than as missing (a family
    // without labels has its one series from the start).
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
    for (const char* reason : {"resync", "unreachable"}) kvstore_index_resets.With({reason});
  }

  Family<Counter>& requests;
  Family<Counter>& rejected;
  Family<Counter>& decisions;
  Family<Counter>& retries;
  Family<Counter>& prompt_tokens;
  Family<Counter>& predicted_cached_tokens;
  Family<Counter>& predicted_colocated_tokens;
  Family<Counter>& mispredictions;
  Family<Counter>& generated_tokens;
  Family<Histogram>& ttft;
  Family<Histogram>& inter_token;
  Family<Histogram>& e2e;
  Family<Gauge>& running;
  Family<Gauge>& workers;
  Family<Gauge>& colocated_workers;
  Family<Gauge>& worker_requests;
  Family<Gauge>& worker_free_pages;
  Family<Gauge>& worker_total_pages;
  Family<Counter>& registrations;
  Family<Counter>& dropped;
  Family<Gauge>& index_keys;
  Family<Counter>& kvstore_events;
  Family<Counter>& kvstore_watch_errors;
  Family<Counter>& kvstore_index_resets;
};

// A request in flight: the cancellation thread and Abort reach the worker call through it. The
// handler clears server_context (under mu) before it returns, since gRPC frees the context
// then: the cancellation thread may still hold this record and must not touch a freed context.
struct InFlight {
  std::mutex mu;
  grpc::ServerContext* server_context = nullptr;  // guarded by mu; null once the handler ends
  grpc::ClientContext* worker_call = nullptr;  // guarded by mu; null between attempts
  std::string worker_address;                  // guarded by mu
  bool aborted = false;                        // guarded by mu
};

uint64_t Micros(absl::Duration d);

// Errors after which another worker may succeed: the worker is down, full, draining or broke.
// Errors about the request itself (invalid, too long, duplicate id, deadline) would repeat.
bool RetryableOnAnotherWorker(grpc::StatusCode code);

std::string CodeString(grpc::StatusCode code);

// Keys of 16 bytes from a repeated bytes field; InvalidArgument naming the field otherwise.
absl::StatusOr<std::vector<PageKey>> KeysFromBytes(
    const google::protobuf::RepeatedPtrField<std::string>& field, const char* name);

absl::StatusOr<PoolIdentity> IdentityFrom(const std::string& model,
                                          const std::string& model_fingerprint,
                                          const v1::KvFormat& format);

}  // namespace kvstrata::router

#pragma once

// What the decode service's translation units share (not a public header): the state one
// Generate handler and the engine thread share, the kvstrata_decode_* metrics, and the local
// tier's gauges. decode_generate.cc and decode_stream.cc handle calls, decode_engine_loop.cc
// runs the engine thread, decode_service.cc sets the service up and describes the worker;
// decode_pages.cc holds the page paths (the local tier, kvstore fetches by gRPC, from a
// same-GPU pool or over NCCL, and publishing).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "core/metrics.h"
#include "engine/engine.h"
#include "services/decode/local_pages.h"

namespace kvstrata::decode {

// Lease on the pages a Lookup matched, until they are fetched (or the request ends, for pages
// read from a same-GPU pool).
inline constexpr uint32_t kLookupLeaseMs = 10000;

// What one Generate handler and the engine thread share. The engine thread fills it; the handler
// waits on cv.
struct RequestChannel {
  std::string request_id;
  std::mutex mu;
  std::condition_variable cv;
  bool submitted = false;
  absl::Status submit_status;
  uint64_t sequence_id = 0;
  bool cache_rejected = false;  // the engine refused the cached pages; resubmitted without
  std::deque<engine::GenerationEvent> events;
  std::atomic<bool> abort_requested{false};
};

class DecodeMetrics {
 public:
  explicit DecodeMetrics(MetricsRegistry* r)
      : requests(r->AddCounter("kvstrata_decode_requests_total",
                               "Generate requests finished, by finish reason.", {"finish_reason"})),
        rejected(r->AddCounter("kvstrata_decode_rejected_requests_total",
                               "Generate requests rejected before running, by gRPC code.",
                               {"code"})),
        prompt_tokens(r->AddCounter("kvstrata_decode_prompt_tokens_total",
                                    "Prompt tokens, by the cache tier that held them (none: "
                                    "prefilled).",
                                    {"tier"})),
        generated_tokens(
            r->AddCounter("kvstrata_decode_generated_tokens_total", "Tokens generated.")),
        kvstore_errors(r->AddCounter("kvstrata_decode_kvstore_errors_total",
                                     "kvstore calls that failed (treated as a miss), by operation.",
                                     {"op"})),
        kvstore_transfers(r->AddCounter(
            "kvstrata_decode_kvstore_transfers_total",
            "Cached prefixes taken from a kvstore, by transport: grpc_stream (Fetch) or "
            "same_gpu_pool (the store's HBM pool on this worker's GPU: read in place or copied "
            "GPU to GPU) or "
            "nccl (from a store on another GPU).",
            {"transport"})),
        prefix_pages_in_place(r->AddCounter(
            "kvstrata_decode_prefix_pages_read_in_place_total",
            "Cached prefix pages the engine read where they lie in the HBM pool of a kvstore on "
            "this worker's GPU, for the whole request (not copied; --same_gpu_pages=in_place).")),
        ttft(r->AddHistogram("kvstrata_decode_time_to_first_token_seconds",
                             "RPC accepted until the first token was sent.",
                             LatencyBucketsSeconds())),
        inter_token(r->AddHistogram("kvstrata_decode_inter_token_latency_seconds",
                                    "Time between consecutive generated tokens of one request.",
                                    TokenLatencyBucketsSeconds())),
        e2e(r->AddHistogram("kvstrata_decode_request_duration_seconds",
                            "RPC accepted until the last message was sent.",
                            LatencyBucketsSeconds())),
        running(r->AddGauge("kvstrata_decode_running_sequences", "Sequences decoding now.")),
        waiting(r->AddGauge("kvstrata_decode_waiting_requests",
                            "Requests queued for the engine (service queue + scheduler).")),
        local_cache_bytes(r->AddGauge("kvstrata_decode_local_cache_bytes",
                                      "Bytes of page data in the local page tier.")),
        local_cache_capacity_bytes(
            r->AddGauge("kvstrata_decode_local_cache_capacity_bytes",
                        "Capacity of the local page tier in bytes (0: no local tier).")),
        local_cache_pages(
            r->AddGauge("kvstrata_decode_local_cache_pages", "Pages in the local page tier.")),
        local_cache_evictions(r->AddCounter("kvstrata_decode_local_cache_evictions_total",
                                            "Pages evicted from the local page tier (LRU).")),
        kv_cache_used_bytes(r->AddGauge("kvstrata_decode_kv_cache_used_bytes",
                                        "Bytes of the engine's KV page slots in use.")),
        kv_cache_capacity_bytes(r->AddGauge("kvstrata_decode_kv_cache_capacity_bytes",
                                            "Capacity of the engine's KV cache in bytes.")),
        kv_cache_free_pages(r->AddGauge(
            "kvstrata_decode_kv_cache_free_pages",
            "Free page slots of the pool that bounds how many tokens fit (INT2 history for "
            "split formats, BF16 otherwise).")),
        kv_cache_pages(
            r->AddGauge("kvstrata_decode_kv_cache_pages", "Page slots of that pool in total.")),
        kvstore_fetch_seconds(r->AddHistogram(
            "kvstrata_decode_kvstore_fetch_seconds",
            "Time to look up and fetch a request's cached prefix from the kvstore (hits, misses "
            "and failures).",
            RpcLatencyBucketsSeconds())),
        kvstore_fetched_bytes(r->AddCounter("kvstrata_decode_kvstore_fetched_bytes_total",
                                            "Page bytes fetched from the kvstore.")),
        kvstore_fetch_bytes(r->AddHistogram(
            "kvstrata_decode_kvstore_fetch_bytes",
            "Page bytes of one request's cached prefix fetched from the kvstore (fetches that "
            "returned pages).",
            TransferBucketsBytes())),
        queue_time(r->AddHistogram(
            "kvstrata_decode_queue_time_seconds",
            "RPC accepted until handed to the engine, less the kvstore fetch (the timings' "
            "queue_us): waits for the service queue and for another request's prefill.",
            LatencyBucketsSeconds())),
        kvstore_ejections(r->AddCounter(
            "kvstrata_decode_kvstore_ejections_total",
            "Times a kvstore node was taken out of this worker's ring after failing calls in a "
            "row (its chains go to the other nodes until it is tried again).")),
        prefix_waits(r->AddCounter(
            "kvstrata_decode_prefix_waits_total",
            "Requests that waited for another request on this worker to finish computing "
            "their prompt's pages, instead of computing them too.")),
        kvstore_chain_fallbacks(r->AddCounter(
            "kvstrata_decode_kvstore_chain_fallbacks_total",
            "Same-GPU handshakes resent with every page key because the kvstore refused the "
            "page chain (a store older than the chain form).")),
        nccl_communicators_made(r->AddCounter(
            "kvstrata_decode_nccl_communicators_made_total",
            "NCCL communicators made with kvstores on other GPUs (joined and warmed up).")),
        nccl_setup_failures(r->AddCounter(
            "kvstrata_decode_nccl_setup_failures_total",
            "NCCL setups with a kvstore that failed or missed their deadline (its prefixes come "
            "by gRPC until a later setup works).")),
        nccl_transfers(r->AddCounter("kvstrata_decode_nccl_transfers_total",
                                     "Cached prefixes received over NCCL, digests checked.")),
        nccl_transfer_bytes(r->AddCounter("kvstrata_decode_nccl_transfer_bytes_total",
                                          "Page bytes received over NCCL.")),
        nccl_transfer_failures(r->AddCounter(
            "kvstrata_decode_nccl_transfer_failures_total",
            "NCCL transfers that failed or missed their deadline (a miss; the communicator is "
            "aborted and made again).")),
        nccl_digest_failures(
            r->AddCounter("kvstrata_decode_nccl_digest_failures_total",
                          "NCCL transfers with a page whose digest differed on arrival (a miss).")),
        nccl_aborts(r->AddCounter("kvstrata_decode_nccl_aborts_total",
                                  "NCCL communicators aborted (ncclCommAbort).")),
        nccl_busy(r->AddCounter(
            "kvstrata_decode_nccl_busy_total",
            "Fetches that found their kvstore's NCCL communicator carrying another request's "
            "pages and took another transport.")) {
    // Labelled series that exist from the start read as 0 rather than as missing (a family
    // without labels has its one series from the start).
    for (const char* op : {"lookup", "fetch", "put", "import", "transfer"}) {
      kvstore_errors.With({op});
    }
    for (const char* t : {"grpc_stream", "same_gpu_pool", "nccl"}) kvstore_transfers.With({t});
    for (const char* tier : {"local", "kvstore", "none"}) prompt_tokens.With({tier});
  }

  Family<Counter>& requests;
  Family<Counter>& rejected;
  Family<Counter>& prompt_tokens;
  Family<Counter>& generated_tokens;
  Family<Counter>& kvstore_errors;
  Family<Counter>& kvstore_transfers;
  Family<Counter>& prefix_pages_in_place;
  Family<Histogram>& ttft;
  Family<Histogram>& inter_token;
  Family<Histogram>& e2e;
  Family<Gauge>& running;
  Family<Gauge>& waiting;
  Family<Gauge>& local_cache_bytes;
  Family<Gauge>& local_cache_capacity_bytes;
  Family<Gauge>& local_cache_pages;
  Family<Counter>& local_cache_evictions;
  Family<Gauge>& kv_cache_used_bytes;
  Family<Gauge>& kv_cache_capacity_bytes;
  Family<Gauge>& kv_cache_free_pages;
  Family<Gauge>& kv_cache_pages;
  Family<Histogram>& kvstore_fetch_seconds;
  Family<Counter>& kvstore_fetched_bytes;
  Family<Histogram>& kvstore_fetch_bytes;
  Family<Histogram>& queue_time;
  Family<Counter>& kvstore_ejections;
  Family<Counter>& prefix_waits;
  Family<Counter>& kvstore_chain_fallbacks;
  Family<Counter>& nccl_communicators_made;
  Family<Counter>& nccl_setup_failures;
  Family<Counter>& nccl_transfers;
  Family<Counter>& nccl_transfer_bytes;
  Family<Counter>& nccl_transfer_failures;
  Family<Counter>& nccl_digest_failures;
  Family<Counter>& nccl_aborts;
  Family<Counter>& nccl_busy;
};

// The local tier's size for the gauges.
void UpdateLocalGauges(const LocalPageCache* cache, DecodeMetrics& metrics);

}  // namespace kvstrata::decode

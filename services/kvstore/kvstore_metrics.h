#pragma once

// The kvstrata_kvstore_* Prometheus metrics of KvStoreService (docs/kvstore.md#metrics), in
// their own header so that the service's handlers read as the steps of each call.

#include <cstdint>
#include <mutex>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/metrics.h"
#include "kvstrata/v1/kvstore.pb.h"
#include "services/kvstore/nccl_sender.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore {

// The kvstrata_kvstore_* metrics, declared in one place. Store occupancy and totals are copied
// from PageStore::Stats after every call (counters advance by the difference).
class KvStoreMetrics {
 public:
  explicit KvStoreMetrics(MetricsRegistry& r)
      : pages_(r.AddGauge("kvstrata_kvstore_pages", "Pages stored (primary forms).").Get()),
        recent_copies_(r.AddGauge("kvstrata_kvstore_bf16_recent_copies",
                                  "BF16_RECENT copies stored beside their INT2 pages.")
                           .Get()),
        used_bytes_(r.AddGauge("kvstrata_kvstore_used_bytes", "Bytes of page data stored.").Get()),
        capacity_bytes_(
            r.AddGauge("kvstrata_kvstore_capacity_bytes", "Capacity of the page store.").Get()),
        pinned_pages_(
            r.AddGauge("kvstrata_kvstore_pinned_pages", "Pages covered by a live lease.").Get()),
        active_leases_(r.AddGauge("kvstrata_kvstore_active_leases", "Live leases.").Get()),
        held_leases_(r.AddGauge("kvstrata_kvstore_held_leases",
                                "Live leases held by a same-GPU worker's pool connection "
                                "(pages read in place; no expiry while it is open).")
                         .Get()),
        pool_holders_(r.AddGauge("kvstrata_kvstore_pool_holders",
                                 "Open pool-socket connections that hold leases.")
                          .Get()),
        stored_(
            r.AddCounter("kvstrata_kvstore_pages_stored_total", "Page forms newly stored.").Get()),
        duplicates_(r.AddCounter("kvstrata_kvstore_put_duplicates_total",
                                 "Puts of page forms already stored (nothing written).")
                        .Get()),
        evictions_(r.AddCounter("kvstrata_kvstore_evictions_total",
                                "Pages evicted to make room (LRU leaves).")
                       .Get()),
        evicted_bytes_(r.AddCounter("kvstrata_kvstore_evicted_bytes_total",
                                    "Bytes of pages evicted to make room.")
                           .Get()),
        lookups_(r.AddCounter("kvstrata_kvstore_lookups_total", "Lookup calls.").Get()),
        lookup_pages_(
            r.AddCounter("kvstrata_kvstore_lookup_pages_total", "Page keys asked for in Lookups.")
                .Get()),
        lookup_hit_pages_(r.AddCounter("kvstrata_kvstore_lookup_hit_pages_total",
                                       "Page keys found by Lookups (matched prefix).")
                              .Get()),
        fetched_pages_(
            r.AddCounter("kvstrata_kvstore_fetched_pages_total", "Pages served by Fetch.").Get()),
        fetched_bytes_(
            r.AddCounter("kvstrata_kvstore_fetch_bytes_total", "Page bytes served by Fetch.")
                .Get()),
        checksum_failures_(r.AddCounter("kvstrata_kvstore_checksum_failures_total",
                                        "Puts with a checksum mismatch and pages found corrupt.")
                               .Get()),
        leases_expired_(
            r.AddCounter("kvstrata_kvstore_leases_expired_total", "Leases that expired.").Get()),
        tier_used_(r.AddGauge("kvstrata_kvstore_tier_used_bytes",
                              "Bytes of page data per tier (gpu: the HBM pool; host).", {"tier"})),
        tier_capacity_(
            r.AddGauge("kvstrata_kvstore_tier_capacity_bytes", "Capacity per tier.", {"tier"})),
        tier_forms_(r.AddGauge("kvstrata_kvstore_tier_page_forms",
                               "Page forms (primaries and BF16_RECENT copies) per tier.",
                               {"tier"})),
        tier_moves_(r.AddCounter("kvstrata_kvstore_tier_moves_total",
                                 "Page forms moved between tiers (down: to make room in the GPU "
                                 "tier; up: for a same-GPU transfer).",
                                 {"direction"})),
        transfers_(r.AddCounter("kvstrata_kvstore_transfers_total",
                                "OpenTransfer calls answered, by the transport chosen.",
                                {"transport"})),
        nccl_communicators_(r.AddGauge("kvstrata_kvstore_nccl_communicators",
                                       "NCCL communicators with workers, joining or ready.")
                                .Get()),
        nccl_made_(r.AddCounter("kvstrata_kvstore_nccl_communicators_made_total",
                                "NCCL communicators joined by their worker and warmed up.")
                       .Get()),
        nccl_init_failures_(
            r.AddCounter("kvstrata_kvstore_nccl_init_failures_total",
                         "NCCL communicators that failed to come up or ran past the init "
                         "timeout (aborted).")
                .Get()),
        nccl_sent_(
            r.AddCounter("kvstrata_kvstore_nccl_transfers_total", "NCCL transfers sent in full.")
                .Get()),
        nccl_sent_bytes_(
            r.AddCounter("kvstrata_kvstore_nccl_transfer_bytes_total", "Page bytes sent over NCCL.")
                .Get()),
        nccl_failures_(r.AddCounter("kvstrata_kvstore_nccl_transfer_failures_total",
                                    "NCCL transfers that failed or missed their deadline.")
                           .Get()),
        nccl_aborts_(r.AddCounter("kvstrata_kvstore_nccl_aborts_total",
                                  "NCCL communicators aborted (ncclCommAbort).")
                         .Get()),
        nccl_fallbacks_(r.AddCounter("kvstrata_kvstore_nccl_fallbacks_total",
                                     "Transfers on a ready NCCL communicator answered with "
                                     "another transport (too big for the client or the pool).")
                            .Get()),
        requests_(r.AddCounter("kvstrata_kvstore_requests_total",
                               "KvStore RPCs by method and gRPC status code.", {"method", "code"})),
        latency_(r.AddHistogram("kvstrata_kvstore_request_duration_seconds",
                                "KvStore RPC latency (whole stream for streaming RPCs).",
                                RpcLatencyBucketsSeconds(), {"method"})) {}

  void Record(const char* method, absl::Duration elapsed, absl::StatusCode code) {
    latency_.With({method}).Observe(absl::ToDoubleSeconds(elapsed));
    requests_.With({method, absl::StatusCodeToString(code)}).Increment();
  }

  void Sync(const PageStoreStats& s) {
    pages_.Set(static_cast<double>(s.pages));
    recent_copies_.Set(static_cast<double>(s.bf16_recent_copies));
    used_bytes_.Set(static_cast<double>(s.bytes_used));
    capacity_bytes_.Set(static_cast<double>(s.bytes_capacity));
    pinned_pages_.Set(static_cast<double>(s.pinned_pages));
    active_leases_.Set(static_cast<double>(s.active_leases));
    held_leases_.Set(static_cast<double>(s.held_leases));
    pool_holders_.Set(static_cast<double>(s.open_holders));
    tier_used_.With({"gpu"}).Set(static_cast<double>(s.fast_bytes_used));
    tier_used_.With({"host"}).Set(static_cast<double>(s.host_bytes_used));
    tier_capacity_.With({"gpu"}).Set(static_cast<double>(s.fast_bytes_capacity));
    tier_capacity_.With({"host"}).Set(
        static_cast<double>(s.bytes_capacity - s.fast_bytes_capacity));
    tier_forms_.With({"gpu"}).Set(static_cast<double>(s.fast_forms));
    tier_forms_.With({"host"}).Set(static_cast<double>(s.host_forms));
    std::lock_guard<std::mutex> lock(mu_);
    auto advance = [](Counter& c, uint64_t now, uint64_t before) {
      if (now > before) c.Increment(static_cast<double>(now - before));
    };
    advance(stored_, s.pages_stored_total, last_.pages_stored_total);
    advance(duplicates_, s.put_duplicates_total, last_.put_duplicates_total);
    advance(evictions_, s.evictions_total, last_.evictions_total);
    advance(evicted_bytes_, s.evicted_bytes_total, last_.evicted_bytes_total);
    advance(lookups_, s.lookups_total, last_.lookups_total);
    advance(lookup_pages_, s.lookup_pages_total, last_.lookup_pages_total);
    advance(lookup_hit_pages_, s.lookup_hit_pages_total, last_.lookup_hit_pages_total);
    advance(fetched_pages_, s.fetched_pages_total, last_.fetched_pages_total);
    advance(fetched_bytes_, s.fetched_bytes_total, last_.fetched_bytes_total);
    advance(checksum_failures_, s.checksum_failures_total, last_.checksum_failures_total);
    advance(leases_expired_, s.leases_expired_total, last_.leases_expired_total);
    advance(tier_moves_.With({"down"}), s.demotions_total, last_.demotions_total);
    advance(tier_moves_.With({"up"}), s.promotions_total, last_.promotions_total);
    last_ = s;
  }

  void RecordTransfer(v1::Transport transport) {
    const char* name = "grpc_stream";
    if (transport == v1::TRANSPORT_SAME_GPU_POOL) name = "same_gpu_pool";
    if (transport == v1::TRANSPORT_NCCL) name = "nccl";
    transfers_.With({name}).Increment();
  }

  void RecordNcclFallback() { nccl_fallbacks_.Increment(); }

  void SyncNccl(const NcclSenderCounts& n) {
    nccl_communicators_.Set(static_cast<double>(n.live_communicators));
    std::lock_guard<std::mutex> lock(mu_);
    auto advance = [](Counter& c, uint64_t now, uint64_t before) {
      if (now > before) c.Increment(static_cast<double>(now - before));
    };
    advance(nccl_made_, n.communicators_made, last_nccl_.communicators_made);
    advance(nccl_init_failures_, n.init_failures, last_nccl_.init_failures);
    advance(nccl_sent_, n.transfers, last_nccl_.transfers);
    advance(nccl_sent_bytes_, n.transfer_bytes, last_nccl_.transfer_bytes);
    advance(nccl_failures_, n.transfer_failures, last_nccl_.transfer_failures);
    advance(nccl_aborts_, n.aborts, last_nccl_.aborts);
    last_nccl_ = n;
  }

 private:
  Gauge& pages_;
  Gauge& recent_copies_;
  Gauge& used_bytes_;
  Gauge& capacity_bytes_;
  Gauge& pinned_pages_;
  Gauge& active_leases_;
  Gauge& held_leases_;
  Gauge& pool_holders_;
  Counter& stored_;
  Counter& duplicates_;
  Counter& evictions_;
  Counter& evicted_bytes_;
  Counter& lookups_;
  Counter& lookup_pages_;
  Counter& lookup_hit_pages_;
  Counter& fetched_pages_;
  Counter& fetched_bytes_;
  Counter& checksum_failures_;
  Counter& leases_expired_;
  Family<Gauge>& tier_used_;
  Family<Gauge>& tier_capacity_;
  Family<Gauge>& tier_forms_;
  Family<Counter>& tier_moves_;
  Family<Counter>& transfers_;
  Gauge& nccl_communicators_;
  Counter& nccl_made_;
  Counter& nccl_init_failures_;
  Counter& nccl_sent_;
  Counter& nccl_sent_bytes_;
  Counter& nccl_failures_;
  Counter& nccl_aborts_;
  Counter& nccl_fallbacks_;
  Family<Counter>& requests_;
  Family<Histogram>& latency_;
  std::mutex mu_;
  PageStoreStats last_;
  NcclSenderCounts last_nccl_;
};

}  // namespace kvstrata::kvstore

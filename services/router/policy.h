#pragma once

// Routing policies: given a request's page keys, the live workers and the prefix index, pick a
// worker. Every policy is selectable by name (MakeRoutingPolicy) and documented in
// docs/routing.md. Notation used below, per request and worker w:
//
//   N      request pages (full pages of the prompt), T = prompt tokens, P = tokens per page
//   L_w    leading pages worker w holds (PrefixIndex::Match)
//   S      leading pages the kvstore holds (all nodes together); any worker can fetch them
//   C_w    leading pages held by the kvstore node on worker w's GPU (its co-located node,
//          WorkerInfo::colocated_kvstore; 0 without one), C_w ≤ S; w fetches those by the
//          same-GPU transport, the rest across GPUs or over gRPC
//   q_w    worker w's queue: running + waiting requests
//   q̄      mean queue over the live workers, m = Σ q_w, n = number of workers
//
// round-robin     w = workers[k mod n], k counting calls. Ignores load and cache.
// least-load      argmin q_w; ties by most free pages, then id.
// cache-aware     SGLang's cache-aware policy, a faithful baseline:
//                   if max q − min q > balance_abs (64) and max q > balance_rel (1.5) × min q:
//                     the shortest queue (reason kLoadBalance);
//                   else if max_w L_w·P / T > cache_threshold (0.3): argmax L_w (kAffinity);
//                   else the worker with the smallest cache (fewest used pages, i.e. most free
//                     pages; SGLang's "smallest tree"), reason kSmallestCache.
//                 It is unaware of the kvstore and of load below the imbalance trigger.
// prefix-affinity ours. Prefill cost on w, in pages computed (a fetched page costs r, the
//                 configurable fetch/compute cost ratio, 0 ≤ r ≤ 1; a page fetched from the
//                 co-located node costs r_c, colocated_fetch_cost_ratio, 0 ≤ r_c ≤ r):
//                   F_w     = max(0, S − L_w)       (pages w would fetch)
//                   G_w     = max(0, C_w − L_w)     (of those, on its co-located node)
//                   cost_w  = (N − max(L_w, S)) + r · (F_w − G_w) + r_c · G_w
//                   saved_w = N − cost_w            (pages of prefill avoided)
//                 so a prefix the kvstore holds lowers every worker's cost, and only the part
//                 beyond S (or the fetch it spares) argues for affinity; with no co-located
//                 node anywhere (G_w = 0) this is the cost without the r_c term, and the
//                 choice is the same. Score, as in vLLM's
//                 loadaware, scale-free:
//                   score_w = saved_w·P / T − load_weight · (q_w − q̄) / max(1, q̄)
//                 Bounded load (consistent hashing with bounded loads, Mirrokni et al.): only
//                 workers with q_w + 1 ≤ ⌈c · (m + 1) / n⌉ are eligible (c = load_bound ≥ 1), so
//                 no worker exceeds c × the average load counting this request. The least
//                 loaded worker is always eligible. Pick argmax score among the eligible; ties
//                 by smaller q_w, then id. Reason: kLoadBalance if a better-scoring worker was
//                 over the bound, else kAffinity if the choice saves more than the worst worker
//                 would counting no co-located node (its local pages mattered), else
//                 kColocated if it does counting them (its node's pages mattered), else
//                 kLeastLoad.
//
// Thread-safety: Route may be called concurrently (round-robin's counter is atomic).

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/radix_hash.h"
#include "services/router/prefix_index.h"
#include "services/router/worker_table.h"

namespace kvstrata::router {

enum class RouteReason {
  kRoundRobin,     // round-robin's turn
  kLeastLoad,      // the least loaded worker; cache did not decide
  kAffinity,       // chosen for the pages it holds locally
  kLoadBalance,    // load overrode cache (SGLang's imbalance regime, or our bound)
  kSmallestCache,  // cache-aware's miss path: the worker with the smallest cache
  kColocated,      // chosen for the pages the kvstore node on its GPU holds
};

const char* RouteReasonName(RouteReason reason);

struct RouteRequest {
  std::span<const PageKey> page_keys;  // [full pages of the prompt], in order
  int64_t prompt_tokens = 0;           // T, ≥ page_keys.size() × page_tokens
  int64_t page_tokens = 64;            // P
};

struct RouteDecision {
  std::string worker_id;
  std::string address;
  int64_t local_pages = 0;  // predicted leading pages already on the chosen worker
  int64_t store_pages = 0;  // predicted further pages it can fetch from the kvstore
  // Of store_pages, those on the kvstore node on the chosen worker's GPU (G_w above): fetched by
  // the same-GPU transport.
  int64_t colocated_store_pages = 0;
  RouteReason reason = RouteReason::kLeastLoad;

  int64_t PredictedCachedPages() const { return local_pages + store_pages; }
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual absl::string_view name() const = 0;

  // Picks a worker among `workers` (a WorkerTable snapshot; order matters only for ties and
  // round-robin). Unavailable if `workers` is empty; InvalidArgument if the request is
  // inconsistent (negative tokens, page_tokens ≤ 0, more pages than tokens allow).
  virtual absl::StatusOr<RouteDecision> Route(const RouteRequest& request,
                                              std::span<const WorkerInfo> workers,
                                              PrefixIndex& index) = 0;
};

struct CacheAwareOptions {
  double cache_threshold = 0.3;  // matched tokens / prompt tokens to prefer the best match
  int64_t balance_abs = 64;      // imbalance trigger: max − min queue >
  double balance_rel = 1.5;      // and max queue > balance_rel × min queue
};

struct PrefixAffinityOptions {
  double load_bound = 1.25;       // c: no worker above c × average load (≥ 1)
  double load_weight = 0.5;       // weight of the relative-load penalty in the score (≥ 0)
  double fetch_cost_ratio = 0.1;  // r: cost of fetching a page / computing it, in [0, 1]
  // r_c: the same for a page on the kvstore node on the worker's own GPU, in [0, r]. r / 10 by
  // default: docs/benchmarks/kvstore-gpu.md measures a same-GPU fetch of 1,600 pages at ~3.1 ms
  // (1.9 ms handshake + 1.2 ms gather at 1.9 TB/s) against 5.4 s over gRPC (~1/1,700), and NCCL
  // over NVLink (unmeasured) is a few times slower than the gather, not a thousand: r / 10 sits
  // between. It stays above 0 so that a worker's own pages (no fetch, no lease) still beat its
  // node's, and at r / 10 the co-located preference is worth at most 0.09 of score, less than
  // one extra request's load penalty (0.5 / q̄) while q̄ < 5.5 (docs/routing.md).
  double colocated_fetch_cost_ratio = 0.01;
};

struct RoutingPolicyOptions {
  CacheAwareOptions cache_aware;
  PrefixAffinityOptions prefix_affinity;
};

// "round-robin", "least-load", "cache-aware" or "prefix-affinity". InvalidArgument naming the
// known names for anything else, or naming the option out of range.
absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(
    absl::string_view name, const RoutingPolicyOptions& options = {});

// The names MakeRoutingPolicy accepts.
std::vector<std::string> RoutingPolicyNames();

}  // namespace kvstrata::router

#include "services/router/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace kvstrata::router {
namespace {

absl::Status ValidateRequest(const RouteRequest& request, std::span<const WorkerInfo> workers) {
  if (workers.empty()) return absl::UnavailableError("no live workers to route to");
  if (request.page_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_tokens must be > 0, got ", request.page_tokens));
  }
  const int64_t pages = static_cast<int64_t>(request.page_keys.size());
  if (request.prompt_tokens < pages * request.page_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_tokens=", request.prompt_tokens,
                                                   " is fewer than ", pages, " full pages of ",
                                                   request.page_tokens, " tokens"));
  }
  return absl::OkStatus();
}

// The decision for `worker`, filling the predicted cached pages from `match`.
RouteDecision DecisionFor(const WorkerInfo& worker, const PrefixMatch& match, RouteReason reason) {
  RouteDecision d;
  d.worker_id = worker.id;
  d.address = worker.address;
  d.local_pages = match.WorkerPages(worker.id);
  d.store_pages = std::max<int64_t>(0, match.store_pages - d.local_pages);
  d.colocated_store_pages = std::min<int64_t>(
      d.store_pages,
      std::max<int64_t>(0, match.StoreNodePages(worker.colocated_kvstore) - d.local_pages));
  d.reason = reason;
  return d;
}

// argmin queue; ties by most free pages, then by order (the snapshot is sorted by id).
size_t LeastLoaded(std::span<const WorkerInfo> workers) {
  size_t best = 0;
  for (size_t i = 1; i < workers.size(); ++i) {
    const WorkerLoad& a = workers[i].load;
    const WorkerLoad& b = workers[best].load;
    if (a.requests() < b.requests() ||
        (a.requests() == b.requests() && a.free_pages > b.free_pages)) {
      best = i;
    }
  }
  return best;
}

class RoundRobinPolicy final : public RoutingPolicy {
 public:
  absl::string_view name() const override { return "round-robin"; }
  absl::StatusOr<RouteDecision> Route(const RouteRequest& request,
                                      std::span<const WorkerInfo> workers,
                                      PrefixIndex& index) override {
    KV_RETURN_IF_ERROR(ValidateRequest(request, workers));
    const uint64_t turn = next_.fetch_add(1, std::memory_order_relaxed);
    return DecisionFor(workers[turn % workers.size()], index.Match(request.page_keys),
                       RouteReason::kRoundRobin);
  }

 private:
  std::atomic<uint64_t> next_{0};
};

class LeastLoadPolicy final : public RoutingPolicy {
 public:
  absl::string_view name() const override { return "least-load"; }
  absl::StatusOr<RouteDecision> Route(const RouteRequest& request,
                                      std::span<const WorkerInfo> workers,
                                      PrefixIndex& index) override {
    KV_RETURN_IF_ERROR(ValidateRequest(request, workers));
    return DecisionFor(workers[LeastLoaded(workers)], index.Match(request.page_keys),
                       RouteReason::kLeastLoad);
  }
};

class CacheAwarePolicy final : public RoutingPolicy {
 public:
  explicit CacheAwarePolicy(const CacheAwareOptions& options) : options_(options) {}
  absl::string_view name() const override { return "cache-aware"; }

  absl::StatusOr<RouteDecision> Route(const RouteRequest& request,
                                      std::span<const WorkerInfo> workers,
                                      PrefixIndex& index) override {
    KV_RETURN_IF_ERROR(ValidateRequest(request, workers));
    const PrefixMatch match = index.Match(request.page_keys);
    int64_t max_q = std::numeric_limits<int64_t>::min();
    int64_t min_q = std::numeric_limits<int64_t>::max();
    for (const WorkerInfo& w : workers) {
      max_q = std::max(max_q, w.load.requests());
      min_q = std::min(min_q, w.load.requests());
    }
    if (max_q - min_q > options_.balance_abs &&
        static_cast<double>(max_q) > options_.balance_rel * static_cast<double>(min_q)) {
      return DecisionFor(workers[LeastLoaded(workers)], match, RouteReason::kLoadBalance);
    }
    size_t best = 0;
    for (size_t i = 1; i < workers.size(); ++i) {
      if (match.WorkerPages(workers[i].id) > match.WorkerPages(workers[best].id)) best = i;
    }
    const double ratio =
        request.prompt_tokens == 0
            ? 0.0
            : static_cast<double>(match.WorkerPages(workers[best].id) * request.page_tokens) /
                  static_cast<double>(request.prompt_tokens);
    if (ratio > options_.cache_threshold) {
      return DecisionFor(workers[best], match, RouteReason::kAffinity);
    }
    size_t smallest = 0;
    for (size_t i = 1; i < workers.size(); ++i) {
      const WorkerLoad& a = workers[i].load;
      const WorkerLoad& b = workers[smallest].load;
      const int64_t used_a = a.total_pages - a.free_pages;
      const int64_t used_b = b.total_pages - b.free_pages;
      if (used_a < used_b || (used_a == used_b && a.requests() < b.requests())) smallest = i;
    }
    return DecisionFor(workers[smallest], match, RouteReason::kSmallestCache);
  }

 private:
  const CacheAwareOptions options_;
};

class PrefixAffinityPolicy final : public RoutingPolicy {
 public:
  explicit PrefixAffinityPolicy(const PrefixAffinityOptions& options) : options_(options) {}
  absl::string_view name() const override { return "prefix-affinity"; }

  absl::StatusOr<RouteDecision> Route(const RouteRequest& request,
                                      std::span<const WorkerInfo> workers,
                                      PrefixIndex& index) override {
    KV_RETURN_IF_ERROR(ValidateRequest(request, workers));
    const PrefixMatch match = index.Match(request.page_keys);
    const double n = static_cast<double>(workers.size());
    int64_t total_q = 0;
    for (const WorkerInfo& w : workers) total_q += w.load.requests();
    const double mean_q = static_cast<double>(total_q) / n;
    const int64_t capacity =
        static_cast<int64_t>(std::ceil(options_.load_bound * static_cast<double>(total_q + 1) / n));
    const double num_pages = static_cast<double>(request.page_keys.size());
    const double s = static_cast<double>(match.store_pages);
    const double tokens = std::max<double>(1.0, static_cast<double>(request.prompt_tokens));

    // `colocated`: count the pages on w's co-located node at r_c (else all fetches at r).
    auto saved_pages_with = [&](const WorkerInfo& w, bool colocated) {
      const double l = static_cast<double>(match.WorkerPages(w.id));
      const double fetched = std::max(0.0, s - l);
      const double c = static_cast<double>(match.StoreNodePages(w.colocated_kvstore));
      const double near = colocated ? std::min(fetched, std::max(0.0, c - l)) : 0.0;
      const double cost = (num_pages - std::max(l, s)) +
                          options_.fetch_cost_ratio * (fetched - near) +
                          options_.colocated_fetch_cost_ratio * near;
      return num_pages - cost;
    };
    auto saved_pages = [&](const WorkerInfo& w) { return saved_pages_with(w, true); };
    auto score = [&](const WorkerInfo& w) {
      return saved_pages(w) * static_cast<double>(request.page_tokens) / tokens -
             options_.load_weight * (static_cast<double>(w.load.requests()) - mean_q) /
                 std::max(1.0, mean_q);
    };
    // Better: higher score, then shorter queue, then earlier in the (id-sorted) snapshot.
    auto better = [&](size_t i, double si, size_t j, double sj) {
      if (si != sj) return si > sj;
      return workers[i].load.requests() < workers[j].load.requests();
    };

    size_t best_any = 0, best_eligible = workers.size();
    double score_any = 0, score_eligible = 0;
    for (size_t i = 0; i < workers.size(); ++i) {
      const double si = score(workers[i]);
      if (i == 0 || better(i, si, best_any, score_any)) {
        best_any = i;
        score_any = si;
      }
      if (workers[i].load.requests() + 1 > capacity) continue;
      if (best_eligible == workers.size() || better(i, si, best_eligible, score_eligible)) {
        best_eligible = i;
        score_eligible = si;
      }
    }
    // Unreachable by the bound's maths (the least loaded worker fits), kept as a guard.
    if (best_eligible == workers.size()) best_eligible = LeastLoaded(workers);

    const WorkerInfo& chosen = workers[best_eligible];
    RouteReason reason = RouteReason::kLeastLoad;
    if (best_eligible != best_any && score_any > score_eligible) {
      reason = RouteReason::kLoadBalance;
    } else {
      double min_local = saved_pages_with(workers[0], false);
      double min_saved = saved_pages(workers[0]);
      for (const WorkerInfo& w : workers) {
        min_local = std::min(min_local, saved_pages_with(w, false));
        min_saved = std::min(min_saved, saved_pages(w));
      }
      if (saved_pages_with(chosen, false) > min_local) {
        reason = RouteReason::kAffinity;
      } else if (saved_pages(chosen) > min_saved) {
        reason = RouteReason::kColocated;
      }
    }
    return DecisionFor(chosen, match, reason);
  }

 private:
  const PrefixAffinityOptions options_;
};

}  // namespace

const char* RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kRoundRobin:
      return "round_robin";
    case RouteReason::kLeastLoad:
      return "least_load";
    case RouteReason::kAffinity:
      return "affinity";
    case RouteReason::kLoadBalance:
      return "load_balance";
    case RouteReason::kSmallestCache:
      return "smallest_cache";
    case RouteReason::kColocated:
      return "colocated";
  }
  return "unknown";
}

std::vector<std::string> RoutingPolicyNames() {
  return {"round-robin", "least-load", "cache-aware", "prefix-affinity"};
}

absl::StatusOr<std::unique_ptr<RoutingPolicy>> MakeRoutingPolicy(
    absl::string_view name, const RoutingPolicyOptions& options) {
  if (name == "round-robin") return std::make_unique<RoundRobinPolicy>();
  if (name == "least-load") return std::make_unique<LeastLoadPolicy>();
  if (name == "cache-aware") {
    const CacheAwareOptions& o = options.cache_aware;
    if (!(o.cache_threshold >= 0 && o.cache_threshold <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cache_threshold must be in [0, 1], got ", o.cache_threshold));
    }
    if (o.balance_abs < 0 || !(o.balance_rel >= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("balance_abs must be >= 0 and balance_rel >= 1, got ", o.balance_abs,
                       " and ", o.balance_rel));
    }
    return std::make_unique<CacheAwarePolicy>(o);
  }
  if (name == "prefix-affinity") {
    const PrefixAffinityOptions& o = options.prefix_affinity;
    if (!(o.load_bound >= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("load_bound must be >= 1, got ", o.load_bound));
    }
    if (!(o.load_weight >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("load_weight must be >= 0, got ", o.load_weight));
    }
    if (!(o.fetch_cost_ratio >= 0 && o.fetch_cost_ratio <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fetch_cost_ratio must be in [0, 1], got ", o.fetch_cost_ratio));
    }
    if (!(o.colocated_fetch_cost_ratio >= 0 &&
          o.colocated_fetch_cost_ratio <= o.fetch_cost_ratio)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "colocated_fetch_cost_ratio must be in [0, fetch_cost_ratio = ", o.fetch_cost_ratio,
          "], got ", o.colocated_fetch_cost_ratio));
    }
    return std::make_unique<PrefixAffinityPolicy>(o);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown routing policy '", name, "'; known: ", absl::StrJoin(RoutingPolicyNames(), ", ")));
}

}  // namespace kvstrata::router

#include "loadtest/sim/cluster_sim.h"

#include <algorithm>
#include <deque>
#include <list>
#include <memory>
#include <queue>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/radix_hash.h"
#include "services/router/prefix_index.h"

namespace kvstrata::loadtest {
namespace {

// Pages by key, least recently used first out; reports what it stores and evicts.
class LruPages {
 public:
  explicit LruPages(int64_t capacity_pages) : capacity_(capacity_pages) {}
  bool Contains(const PageKey& k) const { return where_.contains(k); }
  int64_t size() const { return static_cast<int64_t>(where_.size()); }
  // Inserts or refreshes `keys`; appends what was new to `stored` and what left to `evicted`.
  void Put(std::span<const PageKey> keys, std::vector<PageKey>* stored,
           std::vector<PageKey>* evicted) {
    for (const PageKey& k : keys) {
      auto it = where_.find(k);
      if (it != where_.end()) {
        order_.splice(order_.end(), order_, it->second);
        continue;
      }
      if (capacity_ <= 0) return;
      while (static_cast<int64_t>(where_.size()) >= capacity_) {
        evicted->push_back(order_.front());
        where_.erase(order_.front());
        order_.pop_front();
      }
      order_.push_back(k);
      where_[k] = std::prev(order_.end());
      stored->push_back(k);
    }
  }
  void Touch(std::span<const PageKey> keys) {
    for (const PageKey& k : keys) {
      auto it = where_.find(k);
      if (it != where_.end()) order_.splice(order_.end(), order_, it->second);
    }
  }

 private:
  int64_t capacity_;
  std::list<PageKey> order_;
  absl::flat_hash_map<PageKey, std::list<PageKey>::iterator> where_;
};

struct Request {
  double arrival_s = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  std::vector<PageKey> keys;  // full pages of the prompt
  int worker = -1;
  int64_t predicted_pages = 0;
};

struct Worker {
  std::string id;
  std::unique_ptr<LruPages> cache;
  std::deque<int> queue;  // requests waiting for the prefill server
  bool prefilling = false;
  int64_t decoding = 0;
  int64_t assigned = 0;
  double busy_s = 0;
};

enum class EventKind { kArrival, kPrefillDone, kDecodeDone };
struct Event {
  double t;
  EventKind kind;
  int request;
  bool operator>(const Event& o) const { return t > o.t || (t == o.t && request > o.request); }
};

}  // namespace

absl::StatusOr<SimResult> Simulate(const std::vector<TraceRecord>& trace, const SimOptions& o) {
  if (o.workers < 1) return absl::InvalidArgumentError("workers must be >= 1");
  if (o.worker_cache_tokens < 0 || o.kvstore_tokens < 0) {
    return absl::InvalidArgumentError("cache capacities must be >= 0");
  }
  if (!(o.cost.prefill_tokens_per_s > 0 && o.cost.decode_tokens_per_s > 0 &&
        o.cost.fetch_tokens_per_s > 0)) {
    return absl::InvalidArgumentError("every cost must be a rate > 0 tokens/s");
  }
  if (!(o.speedup > 0)) return absl::InvalidArgumentError("speedup must be > 0");
  absl::StatusOr<std::unique_ptr<router::RoutingPolicy>> policy =
      router::MakeRoutingPolicy(o.policy, o.policy_options);
  if (!policy.ok()) return policy.status();
  const int P = o.page_tokens;

  // The requests and their page keys, under one namespace.
  PageKey root;
  std::vector<Request> reqs(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    absl::StatusOr<std::vector<uint32_t>> prompt = TracePrompt(trace[i], o.blocks);
    if (!prompt.ok()) return prompt.status();
    Request& r = reqs[i];
    r.arrival_s = trace[i].timestamp_ms / 1e3 / o.speedup;
    r.prompt_tokens = static_cast<int64_t>(prompt->size());
    r.output_tokens = std::max<int64_t>(
        1, std::llround(trace[i].output_length * o.blocks.block_tokens / 512.0));
    PageKey parent = root;
    for (size_t p = 0; (p + 1) * P <= prompt->size(); ++p) {
      parent = ChainPageKey(parent, std::span<const uint32_t>(prompt->data() + p * P, P));
      r.keys.push_back(parent);
    }
  }

  std::vector<Worker> workers(o.workers);
  for (int w = 0; w < o.workers; ++w) {
    workers[w].id = absl::StrCat("w", w);
    workers[w].cache = std::make_unique<LruPages>(o.worker_cache_tokens / P);
  }
  std::unique_ptr<LruPages> store =
      o.kvstore_tokens > 0 ? std::make_unique<LruPages>(o.kvstore_tokens / P) : nullptr;
  router::PrefixIndexOptions index_options;
  index_options.max_keys = size_t{1} << 26;  // the simulation's index forgets nothing it needs
  router::PrefixIndex index(index_options);

  SimResult res;
  res.requests = static_cast<int64_t>(reqs.size());
  std::vector<double> ttft, queue;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  for (size_t i = 0; i < reqs.size(); ++i) {
    events.push({reqs[i].arrival_s, EventKind::kArrival, static_cast<int>(i)});
  }
  std::vector<PageKey> stored, evicted;
  double first = reqs.empty() ? 0 : reqs.front().arrival_s, last = first;

  // Starts the next queued prefill on worker w at time t.
  auto start_prefill = [&](int w, double t) {
    Worker& wk = workers[w];
    if (wk.prefilling || wk.queue.empty()) return;
    const int i = wk.queue.front();
    wk.queue.pop_front();
    Request& r = reqs[i];
    // As the worker does: its own leading run first, then the kvstore for the pages after it;
    // at most the pages before the last prompt token.
    const int64_t usable = std::min<int64_t>(static_cast<int64_t>(r.keys.size()),
                                             (r.prompt_tokens - 1) / P);
    int64_t local = 0, fetched = 0;
    while (local < usable && wk.cache->Contains(r.keys[local])) ++local;
    while (store && local + fetched < usable && store->Contains(r.keys[local + fetched])) {
      ++fetched;
    }
    const std::span<const PageKey> keys(r.keys);
    wk.cache->Touch(keys.subspan(0, local));
    if (store) store->Touch(keys.subspan(local, fetched));
    const double computed = static_cast<double>(r.prompt_tokens - (local + fetched) * P);
    const double prefill_s = computed / o.cost.prefill_tokens_per_s +
                             static_cast<double>(fetched * P) / o.cost.fetch_tokens_per_s;
    wk.prefilling = true;
    wk.busy_s += prefill_s;
    res.prompt_tokens += r.prompt_tokens;
    res.cached_local_tokens += local * P;
    res.cached_kvstore_tokens += fetched * P;
    res.predicted_cached_tokens += r.predicted_pages * P;
    queue.push_back(1e3 * (t - r.arrival_s));
    ttft.push_back(1e3 * (t + prefill_s - r.arrival_s));
    events.push({t + prefill_s, EventKind::kPrefillDone, i});
  };

  while (!events.empty()) {
    const Event e = events.top();
    events.pop();
    last = std::max(last, e.t);
    Request& r = reqs[e.request];
    switch (e.kind) {
      case EventKind::kArrival: {
        std::vector<router::WorkerInfo> snapshot(o.workers);
        for (int w = 0; w < o.workers; ++w) {
          const Worker& wk = workers[w];
          snapshot[w].id = wk.id;
          snapshot[w].address = wk.id;
          snapshot[w].load.running = wk.decoding + (wk.prefilling ? 1 : 0);
          snapshot[w].load.waiting = static_cast<int64_t>(wk.queue.size());
          snapshot[w].load.total_pages = o.worker_cache_tokens / P;
          snapshot[w].load.free_pages = o.worker_cache_tokens / P - wk.cache->size();
        }
        router::RouteRequest rr;
        rr.page_keys = r.keys;
        rr.prompt_tokens = r.prompt_tokens;
        rr.page_tokens = P;
        absl::StatusOr<router::RouteDecision> d = (*policy)->Route(rr, snapshot, index);
        if (!d.ok()) return d.status();
        int w = 0;
        while (w < o.workers && workers[w].id != d->worker_id) ++w;
        if (w == o.workers) return absl::InternalError("the policy chose an unknown worker");
        r.worker = w;
        r.predicted_pages = d->PredictedCachedPages();
        ++workers[w].assigned;
        workers[w].queue.push_back(e.request);
        start_prefill(w, e.t);
        break;
      }
      case EventKind::kPrefillDone: {
        Worker& wk = workers[r.worker];
        wk.prefilling = false;
        ++wk.decoding;
        // The prompt's pages enter the worker's cache and are published to the kvstore.
        stored.clear();
        evicted.clear();
        wk.cache->Put(r.keys, &stored, &evicted);
        if (!evicted.empty()) index.OnWorkerRemoved(wk.id, evicted);
        if (!stored.empty()) index.OnWorkerStored(wk.id, stored);
        if (store) {
          stored.clear();
          evicted.clear();
          store->Put(r.keys, &stored, &evicted);
          if (!evicted.empty()) index.OnStoreRemoved(evicted);
          if (!stored.empty()) index.OnStoreStored(stored);
        }
        events.push({e.t + r.output_tokens / o.cost.decode_tokens_per_s, EventKind::kDecodeDone,
                     e.request});
        start_prefill(r.worker, e.t);
        break;
      }
      case EventKind::kDecodeDone:
        --workers[r.worker].decoding;
        r.keys.clear();
        r.keys.shrink_to_fit();
        break;
    }
  }
  res.ttft_ms = Distribute(ttft);
  res.queue_ms = Distribute(queue);
  int64_t max_req = 0;
  double max_busy = 0, sum_busy = 0;
  for (const Worker& wk : workers) {
    res.requests_per_worker.push_back(wk.assigned);
    res.prefill_busy_s_per_worker.push_back(wk.busy_s);
    max_req = std::max(max_req, wk.assigned);
    max_busy = std::max(max_busy, wk.busy_s);
    sum_busy += wk.busy_s;
  }
  const double mean_req = static_cast<double>(res.requests) / o.workers;
  res.request_imbalance = mean_req > 0 ? max_req / mean_req : 0;
  res.busy_imbalance = sum_busy > 0 ? max_busy / (sum_busy / o.workers) : 0;
  res.simulated_s = last - first;
  return res;
}

}  // namespace kvstrata::loadtest

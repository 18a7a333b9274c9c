// The engine thread: the one thread that touches the Engine. It takes the handlers' submits,
// cancellations and tasks from the queue under mu_, runs Scheduler::Step, and hands each event
// to its request's channel; RequestCancel is how a handler queues a cancellation.

#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/decode/decode_internal.h"
#include "services/decode/decode_service.h"

namespace kvstrata::decode {

void DecodeService::RequestCancel(uint64_t sequence_id, engine::FinishReason reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back({sequence_id, reason});
  }
  engine_cv_.notify_all();
}

void DecodeService::EngineLoop() {
  engine::Scheduler& scheduler = engine_->scheduler();
  std::vector<engine::GenerationEvent> events;
  for (;;) {
    std::deque<PendingSubmit> submits;
    std::deque<PendingCancel> cancels;
    std::deque<std::function<void()>> tasks;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      engine_cv_.wait(lock, [&] {
        return stopping_ || !tasks_.empty() || !submits_.empty() || !cancels_.empty() ||
               !scheduler.idle();
      });
      tasks.swap(tasks_);
      stopping = stopping_;
      if (stopping && scheduler.idle() && submits_.empty() && tasks.empty()) break;
      submits.swap(submits_);
      cancels.swap(cancels_);
      if (stopping) {
        for (const auto& [id, channel] : running_) {
          cancels.push_back({id, engine::FinishReason::kCancelled});
        }
      }
    }
    for (std::function<void()>& task : tasks) task();
    for (PendingSubmit& s : submits) {
      absl::StatusOr<uint64_t> id = absl::UnavailableError("the server is shutting down");
      bool rejected = false;
      if (!stopping) {
        engine::GenerationRequest fallback;
        const bool had_cache =
            !s.request.cached_pages.empty() || !s.request.device_cached_pages.empty();
        if (had_cache) {
          fallback = s.request;
          fallback.cached_pages.clear();
          fallback.device_cached_pages.clear();
          fallback.cached_pages_owner.reset();  // let go with the refused request
          fallback.in_place_hold.reset();
        }
        id = engine_->Submit(std::move(s.request));
        if (!id.ok() && had_cache && id.status().code() == absl::StatusCode::kInvalidArgument) {
          fprintf(stderr,
                  "kvstrata-decode: request %s: engine rejected the cached pages (%s); "
                  "prefilling the whole prompt\n",
                  fallback.request_id.c_str(), std::string(id.status().message()).c_str());
          metrics_->kvstore_errors.With({"import"}).Increment();
          rejected = true;
          id = engine_->Submit(std::move(fallback));
        }
      }
      if (id.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        running_[*id] = s.channel;
      }
      {
        std::lock_guard<std::mutex> lock(s.channel->mu);
        s.channel->submitted = true;
        s.channel->submit_status = id.status();
        if (id.ok()) s.channel->sequence_id = *id;
        s.channel->cache_rejected = rejected;
      }
      s.channel->cv.notify_all();
    }
    for (const PendingCancel& c : cancels) scheduler.Cancel(c.sequence_id, c.reason);

    events.clear();
    if (!scheduler.idle()) {
      const absl::Time step_start = absl::Now();
      const absl::Status status = scheduler.Step(&events);
      const int64_t micros = absl::ToInt64Microseconds(absl::Now() - step_start);
      const int64_t before = step_micros_.load(std::memory_order_relaxed);
      step_micros_.store(before == 0 ? micros : (4 * before + micros) / 5,
                         std::memory_order_relaxed);
      if (!status.ok()) {
        // The step's sequences are in an unknown state: end them all with an error.
        fprintf(stderr, "kvstrata-decode: engine step failed: %s\n", status.ToString().c_str());
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, channel] : running_) {
          scheduler.Cancel(id, engine::FinishReason::kError);
        }
      }
    }
    for (engine::GenerationEvent& e : events) {
      std::shared_ptr<RequestChannel> channel;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = running_.find(e.sequence_id);
        if (it == running_.end()) continue;
        channel = it->second;
        if (e.finish != engine::FinishReason::kNone) running_.erase(it);
      }
      if (e.token >= 0) generated_tokens_.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(channel->mu);
        channel->events.push_back(std::move(e));
      }
      channel->cv.notify_all();
    }
    kv_bytes_in_use_.store(engine_->KvBytesInUse());
    active_sequences_.store(scheduler.running() + scheduler.waiting());
    scheduler_waiting_.store(scheduler.waiting());
    scheduler_running_.store(scheduler.running());
    {
      // Free pages of the pool that bounds how many tokens fit: INT2 history for split
      // formats, BF16 otherwise.
      const engine::KvCache& cache = engine_->cache();
      free_pages_.store(cache.int2_pool() != nullptr ? cache.free_int2_slots()
                                                     : cache.free_bf16_slots());
    }
    metrics_->kv_cache_used_bytes.Get().Set(static_cast<double>(kv_bytes_in_use_.load()));
    metrics_->kv_cache_free_pages.Get().Set(static_cast<double>(free_pages_.load()));
    metrics_->running.Get().Set(scheduler.running());
    {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_->waiting.Get().Set(scheduler.waiting() + static_cast<double>(submits_.size()));
    }
  }
}

}  // namespace kvstrata::decode

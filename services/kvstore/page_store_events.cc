// The page store's log of stored/removed events: appending to the bounded backlog, the
// snapshot a new watcher starts from, and the wait of a watcher for what follows.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore {

std::pair<std::vector<PageEvent>, uint64_t> PageStore::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  std::vector<PageEvent> events;
  events.reserve(entries_.size() + recent_copies_);
  for (const auto& [key, entry] : entries_) {
    events.push_back({.sequence = last_sequence_,
                      .time = now,
                      .snapshot = true,
                      .kind = PageEvent::Kind::kStored,
                      .page = entry.primary.meta});
    if (entry.recent.has_value()) {
      events.push_back({.sequence = last_sequence_,
                        .time = now,
                        .snapshot = true,
                        .kind = PageEvent::Kind::kStored,
                        .page = entry.recent->meta});
    }
  }
  // A child's page_index is its parent's plus one (checked on Put), so ordering by index puts
  // parents first; a copy sorts after its primary.
  std::stable_sort(events.begin(), events.end(), [](const PageEvent& a, const PageEvent& b) {
    return std::make_pair(a.page.page_index, a.page.form == PageForm::kBf16Recent) <
           std::make_pair(b.page.page_index, b.page.form == PageForm::kBf16Recent);
  });
  return {std::move(events), last_sequence_};
}

std::vector<PageEvent> PageStore::WaitForEvents(uint64_t after_sequence, absl::Time deadline,
                                                size_t max_events) {
  std::unique_lock<std::mutex> lock(mu_);
  while (last_sequence_ <= after_sequence || events_.empty()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return {};
    events_cv_.wait_for(lock, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  std::vector<PageEvent> out;
  const uint64_t first_kept = events_.front().sequence;
  size_t start = after_sequence < first_kept ? 0 : after_sequence - first_kept + 1;
  for (size_t i = start; i < events_.size() && out.size() < max_events; ++i) {
    out.push_back(events_[i]);
  }
  return out;
}

void PageStore::AppendEventLocked(PageEvent event) {
  event.sequence = ++last_sequence_;
  events_.push_back(std::move(event));
  while (events_.size() > options_.event_backlog) events_.pop_front();
  events_cv_.notify_all();
}

}  // namespace kvstrata::kvstore

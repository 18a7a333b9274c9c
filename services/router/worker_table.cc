#include "services/router/worker_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace kvstrata::router {

WorkerTable::WorkerTable(const WorkerTableOptions& options, const Clock* clock)
    : options_(options), clock_(clock) {
  KV_CHECK(clock_ != nullptr);
  KV_CHECK(options_.heartbeat_interval > absl::ZeroDuration());
  KV_CHECK(options_.max_missed_heartbeats > 0) << options_.max_missed_heartbeats;
}

absl::Status WorkerTable::AddStatic(absl::string_view id, absl::string_view address) {
  if (id.empty() || address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("worker needs an id and an address, got id='",
                                                   id, "' address='", address, "'"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (workers_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("worker '", id, "' is already known"));
  }
  WorkerInfo info;
  info.id = std::string(id);
  info.address = std::string(address);
  info.last_heartbeat = clock_->Now();
  info.is_static = true;
  workers_.emplace(info.id, std::move(info));
  return absl::OkStatus();
}

absl::Status WorkerTable::Register(absl::string_view id, absl::string_view address,
                                   const WorkerLoad& load, absl::string_view same_gpu_uuid) {
  if (id.empty() || address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("worker needs an id and an address, got id='",
                                                   id, "' address='", address, "'"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  WorkerInfo& info = workers_[id];
  info.id = std::string(id);
  info.address = std::string(address);
  info.load = load;
  info.same_gpu_uuid = std::string(same_gpu_uuid);
  info.last_heartbeat = clock_->Now();
  return absl::OkStatus();
}

absl::Status WorkerTable::Heartbeat(absl::string_view id, const WorkerLoad& load) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireStaleLocked();
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker '", id, "' is not registered (or was dropped): register again"));
  }
  it->second.load = load;
  it->second.last_heartbeat = clock_->Now();
  return absl::OkStatus();
}

void WorkerTable::Touch(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(id);
  if (it != workers_.end()) it->second.last_heartbeat = std::max(it->second.last_heartbeat, clock_->Now());
}

bool WorkerTable::Remove(absl::string_view id) {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.erase(id) > 0;
}

std::vector<std::string> WorkerTable::ExpireStale() {
  std::lock_guard<std::mutex> lock(mu_);
  return ExpireStaleLocked();
}

std::vector<std::string> WorkerTable::ExpireStaleLocked() {
  const absl::Time now = clock_->Now();
  const absl::Duration limit = options_.heartbeat_interval * options_.max_missed_heartbeats;
  std::vector<std::string> dropped;
  for (const auto& [id, info] : workers_) {
    if (!info.is_static && now - info.last_heartbeat > limit) dropped.push_back(id);
  }
  for (const std::string& id : dropped) workers_.erase(id);
  std::sort(dropped.begin(), dropped.end());
  return dropped;
}

std::vector<WorkerInfo> WorkerTable::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireStaleLocked();
  std::vector<WorkerInfo> out;
  out.reserve(workers_.size());
  for (const auto& [id, info] : workers_) out.push_back(info);
  std::sort(out.begin(), out.end(),
            [](const WorkerInfo& a, const WorkerInfo& b) { return a.id < b.id; });
  return out;
}

size_t WorkerTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.size();
}

}  // namespace kvstrata::router

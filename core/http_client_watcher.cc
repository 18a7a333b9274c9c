#include "core/http_client_watcher.h"

#include <poll.h>

#include <utility>
#include <vector>

namespace kvstrata::http {

void Exchange::SetCancel(std::function<void()> cancel) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!gone_) {
    cancel_ = std::move(cancel);
    return;
  }
  lock.unlock();
  if (cancel) cancel();
}

void Exchange::Gone() {
  std::function<void()> cancel;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_) return;
    gone_ = true;
    cancel = std::move(cancel_);
  }
  if (cancel) cancel();
}

ClientWatcher::ClientWatcher() : thread_([this] { Loop(); }) {}

ClientWatcher::~ClientWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ClientWatcher::Watch(int fd, Exchange* exchange) {
  bool gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone = all_gone_;
    watched_[exchange] = {.fd = fd, .id = next_id_++, .fired = gone};
  }
  if (gone) exchange->Gone();
  cv_.notify_all();
}

void ClientWatcher::Unwatch(Exchange* exchange) {
  std::lock_guard<std::mutex> lock(mu_);
  watched_.erase(exchange);
}

void ClientWatcher::AllGone() {
  std::lock_guard<std::mutex> lock(mu_);
  all_gone_ = true;
  // Under the lock, so that no exchange is unwatched and freed meanwhile.
  for (auto& [exchange, entry] : watched_) {
    if (!entry.fired) exchange->Gone();
    entry.fired = true;
  }
}

void ClientWatcher::Loop() {
  std::vector<pollfd> fds;
  std::vector<std::pair<Exchange*, uint64_t>> who;
  while (true) {
    fds.clear();
    who.clear();
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] {
        if (stop_) return true;
        for (const auto& [exchange, entry] : watched_) {
          if (!entry.fired) return true;
        }
        return false;
      });
      if (stop_) return;
      for (const auto& [exchange, entry] : watched_) {
        if (entry.fired) continue;
        fds.push_back({.fd = entry.fd, .events = POLLRDHUP, .revents = 0});
        who.emplace_back(exchange, entry.id);
      }
    }
    // Sockets watched meanwhile join at the next round, 50 ms later at most.
    if (poll(fds.data(), fds.size(), /*timeout=*/50) <= 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) continue;
      auto it = watched_.find(who[i].first);
      // Still the same registration, so the descriptor was still this request's socket.
      if (it == watched_.end() || it->second.id != who[i].second || it->second.fired) continue;
      it->second.fired = true;
      it->first->Gone();
    }
  }
}

}  // namespace kvstrata::http

#pragma once

// transport/nccl.h in host memory, for CPU tests of the kvstore's and the worker's NCCL code:
// communicators of any size joined by threads of one process (each Join waits, to its deadline,
// for the other ranks), and transfers that behave like NCCL's point-to-point: a rank's sends to
// a peer are matched in order with that peer's receives, a send completes only when received,
// and a size mismatch is an error. Faults for the failure paths: a Join that fails, bytes
// corrupted in flight. Abort wakes whoever waits on the communicator. Digest checkers check on
// the host, refuse more pages than they were made for, and are counted.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/page_digest.h"
#include "transport/nccl.h"

namespace kvstrata::testing {

class FakeNccl final : public transport::NcclRuntime {
 public:
  // What tests look at and the faults they set (guarded by mu()).
  struct Record {
    int joins = 0;  // communicators joined (every rank counts)
    int join_timeouts = 0;
    int aborts = 0;
    int transfers = 0;     // Transfer calls that completed
    int sends_posted = 0;  // sends handed to a peer's channel (received or not)
    bool fail_joins = false;
    bool corrupt_next_send = false;   // flips a byte of the next page sent
    bool hold_sends = false;          // sends are posted but never reach the peer (a dead sender)
    int digest_checkers = 0;          // NewDigestChecker calls
    size_t digest_checker_pages = 0;  // max_pages of the last one
    int digest_checks = 0;            // Check calls that ran (within max_pages)
  };

  absl::StatusOr<std::string> NewUniqueId() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string id(transport::kNcclUniqueIdBytes, '\0');
    const std::string n = absl::StrCat("fake-", ++next_id_);
    std::memcpy(id.data(), n.data(), n.size());
    return id;
  }

  absl::StatusOr<std::unique_ptr<transport::NcclCommunicator>> Join(
      const std::string& unique_id, int num_ranks, int rank, int device, absl::Time deadline,
      const std::atomic<bool>* cancel) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (record_.fail_joins) return absl::UnavailableError("fake: joins fail");
    std::shared_ptr<World>& world = worlds_[unique_id];
    if (world == nullptr) world = std::make_shared<World>(num_ranks);
    std::shared_ptr<World> w = world;
    ++w->joined;
    cv_.notify_all();
    while (w->joined < w->num_ranks) {
      if (cancel != nullptr && cancel->load()) {
        --w->joined;
        ++record_.aborts;
        return absl::CancelledError("fake: join cancelled");
      }
      if (absl::Now() >= deadline) {
        --w->joined;
        ++record_.join_timeouts;
        ++record_.aborts;
        return absl::DeadlineExceededError("fake: the other ranks did not join");
      }
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
    ++record_.joins;
    return std::unique_ptr<transport::NcclCommunicator>(new Comm(this, w, rank));
  }

  absl::StatusOr<std::shared_ptr<transport::DeviceRange>> Allocate(int device,
                                                                   uint64_t bytes) override {
    auto storage = std::make_shared<std::vector<uint8_t>>(bytes);
    auto* range = new transport::DeviceRange{storage->data(), bytes};
    return std::shared_ptr<transport::DeviceRange>(
        range, [storage](transport::DeviceRange* r) { delete r; });
  }

  absl::StatusOr<std::unique_ptr<transport::DigestChecker>> NewDigestChecker(
      int device, size_t max_pages) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++record_.digest_checkers;
    record_.digest_checker_pages = max_pages;
    return std::unique_ptr<transport::DigestChecker>(new Checker(this, max_pages));
  }

  uint32_t version() const override { return 22809; }

  std::mutex& mu() { return mu_; }
  Record& record() { return record_; }  // with mu() held

 private:
  struct Message {
    std::vector<uint8_t> bytes;
    bool* received;  // set by the receiver; the sender waits for it
  };
  class Checker final : public transport::DigestChecker {
   public:
    Checker(FakeNccl* nccl, size_t max_pages) : nccl_(nccl), max_pages_(max_pages) {}
    size_t max_pages() const override { return max_pages_; }
    absl::Status Check(std::span<const transport::DigestCheck> pages) override {
      if (pages.size() > max_pages_) {
        return absl::InvalidArgumentError(
            absl::StrCat(pages.size(), " pages, above the checker's ", max_pages_));
      }
      {
        std::lock_guard<std::mutex> lock(nccl_->mu_);
        ++nccl_->record_.digest_checks;
      }
      for (size_t i = 0; i < pages.size(); ++i) {
        if (PageDigest64(pages[i].data, pages[i].bytes) != pages[i].expected_digest) {
          return absl::DataLossError(absl::StrCat("page ", i, " of the transfer: digest mismatch"));
        }
      }
      return absl::OkStatus();
    }

   private:
    FakeNccl* nccl_;
    size_t max_pages_;
  };
  struct World {
    explicit World(int n) : num_ranks(n) {}
    int num_ranks;
    int joined = 0;
    bool aborted = false;
    std::map<std::pair<int, int>, std::deque<Message>> channels;  // (from, to)
  };

  class Comm final : public transport::NcclCommunicator {
   public:
    Comm(FakeNccl* nccl, std::shared_ptr<World> world, int rank)
        : nccl_(nccl), world_(std::move(world)), rank_(rank) {}
    ~Comm() override { Abort(); }
    int rank() const override { return rank_; }
    int num_ranks() const override { return world_->num_ranks; }
    absl::Status Register(transport::DeviceRange) override { return absl::OkStatus(); }
    bool broken() const override { return broken_.load(); }

    void Abort() override {
      std::lock_guard<std::mutex> lock(nccl_->mu_);
      AbortLocked();
    }

    absl::Status Transfer(int peer, std::span<const transport::DeviceRange> sends,
                          std::span<const transport::DeviceRange> recvs,
                          absl::Time deadline) override {
      std::unique_lock<std::mutex> lock(nccl_->mu_);
      if (broken_) return absl::FailedPreconditionError("fake: the communicator was aborted");
      std::vector<std::unique_ptr<bool>> received;
      for (const transport::DeviceRange& s : sends) {
        if (nccl_->record_.hold_sends) break;
        received.push_back(std::make_unique<bool>(false));
        std::vector<uint8_t> bytes(s.data, s.data + s.bytes);
        if (nccl_->record_.corrupt_next_send && !bytes.empty()) {
          nccl_->record_.corrupt_next_send = false;
          bytes[bytes.size() / 2] ^= 0x10;
        }
        world_->channels[{rank_, peer}].push_back({std::move(bytes), received.back().get()});
        ++nccl_->record_.sends_posted;
      }
      nccl_->cv_.notify_all();
      auto late = [&]() -> absl::Status {
        if (world_->aborted || broken_) {
          AbortLocked();
          return absl::UnavailableError("fake: the peer aborted the communicator");
        }
        if (absl::Now() < deadline) return absl::OkStatus();
        AbortLocked();
        return absl::DeadlineExceededError("fake: the transfer missed its deadline (aborted)");
      };
      for (const transport::DeviceRange& r : recvs) {
        std::deque<Message>& in = world_->channels[{peer, rank_}];
        while (in.empty()) {
          if (absl::Status s = late(); !s.ok()) return s;
          nccl_->cv_.wait_for(lock, std::chrono::milliseconds(2));
        }
        Message m = std::move(in.front());
        in.pop_front();
        if (m.bytes.size() != r.bytes) {
          *m.received = true;
          AbortLocked();
          return absl::UnavailableError(absl::StrCat("fake: message of ", m.bytes.size(),
                                                     " bytes into a receive of ", r.bytes));
        }
        std::memcpy(r.data, m.bytes.data(), r.bytes);
        *m.received = true;
        nccl_->cv_.notify_all();
      }
      for (const std::unique_ptr<bool>& done : received) {
        while (!*done) {
          if (absl::Status s = late(); !s.ok()) {
            // Withdraw what was not received, as an aborted NCCL communicator would.
            std::deque<Message>& out = world_->channels[{rank_, peer}];
            std::erase_if(out, [&](const Message& m) {
              return std::any_of(
                  received.begin(), received.end(),
                  [&](const std::unique_ptr<bool>& b) { return b.get() == m.received; });
            });
            return s;
          }
          nccl_->cv_.wait_for(lock, std::chrono::milliseconds(2));
        }
      }
      ++nccl_->record_.transfers;
      return absl::OkStatus();
    }

   private:
    void AbortLocked() {
      if (broken_.exchange(true)) return;
      world_->aborted = true;
      ++nccl_->record_.aborts;
      nccl_->cv_.notify_all();
    }
    FakeNccl* nccl_;
    std::shared_ptr<World> world_;
    int rank_;
    std::atomic<bool> broken_{false};
  };

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<World>> worlds_;
  int next_id_ = 0;
  Record record_;
};

}  // namespace kvstrata::testing

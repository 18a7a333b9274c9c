#pragma once

// A Clock (core/clock.h) that moves only when a test advances it. Thread-safe: services read it
// from their own threads while the test advances it.

#include <mutex>

#include "absl/time/time.h"
#include "core/clock.h"

namespace kvstrata::test_util {

class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time Now() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ += d;
  }

 private:
  mutable std::mutex mu_;
  absl::Time now_;
};

}  // namespace kvstrata::test_util

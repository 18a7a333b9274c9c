#pragma once

// The clock seam: services read time through it, so tests drive leases, heartbeats and expiry
// with a fake clock instead of sleeping.

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvstrata {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace kvstrata

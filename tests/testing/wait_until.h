#pragma once

// Polling for a condition that another thread or process makes true, in tests.

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvstrata::test_util {

// Polls `done` every few milliseconds until it holds or `timeout` has passed; whether it held.
template <typename Done>
bool WaitUntil(Done done, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

}  // namespace kvstrata::test_util

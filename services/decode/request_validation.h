#pragma once

// The checks of a GenerateRequest's fields that need no engine (sampling ranges, stop strings,
// logprobs, priority), and the limits they enforce. Internal to the decode service.

#include "absl/status/status.h"

namespace kvstrata::v1 {
class GenerateRequest;
}  // namespace kvstrata::v1

namespace kvstrata::decode {

// Most stop.stop_strings a request may carry (reported in RequestLimits).
inline constexpr int kMaxStopStrings = 16;

// Field checks of the proto contract that need no engine: INVALID_ARGUMENT naming the field.
absl::Status ValidateRequest(const v1::GenerateRequest& r, int max_logprobs_top_n);

}  // namespace kvstrata::decode

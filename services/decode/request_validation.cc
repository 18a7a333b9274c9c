// The decode worker's checks of a GenerateRequest's fields that need no engine.

#include "services/decode/request_validation.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kvstrata/v1/generate.pb.h"
#include "services/common/generate_input.h"

namespace kvstrata::decode {

namespace {

// True when lo <= v <= hi (false for NaN).
bool InRange(float v, float lo, float hi) { return v >= lo && v <= hi; }

absl::Status RangeError(const char* field, float v, const char* range) {
  return absl::InvalidArgumentError(absl::StrCat(field, "=", v, " must be in ", range));
}

}  // namespace

// Field checks of the proto contract that need no engine.
absl::Status ValidateRequest(const v1::GenerateRequest& r, int max_logprobs_top_n) {
  if (absl::Status s = ValidateRequestEnvelope(r); !s.ok()) return s;
  if (absl::Status s = ValidateRoutingHints(r.routing()); !s.ok()) return s;
  const v1::SamplingParams& s = r.sampling();
  if (s.has_temperature() && !InRange(s.temperature(), 0, 100)) {
    return RangeError("sampling.temperature", s.temperature(), "[0, 100]");
  }
  if (!InRange(s.top_p(), 0, 1)) return RangeError("sampling.top_p", s.top_p(), "[0, 1]");
  if (!InRange(s.min_p(), 0, 1)) return RangeError("sampling.min_p", s.min_p(), "[0, 1]");
  if (!InRange(s.repetition_penalty(), 0, 10)) {
    return RangeError("sampling.repetition_penalty", s.repetition_penalty(), "(0, 10]");
  }
  if (!InRange(s.frequency_penalty(), -2, 2)) {
    return RangeError("sampling.frequency_penalty", s.frequency_penalty(), "[-2, 2]");
  }
  if (!InRange(s.presence_penalty(), -2, 2)) {
    return RangeError("sampling.presence_penalty", s.presence_penalty(), "[-2, 2]");
  }
  if (s.n() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.n=", s.n(), " exceeds max_n=1 of this server"));
  }
  if (r.stop().stop_strings_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop.stop_strings: at most ", kMaxStopStrings, " strings"));
  }
  for (const std::string& s : r.stop().stop_strings()) {
    if (s.empty()) return absl::InvalidArgumentError("stop.stop_strings: empty string");
  }
  if (r.has_logprobs()) {
    if (r.logprobs().top_n() > static_cast<uint32_t>(max_logprobs_top_n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logprobs.top_n=", r.logprobs().top_n(),
                       " exceeds max_logprobs_top_n=", max_logprobs_top_n));
    }
    if (r.logprobs().prompt_logprobs()) {
      return absl::InvalidArgumentError("logprobs.prompt_logprobs: not supported by this server");
    }
  }
  if (r.priority() < -100 || r.priority() > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("priority=", r.priority(), " must be in [-100, 100]"));
  }
  return absl::OkStatus();
}

}  // namespace kvstrata::decode

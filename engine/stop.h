#pragma once

// When a generation ends, and which text may be streamed so far: stop token ids, end of
// generation, stop strings (text that could still grow into a stop string is held back),
// max/min tokens, and incomplete UTF-8 sequences (held until complete).

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace kvstrata::engine {

struct StopOptions {
  int max_tokens = 256;  // >= 1
  int min_tokens = 0;    // stop conditions are ignored before this many tokens
  std::vector<std::string> stop_strings;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_string = false;  // emit the matched stop string itself
};

absl::Status ValidateStopOptions(const StopOptions& options, int vocab_size);

enum class FinishReason {
  kNone,
  kEndOfGeneration,  // the model's end-of-generation token
  kStopToken,        // one of stop_token_ids
  kStopString,
  kLength,  // max_tokens, or the KV capacity the request reserved
  kCancelled,
  kDeadline,
  kError,
};
const char* FinishReasonName(FinishReason reason);

class StopChecker {
 public:
  StopChecker(const StopOptions& options, std::function<bool(int32_t)> is_end_of_generation);

  struct Step {
    std::string text;  // bytes that may be emitted now
    FinishReason finish = FinishReason::kNone;
    std::string matched_stop;  // for kStopString: the stop string that matched
  };
  // Adds the n-th generated token (n counts from 1) with its bytes.
  Step Add(int32_t token, std::string_view bytes, int n);
  // Everything generated (without a matched stop string unless included).
  const std::string& text() const { return text_; }

 private:
  StopOptions options_;
  std::function<bool(int32_t)> is_eog_;
  std::string text_;
  size_t emitted_ = 0;
  size_t longest_stop_ = 0;
};

}  // namespace kvstrata::engine

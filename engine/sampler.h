#pragma once

// Turning logits into the next token: greedy, temperature, top-k, top-p, min-p, repetition
// penalties, with a per-request seeded generator so a seeded request is reproducible.

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace kvstrata::engine {

struct SamplingOptions {
  float temperature = 0.0f;         // 0 = greedy
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1)
  float repetition_penalty = 1.0f;  // > 0; 1 = off (divides positive logits of seen tokens)
  float frequency_penalty = 0.0f;   // subtracted per occurrence in the output so far
  float presence_penalty = 0.0f;    // subtracted once if present in the output so far
  std::optional<uint64_t> seed;     // unset: drawn from the engine's generator
  int top_logprobs = 0;             // alternatives to report with each token
};

// InvalidArgument naming the field when an option is out of range.
absl::Status ValidateSamplingOptions(const SamplingOptions& options);

// What a device needs to draw a token as Sample would (Sampler::DeviceSampleable): the
// penalties and counts, the temperature and the request's own uniform number in [0, 1).
struct DeviceDraw {
  float temperature = 0.0f;  // 0 = greedy
  double uniform = 0.0;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::vector<std::pair<int32_t, int32_t>> counts;  // (token, occurrences) in the output so far
};

struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;                        // log-softmax of the (penalised) logits
  std::vector<std::pair<int32_t, float>> top;  // top_logprobs best (token, logprob)
};

class Sampler {
 public:
  Sampler(const SamplingOptions& options, uint64_t seed);
  // logits [vocab]; `generated` are the tokens produced so far (for the penalties).
  SampledToken Sample(std::span<const float> logits, std::span<const int32_t> generated);

  // True when a device can draw this request's tokens from DeviceDraw alone: no top-k, top-p or
  // min-p filter (a sort of the vocabulary) and no alternatives to report.
  bool DeviceSampleable() const;
  // The draw of the next token, advancing the generator exactly as Sample would: a seeded
  // request gives the same tokens whether the host or a device samples it.
  DeviceDraw PrepareDeviceDraw(std::span<const int32_t> generated);

 private:
  // A uniform number in [0, 1): what std::uniform_real_distribution scales, so u · Σ is its draw.
  double Uniform();

  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> order_;
  std::vector<double> probs_;
};

}  // namespace kvstrata::engine

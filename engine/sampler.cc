#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace kvstrata::engine {

absl::Status ValidateSamplingOptions(const SamplingOptions& o) {
  auto bad = [](const char* field, float value, const char* range) {
    return absl::InvalidArgumentError(absl::StrCat(field, "=", value, " is outside ", range));
  };
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    return bad("temperature", o.temperature, "[0, inf)");
  if (o.top_k < 0) return bad("top_k", static_cast<float>(o.top_k), "[0, vocab]");
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) return bad("top_p", o.top_p, "(0, 1]");
  if (!(o.min_p >= 0.0f && o.min_p < 1.0f)) return bad("min_p", o.min_p, "[0, 1)");
  if (!(o.repetition_penalty > 0.0f) || !std::isfinite(o.repetition_penalty)) {
    return bad("repetition_penalty", o.repetition_penalty, "(0, inf)");
  }
  if (!std::isfinite(o.frequency_penalty))
    return bad("frequency_penalty", o.frequency_penalty, "finite values");
  if (!std::isfinite(o.presence_penalty))
    return bad("presence_penalty", o.presence_penalty, "finite values");
  if (o.top_logprobs < 0 || o.top_logprobs > 20) {
    return bad("top_logprobs", static_cast<float>(o.top_logprobs), "[0, 20]");
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingOptions& options, uint64_t seed)
    : options_(options), rng_(options.seed.value_or(seed)) {}

double Sampler::Uniform() {
  return std::generate_canonical<double, std::numeric_limits<double>::digits>(rng_);
}

bool Sampler::DeviceSampleable() const {
  return options_.top_k <= 0 && options_.top_p >= 1.0f && options_.min_p <= 0.0f &&
         options_.top_logprobs == 0;
}

DeviceDraw Sampler::PrepareDeviceDraw(std::span<const int32_t> generated) {
  DeviceDraw d;
  d.temperature = options_.temperature;
  d.repetition_penalty = options_.repetition_penalty;
  d.frequency_penalty = options_.frequency_penalty;
  d.presence_penalty = options_.presence_penalty;
  if (options_.repetition_penalty != 1.0f || options_.frequency_penalty != 0.0f ||
      options_.presence_penalty != 0.0f) {
    std::unordered_map<int32_t, int32_t> counts;
    for (int32_t t : generated) ++counts[t];
    d.counts.assign(counts.begin(), counts.end());
  }
  if (options_.temperature != 0.0f) d.uniform = Uniform();
  return d;
}

SampledToken Sampler::Sample(std::span<const float> logits, std::span<const int32_t> generated) {
  const int vocab = static_cast<int>(logits.size());
  work_.assign(logits.begin(), logits.end());
  // Penalties on tokens generated so far.
  if (options_.repetition_penalty != 1.0f || options_.frequency_penalty != 0.0f ||
      options_.presence_penalty != 0.0f) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : generated) {
      if (t >= 0 && t < vocab) ++counts[t];
    }
    for (const auto& [t, c] : counts) {
      float& z = work_[t];
      if (options_.repetition_penalty != 1.0f) {
        z = z > 0 ? z / options_.repetition_penalty : z * options_.repetition_penalty;
      }
      z -= options_.frequency_penalty * c + options_.presence_penalty;
    }
  }
  // log-softmax of the penalised logits, reported as the token's logprob.
  const float max_logit = *std::max_element(work_.begin(), work_.end());
  double z = 0.0;
  for (float v : work_) z += std::exp(double{v} - max_logit);
  const float log_z = max_logit + static_cast<float>(std::log(z));

  SampledToken out;
  if (options_.top_logprobs > 0) {
    order_.resize(vocab);
    std::iota(order_.begin(), order_.end(), 0);
    const int k = std::min(options_.top_logprobs, vocab);
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                      [&](int32_t a, int32_t b) { return work_[a] > work_[b]; });
    for (int i = 0; i < k; ++i) out.top.emplace_back(order_[i], work_[order_[i]] - log_z);
  }

  if (options_.temperature == 0.0f) {
    out.token = static_cast<int32_t>(std::max_element(work_.begin(), work_.end()) - work_.begin());
    out.logprob = work_[out.token] - log_z;
    return out;
  }

  // Nothing filtered: draw from the whole tempered distribution in token order, one pass over
  // the vocabulary (a sort of 150k logits per token would dominate a GPU decode step).
  if ((options_.top_k <= 0 || options_.top_k >= vocab) && options_.min_p <= 0.0f &&
      options_.top_p >= 1.0f) {
    probs_.resize(vocab);
    double sum = 0.0;
    for (int i = 0; i < vocab; ++i) {
      sum += probs_[i] = std::exp((double{work_[i]} - max_logit) / options_.temperature);
    }
    double r = Uniform() * sum;  // std::uniform_real_distribution(0, sum), shared with devices
    int pick = vocab - 1;
    for (int i = 0; i < vocab; ++i) {
      r -= probs_[i];
      if (r < 0.0) {
        pick = i;
        break;
      }
    }
    // A token of zero weight is never drawn (r lands past it only by rounding at the end).
    while (pick > 0 && probs_[pick] == 0.0) --pick;
    out.token = pick;
    out.logprob = work_[out.token] - log_z;
    return out;
  }

  // Candidates sorted by logit; top-k, then min-p, then top-p on the tempered distribution.
  order_.resize(vocab);
  std::iota(order_.begin(), order_.end(), 0);
  int n = vocab;
  if (options_.top_k > 0 && options_.top_k < vocab) {
    n = options_.top_k;
    std::partial_sort(order_.begin(), order_.begin() + n, order_.end(),
                      [&](int32_t a, int32_t b) { return work_[a] > work_[b]; });
  } else {
    std::sort(order_.begin(), order_.end(),
              [&](int32_t a, int32_t b) { return work_[a] > work_[b]; });
  }
  std::vector<double> probs(n);
  const double top = work_[order_[0]];
  double sum = 0.0;
  for (int i = 0; i < n; ++i)
    sum += probs[i] = std::exp((work_[order_[i]] - top) / options_.temperature);
  if (options_.min_p > 0.0f) {
    const double threshold = options_.min_p * probs[0];  // probs[0] is the maximum
    int keep = 1;
    while (keep < n && probs[keep] >= threshold) ++keep;
    n = keep;
    sum = std::accumulate(probs.begin(), probs.begin() + n, 0.0);
  }
  if (options_.top_p < 1.0f) {
    double cumulative = 0.0;
    int keep = 0;
    while (keep < n) {
      cumulative += probs[keep++] / sum;
      if (cumulative >= options_.top_p) break;
    }
    n = keep;
    sum = std::accumulate(probs.begin(), probs.begin() + n, 0.0);
  }
  std::uniform_real_distribution<double> uniform(0.0, sum);
  double r = uniform(rng_);
  int pick = n - 1;
  for (int i = 0; i < n; ++i) {
    r -= probs[i];
    if (r < 0.0) {
      pick = i;
      break;
    }
  }
  out.token = order_[pick];
  out.logprob = work_[out.token] - log_z;
  return out;
}

}  // namespace kvstrata::engine

#pragma once

// The seam between the engine (scheduling, sampling, cache bookkeeping) and the math of the
// forward pass. The CPU backend is here; a CUDA backend implements the same interface over
// device page pools.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv_cache.h"

namespace kvstrata::engine {

// One sequence's share of a forward pass: tokens at positions [pos0, pos0 + n) whose K/V are
// appended to the sequence's cache. The tokens must already be in seq->tokens.
struct ForwardItem {
  SequenceKv* seq = nullptr;
  int64_t pos0 = 0;
  int n = 0;
  bool all_logits = false;  // logits for every position (evaluation) or only the last
};

// Optional observation of the forward pass, for calibration and evaluation. Pointers are valid
// only during the call. Shapes: q [n][num_heads][head_dim], k and v [n][num_kv_heads][head_dim],
// after RoPE and before rotation.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual void OnQkv(int item, int layer, const float* q, const float* k, const float* v,
                     int n) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Runs the model over the batch, appending K/V to the cache, and returns logits: for each
  // item in order, [n][vocab] rows if all_logits else one [vocab] row.
  virtual absl::Status Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                               ForwardObserver* observer = nullptr) = 0;
  virtual int vocab_size() const = 0;
};

}  // namespace kvstrata::engine

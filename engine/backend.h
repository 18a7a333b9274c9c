#pragma once

// The seam between the engine (scheduling, sampling, cache bookkeeping) and the math of the
// forward pass: the CPU backend (cpu_backend.h) and the CUDA backend (cuda/cuda_backend.h, over
// device page pools) implement it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"

namespace kvstrata::engine {

// One sequence's share of a forward pass: tokens at positions [pos0, pos0 + n) whose K/V are
// appended to the sequence's cache. The tokens must already be in seq->tokens.
struct ForwardItem {
  SequenceKv* seq = nullptr;
  int64_t pos0 = 0;
  int n = 0;
  bool all_logits = false;  // logits for every position (evaluation) or only the last
};

// What every backend checks of a batch before it runs: each item has tokens, continues its
// sequence (InternalError otherwise) and stays inside the vocabulary (InvalidArgument naming the
// token and its position). Gives each item's first row in the pass and the pass's tokens.
absl::Status CheckForwardBatch(const std::vector<ForwardItem>& batch, int vocab_size,
                               std::vector<int>* offset, int* tokens);

// Optional observation of the forward pass, for calibration and evaluation. Pointers are valid
// only during the call. Shapes: q [n][num_heads][head_dim], k and v [n][num_kv_heads][head_dim],
// after RoPE and before rotation.
class ForwardObserver {
 public:
  virtual ~ForwardObserver() = default;
  virtual void OnQkv(int item, int layer, const float* q, const float* k, const float* v,
                     int n) = 0;
};

// What the last Forward took on its device (zero for a backend that does not measure it, the
// CPU's): the wall time of a pass minus this is what it spent outside kernels.
struct ForwardTiming {
  double device_seconds = 0.0;
};

// A token drawn on the backend's device (ForwardAndSample).
struct DeviceSampled {
  int32_t token = -1;
  float logprob = 0.0f;  // log-softmax of the penalised logits, as SampledToken's
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Runs the model over the batch, appending K/V to the cache, and returns logits: for each
  // item in order, [n][vocab] rows if all_logits else one [vocab] row.
  virtual absl::Status Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                               ForwardObserver* observer = nullptr) = 0;
  // Whether ForwardAndSample draws tokens on the backend's device (the CPU backend does not).
  virtual bool samples_on_device() const { return false; }
  // Forward, then a token for every item whose draws[i] is set, drawn on the device from its
  // (last) row of logits into (*sampled)[i]. Logits come back as Forward returns them only when
  // host_logits is true; otherwise `logits` is left empty and only the tokens are copied.
  virtual absl::Status ForwardAndSample(const std::vector<ForwardItem>& batch,
                                        const std::vector<const DeviceDraw*>& draws,
                                        bool host_logits, std::vector<float>* logits,
                                        std::vector<DeviceSampled>* sampled) {
    return absl::UnimplementedError("this backend samples on the host");
  }
  virtual int vocab_size() const = 0;
  virtual ForwardTiming last_timing() const { return {}; }
  // Moves cached pages that lie in device memory (KvCache::ImportPrefix); null on the host.
  virtual DevicePageAccess* device_page_access() { return nullptr; }
  // Where and how the pass runs, for logs: "cpu (weights as stored, avx512 kernels, 2 threads)",
  // "cuda:0 (NVIDIA H200, ...), bf16 weights".
  virtual std::string Describe() const = 0;
};

}  // namespace kvstrata::engine

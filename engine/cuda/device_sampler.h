#pragma once

// Tokens drawn on the GPU from a pass's rows of logits (kernels/cuda/sample.h), so a decode step
// copies back a token per sequence instead of a row of the vocabulary. The draws (penalties,
// temperature, the request's uniform number: Sampler::PrepareDeviceDraw) are staged in pinned
// memory: one copy up, one launch, one copy of the tokens down, all on the pass's stream.

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend.h"
#include "engine/cuda/cuda_util.h"

namespace kvstrata::engine {

class DeviceSampler {
 public:
  explicit DeviceSampler(int device) : device_(device) {}

  // Enqueues on `stream` the draw of row rows[i] of `logits` (device fp32 [*][vocab]) for every
  // item i whose draws[i] is set. The rows drawn get their penalties applied in place.
  absl::Status Enqueue(float* logits, int vocab, const std::vector<int32_t>& rows,
                       const std::vector<const DeviceDraw*>& draws, cudaStream_t stream);
  // Once the stream has been synchronised: (*out)[i] for every item that had a draw.
  void Collect(const std::vector<const DeviceDraw*>& draws,
               std::vector<DeviceSampled>* out) const;

 private:
  // Room for `rows` draws with `counts` penalised tokens in all, and the kernel's workspace for
  // `rows` rows of `vocab` (grows, never shrinks: the steady state allocates nothing).
  absl::Status Reserve(int rows, int64_t counts, int vocab, cudaStream_t stream);

  const int device_;
  PinnedBuffer staging_;   // the draws' arrays, then the results
  DeviceBuffer arrays_;    // the same layout on the device
  DeviceBuffer workspace_;  // the kernel's per-row counts (zeroed when allocated), chunk results
  int row_capacity_ = 0;
  int workspace_vocab_ = 0;  // the vocabulary workspace_ was sized for (row_capacity_ rows)
  int64_t count_capacity_ = 0;
  int num_rows_ = 0;
};

}  // namespace kvstrata::engine

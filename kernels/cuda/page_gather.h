#pragma once

// Moves whole pages on one GPU and checks them where they land: the same-GPU transport's copy
// from the kvstore's HBM pool (mapped into the worker) into the worker's own page slots, with
// the page digest (core/page_digest.h, docs/kv-format.md §8) of every page computed from the
// bytes as they pass, at memory speed. With no destination it only digests (pages read in place).

#include <cuda_runtime.h>

#include <cstdint>

namespace kvstrata::kernels {

struct PageCopy {
  const uint8_t* src = nullptr;  // device, 16-byte aligned
  uint8_t* dst = nullptr;        // device, 16-byte aligned; null: digest only
  uint64_t bytes = 0;            // a multiple of 16
  uint64_t expected_digest = 0;
};

struct PageGatherParams {
  const PageCopy* copies = nullptr;  // device array of num_pages
  int num_pages = 0;
  uint64_t max_page_bytes = 0;       // sizes the grid
  // device [num_pages]: the running sums, zeroed by the launch; and per page 1 when the digest
  // differs from expected_digest, else 0.
  unsigned long long* sums = nullptr;
  uint32_t* mismatch = nullptr;
};

// Two kernels on `stream`: the copy-and-sum over all pages, then one that finishes the digests.
// cudaErrorInvalidValue for a misaligned page or a size that is not a multiple of 16.
cudaError_t LaunchPageGather(const PageGatherParams& params, cudaStream_t stream);

}  // namespace kvstrata::kernels

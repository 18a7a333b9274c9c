#pragma once

// Dequantises INT2 pages on the GPU: the first CUDA kernel of the page format, checked against
// DecodeInt2Block (kernels/quant.h). Used by tests and by tools that need float rows of a page.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

struct Int2DequantParams {
  const uint8_t* pages = nullptr;  // device: num_pages pages of encoding `encoding`
  int64_t page_stride = 0;         // bytes between pages
  int num_pages = 0;
  KvGeometry geometry;
  PageEncoding encoding = PageEncoding::kInt2Uniform;
  // device: [num_pages][num_layers][2][num_kv_heads][page_tokens][head_dim]
  float* out = nullptr;
};

// Returns cudaErrorInvalidValue for an unsupported head_dim, group size or encoding.
cudaError_t LaunchInt2Dequant(const Int2DequantParams& params, cudaStream_t stream);

}  // namespace kvstrata::kernels

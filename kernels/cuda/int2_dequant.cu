#include "kernels/cuda/int2_dequant.h"
#include "kernels/dispatch.h"

namespace kvstrata::kernels {

namespace {

// One thread block per (page, block of the page); one thread per (token, channel). A plain
// gather through KCodeBit / VCodeBit: this kernel checks the layout, it is not a fast path.
template <int HEAD_DIM>
__global__ void Int2DequantKernel(Int2DequantParams p) {
  const KvGeometry& g = p.geometry;
  const int64_t blocks_per_page = NumBlocks(g);
  const int64_t page = blockIdx.x / blocks_per_page;
  const int64_t blk = blockIdx.x % blocks_per_page;
  const int kind = static_cast<int>((blk / g.num_kv_heads) % 2);
  const uint8_t* block =
      p.pages + page * p.page_stride + kPageHeaderBytes + blk * BlockBytes(g, p.encoding);
  const uint8_t* codes = block;
  const uint8_t* params = block + int64_t{g.page_tokens} * (HEAD_DIM / 4);
  const Int2Levels levels = LevelsFor(p.encoding);
  const int groups = HEAD_DIM / g.group_size;
  float* out = p.out + blockIdx.x * int64_t{g.page_tokens} * HEAD_DIM;
  for (int i = threadIdx.x; i < g.page_tokens * HEAD_DIM; i += blockDim.x) {
    const int t = i / HEAD_DIM, c = i % HEAD_DIM;
    const int bit =
        kind == 0 ? t * (HEAD_DIM / 4) * 8 + KCodeBit(c, HEAD_DIM) : VCodeBit(t, c, HEAD_DIM);
    const int code = (codes[bit / 8] >> (bit % 8)) & 3;
    const uint8_t* pr = params + (int64_t{t} * groups + c / g.group_size) * 4;
    const float scale = Fp16ToFloat(static_cast<uint16_t>(pr[0] | pr[1] << 8));
    const float offset = Fp16ToFloat(static_cast<uint16_t>(pr[2] | pr[3] << 8));
    out[i] = offset + scale * levels.v[code];
  }
}

}  // namespace

cudaError_t LaunchInt2Dequant(const Int2DequantParams& p, cudaStream_t stream) {
  const KvGeometry& g = p.geometry;
  if (!IsInt2(p.encoding) || g.group_size < 16 || g.group_size % 16 != 0 ||
      g.head_dim % g.group_size != 0 || g.page_tokens != 64 || p.num_pages < 0) {
    return cudaErrorInvalidValue;
  }
  if (p.num_pages == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(p.num_pages * NumBlocks(g));
  return KV_DISPATCH_HEAD_DIM(g.head_dim, HEAD_DIM, {
    Int2DequantKernel<HEAD_DIM><<<grid, 256, 0, stream>>>(p);
    return cudaGetLastError();
  });
}

}  // namespace kvstrata::kernels

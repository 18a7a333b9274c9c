#include "kernels/cuda/page_gather.h"

namespace kvstrata::kernels {
namespace {

constexpr int kThreads = 256;
// Bytes of one page a CTA handles: 64 KiB, so a 1.3 MB page spreads over ~20 CTAs and 512
// pages fill the GPU many times over.
constexpr uint64_t kBytesPerCta = 64 << 10;
constexpr unsigned long long kGolden = 0x9E3779B97F4A7C15ull;

__device__ __forceinline__ unsigned long long Mix(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Grid: x = CTA within a page, y = page. Each thread moves 16 bytes at a time and adds the
// digest terms of its two words; a CTA's sum goes to the page's total with one atomic.
__global__ void GatherKernel(const PageCopy* __restrict__ copies, unsigned long long* sums) {
  const PageCopy c = copies[blockIdx.y];
  const uint64_t begin = blockIdx.x * kBytesPerCta;
  if (begin >= c.bytes) return;
  const uint64_t end = min(c.bytes, begin + kBytesPerCta);
  unsigned long long sum = 0;
  const uint4* src = reinterpret_cast<const uint4*>(c.src);
  uint4* dst = reinterpret_cast<uint4*>(c.dst);
  for (uint64_t v = begin / 16 + threadIdx.x; v < end / 16; v += kThreads) {
    const uint4 x = __ldcs(src + v);  // streamed: read once
    if (dst != nullptr) dst[v] = x;
    const unsigned long long w0 = (static_cast<unsigned long long>(x.y) << 32) | x.x;
    const unsigned long long w1 = (static_cast<unsigned long long>(x.w) << 32) | x.z;
    const unsigned long long i = 2 * v;  // word index
    sum += Mix(w0 + (i + 1) * kGolden) + Mix(w1 + (i + 2) * kGolden);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ unsigned long long warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    atomicAdd(sums + blockIdx.y, total);
  }
}

__global__ void FinishKernel(const PageCopy* __restrict__ copies, int num_pages,
                             const unsigned long long* sums, uint32_t* mismatch) {
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= num_pages) return;
  const unsigned long long digest = Mix(sums[p] ^ copies[p].bytes);
  mismatch[p] = digest != copies[p].expected_digest ? 1u : 0u;
}

}  // namespace

cudaError_t LaunchPageGather(const PageGatherParams& params, cudaStream_t stream) {
  if (params.num_pages <= 0) return cudaSuccess;
  if (params.copies == nullptr || params.sums == nullptr || params.mismatch == nullptr ||
      params.max_page_bytes == 0 || params.max_page_bytes % 16 != 0 || params.num_pages > 65535) {
    return cudaErrorInvalidValue;
  }
  if (cudaError_t e = cudaMemsetAsync(params.sums, 0,
                                      sizeof(unsigned long long) * params.num_pages, stream);
      e != cudaSuccess) {
    return e;
  }
  const dim3 grid(static_cast<unsigned>((params.max_page_bytes + kBytesPerCta - 1) / kBytesPerCta),
                  static_cast<unsigned>(params.num_pages));
  GatherKernel<<<grid, kThreads, 0, stream>>>(params.copies, params.sums);
  FinishKernel<<<(params.num_pages + 255) / 256, 256, 0, stream>>>(
      params.copies, params.num_pages, params.sums, params.mismatch);
  return cudaGetLastError();
}

}  // namespace kvstrata::kernels

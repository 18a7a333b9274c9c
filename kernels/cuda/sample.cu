#include "kernels/cuda/sample.h"

#include <cfloat>

namespace kvstrata::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// The larger logit, the smaller token on a tie (std::max_element's first maximum).
struct Best {
  float value;
  int index;
};

__device__ __forceinline__ Best Better(Best a, Best b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

__device__ Best BlockBest(Best v) {
  __shared__ float values[kWarps];
  __shared__ int indices[kWarps];
  for (int o = 16; o > 0; o >>= 1) {
    v = Better(v, {__shfl_xor_sync(0xffffffffu, v.value, o),
                   __shfl_xor_sync(0xffffffffu, v.index, o)});
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) {
    values[warp] = v.value;
    indices[warp] = v.index;
  }
  __syncthreads();
  v = lane < kWarps ? Best{values[lane], indices[lane]} : Best{-FLT_MAX, 0x7fffffff};
  for (int o = 16; o > 0; o >>= 1) {
    v = Better(v, {__shfl_xor_sync(0xffffffffu, v.value, o),
                   __shfl_xor_sync(0xffffffffu, v.index, o)});
  }
  return v;
}

__device__ double BlockSumDouble(double v) {
  __shared__ double partial[kWarps];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < kWarps ? partial[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The sum of v over the threads before this one (in thread order), and the block's total.
__device__ double BlockExclusiveScan(double v, double* total) {
  __shared__ double warp_sums[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  double inclusive = v;
  for (int o = 1; o < 32; o <<= 1) {
    const double up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  __syncthreads();
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_sums[w];
    all += warp_sums[w];
  }
  *total = all;
  return before + inclusive - v;
}

__device__ int BlockMinInt(int v) {
  __shared__ int partial[kWarps];
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < kWarps ? partial[lane] : 0x7fffffff;
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ int BlockMaxInt(int v) { return -BlockMinInt(-v); }

// One block per sampled row.
__global__ __launch_bounds__(kThreads) void SampleKernel(SampleParams p) {
  const int r = blockIdx.x;
  float* z = p.logits + static_cast<int64_t>(p.row[r]) * p.vocab;
  const int vocab = p.vocab;

  // Penalties, one distinct token per thread (the host's arithmetic, in float).
  const float rep = p.repetition_penalty[r];
  const float freq = p.frequency_penalty[r], pres = p.presence_penalty[r];
  for (int i = p.count_indptr[r] + threadIdx.x; i < p.count_indptr[r + 1]; i += kThreads) {
    const int t = p.count_token[i];
    if (t < 0 || t >= vocab) continue;
    float v = z[t];
    if (rep != 1.0f) v = v > 0 ? v / rep : v * rep;
    v -= freq * static_cast<float>(p.count_n[i]) + pres;
    z[t] = v;
  }
  __syncthreads();

  // The first maximum, then log Σ exp(z - max) in double (the reported logprob's normaliser).
  Best best{-FLT_MAX, 0x7fffffff};
  for (int i = threadIdx.x; i < vocab; i += kThreads) best = Better(best, {z[i], i});
  best = BlockBest(best);
  const float max_logit = best.value;
  double sum_exp = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    sum_exp += exp(static_cast<double>(z[i]) - max_logit);
  }
  sum_exp = BlockSumDouble(sum_exp);
  const float log_z = max_logit + static_cast<float>(log(sum_exp));

  int pick = best.index;
  const float temperature = p.temperature[r];
  if (temperature != 0.0f) {
    // Contiguous chunks in token order, so a scan of the chunks' sums gives each chunk the
    // running sum before it; the first token whose running sum passes u · Σ is drawn.
    const int per = (vocab + kThreads - 1) / kThreads;
    const int begin = min(vocab, static_cast<int>(threadIdx.x) * per);
    const int end = min(vocab, begin + per);
    const double t = temperature;
    double chunk = 0.0;
    int last_nonzero = -1;
    for (int i = begin; i < end; ++i) {
      const double w = exp((static_cast<double>(z[i]) - max_logit) / t);
      chunk += w;
      if (w != 0.0) last_nonzero = i;
    }
    double total = 0.0;
    double running = BlockExclusiveScan(chunk, &total);
    const double target = p.uniform[r] * total;
    int crossed = 0x7fffffff;
    if (running + chunk > target) {
      for (int i = begin; i < end; ++i) {
        running += exp((static_cast<double>(z[i]) - max_logit) / t);
        if (running > target) {
          crossed = i;
          break;
        }
      }
    }
    crossed = BlockMinInt(crossed);
    // Past the end only by rounding: the last token of non-zero weight, as on the host.
    last_nonzero = BlockMaxInt(last_nonzero);
    pick = crossed != 0x7fffffff ? crossed : max(last_nonzero, 0);
  }
  if (threadIdx.x == 0) {
    p.out_token[r] = pick;
    p.out_logprob[r] = z[pick] - log_z;
  }
}

}  // namespace

cudaError_t LaunchSample(const SampleParams& params, cudaStream_t stream) {
  if (params.num_rows <= 0) return cudaSuccess;
  if (params.vocab <= 0 || params.logits == nullptr || params.row == nullptr) {
    return cudaErrorInvalidValue;
  }
  SampleKernel<<<params.num_rows, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace kvstrata::kernels

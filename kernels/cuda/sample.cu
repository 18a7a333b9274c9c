#include "kernels/cuda/sample.h"

#include <cfloat>
#include <cmath>
#include <cstdint>

namespace kvstrata::kernels {

namespace {

constexpr int kThreads = 256;  // kSampleChunk / 8: eight tokens a thread
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

// What a chunk of a row reduces to. Its sums are relative to its own maximum.
struct ChunkResult {
  float max;            // the chunk's first maximum (-inf when all are -inf or NaN)
  int index;            // its token
  double sum_exp;       // Σ exp(z - max)
  double sum_tempered;  // Σ exp((z - max) / T), for a draw
};

int NumChunks(int vocab) { return (vocab + kSampleChunk - 1) / kSampleChunk; }

// exp((x - m) / t) in double, as on the host; 0 where m is -inf (there x - m would be NaN).
__device__ __forceinline__ double ExpFrom(double x, float m, double t) {
  return m == -INFINITY ? 0.0 : exp((x - m) / t);
}

// The penalties of row r's generated tokens that fall in [c0, c1), in place (the host's
// arithmetic, in float).
__device__ void Penalise(const SampleParams& p, int r, float* z, int c0, int c1) {
  const float rep = p.repetition_penalty[r];
  const float freq = p.frequency_penalty[r], pres = p.presence_penalty[r];
  for (int i = p.count_indptr[r] + threadIdx.x; i < p.count_indptr[r + 1]; i += kThreads) {
    const int t = p.count_token[i];
    if (t < c0 || t >= c1) continue;
    float v = z[t];
    if (rep != 1.0f) v = v > 0 ? v / rep : v * rep;
    v -= freq * static_cast<float>(p.count_n[i]) + pres;
    z[t] = v;
  }
}

// A chunk's weight in the row's tempered sum.
__device__ __forceinline__ double TemperedWeight(const ChunkResult* part, float max_logit,
                                                 double t) {
  return __ldcg(&part->sum_tempered) * ExpFrom(__ldcg(&part->max), max_logit, t);
}

// The draw inside tokens [c0, c1) of row z: the first token where the running sum (`running`
// before c0) passes `target`; else (only by rounding) the last token of non-zero weight.
__device__ int WalkChunk(const float* z, int c0, int c1, float max_logit, double t, double running,
                         double target) {
  constexpr int kPer = kSampleChunk / kThreads;
  const int begin = min(c1, c0 + static_cast<int>(threadIdx.x) * kPer);
  const int end = min(c1, begin + kPer);
  double w[kPer];
  double mine = 0.0;
  int last_nonzero = -1;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    w[j] = begin + j < end ? ExpFrom(__ldcg(z + begin + j), max_logit, t) : 0.0;
    mine += w[j];
    if (w[j] != 0.0) last_nonzero = begin + j;
  }
  double total = 0.0;
  running += BlockExclusiveScan(mine, &total);
  int crossed = 0x7fffffff;
  if (running + mine > target) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      running += w[j];
      if (begin + j < end && running > target) {
        crossed = begin + j;
        break;
      }
    }
  }
  crossed = BlockMinInt(crossed);
  last_nonzero = BlockMaxInt(last_nonzero);
  return crossed != 0x7fffffff ? crossed : max(last_nonzero, c0);
}

// Row r's chunks combined by its last CTA: the first maximum, log Σ exp, and the draw.
__device__ void Combine(const SampleParams& p, int r, const ChunkResult* part, int chunks,
                        const float* z) {
  Best best{-INFINITY, 0x7fffffff};
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    best = Better(best, {__ldcg(&part[c].max), __ldcg(&part[c].index)});
  }
  best = BlockBest(best);
  const float max_logit = best.value;
  double sum_exp = 0.0;
  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    sum_exp += __ldcg(&part[c].sum_exp) * ExpFrom(__ldcg(&part[c].max), max_logit, 1.0);
  }
  sum_exp = BlockSumDouble(sum_exp);
  const float log_z = max_logit + static_cast<float>(log(sum_exp));

  int pick = best.index < p.vocab ? best.index : 0;  // every logit NaN: token 0
  const float temperature = p.temperature[r];
  if (temperature != 0.0f) {
    // Contiguous runs of chunks per thread in token order, so a scan of the runs' tempered
    // sums gives the running sum before each chunk; the chunk where it passes u · Σ is walked.
    const double t = temperature;
    const int per = (chunks + kThreads - 1) / kThreads;
    const int begin = min(chunks, static_cast<int>(threadIdx.x) * per);
    const int end = min(chunks, begin + per);
    double mine = 0.0;
    int last_weighted = -1;
    for (int c = begin; c < end; ++c) {
      const double w = TemperedWeight(part + c, max_logit, t);
      mine += w;
      if (w != 0.0) last_weighted = c;
    }
    double total = 0.0;
    double running = BlockExclusiveScan(mine, &total);
    const double target = p.uniform[r] * total;
    int found = 0x7fffffff;
    if (running + mine > target) {
      for (int c = begin; c < end; ++c) {
        const double w = TemperedWeight(part + c, max_logit, t);
        if (running + w > target) {
          found = c;
          break;
        }
        running += w;
      }
    }
    __shared__ double s_before;
    const int chunk = BlockMinInt(found);
    if (found == chunk && found != 0x7fffffff) s_before = running;  // one thread
    last_weighted = BlockMaxInt(last_weighted);  // (its barriers publish s_before)
    if (chunk != 0x7fffffff) {
      const int c0 = chunk * kSampleChunk;
      pick = WalkChunk(z, c0, min(p.vocab, c0 + kSampleChunk), max_logit, t, s_before, target);
    } else if (last_weighted >= 0) {  // past the end, only by rounding: the last weighted token
      const int c0 = last_weighted * kSampleChunk;
      pick = WalkChunk(z, c0, min(p.vocab, c0 + kSampleChunk), max_logit, t, 0.0, HUGE_VAL);
    } else {
      pick = 0;
    }
  }
  if (threadIdx.x == 0) {
    p.out_token[r] = pick;
    p.out_logprob[r] = __ldcg(z + pick) - log_z;
  }
}

// CTA (c, r): chunk c of sampled row r; the row's last CTA to finish combines the chunks.
__global__ __launch_bounds__(kThreads) void SampleKernel(SampleParams p, int chunks) {
  const int c = blockIdx.x, r = blockIdx.y;
  float* z = p.logits + static_cast<int64_t>(p.row[r]) * p.vocab;
  const int c0 = c * kSampleChunk, c1 = min(p.vocab, c0 + kSampleChunk);
  Penalise(p, r, z, c0, c1);
  __threadfence();  // the penalised logits before the count below (the last CTA reads them)
  __syncthreads();

  constexpr int kPer = kSampleChunk / kThreads;
  float v[kPer];
  Best best{-INFINITY, 0x7fffffff};
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = c0 + j * kThreads + threadIdx.x;
    v[j] = i < c1 ? z[i] : -INFINITY;
    if (i < c1) best = Better(best, {v[j], i});
  }
  best = BlockBest(best);
  const float temperature = p.temperature[r];
  double sum_exp = 0.0, sum_tempered = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    sum_exp += ExpFrom(v[j], best.value, 1.0);  // padding is -inf: 0
    if (temperature != 0.0f) sum_tempered += ExpFrom(v[j], best.value, temperature);
  }
  sum_exp = BlockSumDouble(sum_exp);
  if (temperature != 0.0f) sum_tempered = BlockSumDouble(sum_tempered);

  unsigned* done = p.chunks_done;
  ChunkResult* part = static_cast<ChunkResult*>(p.chunk_results) + static_cast<int64_t>(r) * chunks;
  __shared__ bool s_last;
  if (threadIdx.x == 0) {
    part[c] = {best.value, best.index, sum_exp, sum_tempered};
    __threadfence();
    s_last = atomicAdd(done + r, 1u) == static_cast<unsigned>(chunks - 1);
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other chunks' results and logits after their count
  if (threadIdx.x == 0) done[r] = 0;  // zero again for the next launch
  Combine(p, r, part, chunks, z);
}

}  // namespace

size_t SampleChunkResultBytes(int num_rows, int vocab) {
  if (num_rows <= 0 || vocab <= 0) return 0;
  return sizeof(ChunkResult) * static_cast<size_t>(num_rows) * NumChunks(vocab);
}

cudaError_t LaunchSample(const SampleParams& params, cudaStream_t stream) {
  if (params.num_rows <= 0) return cudaSuccess;
  if (params.vocab <= 0 || params.logits == nullptr || params.row == nullptr ||
      params.chunk_results == nullptr || params.chunks_done == nullptr || params.num_rows > 65535) {
    return cudaErrorInvalidValue;
  }
  const int chunks = NumChunks(params.vocab);
  SampleKernel<<<dim3(chunks, params.num_rows), kThreads, 0, stream>>>(params, chunks);
  return cudaGetLastError();
}

}  // namespace kvstrata::kernels

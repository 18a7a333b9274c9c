// Split decode attention over the INT2 page format, on tensor cores.
//
// History kernel, one CTA of 4 warps per (history page range, KV head, sequence); each warp
// streams whole 64-token pages. Both products run as mma.m16n8k16 with fp16 inputs and fp32
// accumulators, transposed so that the G <= 8 query heads of a KV head fill the n = 8 side:
//   Sᵀ[tokens x heads] = K[tokens x dims] · Qᵀ          (A = K codes, B = Q)
//   Oᵀ[dims x heads]   = Vᵀ[dims x tokens] · (P·s_v)ᵀ   (A = V codes, B = probabilities)
// The page layout (kv_layout.h: KCodeBit, VCodeBit) puts every A-fragment pair of codes at bits
// (2p, 16 + 2p) of one 32-bit word, so a pair becomes an fp16x2 with one logic op:
//   w & (3 << 2p) = 4^p · code · 2^-24, a subnormal half    (p < 5; p >= 5 uses w >> 10)
// Tensor cores take subnormal fp16 inputs exactly, so the products carry no bias; the 2^-24 unit
// and the 4^p weights are undone on the fp32 side: per token for K (S = offset·Σq +
// scale·2^24·R, with q' = q / 4^p folded into Q) and per output channel for V at the end.
// Dequantisation thus costs one logic op per two codes, and the per-token scale and offset
// never touch the codes. In long page ranges the keys' product runs on integer tensor cores
// instead, four codes a logic op (split_decode_int2.cuh, SplitDecodeVariant::
// int2_int8_keys_min_pages).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/attention_ref.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/split_decode.h"
#include "kernels/cuda/split_decode_bf16.cuh"
#include "kernels/cuda/split_decode_codec.cuh"
#include "kernels/cuda/split_decode_common.cuh"
#include "kernels/cuda/split_decode_fp32.cuh"
#include "kernels/cuda/split_decode_fragment.cuh"
#include "kernels/cuda/split_decode_int2.cuh"
#include "kernels/dispatch.h"

namespace kvstrata::kernels {

namespace {

using namespace split;  // NOLINT: the kernels' shared constants and workspace
using ptx::BarrierExpect;
using ptx::BarrierInit;
using ptx::BarrierWait;
using ptx::BulkCopy;
using ptx::Exp2;
using ptx::HalfHi;
using ptx::HalfLo;
using ptx::PackHalf2;
using ptx::Transpose8x8;

constexpr int kBf16Stages = 3;  // BF16 pages in flight per CTA (BF16 history)

// History in BF16 (the BF16 cache format, all of whose pages are BF16) on bf16 tensor cores: a
// range of pages per CTA as for INT2, kBf16Stages pages in flight (split_decode_bf16.cuh). The
// first window_ctas CTAs of the launch take the window pages.
template <int D>
constexpr int kBf16HistorySmemBytes = kBf16Stages * kBf16StageBytes<D>;

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    Bf16HistoryMmaKernel(SplitDecodeCudaParams p, int pages_per_split, int window_ctas,
                         Workspace ws) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int h = blockIdx.y, b = blockIdx.z;
  if (static_cast<int>(blockIdx.x) < window_ctas) {
    Bf16WindowSlot<D, 2>(p, ws, blockIdx.x, h, b, smem);
    return;
  }
  const int split = blockIdx.x - window_ctas;
  const int begin = split * pages_per_split;
  Bf16PageRange<D, kBf16Stages>(p, p.segments[kHistorySegment], b, h, begin,
                                begin + pages_per_split, smem,
                                PartialRow(ws, b, p.geometry.num_kv_heads, h, ws.window + split),
                                ws);
}

// History in a codec (the codec cache format), decoded to fp16 rows page by page
// (split_decode_codec.cuh); the first window_ctas CTAs take the window pages.
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    CodecHistoryKernel(SplitDecodeCudaParams p, int pages_per_split, int window_ctas,
                       Workspace ws, bool page_tables) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int h = blockIdx.y, b = blockIdx.z;
  if (static_cast<int>(blockIdx.x) < window_ctas) {
    Bf16WindowSlot<D, 2>(p, ws, blockIdx.x, h, b, smem);
    return;
  }
  const int split = blockIdx.x - window_ctas;
  const int begin = split * pages_per_split;
  CodecPageRange<D>(p, p.segments[kHistorySegment], b, h, begin, begin + pages_per_split, smem,
                    PartialRow(ws, b, p.geometry.num_kv_heads, h, ws.window + split), ws,
                    page_tables);
}

// The window pages as a launch of their own, on tensor cores (fuse_window off), one page per
// CTA (the plan's window_pages_per_cta is 1 then).
template <int D>
__global__ void __launch_bounds__(kThreads) Bf16WindowKernel(SplitDecodeCudaParams p, Workspace ws) {
  __shared__ alignas(128) uint8_t s_stage[kBf16StageBytes<D>];
  Bf16WindowSlot<D, 1>(p, ws, blockIdx.x, blockIdx.y, blockIdx.z, s_stage);
}

// The merge of one query head's partials, spread over the CTA: the weights exp(lse - max) of
// every slot first (shared memory, dynamic: one float per slot), then each thread sums four
// channels over a share of the slots. The first kMergeHeld slots of a thread's share are loaded
// as soon as the partials are there, beside the slots' lse, so the weights' reductions and the
// outputs' loads overlap (SplitDecodeVariant::merge_early_loads: kMergeEarlyLoads; 0: every load
// after the weights, as before).
constexpr int kMergeEarlyLoads = 16;

template <int D, int kMergeHeld>
__global__ void __launch_bounds__(kThreads)
    MergeParallelKernel(SplitDecodeCudaParams p, Workspace ws, bool dependents_at_start) {
  extern __shared__ float s_w[];  // [ws.slots]
  constexpr int kLanesPerRow = D / 4, kGroups = kThreads / kLanesPerRow;
  __shared__ float s_red[kWarps];
  __shared__ float4 s_acc[kGroups][kLanesPerRow];
  // The kernel after it (launched early) may launch, before or after the partials are in
  // (SplitDecodeVariant::dependents_at_start).
  if (dependents_at_start) ptx::LaunchDependents();
  ptx::GridDependencyWait();  // the partials (a no-op unless launched early)
  if (!dependents_at_start) ptx::LaunchDependents();
  const int b = blockIdx.x / p.num_q_heads, hq = blockIdx.x % p.num_q_heads;
  const int G = p.num_q_heads / p.geometry.num_kv_heads;
  const int h = hq / G, n = hq % G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = PartialRow(ws, b, p.geometry.num_kv_heads, h, 0) + n;
  const int c4 = threadIdx.x % kLanesPerRow, group = threadIdx.x / kLanesPerRow;
  float4 held[kMergeHeld > 0 ? kMergeHeld : 1];
  auto partial = [&](int s) {
    return *reinterpret_cast<const float4*>(ws.part_o + (row0 + int64_t{s} * kMaxGroup) * D +
                                            4 * c4);
  };
#pragma unroll
  for (int k = 0; k < kMergeHeld; ++k) {
    const int s = group + k * kGroups;
    held[k] = s < ws.slots ? partial(s) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < ws.slots; s += kThreads) {
    const float lse = ws.part_lse[row0 + int64_t{s} * kMaxGroup];
    s_w[s] = lse;
    mx = fmaxf(mx, lse);
  }
  for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
  if (lane == 0) s_red[warp] = mx;
  __syncthreads();
  float M = s_red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) M = fmaxf(M, s_red[w]);
  float sum = 0.0f;
  for (int s = threadIdx.x; s < ws.slots; s += kThreads) {
    const float w = M == -INFINITY || s_w[s] == -INFINITY ? 0.0f : __expf(s_w[s] - M);
    s_w[s] = w;
    sum += w;
  }
  for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
  __syncthreads();  // everyone has read s_red's maxima
  if (lane == 0) s_red[warp] = sum;
  __syncthreads();
  float L = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) L += s_red[w];
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int k = 0; k < kMergeHeld; ++k) {  // the same slots, in the same order, as the loop below
    const int s = group + k * kGroups;
    const float w = s < ws.slots ? s_w[s] : 0.0f;
    if (w == 0.0f) continue;
    acc.x += w * held[k].x;
    acc.y += w * held[k].y;
    acc.z += w * held[k].z;
    acc.w += w * held[k].w;
  }
#pragma unroll 4
  for (int s = group + kMergeHeld * kGroups; s < ws.slots; s += kGroups) {
    const float w = s_w[s];
    if (w == 0.0f) continue;
    const float4 v = partial(s);
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  s_acc[group][c4] = acc;
  __syncthreads();
  if (threadIdx.x < D) {
    const int d = threadIdx.x;
    float O = 0.0f;
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) {
      const float4 a = s_acc[gr][d / 4];
      O += d % 4 == 0 ? a.x : d % 4 == 1 ? a.y : d % 4 == 2 ? a.z : a.w;
    }
    StoreOutput(p, b, hq, d, L > 0.0f ? O / L : 0.0f);
    if (d == 0 && p.lse)
      p.lse[int64_t{b} * p.num_q_heads + hq] = L > 0.0f ? M + logf(L) : -INFINITY;
  }
}

__global__ void FillKernel(uint8_t* pool, int64_t stride, int num_pages, KvGeometry g,
                           uint32_t seed) {
  const int64_t block_bytes = BlockBytes(g, PageEncoding::kInt2Uniform);
  const int64_t code_bytes = int64_t{g.page_tokens} * g.head_dim / 4;
  const int64_t body_words = NumBlocks(g) * block_bytes / 4;
  const int64_t total = body_words * num_pages;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t page = i / body_words, off = (i % body_words) * 4;
    const int64_t within = off % block_bytes;
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    uint32_t word = x;
    if (within >= code_bytes) {
      const float scale = 0.01f + (x & 0xff) * 1e-4f;
      word = static_cast<uint32_t>(__half_as_ushort(__float2half(scale))) |
             static_cast<uint32_t>(__half_as_ushort(__float2half(-1.5f * scale))) << 16;
    }
    *reinterpret_cast<uint32_t*>(pool + page * stride + kPageHeaderBytes + off) = word;
  }
}

}  // namespace

namespace {

// The BF16, codec and fragment history kernels want more than the default 48 KB of dynamic
// shared memory; set once per device (a function attribute, not a stream operation, but done
// before any capture by SplitDecodeCtasPerSm, which callers run while planning).
cudaError_t AllowLargeSharedMemory() {
  static std::atomic<uint64_t> done{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) {
    return cudaErrorInvalidDevice;
  }
  if (done.load(std::memory_order_acquire) & (uint64_t{1} << device)) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(Bf16HistoryMmaKernel<64>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kBf16HistorySmemBytes<64>);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(Bf16HistoryMmaKernel<128>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kBf16HistorySmemBytes<128>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(CodecHistoryKernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kCodecHistorySmemBytes<64>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(CodecHistoryKernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kCodecHistorySmemBytes<128>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(FragmentHistoryKernel<64>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kFragmentSmemBytes<64>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(FragmentHistoryKernel<128>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kFragmentSmemBytes<128>);
  }
  if (e == cudaSuccess) done.fetch_or(uint64_t{1} << device, std::memory_order_release);
  return e;
}

// The INT2 history kernel the variant asks for (split_decode_int2.cuh).
// group: query heads per KV head, pages_per_split: the plan's range (group 0 when not known: the
// kernel for any group and range).
template <int D>
auto Int2Kernel(const SplitDecodeVariant& v, int group, int pages_per_split) {
  if (v.int2_bandwidth_probe) return Int2HistoryKernel<D, Int2Flow::kStreamOnly, false>;
  if (v.int2_overlap_pages) return Int2HistoryKernel<D, Int2Flow::kOverlap, false>;
  const bool split_rows = group > 0 && group <= 4 && pages_per_split >= v.int2_split_rows_min_pages;
  if (pages_per_split >= v.int2_int8_keys_min_pages) {
    return split_rows ? Int2HistoryKernel<D, Int2Flow::kWholePage, true, true>
                      : Int2HistoryKernel<D, Int2Flow::kWholePage, false, true>;
  }
  return split_rows ? Int2HistoryKernel<D, Int2Flow::kWholePage, true>
                    : Int2HistoryKernel<D, Int2Flow::kWholePage, false>;
}

template <typename Kernel>
int Occupancy(Kernel kernel, int dynamic_smem) {
  int blocks = 0;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, dynamic_smem) ==
                     cudaSuccess &&
                 blocks > 0
             ? blocks
             : 1;
}

// Window pages run as CTAs of the history launch when the variant allows it and they are few
// (at most a quarter of a wave): then they fill places the history leaves, where a launch of
// their own would cost a kernel boundary. Many of them would instead push the history into
// more waves, or into fewer ranges (measured: batch 8 and 32 are faster apart).
bool WindowCtas(const SplitDecodeVariant& v, int64_t window_ctas, int64_t capacity) {
  return v.fuse_window && v.bf16_tensor_cores && 4 * window_ctas <= capacity;
}

}  // namespace

int SplitDecodeCtasPerSm(int head_dim, PageEncoding history, const SplitDecodeVariant& variant) {
  const bool d64 = head_dim == 64;
  if (history == PageEncoding::kCodecFragment) {
    if (AllowLargeSharedMemory() != cudaSuccess) return 1;
    return d64 ? Occupancy(FragmentHistoryKernel<64>, kFragmentSmemBytes<64>)
               : Occupancy(FragmentHistoryKernel<128>, kFragmentSmemBytes<128>);
  }
  if (history == PageEncoding::kCodec) {
    if (AllowLargeSharedMemory() != cudaSuccess) return 1;
    return d64 ? Occupancy(CodecHistoryKernel<64>, kCodecHistorySmemBytes<64>)
               : Occupancy(CodecHistoryKernel<128>, kCodecHistorySmemBytes<128>);
  }
  if (history != PageEncoding::kBf16) {
    // The bandwidth probe is planned as the kernel whose page stream it measures; the kernel
    // for any group stands for both forms (the same launch bounds, 3 CTAs an SM).
    SplitDecodeVariant v = variant;
    v.int2_bandwidth_probe = false;
    return d64 ? Occupancy(Int2Kernel<64>(v, 0, 0), 0) : Occupancy(Int2Kernel<128>(v, 0, 0), 0);
  }
  if (!variant.bf16_tensor_cores) {
    return d64 ? Occupancy(Bf16HistoryKernel<64>, 0) : Occupancy(Bf16HistoryKernel<128>, 0);
  }
  if (AllowLargeSharedMemory() != cudaSuccess) return 1;
  return d64 ? Occupancy(Bf16HistoryMmaKernel<64>, kBf16HistorySmemBytes<64>)
             : Occupancy(Bf16HistoryMmaKernel<128>, kBf16HistorySmemBytes<128>);
}

SplitDecodePlan PlanSplitDecode(int batch, int num_kv_heads, int head_dim, int max_history_pages,
                                int max_window_pages, int num_sms, int ctas_per_sm,
                                PageEncoding history, const SplitDecodeVariant& variant) {
  SplitDecodePlan plan;
  plan.variant = variant;
  plan.window_pages = std::max(1, max_window_pages);
  const int64_t units = std::max(1, batch * num_kv_heads);
  const int64_t capacity = int64_t{std::max(1, num_sms)} * std::max(1, ctas_per_sm);
  const int pages = std::max(1, max_history_pages);
  // Window pages run as CTAs of the history launch when there are few of them (WindowCtas, a
  // CTA per page), taking places in its waves.
  plan.fused_window = WindowCtas(variant, units * plan.window_pages, capacity);
  // Then how many window pages a window CTA may take. A CTA of several window pages finishes
  // within the history CTAs' time when their ranges are long, and the places it frees go to
  // more, shorter history ranges. Its pages cost, in history pages per warp: an INT2 history
  // CTA stages one window page at a time (its shared memory holds one BF16 page), so each costs
  // a round trip to memory and four warps' work on it, about one and a half of an INT2 warp's
  // pages; a BF16 history CTA streams its window pages as it streams its own, a quarter each.
  // Codec histories keep a CTA per window page.
  const bool bf16_mma = history == PageEncoding::kBf16 && variant.bf16_tensor_cores;
  int max_w = 1;
  if (plan.fused_window && variant.window_pages_per_cta > 0) {
    max_w = std::min(variant.window_pages_per_cta, plan.window_pages);
  } else if (plan.fused_window && (history == PageEncoding::kInt2Uniform || bf16_mma)) {
    max_w = plan.window_pages;
  }
  const auto window_ctas_of = [&](int w) { return (plan.window_pages + w - 1) / w; };
  const double window_page_cost = bf16_mma ? 0.25 : 1.5;
  // Time ~ waves x (pages per CTA + a setup cost of about two pages): choose the split count
  // (and the window pages per CTA) that minimises it, so the last wave is not a sliver of a few
  // CTAs. A BF16 history streams faster in ranges of at most 64 pages (measured: one wave of
  // ranges of 500 pages at batch 8 ran 10 % slower than seven waves of 73), so longer ranges
  // are not considered for it.
  const int max_pps = history == PageEncoding::kBf16 && variant.bf16_tensor_cores &&
                              variant.bf16_max_pages_per_split > 0
                          ? variant.bf16_max_pages_per_split
                          : pages;
  const int max_splits = std::min(pages, 512);
  const int min_splits = std::min(max_splits, (pages + max_pps - 1) / max_pps);
  double best = 1e300;
  for (int w = variant.window_pages_per_cta > 0 ? max_w : 1; w <= max_w; ++w) {  // n: just n
    const int window_ctas = plan.fused_window ? window_ctas_of(w) : 0;
    // A CTA of one window page costs less than any history range (the former model's view);
    // more pages than that can make the window the longest CTA of its wave.
    const double window_cost = w > 1 ? window_page_cost * w + 2.0 : 0.0;
    for (int splits = min_splits; splits <= max_splits; ++splits) {
      const int pps = (pages + splits - 1) / splits;
      const int used = (pages + pps - 1) / pps;  // ranges that hold a page: <= splits
      const int64_t ctas = units * (used + window_ctas);
      const int64_t waves = (ctas + capacity - 1) / capacity;
      const double cost = static_cast<double>(waves) *
                          std::max(static_cast<double>(pps) / kWarps + 2.0, window_cost);
      if (cost < best - 1e-9) {
        best = cost;
        plan.splits = used;
        plan.pages_per_split = pps;
        plan.window_pages_per_cta = w;
      }
    }
  }
  plan.window_slots = window_ctas_of(plan.window_pages_per_cta);
  const int64_t rows = units * (plan.window_slots + plan.splits) * kMaxGroup;
  plan.workspace_bytes = rows * head_dim * 4 + rows * 4;
  return plan;
}

bool SplitDecodeTakesCodec(const CodecLayerLayout& layout, int head_dim) {
  return (head_dim == 64 || head_dim == 128) &&
         codec::GpuLayoutOk(layout, head_dim,
                            head_dim == 64 ? kCodecSideBytes<64> : kCodecSideBytes<128>,
                            kCodecTablePairs);
}

bool SplitDecodeTakesCodecFragment(const CodecLayerLayout& layout, int head_dim) {
  if ((head_dim != 64 && head_dim != 128) ||
      !codec::GpuLayoutOk(layout, head_dim,
                          head_dim == 64 ? kFragmentSideBytes<64> : kFragmentSideBytes<128>)) {
    return false;
  }
  // And a fragment block's own shape: whole steps, the codes right up to the row scales.
  return CodecFragmentLayoutOk(layout);
}

cudaError_t LaunchSplitDecode(const SplitDecodeCudaParams& p, const SplitDecodePlan& plan,
                              void* workspace, cudaStream_t stream) {
  const KvGeometry& g = p.geometry;
  const SplitDecodeVariant& v = plan.variant;
  const PageEncoding history = p.segments[kHistorySegment].encoding;
  const bool bf16_history = history == PageEncoding::kBf16;
  const bool codec_history = history == PageEncoding::kCodec;
  const bool fragment_history = history == PageEncoding::kCodecFragment;
  if (g.num_kv_heads <= 0 || p.num_q_heads % g.num_kv_heads != 0 ||
      p.num_q_heads / g.num_kv_heads > kMaxGroup || g.page_tokens != kPageTokens ||
      (history == PageEncoding::kInt2Uniform && g.group_size != g.head_dim) ||
      (codec_history && (!v.bf16_tensor_cores || !SplitDecodeTakesCodec(p.codec, g.head_dim))) ||
      (fragment_history && !SplitDecodeTakesCodecFragment(p.codec, g.head_dim)) ||
      (!bf16_history && !codec_history && !fragment_history &&
       history != PageEncoding::kInt2Uniform) ||
      p.segments[0].encoding != PageEncoding::kBf16 ||
      p.segments[2].encoding != PageEncoding::kBf16) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  if (((bf16_history || codec_history) && v.bf16_tensor_cores) || fragment_history) {
    if (const cudaError_t e = AllowLargeSharedMemory(); e != cudaSuccess) return e;
  }
  Workspace ws;
  ws.window = plan.window_slots;
  ws.window_pages_per_slot = plan.fused_window ? plan.window_pages_per_cta : 1;
  ws.slots = plan.window_slots + plan.splits;
  ws.head_weights = v.combine_head_weights;
  const int64_t rows = int64_t{p.batch} * g.num_kv_heads * ws.slots * kMaxGroup;
  ws.part_o = static_cast<float*>(workspace);
  ws.part_lse = ws.part_o + rows * g.head_dim;
  const int window_ctas = plan.fused_window ? plan.window_slots : 0;
  const dim3 history_grid(window_ctas + plan.splits, g.num_kv_heads, p.batch);
  const dim3 window_grid(plan.window_pages, g.num_kv_heads, p.batch);
  const bool early = v.early_launch;
  const bool ahead = early && v.dependents_at_start;
  const int pps = plan.pages_per_split;
  const unsigned merge_ctas = static_cast<unsigned>(p.batch * p.num_q_heads);
  return KV_DISPATCH_HEAD_DIM(g.head_dim, D, {
    cudaError_t e = cudaSuccess;
    if (fragment_history) {
      e = LaunchKernel(early, history_grid, dim3(kThreads), kFragmentSmemBytes<D>, stream,
                       FragmentHistoryKernel<D>, p, pps, window_ctas, ws);
    } else if (codec_history) {
      e = LaunchKernel(early, history_grid, dim3(kThreads), kCodecHistorySmemBytes<D>, stream,
                       CodecHistoryKernel<D>, p, pps, window_ctas, ws, v.codec_page_tables);
    } else if (bf16_history && v.bf16_tensor_cores) {
      e = LaunchKernel(early, history_grid, dim3(kThreads), kBf16HistorySmemBytes<D>, stream,
                       Bf16HistoryMmaKernel<D>, p, pps, window_ctas, ws);
    } else if (bf16_history) {
      Bf16HistoryKernel<D><<<dim3(plan.splits, g.num_kv_heads, p.batch), kThreads, 0, stream>>>(
          p, pps, ws);
    } else {
      e = LaunchKernel(early, history_grid, dim3(kThreads), 0, stream,
                       Int2Kernel<D>(v, p.num_q_heads / g.num_kv_heads, pps), p, pps, window_ctas,
                       ws, v.int2_quick_start, early, v.int2_slots_ahead, ahead);
    }
    if (e != cudaSuccess) return e;
    if (window_ctas == 0) {
      if (v.bf16_tensor_cores) {
        Bf16WindowKernel<D><<<window_grid, kThreads, 0, stream>>>(p, ws);
      } else {
        Bf16PageKernel<D><<<window_grid, kThreads, 0, stream>>>(p, ws);
      }
    }
    if (v.parallel_merge) {
      e = v.merge_early_loads
              ? LaunchKernel(early, dim3(merge_ctas), dim3(kThreads), ws.slots * sizeof(float),
                             stream, MergeParallelKernel<D, kMergeEarlyLoads>, p, ws, ahead)
              : LaunchKernel(early, dim3(merge_ctas), dim3(kThreads), ws.slots * sizeof(float),
                             stream, MergeParallelKernel<D, 0>, p, ws, ahead);
    } else {
      e = LaunchKernel(early, dim3(merge_ctas), dim3(D), 0, stream, MergeKernel<D>, p, ws);
    }
    return e != cudaSuccess ? e : cudaGetLastError();
  });
}

cudaError_t FillRandomInt2Pages(uint8_t* pool, int64_t slot_stride, int num_pages,
                                const KvGeometry& geometry, uint32_t seed, cudaStream_t stream) {
  if (num_pages <= 0) return cudaSuccess;
  FillKernel<<<1024, 256, 0, stream>>>(pool, slot_stride, num_pages, geometry, seed);
  return cudaGetLastError();
}

}  // namespace kvstrata::kernels

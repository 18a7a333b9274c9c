// Decode-attention benchmark on the GPU: kvstrata's split INT2 attention (sink 64 BF16 + INT2
// history + recent >= 256 BF16) for a Qwen3-8B-shaped layer (32 query / 8 KV heads, head_dim
// 128), with distinct pages for all 36 layers so the data cannot sit in L2, plus the append and
// demotion kernels' cost per decode step and the device's copy bandwidth. One JSON object per
// line on stdout. Synthetic data (random codes and scales); the kernels do not depend on values.
//
// The same split decode also runs over the BF16 cache format (every page BF16) beside it, and
// each step of the kernel round runs side by side (kInt2Steps, kBf16Steps), for Qwen3-8B's
// shape and the default model's (head_dim 64, 9 query / 3 KV heads). --formats codec adds the
// codec format's history (--codec64 / --codec128: its recipes, every layer) at about INT2's bits,
// --formats fragment the same recipes with uniform levels in codec fragment blocks.
//
//   kvstrata_bench_attention [--contexts 8192,32768,...] [--batches 1,8,32] [--iters N]
//                            [--shapes qwen3-8b,smollm2-135m] [--formats int2,bf16,codec,fragment]
//                            [--rounds R] [--int2_steps i,j] [--bf16_steps i,j]
//                            [--codec_steps i,j]
//
// The steps at one point (shape, batch, context) are timed in rotated rounds (--rounds, default
// 4, rounded up to a multiple of the number of steps): every step runs first, second, ...
// equally often, --iters graph replays per step are spread over the rounds, and a step's
// us_per_layer is the median of its rounds (us_min, us_max and us_rounds beside it).

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/copy_bandwidth.h"
#include "kernels/bits.h"
#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "kernels/cuda/append.h"
#include "kernels/cuda/split_decode.h"

namespace kvstrata::kernels {
namespace {

#define CHECK_CUDA(expr)                                                                          \
  do {                                                                                            \
    cudaError_t e_ = (expr);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

std::vector<int> ParseList(const char* s) {
  std::vector<int> out;
  while (*s) {
    out.push_back(std::atoi(s));
    const char* c = std::strchr(s, ',');
    if (!c) break;
    s = c + 1;
  }
  return out;
}

__global__ void FillBf16(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    p[i] = static_cast<uint16_t>(0x3c00 | (x & 0x7f)) ^ ((x >> 8) & 1 ? 0x8000 : 0);  // +-(1..2)
  }
}

// The model shapes the benchmark measures: Qwen3-8B's attention and the default model's.
struct Shape {
  const char* name;
  int q_heads, kv_heads, head_dim, layers;
};
constexpr Shape kShapes[] = {{"qwen3-8b", 32, 8, 128, 36}, {"smollm2-135m", 9, 3, 64, 30}};

// The steps of this round, each one on top of the one before, measured side by side.
struct Step {
  const char* name;
  SplitDecodeVariant variant;
};
constexpr SplitDecodeVariant kBefore = {.bf16_tensor_cores = false,
                                        .fuse_window = false,
                                        .parallel_merge = false,
                                        .bf16_max_pages_per_split = 0,
                                        .int2_overlap_pages = false,
                                        .int2_slots_ahead = false,
                                        .int2_quick_start = false,
                                        .combine_head_weights = false};
// The INT2 steps before the slots read ahead (the default since) keep their former kernel; the
// page-loop changes made since in kernels the chooser picks by range length (rows split between
// lane pairs, keys on integer tensor cores) apply to the steps before them where ranges are long.
// Steps 13-14 keep fp16 pairs for the keys, as measured.
constexpr Step kInt2Steps[] = {
    {"before: separate fp32 window kernel, one thread per channel merge", kBefore},
    {"+ merge spread over the CTA",
     {.bf16_tensor_cores = false,
      .fuse_window = false,
      .int2_overlap_pages = false,
      .int2_slots_ahead = false,
      .int2_quick_start = false,
      .combine_head_weights = false}},
    {"+ window pages on tensor cores",
     {.fuse_window = false,
      .int2_overlap_pages = false,
      .int2_slots_ahead = false,
      .int2_quick_start = false,
      .combine_head_weights = false}},
    {"+ window pages in the history launch when few",
     {.int2_slots_ahead = false, .int2_quick_start = false, .combine_head_weights = false}},
    {"+ next page's scores before this page's softmax (off by default)",
     {.int2_overlap_pages = true,
      .int2_slots_ahead = false,
      .int2_quick_start = false,
      .combine_head_weights = false}},
    {"+ quick start: one page per warp in the first burst, 16-byte query loads",
     {.int2_slots_ahead = false, .combine_head_weights = false}},
    {"+ warps combined with weights per head",
     {.int2_slots_ahead = false, .window_pages_per_cta = 1}},
    {"quick start + next page's scores first (off by default)",
     {.int2_overlap_pages = true, .int2_slots_ahead = false, .window_pages_per_cta = 1}},
    {"+ launched early: pages asked for while the kernel before (the last layer's merge) runs",
     {.int2_slots_ahead = false, .early_launch = true, .window_pages_per_cta = 1}},
    {"+ window pages several per CTA, the history more ranges", {.int2_slots_ahead = false}},
    {"+ window pages several per CTA, launched early",
     {.int2_slots_ahead = false, .early_launch = true}},
    {"the same, the merge's loads after the slots' weights (the former merge)",
     {.int2_slots_ahead = false, .early_launch = true, .merge_early_loads = false}},
    {"bandwidth probe: step 10's pages streamed with no math (wrong output)",
     {.int2_slots_ahead = false, .int2_bandwidth_probe = true, .early_launch = true}},
    {"+ each page's slot read one request ahead", {.int2_int8_keys_min_pages = 1 << 30}},
    {"+ each page's slot read one request ahead, launched early",
     {.int2_int8_keys_min_pages = 1 << 30, .early_launch = true}},
    {"+ keys on integer tensor cores, four codes a mask, every range",
     {.int2_int8_keys_min_pages = 0}},
    {"+ keys on integer tensor cores, every range, launched early",
     {.int2_int8_keys_min_pages = 0, .early_launch = true}},
    {"+ keys on integer tensor cores in ranges of 32 pages or more (default)", {}},
    {"+ keys on integer tensor cores in ranges of 32 pages or more, launched early",
     {.early_launch = true}},
};
constexpr Step kBf16Steps[] = {
    {"fp32 math (before)", kBefore},
    {"tensor cores, ranges of any length",
     {.bf16_max_pages_per_split = 0, .combine_head_weights = false, .window_pages_per_cta = 1}},
    {"+ ranges of at most 64 pages", {.combine_head_weights = false, .window_pages_per_cta = 1}},
    {"+ warps combined with weights per head", {.window_pages_per_cta = 1}},
    {"+ launched early: pages asked for while the kernel before (the last layer's merge) runs",
     {.early_launch = true, .window_pages_per_cta = 1}},
    {"+ window pages several per CTA, the history more ranges (default)", {}},
    {"+ window pages several per CTA, launched early", {.early_launch = true}},
    {"the same, the merge's loads after the slots' weights (the former merge)",
     {.early_launch = true, .merge_early_loads = false}},
};

// --int2_steps, --bf16_steps, --codec_steps: the steps to run (indices into kInt2Steps,
// kBf16Steps and RunCodec's steps); empty: all of them.
std::vector<int> g_int2_steps, g_bf16_steps, g_codec_steps;
bool Chosen(const std::vector<int>& steps, int k) {
  return steps.empty() || std::find(steps.begin(), steps.end(), k) != steps.end();
}

std::vector<int32_t*> g_allocations;
int32_t* Upload(const std::vector<int32_t>& v) {
  int32_t* p;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(1, v.size()) * 4));
  CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  g_allocations.push_back(p);
  return p;
}
void FreeUploads() {
  for (int32_t* p : g_allocations) cudaFree(p);
  g_allocations.clear();
}

void* Workspace(const SplitDecodePlan& plan) {
  void* ws;
  CHECK_CUDA(cudaMalloc(&ws, plan.workspace_bytes));
  return ws;
}

// A codec history: each layer's blocks (SplitDecodeCudaParams::codec), set per launch.
std::vector<CodecLayerLayout> g_codec_layouts;

// The layers' launches (layers 0..layers-1) captured in one graph.
cudaGraphExec_t CaptureLayers(SplitDecodeCudaParams p, const SplitDecodePlan& plan, void* ws,
                              int layers, cudaStream_t stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < layers; ++l) {
    p.layer = l;
    if (!g_codec_layouts.empty()) p.codec = g_codec_layouts[l];
    CHECK_CUDA(LaunchSplitDecode(p, plan, ws, stream));
  }
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphDestroy(graph));
  return exec;
}

// Time per layer of `iters` back-to-back replays of a graph of `layers` launches.
double TimeReplays(cudaGraphExec_t exec, int layers, int iters, cudaStream_t stream) {
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaEventRecord(e0, stream));
  for (int i = 0; i < iters; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  CHECK_CUDA(cudaEventRecord(e1, stream));
  CHECK_CUDA(cudaEventSynchronize(e1));
  float ms;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms * 1e3 / (iters * layers);
}

// Time per layer of one plan's launches for `layers` layers, captured in one graph and replayed
// `iters` times after one warm-up replay.
double TimeLayers(SplitDecodeCudaParams p, const SplitDecodePlan& plan, void* ws, int layers,
                  int iters, cudaStream_t stream) {
  cudaGraphExec_t exec = CaptureLayers(p, plan, ws, layers, stream);
  CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const double us = TimeReplays(exec, layers, iters, stream);
  cudaGraphExecDestroy(exec);
  return us;
}

// --rounds: the steps at one point are timed in rounds, with no host work between them.
// Round r runs the steps in their order starting at the (r mod n)-th of the n steps, so with
// rounds a multiple of n (the count is rounded up to one) every step runs first, second, ...
// equally often; each round times ceil(iters / rounds) replays of each step's graph. A step's
// figure is the median of its rounds. (With the steps run one after the other, each once, the
// first step at a point came out 5-9 % faster at batch 32 / 100K-128K whichever step it was:
// docs/data/h200-attention-round3/order-control/.)
int g_rounds = 4;
struct Timing {
  double median_us, min_us, max_us;
  std::vector<double> rounds_us;  // in round order
  int iters_per_round;
};

// Every step's graph is captured and instantiated, and replayed once to warm up, before any
// timed replay, so that no host work (capture, instantiation, allocation) falls between them.
std::vector<Timing> TimeStepsRotated(SplitDecodeCudaParams p,
                                     const std::vector<SplitDecodePlan>& plans, int layers,
                                     int iters, cudaStream_t stream) {
  const int n = static_cast<int>(plans.size());
  std::vector<Timing> out(n);
  if (n == 0) return out;
  const int rounds = (std::max(1, g_rounds) + n - 1) / n * n;
  const int per_round = std::max(1, (iters + rounds - 1) / rounds);
  std::vector<void*> ws(n);
  std::vector<cudaGraphExec_t> execs(n);
  for (int k = 0; k < n; ++k) {
    ws[k] = Workspace(plans[k]);
    execs[k] = CaptureLayers(p, plans[k], ws[k], layers, stream);
  }
  for (int k = 0; k < n; ++k) CHECK_CUDA(cudaGraphLaunch(execs[k], stream));  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  for (int r = 0; r < rounds; ++r) {
    for (int j = 0; j < n; ++j) {
      const int k = (r + j) % n;
      out[k].rounds_us.push_back(TimeReplays(execs[k], layers, per_round, stream));
    }
  }
  for (int k = 0; k < n; ++k) {
    Timing& t = out[k];
    std::vector<double> v = t.rounds_us;
    std::sort(v.begin(), v.end());
    const size_t m = v.size();
    t.median_us = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
    t.min_us = v.front();
    t.max_us = v.back();
    t.iters_per_round = per_round;
    cudaGraphExecDestroy(execs[k]);
    cudaFree(ws[k]);
  }
  return out;
}

// The JSON fields of a rotated timing (after us_per_layer's).
std::string TimingFields(const Timing& t) {
  std::string s;
  char buf[64];
  std::snprintf(buf, sizeof buf, "\"us_min\": %.2f, \"us_max\": %.2f, ", t.min_us, t.max_us);
  s += buf;
  std::snprintf(buf, sizeof buf, "\"rounds\": %zu, \"iters_per_round\": %d, \"us_rounds\": [",
                t.rounds_us.size(), t.iters_per_round);
  s += buf;
  for (size_t i = 0; i < t.rounds_us.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.2f", i ? ", " : "", t.rounds_us[i]);
    s += buf;
  }
  return s + "]";
}

// One layer's split cache for `batch` sequences of `context` tokens: BF16 sink and recent
// pages, and a history of INT2 pages or (bf16_history) BF16 pages. Pages of a sequence sit in
// a shuffled slot order, as a pool would give them.
struct Cache {
  SplitDecodeCudaParams p;
  uint8_t *history_pool = nullptr, *bf16_pool = nullptr;
  int history_pages = 0, recent_pages = 0;
  SplitSegments seg;
};

// codec_page_bytes > 0: a history of codec pages of that size (their bytes random: every byte
// is a valid code or scale code).
Cache MakeCache(const Shape& s, int layers, int batch, int context, bool bf16_history,
                int64_t codec_page_bytes = 0,
                PageEncoding codec_encoding = PageEncoding::kCodec) {
  Cache c;
  const KvGeometry g{layers, s.kv_heads, s.head_dim, s.head_dim, 64};
  const SplitLayout layout;
  c.seg = SegmentsAt(layout, context);
  c.history_pages = static_cast<int>(c.seg.history / 64);
  c.recent_pages = static_cast<int>((c.seg.recent + 63) / 64);
  const bool codec = codec_page_bytes > 0;
  const PageEncoding history_encoding = codec          ? codec_encoding
                                        : bf16_history ? PageEncoding::kBf16
                                                       : PageEncoding::kInt2Uniform;
  const int64_t history_stride = codec ? codec_page_bytes : PageBytes(g, history_encoding);
  const int64_t bf16_stride = PageBytes(g, PageEncoding::kBf16);
  CHECK_CUDA(cudaMalloc(&c.history_pool, int64_t{batch} * c.history_pages * history_stride + 256));
  CHECK_CUDA(cudaMalloc(&c.bf16_pool, int64_t{batch} * (1 + c.recent_pages) * bf16_stride));
  if (bf16_history || codec) {
    FillBf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(c.history_pool),
                            int64_t{batch} * c.history_pages * history_stride / 2, 5);
  } else {
    CHECK_CUDA(FillRandomInt2Pages(c.history_pool, history_stride, batch * c.history_pages, g, 7,
                                   nullptr));
  }
  FillBf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(c.bf16_pool),
                          int64_t{batch} * (1 + c.recent_pages) * bf16_stride / 2, 3);
  std::vector<int32_t> hist_indptr{0}, hist_idx, sink_indptr{0}, sink_idx, rec_indptr{0}, rec_idx;
  std::vector<int32_t> sink_last(batch, 64), hist_last(batch, 64), rec_last(batch);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < c.history_pages; ++p)
      hist_idx.push_back(
          static_cast<int32_t>((int64_t{p} * batch + b) % (int64_t{batch} * c.history_pages)));
    hist_indptr.push_back(static_cast<int32_t>(hist_idx.size()));
    sink_idx.push_back(b * (1 + c.recent_pages));
    sink_indptr.push_back(static_cast<int32_t>(sink_idx.size()));
    for (int p = 0; p < c.recent_pages; ++p) rec_idx.push_back(b * (1 + c.recent_pages) + 1 + p);
    rec_indptr.push_back(static_cast<int32_t>(rec_idx.size()));
    rec_last[b] = static_cast<int32_t>(c.seg.recent - 64 * (c.recent_pages - 1));
  }
  SplitDecodeCudaParams& p = c.p;
  uint16_t* q;
  float *out, *lse;
  CHECK_CUDA(cudaMalloc(&q, int64_t{batch} * s.q_heads * s.head_dim * 2));
  FillBf16<<<64, 256>>>(q, int64_t{batch} * s.q_heads * s.head_dim, 11);
  CHECK_CUDA(cudaMalloc(&out, int64_t{batch} * s.q_heads * s.head_dim * 4));
  CHECK_CUDA(cudaMalloc(&lse, int64_t{batch} * s.q_heads * 4));
  p.q = q;
  p.batch = batch;
  p.num_q_heads = s.q_heads;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  p.geometry = g;
  p.segments[0] = {c.bf16_pool,       bf16_stride,       Upload(sink_indptr),
                   Upload(sink_idx),  Upload(sink_last), PageEncoding::kBf16};
  p.segments[1] = {c.history_pool,    history_stride,    Upload(hist_indptr),
                   Upload(hist_idx),  Upload(hist_last), history_encoding};
  p.segments[2] = {c.bf16_pool,       bf16_stride,       Upload(rec_indptr),
                   Upload(rec_idx),   Upload(rec_last),  PageEncoding::kBf16};
  p.out = out;
  p.lse = lse;
  return c;
}

void FreeCache(Cache& c) {
  cudaFree(c.history_pool);
  cudaFree(c.bf16_pool);
  cudaFree(const_cast<uint16_t*>(c.p.q));
  cudaFree(c.p.out);
  cudaFree(c.p.lse);
  FreeUploads();
}

void RunInt2(const Shape& s, int batch, int context, int iters, int sms) {
  Cache c = MakeCache(s, s.layers, batch, context, /*bf16_history=*/false);
  SplitDecodeCudaParams& p = c.p;
  const KvGeometry& g = p.geometry;
  const int d = s.head_dim;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  // Bytes one layer's attention must read: INT2 codes + scales of the history, BF16 windows.
  const double hist_bytes = static_cast<double>(batch) * c.history_pages * 2 * s.kv_heads *
                            BlockBytes(g, PageEncoding::kInt2Uniform);
  const double window_bytes =
      static_cast<double>(batch) * (c.seg.sink + c.seg.recent) * 2 * s.kv_heads * d * 2;
  const double bytes = hist_bytes + window_bytes + static_cast<double>(batch) * s.q_heads * d * 2;
  const double bf16_bytes = static_cast<double>(batch) * context * 2 * s.kv_heads * d * 2;
  std::vector<int> chosen;
  std::vector<SplitDecodePlan> plans;
  for (int k = 0; k < static_cast<int>(std::size(kInt2Steps)); ++k) {
    if (!Chosen(g_int2_steps, k)) continue;
    chosen.push_back(k);
    plans.push_back(PlanSplitDecode(
        batch, s.kv_heads, d, c.history_pages, 1 + c.recent_pages, sms,
        SplitDecodeCtasPerSm(d, PageEncoding::kInt2Uniform, kInt2Steps[k].variant),
        PageEncoding::kInt2Uniform, kInt2Steps[k].variant));
  }
  const std::vector<Timing> times = TimeStepsRotated(p, plans, s.layers, iters, stream);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Step& step = kInt2Steps[chosen[i]];
    const SplitDecodePlan& plan = plans[i];
    const double us = times[i].median_us;
    std::printf(
        "{\"kernel\": \"kvstrata-int2-split\", \"shape\": \"%s\", \"step\": \"%s\", \"batch\": %d, "
        "\"context\": %d, \"us_per_layer\": %.2f, \"bytes_per_layer\": %.0f, \"tb_per_s\": %.3f, "
        "\"bf16_equivalent_bytes\": %.0f, \"splits\": %d, \"pages_per_split\": %d, "
        "\"fused_window\": %s, \"window_pages_per_cta\": %d, %s}\n",
        s.name, step.name, batch, context, us, bytes, bytes / (us * 1e-6) / 1e12, bf16_bytes,
        plan.splits, plan.pages_per_split, plan.fused_window ? "true" : "false",
        plan.window_pages_per_cta, TimingFields(times[i]).c_str());
    std::fflush(stdout);
  }
  if (std::strcmp(s.name, "qwen3-8b") != 0) {
    cudaStreamDestroy(stream);
    FreeCache(c);
    return;
  }
  // The same with empty windows: the INT2 history kernel and the merge alone.
  double history_us = 0;
  {
    const std::vector<int32_t> zeros(batch + 1, 0);
    SplitDecodeCudaParams h = p;
    h.segments[0].indptr = Upload(zeros);
    h.segments[2].indptr = Upload(zeros);
    const SplitDecodePlan hplan =
        PlanSplitDecode(batch, s.kv_heads, d, c.history_pages, 0, sms, SplitDecodeCtasPerSm(d));
    void* ws = Workspace(hplan);
    history_us = TimeLayers(h, hplan, ws, s.layers, iters, stream);
    cudaFree(ws);
  }

  // Append cost per decode step: every sequence's new token, all layers, one launch; and the
  // demotion of one page per sequence every 64 steps.
  const int layers = s.layers, kv_heads = s.kv_heads;
  const int64_t bf16_stride = PageBytes(g, PageEncoding::kBf16);
  const std::vector<int32_t> slot(batch, 0), row(batch, 5);
  uint16_t *knew, *vnew;
  float* rot;
  CHECK_CUDA(cudaMalloc(&knew, int64_t{layers} * batch * kv_heads * d * 2));
  CHECK_CUDA(cudaMalloc(&vnew, int64_t{layers} * batch * kv_heads * d * 2));
  CHECK_CUDA(cudaMalloc(&rot, int64_t{layers} * kv_heads * d * d * 4));
  FillBf16<<<256, 256>>>(knew, int64_t{layers} * batch * kv_heads * d, 1);
  FillBf16<<<256, 256>>>(vnew, int64_t{layers} * batch * kv_heads * d, 2);
  CHECK_CUDA(cudaMemset(rot, 0, int64_t{layers} * kv_heads * d * d * 4));
  AppendParams ap;
  ap.k = knew;
  ap.v = vnew;
  ap.num_tokens = batch;
  ap.k_rotation = rot;
  ap.v_rotation = rot;
  ap.slot = Upload(slot);
  ap.row = Upload(row);
  ap.bf16_pool = c.bf16_pool;
  ap.slot_stride = bf16_stride;
  ap.geometry = g;
  DemoteParams dp;
  dp.bf16_pool = c.bf16_pool;
  dp.bf16_stride = bf16_stride;
  dp.int2_pool = c.history_pool;
  dp.int2_stride = PageBytes(g, PageEncoding::kInt2Uniform);
  std::vector<int32_t> src(batch), dst(batch);
  for (int b = 0; b < batch; ++b) src[b] = b * (1 + c.recent_pages) + 1, dst[b] = b;
  dp.src_slot = Upload(src);
  dp.dst_slot = Upload(dst);
  dp.num_pages = batch;
  dp.geometry = g;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  CHECK_CUDA(AppendRotatedRows(ap, stream));
  CHECK_CUDA(DemotePages(dp, stream));
  cudaEventRecord(e0, stream);
  for (int i = 0; i < 20; ++i) CHECK_CUDA(AppendRotatedRows(ap, stream));
  cudaEventRecord(e1, stream);
  CHECK_CUDA(cudaEventSynchronize(e1));
  float append_ms;
  cudaEventElapsedTime(&append_ms, e0, e1);
  cudaEventRecord(e0, stream);
  for (int i = 0; i < 5; ++i) CHECK_CUDA(DemotePages(dp, stream));
  cudaEventRecord(e1, stream);
  CHECK_CUDA(cudaEventSynchronize(e1));
  float demote_ms;
  cudaEventElapsedTime(&demote_ms, e0, e1);
  std::printf(
      "{\"kernel\": \"kvstrata-int2-history-only\", \"shape\": \"%s\", \"batch\": %d, "
      "\"context\": %d, \"history_only_us_per_layer\": %.2f, \"history_only_tb_per_s\": %.3f, "
      "\"append_us_per_step\": %.2f, \"demote_us_per_page_batch\": %.2f, "
      "\"demote_us_per_step_amortised\": %.3f}\n",
      s.name, batch, context, history_us, hist_bytes / (history_us * 1e-6) / 1e12,
      append_ms * 1e3 / 20, demote_ms * 1e3 / 5, demote_ms * 1e3 / 5 / 64);
  std::fflush(stdout);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(stream);
  cudaFree(knew);
  cudaFree(vnew);
  cudaFree(rot);
  FreeCache(c);
}

// The codec format's history (every layer under the recipes of `spec`) through the same split
// decode, beside INT2 at about the same bits: the codec's price in decode speed. fragment: the
// same recipes with uniform levels in codec fragment blocks (kernels/codec_fragment.h).
void RunCodec(const Shape& s, int batch, int context, int iters, int sms, const std::string& spec,
              bool fragment = false) {
  HistoryCodec codec;
  std::string error;
  if (!ParseHistoryCodec(spec, s.head_dim, &codec, &error)) {
    std::fprintf(stderr, "--codec: %s\n", error.c_str());
    std::exit(2);
  }
  const PageEncoding encoding = fragment ? PageEncoding::kCodecFragment : PageEncoding::kCodec;
  int64_t at = kPageHeaderBytes;
  g_codec_layouts.clear();
  for (int l = 0; l < s.layers; ++l) {
    const SideRecipe& kr = codec.Side(l, 0);
    const SideRecipe& vr = codec.Side(l, 1);
    const int64_t kb = fragment ? CodecFragmentBlockLayoutFor(kr).bytes
                                : CodecBlockLayoutFor(kr, 64).bytes;
    const int64_t vb = fragment ? CodecFragmentBlockLayoutFor(vr).bytes
                                : CodecBlockLayoutFor(vr, 64).bytes;
    g_codec_layouts.push_back(fragment
                                  ? CodecFragmentLayerLayoutFor(kr, vr, at, at + s.kv_heads * kb)
                                  : CodecLayerLayoutFor(kr, vr, 64, at, at + s.kv_heads * kb));
    at += s.kv_heads * (kb + vb);
  }
  if (fragment && !SplitDecodeTakesCodecFragment(g_codec_layouts[0], s.head_dim)) {
    std::fprintf(stderr, "--codec: %s is not a codec fragment recipe for head_dim %d\n",
                 spec.c_str(), s.head_dim);
    std::exit(2);
  }
  const int64_t page_bytes = (at + 63) / 64 * 64;
  Cache c = MakeCache(s, s.layers, batch, context, /*bf16_history=*/false, page_bytes, encoding);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const int d = s.head_dim;
  const double block_bytes =
      static_cast<double>(g_codec_layouts[0].side[0].block_bytes + g_codec_layouts[0].side[1].block_bytes);
  const double hist_bytes = static_cast<double>(batch) * c.history_pages * s.kv_heads * block_bytes;
  const double window_bytes =
      static_cast<double>(batch) * (c.seg.sink + c.seg.recent) * 2 * s.kv_heads * d * 2;
  const double bytes = hist_bytes + window_bytes + static_cast<double>(batch) * s.q_heads * d * 2;
  const double bits = block_bytes * 8 / (2.0 * 64 * d);
  const Step codec_steps[] = {
      {"every value scaled as decoded", {.codec_page_tables = false}},
      {"page tables, row scales on scores and probabilities (default)", {}},
  };
  const Step fragment_steps[] = {{"fragment blocks decoded in registers", {}}};
  const Step* steps = fragment ? fragment_steps : codec_steps;
  const int num_steps = fragment ? 1 : 2;
  std::vector<const Step*> chosen;
  std::vector<SplitDecodePlan> plans;
  for (int k = 0; k < num_steps; ++k) {
    if (!fragment && !Chosen(g_codec_steps, k)) continue;
    const Step& step = steps[k];
    chosen.push_back(&step);
    plans.push_back(PlanSplitDecode(batch, s.kv_heads, d, c.history_pages, 1 + c.recent_pages, sms,
                                    SplitDecodeCtasPerSm(d, encoding, step.variant), encoding,
                                    step.variant));
  }
  const std::vector<Timing> times = TimeStepsRotated(c.p, plans, s.layers, iters, stream);
  for (size_t i = 0; i < plans.size(); ++i) {
    const double us = times[i].median_us;
    std::printf(
        "{\"kernel\": \"%s\", \"shape\": \"%s\", \"step\": \"%s\", "
        "\"codec\": \"%s\", \"history_bits_per_element\": %.3f, \"batch\": %d, "
        "\"context\": %d, \"us_per_layer\": %.2f, \"bytes_per_layer\": %.0f, "
        "\"tb_per_s\": %.3f, \"splits\": %d, \"pages_per_split\": %d, \"fused_window\": %s, "
        "%s}\n",
        fragment ? "kvstrata-codec-fragment-split" : "kvstrata-codec-split", s.name,
        chosen[i]->name, spec.c_str(), bits, batch, context, us, bytes,
        bytes / (us * 1e-6) / 1e12, plans[i].splits, plans[i].pages_per_split,
        plans[i].fused_window ? "true" : "false", TimingFields(times[i]).c_str());
  }
  std::fflush(stdout);
  g_codec_layouts.clear();
  cudaStreamDestroy(stream);
  FreeCache(c);
}

// The BF16 cache format (every page BF16) through the same split decode: the baseline the INT2
// format is compared with end to end. As many distinct layers as fit in `budget` bytes (at
// least 2, at most the model's), as torch's side gets.
void RunBf16(const Shape& s, int batch, int context, int iters, int sms, double budget) {
  const int pages = (context + 63) / 64;
  const double layer_bytes = static_cast<double>(batch) * pages * 2 * s.kv_heads * 64 *
                             s.head_dim * 2;
  const int layers = static_cast<int>(std::max(2.0, std::min<double>(s.layers, budget / layer_bytes)));
  Cache c = MakeCache(s, layers, batch, context, /*bf16_history=*/true);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  const int d = s.head_dim;
  const double bytes = static_cast<double>(batch) * context * 2 * s.kv_heads * d * 2 +
                       static_cast<double>(batch) * s.q_heads * d * 2;
  std::vector<int> chosen;
  std::vector<SplitDecodePlan> plans;
  for (int k = 0; k < static_cast<int>(std::size(kBf16Steps)); ++k) {
    if (!Chosen(g_bf16_steps, k)) continue;
    chosen.push_back(k);
    plans.push_back(PlanSplitDecode(
        batch, s.kv_heads, d, c.history_pages, 1 + c.recent_pages, sms,
        SplitDecodeCtasPerSm(d, PageEncoding::kBf16, kBf16Steps[k].variant), PageEncoding::kBf16,
        kBf16Steps[k].variant));
  }
  const std::vector<Timing> times = TimeStepsRotated(c.p, plans, layers, iters, stream);
  for (size_t i = 0; i < chosen.size(); ++i) {
    const Step& step = kBf16Steps[chosen[i]];
    const SplitDecodePlan& plan = plans[i];
    const double us = times[i].median_us;
    std::printf(
        "{\"kernel\": \"kvstrata-bf16-paged\", \"shape\": \"%s\", \"step\": \"%s\", \"batch\": %d, "
        "\"context\": %d, \"us_per_layer\": %.2f, \"bytes_per_layer\": %.0f, \"tb_per_s\": %.3f, "
        "\"distinct_layers\": %d, \"splits\": %d, \"pages_per_split\": %d, "
        "\"fused_window\": %s, \"window_pages_per_cta\": %d, %s}\n",
        s.name, step.name, batch, context, us, bytes, bytes / (us * 1e-6) / 1e12, layers,
        plan.splits, plan.pages_per_split, plan.fused_window ? "true" : "false",
        plan.window_pages_per_cta, TimingFields(times[i]).c_str());
    std::fflush(stdout);
  }
  cudaStreamDestroy(stream);
  FreeCache(c);
}

}  // namespace
}  // namespace kvstrata::kernels

// A codec spec with uniform levels (":u" after every ":pr"), for --formats fragment.
std::string UniformLevels(std::string spec) {
  for (size_t at = spec.find(":pr"); at != std::string::npos; at = spec.find(":pr", at + 5)) {
    spec.insert(at + 3, ":u");
  }
  return spec;
}

int main(int argc, char** argv) {
  std::vector<int> contexts = {8192, 32768, 65536, 102400, 131072};
  std::vector<int> batches = {1, 8, 32};
  int iters = 20;
  std::string shapes = "qwen3-8b,smollm2-135m", formats = "int2,bf16";
  double budget_gb = 60;
  // The codec at about INT2's bits: P2v4's base recipe for head_dim 64 (2.41 bits per history
  // element, padding counted, against INT2's 2.50), the same mix of regions for 128 (2.33
  // against 2.25).
  std::string codec64 = "4x16+3x16+2x32:s8:pr|3x16+2x16+1x32:s8:pr";
  std::string codec128 = "4x32+3x32+2x64:s8:pr|3x32+2x32+1x64:s8:pr";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--contexts"))
      contexts = kvstrata::kernels::ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batches"))
      batches = kvstrata::kernels::ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters"))
      iters = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--shapes"))
      shapes = argv[i + 1];
    else if (!std::strcmp(argv[i], "--formats"))
      formats = argv[i + 1];
    else if (!std::strcmp(argv[i], "--codec64"))
      codec64 = argv[i + 1];
    else if (!std::strcmp(argv[i], "--codec128"))
      codec128 = argv[i + 1];
    else if (!std::strcmp(argv[i], "--bf16_budget_gb"))
      budget_gb = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--rounds"))
      kvstrata::kernels::g_rounds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--int2_steps"))
      kvstrata::kernels::g_int2_steps = kvstrata::kernels::ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--bf16_steps"))
      kvstrata::kernels::g_bf16_steps = kvstrata::kernels::ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--codec_steps"))
      kvstrata::kernels::g_codec_steps = kvstrata::kernels::ParseList(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "unknown flag %s\nusage: %s [--contexts a,b] [--batches a,b] [--iters N] "
                   "[--shapes qwen3-8b,smollm2-135m] [--formats int2,bf16,codec,fragment] "
                   "[--codec64 SPEC] [--codec128 SPEC] [--bf16_budget_gb G] "
                   "[--rounds R] [--int2_steps i,j] [--bf16_steps i,j] [--codec_steps i,j] "
                   "(indices of the steps; all by default)\n",
                   argv[i], argv[0]);
      return 2;
    }
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    std::fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"l2_bytes\": %d, \"copy_tb_per_s\": %.3f}\n",
              prop.name, sms, prop.l2CacheSize, kvstrata::bench::CopyBandwidth() / 1e12);
  for (const auto& shape : kvstrata::kernels::kShapes) {
    if (shapes.find(shape.name) == std::string::npos) continue;
    for (int b : batches) {
      for (int c : contexts) {
        if (formats.find("int2") != std::string::npos)
          kvstrata::kernels::RunInt2(shape, b, c, iters, sms);
        if (formats.find("codec") != std::string::npos)
          kvstrata::kernels::RunCodec(shape, b, c, iters, sms,
                                      shape.head_dim == 64 ? codec64 : codec128);
        if (formats.find("fragment") != std::string::npos)
          kvstrata::kernels::RunCodec(shape, b, c, iters, sms,
                                      UniformLevels(shape.head_dim == 64 ? codec64 : codec128),
                                      /*fragment=*/true);
        if (formats.find("bf16") != std::string::npos)
          kvstrata::kernels::RunBf16(shape, b, c, iters, sms, budget_gb * 1e9);
      }
    }
  }
  return 0;
}

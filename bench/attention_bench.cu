// Decode-attention benchmark on the GPU: kvstrata's split INT2 attention (sink 64 BF16 + INT2
// history + recent >= 256 BF16) for a Qwen3-8B-shaped layer (32 query / 8 KV heads, head_dim
// 128), with distinct pages for all 36 layers so the data cannot sit in L2, plus the append and
// demotion kernels' cost per decode step and the device's copy bandwidth. One JSON object per
// line on stdout. Synthetic data (random codes and scales); the kernels do not depend on values.
//
//   kvstrata_bench_attention [--contexts 8192,32768,...] [--batches 1,8,32] [--iters N]

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/bits.h"
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

double CopyBandwidth() {
  const size_t bytes = size_t{4} << 30;
  void *a, *b;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  cudaEventRecord(e0);
  for (int i = 0; i < 5; ++i) CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes * 5 / (ms * 1e-3);  // read + write
}

__global__ void FillBf16(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    p[i] = static_cast<uint16_t>(0x3c00 | (x & 0x7f)) ^ ((x >> 8) & 1 ? 0x8000 : 0);  // +-(1..2)
  }
}

void Run(int batch, int context, int iters, int sms) {
  const int layers = 36, kv_heads = 8, q_heads = 32, d = 128;
  const KvGeometry g{layers, kv_heads, d, d, 64};
  const SplitLayout layout;
  const SplitSegments seg = SegmentsAt(layout, context);
  const int hist_pages = static_cast<int>(seg.history / 64);
  const int recent_pages = static_cast<int>((seg.recent + 63) / 64);
  const int64_t int2_stride = PageBytes(g, PageEncoding::kInt2Uniform);
  const int64_t bf16_stride = PageBytes(g, PageEncoding::kBf16);
  uint8_t *int2_pool, *bf16_pool;
  CHECK_CUDA(cudaMalloc(&int2_pool, int64_t{batch} * hist_pages * int2_stride + 256));
  CHECK_CUDA(cudaMalloc(&bf16_pool, int64_t{batch} * (1 + recent_pages) * bf16_stride));
  CHECK_CUDA(FillRandomInt2Pages(int2_pool, int2_stride, batch * hist_pages, g, 7, nullptr));
  FillBf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(bf16_pool),
                          int64_t{batch} * (1 + recent_pages) * bf16_stride / 2, 3);
  // Page tables; pages of a sequence in a shuffled slot order, as a pool would give them.
  std::vector<int32_t> hist_indptr{0}, hist_idx, sink_indptr{0}, sink_idx, rec_indptr{0}, rec_idx;
  std::vector<int32_t> sink_last(batch, 64), hist_last(batch, 64), rec_last(batch);
  for (int b = 0; b < batch; ++b) {
    for (int p = 0; p < hist_pages; ++p)
      hist_idx.push_back(
          static_cast<int32_t>((int64_t{p} * batch + b) % (int64_t{batch} * hist_pages)));
    hist_indptr.push_back(static_cast<int32_t>(hist_idx.size()));
    sink_idx.push_back(b * (1 + recent_pages));
    sink_indptr.push_back(static_cast<int32_t>(sink_idx.size()));
    for (int p = 0; p < recent_pages; ++p) rec_idx.push_back(b * (1 + recent_pages) + 1 + p);
    rec_indptr.push_back(static_cast<int32_t>(rec_idx.size()));
    rec_last[b] = static_cast<int32_t>(seg.recent - 64 * (recent_pages - 1));
  }
  auto upload = [](const std::vector<int32_t>& v) {
    int32_t* p;
    CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(1, v.size()) * 4));
    CHECK_CUDA(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return p;
  };
  SplitDecodeCudaParams p;
  uint16_t* q;
  float *out, *lse;
  CHECK_CUDA(cudaMalloc(&q, int64_t{batch} * q_heads * d * 2));
  FillBf16<<<64, 256>>>(q, int64_t{batch} * q_heads * d, 11);
  CHECK_CUDA(cudaMalloc(&out, int64_t{batch} * q_heads * d * 4));
  CHECK_CUDA(cudaMalloc(&lse, int64_t{batch} * q_heads * 4));
  p.q = q;
  p.batch = batch;
  p.num_q_heads = q_heads;
  p.sm_scale = 1.0f / std::sqrt(128.0f);
  p.geometry = g;
  p.segments[0] = {bf16_pool,        bf16_stride,       upload(sink_indptr),
                   upload(sink_idx), upload(sink_last), PageEncoding::kBf16};
  p.segments[1] = {int2_pool,        int2_stride,       upload(hist_indptr),
                   upload(hist_idx), upload(hist_last), PageEncoding::kInt2Uniform};
  p.segments[2] = {bf16_pool,       bf16_stride,      upload(rec_indptr),
                   upload(rec_idx), upload(rec_last), PageEncoding::kBf16};
  p.out = out;
  p.lse = lse;
  const SplitDecodePlan plan =
      PlanSplitDecode(batch, kv_heads, d, hist_pages, 1 + recent_pages, sms,
                                               SplitDecodeCtasPerSm(d));
  void* ws;
  CHECK_CUDA(cudaMalloc(&ws, plan.workspace_bytes));

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  // One graph: the 36 layers' attention, as a decode step issues them.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int l = 0; l < layers; ++l) {
    p.layer = l;
    CHECK_CUDA(LaunchSplitDecode(p, plan, ws, stream));
  }
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  CHECK_CUDA(cudaGraphLaunch(exec, stream));  // warm-up
  CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, stream);
  for (int i = 0; i < iters; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  cudaEventRecord(e1, stream);
  CHECK_CUDA(cudaEventSynchronize(e1));
  float ms;
  cudaEventElapsedTime(&ms, e0, e1);
  const double us_per_layer = ms * 1e3 / (iters * layers);
  // The same with empty windows: the INT2 history kernel and the merge alone.
  double history_us = 0;
  {
    const std::vector<int32_t> zeros(batch + 1, 0);
    SplitDecodeCudaParams h = p;
    h.segments[0].indptr = upload(zeros);
    h.segments[2].indptr = upload(zeros);
    const SplitDecodePlan hplan = PlanSplitDecode(batch, kv_heads, d, hist_pages, 0, sms,
                                                SplitDecodeCtasPerSm(d));
    cudaGraph_t hg;
    cudaGraphExec_t hexec;
    CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int l = 0; l < layers; ++l) {
      h.layer = l;
      CHECK_CUDA(LaunchSplitDecode(h, hplan, ws, stream));
    }
    CHECK_CUDA(cudaStreamEndCapture(stream, &hg));
    CHECK_CUDA(cudaGraphInstantiate(&hexec, hg, 0));
    CHECK_CUDA(cudaGraphLaunch(hexec, stream));
    cudaEventRecord(e0, stream);
    for (int i = 0; i < iters; ++i) CHECK_CUDA(cudaGraphLaunch(hexec, stream));
    cudaEventRecord(e1, stream);
    CHECK_CUDA(cudaEventSynchronize(e1));
    float hms;
    cudaEventElapsedTime(&hms, e0, e1);
    history_us = hms * 1e3 / (iters * layers);
    cudaGraphExecDestroy(hexec);
    cudaGraphDestroy(hg);
  }
  // Bytes one layer's attention must read: INT2 codes + scales of the history, BF16 windows.
  const double hist_bytes = static_cast<double>(batch) * hist_pages * 2 * kv_heads *
                            BlockBytes(g, PageEncoding::kInt2Uniform);
  const double window_bytes =
      static_cast<double>(batch) * (seg.sink + seg.recent) * 2 * kv_heads * d * 2;
  const double bytes = hist_bytes + window_bytes + static_cast<double>(batch) * q_heads * d * 2;
  const double bf16_bytes = static_cast<double>(batch) * context * 2 * kv_heads * d * 2;

  // Append cost per decode step: every sequence's new token, all layers, one launch; and the
  // demotion of one page per sequence every 64 steps.
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
  ap.slot = upload(slot);
  ap.row = upload(row);
  ap.bf16_pool = bf16_pool;
  ap.slot_stride = bf16_stride;
  ap.geometry = g;
  DemoteParams dp;
  dp.bf16_pool = bf16_pool;
  dp.bf16_stride = bf16_stride;
  dp.int2_pool = int2_pool;
  dp.int2_stride = int2_stride;
  std::vector<int32_t> src(batch), dst(batch);
  for (int b = 0; b < batch; ++b) src[b] = b * (1 + recent_pages) + 1, dst[b] = b;
  dp.src_slot = upload(src);
  dp.dst_slot = upload(dst);
  dp.num_pages = batch;
  dp.geometry = g;
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
      "{\"kernel\": \"kvstrata-int2-split\", \"batch\": %d, \"context\": %d, \"us_per_layer\": "
      "%.2f, "
      "\"bytes_per_layer\": %.0f, \"tb_per_s\": %.3f, \"bf16_equivalent_bytes\": %.0f, \"splits\": "
      "%d, "
      "\"pages_per_split\": %d, \"append_us_per_step\": %.2f, \"demote_us_per_page_batch\": %.2f, "
      "\"demote_us_per_step_amortised\": %.3f, \"history_only_us_per_layer\": %.2f, "
      "\"history_only_tb_per_s\": %.3f}\n",
      batch, context, us_per_layer, bytes, bytes / (us_per_layer * 1e-6) / 1e12, bf16_bytes,
      plan.splits, plan.pages_per_split, append_ms * 1e3 / 20, demote_ms * 1e3 / 5,
      demote_ms * 1e3 / 5 / 64, history_us, hist_bytes / (history_us * 1e-6) / 1e12);
  std::fflush(stdout);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(int2_pool);
  cudaFree(bf16_pool);
  cudaFree(ws);
  cudaFree(q);
  cudaFree(out);
  cudaFree(lse);
  cudaFree(knew);
  cudaFree(vnew);
  cudaFree(rot);
}

}  // namespace
}  // namespace kvstrata::kernels

int main(int argc, char** argv) {
  std::vector<int> contexts = {8192, 32768, 65536, 102400, 131072};
  std::vector<int> batches = {1, 8, 32};
  int iters = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--contexts"))
      contexts = kvstrata::kernels::ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batches"))
      batches = kvstrata::kernels::ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters"))
      iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "unknown flag %s\nusage: %s [--contexts a,b] [--batches a,b] [--iters N]\n",
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
              prop.name, sms, prop.l2CacheSize, kvstrata::kernels::CopyBandwidth() / 1e12);
  for (int b : batches)
    for (int c : contexts) kvstrata::kernels::Run(b, c, iters, sms);
  return 0;
}

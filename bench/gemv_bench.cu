// The decode matrix-vector kernel (kernels/cuda/gemv.h) on Qwen3-8B's four matrix shapes, each
// launch variant side by side in one run: a CUDA graph of `layers` (RMS norm -> GEMV) pairs on
// distinct weights (so nothing sits in L2), as a decode step chains them. Prints one JSON line
// per (shape, rows, variant): µs per GEMV and the weights' bytes over that time, beside the
// device's copy bandwidth measured in the same run.
//
//   kvstrata_bench_gemv [layers=24] [replays=20]

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/copy_bandwidth.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/model_ops.h"

namespace {

using kvstrata::kernels::GemmType;
using kvstrata::kernels::GemvVariant;

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kvstrata_bench_gemv: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 24;
  const int replays = argc > 2 ? std::atoi(argv[2]) : 20;
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const double copy = kvstrata::bench::CopyBandwidth();
  if (copy <= 0) Check(cudaErrorMemoryAllocation, "the copy bandwidth");
  std::fprintf(stderr, "%s: copy bandwidth %.2f TB/s\n", prop.name, copy / 1e12);
  struct Shape {
    const char* name;
    int out, in;
  } shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 24576, 4096},
                {"down", 4096, 12288}};
  struct Named {
    const char* name;
    GemvVariant v;
  } variants[] = {{"one warp per row", {false, false}},
                  {"one wave", {true, false}},
                  {"one wave, overlapping the kernel before", {true, true}},
                  {"overlapping the kernel before", {false, true}}};
  cudaStream_t stream;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (const Shape& s : shapes) {
    const size_t wbytes = size_t{2} * s.out * s.in;
    std::vector<void*> w(layers);
    for (void*& p : w) {
      Check(cudaMalloc(&p, wbytes), "cudaMalloc (weights)");
      Check(cudaMemset(p, 0x3c, wbytes), "cudaMemset");
    }
    float *x = nullptr, *norm = nullptr, *y = nullptr;
    void* xh = nullptr;
    Check(cudaMalloc(&x, size_t{4} * 4 * s.in), "cudaMalloc");
    Check(cudaMalloc(&norm, size_t{4} * s.in), "cudaMalloc");
    Check(cudaMalloc(&xh, size_t{2} * 4 * s.in), "cudaMalloc");
    Check(cudaMalloc(&y, size_t{4} * 4 * s.out), "cudaMalloc");
    Check(cudaMemset(x, 0, size_t{4} * 4 * s.in), "cudaMemset");
    Check(cudaMemset(norm, 0, size_t{4} * s.in), "cudaMemset");
    for (int rows : {1, 2, 4}) {
      for (const Named& n : variants) {
        cudaGraph_t g;
        Check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
        for (int l = 0; l < layers; ++l) {
          Check(kvstrata::kernels::RmsNormTo(x, s.in, rows, s.in, norm, 1e-6f, xh, GemmType::kBf16,
                                             stream),
                "RmsNormTo");
          Check(kvstrata::kernels::Gemv(xh, rows, s.in, w[l], s.out, y, false, GemmType::kBf16,
                                        stream, n.v),
                "Gemv");
        }
        Check(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
        cudaGraphExec_t exec;
        Check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
        Check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");  // warm-up
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0, stream);
        for (int r = 0; r < replays; ++r) Check(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
        cudaEventRecord(e1, stream);
        Check(cudaEventSynchronize(e1), "the replays");
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        const double us = ms * 1e3 / replays / layers;  // per (norm, GEMV) pair
        std::printf("{\"shape\": \"%s\", \"out\": %d, \"in\": %d, \"rows\": %d, \"variant\": \"%s\", "
                    "\"us_per_pair\": %.3f, \"weight_tb_per_s\": %.3f, \"of_copy\": %.3f, "
                    "\"copy_tb_per_s\": %.3f}\n",
                    s.name, s.out, s.in, rows, n.name, us, wbytes / (us * 1e-6) / 1e12,
                    wbytes / (us * 1e-6) / copy, copy / 1e12);
        std::fflush(stdout);
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(g);
      }
    }
    for (void* p : w) cudaFree(p);
    cudaFree(x);
    cudaFree(norm);
    cudaFree(xh);
    cudaFree(y);
  }
  return 0;
}

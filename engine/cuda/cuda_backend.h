#pragma once

// The forward pass on one GPU, behind the same Backend seam as the CPU one (engine/backend.h),
// with the CPU backend's math as its specification: weights in BF16, FP16 or fp32 on the device
// (GpuWeights), GEMMs through cuBLAS (fp32 accumulation and output), the residual
// stream in fp32, the KV cache in device page memory (engine/cuda/device_page_memory.h) written
// by the append and demotion kernels and read by the chunk attention (prefill, and every BF16
// attention) and split decode (INT2 decode) kernels of kernels/cuda/.
//
// Requests without top-k, top-p or min-p filters and top_logprobs have their tokens drawn on the
// GPU with the host sampler's arithmetic (engine/cuda/device_sampler.h); for the others the
// logits come back to the host's sampler. No allocation per step: every buffer is sized at
// creation for `max_step_tokens` tokens and `max_items` items.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/rotations.h"
#include "model/model.h"

namespace kvstrata::engine {

struct CudaBackendOptions {
  int device = 0;
  // The type of the weights and of the GEMM activations (EngineOptions::gpu_weights).
  GpuWeights weights = GpuWeights::kAuto;
  int max_step_tokens = 512;  // tokens of one forward pass (SchedulerOptions::max_step_tokens)
  int max_items = 16;         // sequences of one forward pass (max_running plus prefills)
  // Decode steps as CUDA graphs, captured once per batch size (false: launched one by one).
  bool decode_graphs = true;
  // History buckets per batch size (EngineOptions::cuda_graph_history_buckets), >= 1.
  int graph_history_buckets = 16;
  // Tokens drawn on the GPU for the requests whose sampling allows it (EngineOptions::gpu_sampling).
  bool device_sampling = true;
  // Passes of 1..4 tokens multiply bf16/fp16 weights with kernels::Gemv instead of cuBLAS
  // (EngineOptions::gpu_gemv).
  bool small_batch_gemv = true;
  // The GEMV streams its weights while the kernel before it finishes (programmatic dependent
  // launch; EngineOptions::gpu_gemv_overlap).
  bool gemv_overlap = true;
  // The layers' RMS norms inside the GEMVs after them, SwiGLU inside gate/up's
  // (EngineOptions::gpu_gemv_fused_norm).
  bool gemv_fused_norm = true;
  // Those GEMVs in one wave of CTAs (EngineOptions::gpu_gemv_normed_one_wave).
  bool gemv_normed_one_wave = true;
  // Their warps stream two rows at once at 2 tokens (EngineOptions::gpu_gemv_normed_paired_rows).
  bool gemv_normed_paired_rows = true;
  // One GEMM for q, k and v and one for gate and up, and the launches between them merged
  // (EngineOptions::gpu_fused_layer_ops).
  bool fused_layer_ops = true;
  // The INT2 history kernel's quick start (EngineOptions::gpu_int2_quick_start).
  bool int2_quick_start = true;
  // Each page's slot read one request ahead (EngineOptions::gpu_int2_slots_ahead).
  bool int2_slots_ahead = true;
  // The small kernels and attention launched early (EngineOptions::gpu_early_launches).
  bool early_launches = true;
  // Window pages per CTA of attention's launch, 0: the plan's choice
  // (EngineOptions::gpu_window_pages_per_cta).
  int window_pages_per_cta = 0;
  // Attention's merge loads its partials early (EngineOptions::gpu_merge_early_loads).
  bool merge_early_loads = true;
  // The INT2 keys' product on integer tensor cores in long page ranges
  // (EngineOptions::gpu_int2_int8_keys).
  bool int2_int8_keys = true;
  // Decode steps write the cache in fewer launches (EngineOptions::gpu_fused_kv_writes).
  bool fused_kv_writes = true;
  // In decode passes of one sequence, the per-head launch, attention's INT2 history and its merge
  // let the launch after them begin at their start (EngineOptions::gpu_launch_ahead_at_batch_1).
  bool launch_ahead_at_batch_1 = true;
};

// What a device is, for logs: "cuda:0 (NVIDIA H200, 139 GiB, compute 9.0)"; Unavailable when there
// is none (no driver, no device, or the index is out of range), naming what is missing.
absl::StatusOr<std::string> DescribeCudaDevice(int device);

// `model`, `rotations` and `cache` must outlive the backend; the cache must live in device page
// memory on options.device. Errors name the CUDA call and the device; an out-of-memory names
// the weights' size.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const model::LoadedModel& model,
                                                           const RotationSet& rotations,
                                                           KvCache* cache,
                                                           const CudaBackendOptions& options);

}  // namespace kvstrata::engine

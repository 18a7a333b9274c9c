#pragma once

// The element-wise and small per-head operations of the forward pass on the GPU (the GEMMs are
// cuBLAS's). Each has its CPU specification in engine/cpu_backend.cc, which the GPU tests compare
// against: the residual stream stays fp32 as there, and GEMM operands are stored in the weights'
// type (BF16, FP16, or fp32 as on the CPU).
//
// Shapes in brackets; every pointer is device memory; every launcher returns the launch error.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

// The type GEMM operands (weights and the activations multiplied by them) are stored in.
enum class GemmType { kBf16, kFp16, kFp32 };
inline int GemmTypeBytes(GemmType t) { return t == GemmType::kFp32 ? 4 : 2; }

// out fp32 [tokens][hidden] = table (of `type`) [vocab][hidden] rows of ids [tokens]. Ids outside
// [0, vocab) give zero rows (the caller validates ids first).
cudaError_t EmbeddingGather(const void* table, GemmType type, int vocab, int hidden,
                            const int32_t* ids, int tokens, float* out, cudaStream_t stream);

// y [rows][dim] (of `type`) = x / rms(x) · weight, x fp32 [rows][dim] (row stride x_stride
// floats), weight fp32 [dim]. The mean of squares is accumulated in fp32.
cudaError_t RmsNormTo(const float* x, int64_t x_stride, int rows, int dim, const float* weight,
                      float eps, void* y, GemmType type, cudaStream_t stream);

// In place on fp32 rows [rows][dim]: x = x / rms(x) · weight (Qwen3's q/k norm per head).
cudaError_t RmsNormInPlace(float* x, int rows, int dim, const float* weight, float eps,
                           cudaStream_t stream);

// y fp32 [rows][cols] += bias fp32 [cols].
cudaError_t AddBias(float* y, int rows, int cols, const float* bias, cudaStream_t stream);

// cos, sin fp32 [tokens][head_dim / 2] of angle position · theta^(-2i / head_dim), computed in
// double as the CPU does, from positions [tokens].
cudaError_t RopeTables(const int32_t* positions, int tokens, int head_dim, float theta,
                       float* cos, float* sin, cudaStream_t stream);

// In place RoPE on x fp32 [tokens][heads][head_dim] with the tables above. interleaved: pairs
// (2i, 2i + 1) (GGUF llama); otherwise (i, i + head_dim / 2) (Hugging Face).
cudaError_t ApplyRope(float* x, int tokens, int heads, int head_dim, const float* cos,
                      const float* sin, bool interleaved, cudaStream_t stream);

// out [rows][cols] (of `type`) = silu(gate) · up, gate and up fp32 [rows][cols] with rows
// `in_stride` floats apart (cols when apart; 2 · cols for one GEMM's [gate | up] rows).
cudaError_t SwiGluTo(const float* gate, const float* up, int64_t rows, int cols,
                     int64_t in_stride, void* out, GemmType type, cudaStream_t stream);

// The attention inputs of one GEMM's output qkv fp32 [tokens][(q_heads + 2 kv_heads) head_dim]
// (the q, k and v projections side by side, as [wq; wk; wv] gives them), in one launch: per
// head, + bias, then (q and k) RMS norm with q_norm / k_norm, then (q and k) RoPE as ApplyRope;
// written to q [tokens][q_heads][head_dim] and k, v [tokens][kv_heads][head_dim]. Each step is
// skipped where its weights are null. The arithmetic of AddBias, RmsNormInPlace and ApplyRope,
// in the same order, so the result is theirs. head_dim 64, 128 or 256.
struct QkvHeadsParams {
  const float* qkv = nullptr;
  int tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  const float* bq = nullptr;  // [q_heads · head_dim], or null
  const float* bk = nullptr;  // [kv_heads · head_dim], or null
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // [head_dim], or null: no q/k norm
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  const float* cos = nullptr;  // RopeTables' [tokens][head_dim / 2]
  const float* sin = nullptr;
  bool interleaved = false;
  float* q = nullptr;
  float* k = nullptr;
  float* v = nullptr;
  // A decode step's next two launches folded in. With bf16_pool set, the K and V rows go into
  // their BF16 pages as AppendRotatedRows writes them with identity rotations (kernels/cuda/
  // append.h: slot and row per token, the pool offset to the layer, geometry of one layer)
  // instead of k and v; with q_bf16 set, the q rows go there in BF16 [tokens][q_heads ·
  // head_dim] (the split decode's queries, as GatherRowsTo writes them with rows 0..tokens-1)
  // instead of q.
  uint8_t* bf16_pool = nullptr;
  int64_t slot_stride = 0;
  const int32_t* slot = nullptr;  // [tokens]
  const int32_t* row = nullptr;   // [tokens]
  KvGeometry geometry;
  uint16_t* q_bf16 = nullptr;
  // Launched as a programmatic dependent of the kernel before it (kernels/cuda/launch.cuh): the
  // launch overlaps that kernel's end; the kernel waits for it before touching memory.
  bool overlap_previous = false;
  // The launch after this one (attention, launched as its programmatic dependent) may begin
  // before this kernel waits for the one before, so its CTAs take the multiprocessors the
  // q/k/v GEMV leaves as it ends and ask for their first pages then; false: once it has waited.
  bool dependents_at_start = false;
};
// cudaErrorInvalidValue for one of q_norm / k_norm without the other, a head_dim other than
// 64, 128 or 256, or bf16_pool without slot and row.
cudaError_t SplitQkvHeads(const QkvHeadsParams& p, cudaStream_t stream);

// out [n] (of `type`: a rounding, or a copy for fp32) = in fp32 [n].
cudaError_t ConvertFloat(const float* in, int64_t n, void* out, GemmType type,
                         cudaStream_t stream);

// out [rows][heads][d] = in [rows][heads][d] · R_(h / group) (or · R_(h / group)ᵀ when
// transpose), R fp32 [heads / group][d][d]. In fp32; out may not alias in. Rows are the
// tokens; q heads map to their KV head's rotation with group = q heads per KV head.
cudaError_t RotateHeads(const float* in, int rows, int heads, int head_dim, const float* R,
                        int group, bool transpose, float* out, cudaStream_t stream);
// The same, written in `type` (the rotation back from value space straight into a GEMM operand).
cudaError_t RotateHeadsTo(const float* in, int rows, int heads, int head_dim, const float* R,
                          int group, bool transpose, void* out, GemmType type,
                          cudaStream_t stream);

// out fp32 [rows][cols] = in fp32 rows `row_ids` [rows] of a [*][cols] matrix.
cudaError_t GatherRows(const float* in, int cols, const int32_t* row_ids, int rows, float* out,
                       cudaStream_t stream);
// The same, written in `type`.
// overlap_previous: launched as a programmatic dependent of the kernel before it
// (kernels/cuda/launch.cuh; it waits for that kernel before touching memory, and only then lets
// the kernel after it start, so a split decode launched early after it reads final pages).
cudaError_t GatherRowsTo(const float* in, int cols, const int32_t* row_ids, int rows, void* out,
                         GemmType type, cudaStream_t stream, bool overlap_previous = false);

// out fp32 rows `row_ids` [rows] of a [*][cols] matrix = in fp32 [rows][cols].
cudaError_t ScatterRows(const float* in, int cols, const int32_t* row_ids, int rows, float* out,
                        cudaStream_t stream);
// The same, written in `type`.
// overlap_previous as for GatherRowsTo.
cudaError_t ScatterRowsTo(const float* in, int cols, const int32_t* row_ids, int rows, void* out,
                          GemmType type, cudaStream_t stream, bool overlap_previous = false);

}  // namespace kvstrata::kernels

#pragma once

// The write side of the cache on the GPU, CPU reference beside each (kernels/quant.h,
// kernels/rotation.h):
//  * AppendRotatedRows: new tokens' K and V rows, for every layer and KV head of a batch of
//    sequences in one launch, rotated (k·R_K, v·R_V) and written in BF16 into their pages;
//  * DemotePages: whole BF16 pages that the recent window has left, clipped, quantised and
//    packed into INT2 pages (all layers and heads of each page in one launch), from their BF16
//    values exactly as EncodeInt2Block does on the CPU;
//  * DemoteCodecPages: the same for the codec format's history (one layer a launch: its blocks'
//    layout is the layer's), byte for byte as EncodeCodecBlock, or for codec fragment blocks as
//    EncodeCodecFragmentBlock.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

struct AppendParams {
  // device bf16 [num_layers][num_tokens][num_kv_heads][head_dim], after RoPE, unrotated
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  // Or the same rows in fp32 (the engine's, so the values are rounded once, after rotation, as
  // on the CPU); used instead of k and v when set.
  const float* k_f32 = nullptr;
  const float* v_f32 = nullptr;
  int num_tokens = 0;
  // device fp32 [num_layers][num_kv_heads][head_dim][head_dim]; null = identity
  const float* k_rotation = nullptr;
  const float* v_rotation = nullptr;
  // device [num_tokens]: the BF16 pool slot and the row (position % 64) each token goes to
  const int32_t* slot = nullptr;
  const int32_t* row = nullptr;
  uint8_t* bf16_pool = nullptr;
  int64_t slot_stride = 0;
  KvGeometry geometry;
  // Launched as a programmatic dependent of the kernel before it (kernels/cuda/launch.cuh): the
  // launch overlaps that kernel's end; the kernel waits for it before touching memory.
  bool overlap_previous = false;
};
cudaError_t AppendRotatedRows(const AppendParams& params, cudaStream_t stream);

struct DemoteParams {
  const uint8_t* bf16_pool = nullptr;
  int64_t bf16_stride = 0;
  uint8_t* int2_pool = nullptr;
  int64_t int2_stride = 0;
  const int32_t* src_slot = nullptr;  // device [num_pages]
  const int32_t* dst_slot = nullptr;  // device [num_pages]
  int num_pages = 0;
  // When set, only the first *num_pages_device of the num_pages are demoted (the count lives on
  // the device, so a captured CUDA graph can demote a different number each replay).
  const int32_t* num_pages_device = nullptr;
  // device fp32 [num_layers][2][num_kv_heads] clip ratios in (0, 1]; null = 1 (no clipping)
  const float* clip = nullptr;
  KvGeometry geometry;  // group_size == head_dim, uniform levels
  bool overlap_previous = false;  // as AppendParams::overlap_previous
};
cudaError_t DemotePages(const DemoteParams& params, cudaStream_t stream);

struct DemoteCodecParams {
  const uint8_t* bf16_pool = nullptr;  // offset to the layer, as DemoteParams::bf16_pool
  int64_t bf16_stride = 0;
  uint8_t* history_pool = nullptr;  // slot s's page starts at history_pool + s * history_stride
  int64_t history_stride = 0;
  const int32_t* src_slot = nullptr;  // device [num_pages]
  const int32_t* dst_slot = nullptr;  // device [num_pages]
  int num_pages = 0;
  const int32_t* num_pages_device = nullptr;  // as DemoteParams::num_pages_device
  KvGeometry geometry;     // num_layers 1 (the layer the pools are offset to), page_tokens 64
  CodecLayerLayout codec;  // that layer's blocks (CodecLayerLayoutFor; codec::GpuLayoutOk)
  // Codec fragment blocks (kernels/codec_fragment.h; `codec` from CodecFragmentLayerLayoutFor,
  // regions in whole steps of 16 channels) on the uniform levels `fragment_levels`
  // [bits][code] (GaussianUniformLevels(bits), as the host computes them: the codes match the
  // CPU's bit for bit). SetCodecFragmentLevels fills them.
  bool fragment = false;
  float fragment_levels[5][16] = {};
  bool overlap_previous = false;
};
// params->fragment = true, and the uniform levels in params->fragment_levels.
void SetCodecFragmentLevels(DemoteCodecParams* params);
// cudaErrorInvalidValue for a layout the kernels do not take or a head_dim other than 64/128.
cudaError_t DemoteCodecPages(const DemoteCodecParams& params, cudaStream_t stream);

}  // namespace kvstrata::kernels

#pragma once

// Split decode attention on the GPU (docs/kv-format.md §5): per sequence and KV head, the INT2
// history is cut into page ranges processed in parallel on tensor cores (flash-decoding), the
// BF16 sink and recent window pages get a partial per run of them (extra CTAs of the same
// launch), and a merge kernel combines every partial (o, lse) exactly. A BF16 history segment (the
// BF16 cache format) is split the same way and attended on bf16 tensor cores: the BF16 baseline the
// INT2 format is measured against. A codec history (the codec format) is decoded page by page into
// fp16 rows in shared memory and attended as those pages are. CPU reference:
// SplitDecodeAttentionRef (kernels/attention_ref.h; the codec's test decodes with
// DecodeCodecBlock).
//
// Plan on the host (PlanSplitDecode), then LaunchSplitDecode allocates nothing, so a decode
// step can be captured in a CUDA graph.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

struct SplitDecodeCudaParams {
  const uint16_t* q = nullptr;  // device bf16 [batch][num_q_heads][head_dim], rotated by R_K
  int batch = 0;
  int num_q_heads = 0;  // num_kv_heads * G with G <= 8
  int layer = 0;
  float sm_scale = 0.0f;
  KvGeometry geometry;  // INT2: group_size == head_dim, page_tokens == 64
  // sink (BF16), history (INT2 uniform levels, BF16 or codec, full pages), recent (BF16);
  // device pointers.
  PagedSegmentView segments[3];
  // A codec history (PageEncoding::kCodec): where this layer's K and V blocks lie in a page and
  // how they are coded (CodecLayerLayoutFor); every region's channels a multiple of 8. A codec
  // fragment history (PageEncoding::kCodecFragment): CodecFragmentLayerLayoutFor's.
  CodecLayerLayout codec;
  float* out = nullptr;  // device [batch][num_q_heads][head_dim], rotated value space
  float* lse = nullptr;  // device [batch][num_q_heads] natural log, or null
  // Or, when out_rows is set, the output rounded to bf16 (fp16 when out_rows_fp16) into row
  // out_row_ids[b] (b when null) of out_rows [*][num_q_heads][head_dim]: a GEMM's operand
  // written by the merge itself, with no row scatter after the launch; out is then unused.
  uint16_t* out_rows = nullptr;
  const int32_t* out_row_ids = nullptr;
  bool out_rows_fp16 = false;
};

// Which kernels a launch uses. The defaults are the fastest; the others are kept so that the
// benchmark can measure what each step bought, side by side in one run
// (docs/benchmarks/attention.md).
struct SplitDecodeVariant {
  bool bf16_tensor_cores = true;  // BF16 pages (window, BF16 history) on mma; else fp32 math
  bool fuse_window = true;        // window pages as extra CTAs of the history launch when they
                                  // are few (batch x KV heads x window pages <= a quarter of a
                                  // wave; needs bf16_tensor_cores); else a launch of their own
  bool parallel_merge = true;     // the merge spreads each row's partials over a CTA's threads
  int bf16_max_pages_per_split = 64;  // BF16 history: ranges of at most this many pages (0: any)
  // INT2 history: a page's scores computed before the previous page's softmax and V product.
  // Measured on one H200: 6-10 % faster for head_dim 64 at batch 1, slower elsewhere (spills at
  // head_dim 128, 3 CTAs per multiprocessor instead of 4 at head_dim 64), so off by default.
  bool int2_overlap_pages = false;
  // INT2 history: each warp reads the slot of the page it will ask for next as soon as it has
  // asked for one, rather than reading the page table when it asks (two dependent reads the
  // whole warp waits for, once a page). Measured on one H200: 1-6 % faster per layer at 31 of 32
  // points (both shapes, batch 1-32, 8K-128K); the same results.
  bool int2_slots_ahead = true;
  // INT2 history, groups of at most 4 query heads (both model shapes here), page ranges of at
  // least this many pages: every head in two of the tensor-core product's 8 columns, so each
  // lane's softmax, scale and probability work covers half of a 16-token tile's rows instead of
  // all of them for heads half of which do not exist; the two halves' sums meet once, at the end
  // of the range. Measured on one H200: 7 % fewer instructions, 0-7 % faster per layer from 4
  // pages a warp on, 0.95-1.00x below (docs/benchmarks/attention.md, round 8). 0: any range;
  // a number above any range: never.
  int int2_split_rows_min_pages = 16;
  // INT2 history, page ranges of at least this many pages: the keys' product on integer tensor
  // cores, four codes a logic op where fp16 pairs take two (kernels/cuda/split_decode_int2.cuh),
  // Q as two 8-bit integers (within about 2^-15 of its largest value, where fp16 keeps 11 bits of
  // each). Measured on one H200 (docs/benchmarks/attention.md, round 10): 4-10 % faster per
  // layer at batch 8-32 from 32K and 3 % at batch 1 / 128K (43 pages a range), the same at 21
  // pages and 4 % slower at 12, whose few pages a warp do not repay the longer start (Q's
  // integer fragments). 0: any range; a number above any range: never (fp16 pairs).
  int int2_int8_keys_min_pages = 32;
  // For benchmarks only: the INT2 history kernel streams its pages through its stages and does
  // no math, so the output is wrong (empty history partials). What the page reads alone cost.
  bool int2_bandwidth_probe = false;
  // INT2 history: one page per warp in the launch's first burst of copies (the second once the
  // queries are in), the queries read in 16-byte loads and summed by shuffles. Measured on one
  // H200 (docs/benchmarks/attention.md): 7-14 % faster per layer at batch 1 for the 8B shape, 3-8 %
  // for head_dim 64, unchanged at batch 32 from 32K.
  bool int2_quick_start = true;
  // The end of a history or window CTA: its warps' weights computed once per head, then float4
  // sums (false: an exponent and a division per output channel).
  bool combine_head_weights = true;
  // The history launch is a programmatic dependent of the kernel before it: its INT2 CTAs fill
  // their page stages (the BF16 history CTAs their first pages) before that kernel has
  // finished, then wait for it before reading the queries or writing the workspace; the window
  // CTAs wait first. The merge is likewise launched while the history finishes. The caller
  // guarantees that the kernel just before writes no page this launch reads (in the engine it
  // is the query gather; the pages were written by launches before that one).
  bool early_launch = false;
  // With early_launch, the INT2 history kernel lets the merge launch at its start, and the merge
  // the kernel after it, rather than once their pages (partials) are done: those launches' CTAs
  // then take the multiprocessors the ones before leave as they end, and a GEMV after the merge
  // asks for its first weights then (launch.cuh: each still waits for the kernel before's end).
  // Measured end to end (docs/benchmarks/engine-gpu.md): faster at batch 1, slower at 2.
  bool dependents_at_start = false;
  // Codec history (kernels/cuda/split_decode_codec.cuh): per page, each region's levels times
  // its page ratio go into tables once, rows are decoded by lookups alone, and the rows' scales
  // multiply the scores and the probabilities (false: every value scaled in fp32 as decoded).
  bool codec_page_tables = true;
  // Window pages (the sink's, then the recent window's) per CTA of the history launch, when they
  // run in it. 0: the plan chooses; for an INT2 or a BF16 history as many as keep a window CTA
  // within the history CTAs' time, so that the window takes fewer of the wave's places and the
  // history more, shorter ranges (INT2: 5-11 % off a batch-1/2 layer of the 8B shape from 100K
  // on one H200); for a codec history one. n: n pages per CTA (1: a CTA per page, as before).
  int window_pages_per_cta = 0;
  // The parallel merge loads its first 16 slots of partial outputs per thread as soon as the
  // partials are there, beside the slots' lse, instead of after the slots' weights: one round
  // trip to L2 on the merge's path where there were four. The same sums in the same order.
  bool merge_early_loads = true;
};

struct SplitDecodePlan {
  int window_pages = 1;  // BF16 pages (sink + recent) per sequence the plan covers
  int splits = 1;        // history page ranges per (sequence, KV head)
  int pages_per_split = 1;
  int64_t workspace_bytes = 0;
  SplitDecodeVariant variant;
  bool fused_window = false;  // the window pages run as CTAs of the history launch
  // Window pages per window CTA (consecutive: the sink's pages, then the recent window's), and
  // so the window's partials per (sequence, KV head): ceil(window_pages / window_pages_per_cta).
  int window_pages_per_cta = 1;
  int window_slots = 1;
};

// max_history_pages / max_window_pages: the most INT2 pages, and the most BF16 pages (sink plus
// recent), any sequence of the batch has (or will have while the plan is reused). num_sms: the
// device's multiprocessor count.
// ctas_per_sm: SplitDecodeCtasPerSm(head_dim, history encoding) on the device that will run it.
SplitDecodePlan PlanSplitDecode(int batch, int num_kv_heads, int head_dim, int max_history_pages,
                                int max_window_pages, int num_sms, int ctas_per_sm,
                                PageEncoding history = PageEncoding::kInt2Uniform,
                                const SplitDecodeVariant& variant = {});

// How many history-kernel CTAs fit on one multiprocessor (a device query on the current device;
// 1 on failure), for an INT2 (uniform), a BF16 or a codec history.
int SplitDecodeCtasPerSm(int head_dim, PageEncoding history = PageEncoding::kInt2Uniform,
                         const SplitDecodeVariant& variant = {});

// Whether the split decode (and the codec demotion and chunk attention) kernels take a codec
// layer's layout: every region's channels a multiple of 8, each side's block within the
// kernels' shared-memory stage, and Σ 4^bits over a side's regions (its page tables) at most
// 512: one 4-bit region with 3-bit and narrower ones beside it, as every P2 recipe.
bool SplitDecodeTakesCodec(const CodecLayerLayout& layout, int head_dim);
// Whether split decode takes a codec fragment layer's layout (CodecFragmentLayerLayoutFor,
// kernels/codec_fragment.h): head_dim 64 or 128, every region whole steps of 16 channels.
bool SplitDecodeTakesCodecFragment(const CodecLayerLayout& layout, int head_dim);

// cudaErrorInvalidValue for unsupported shapes (head_dim other than 64/128, GQA group above 8,
// INT2 history with group_size != head_dim or Lloyd-Max levels, a codec layout the kernel does
// not take: codec::GpuLayoutOk). `workspace` holds plan.workspace_bytes.
cudaError_t LaunchSplitDecode(const SplitDecodeCudaParams& params, const SplitDecodePlan& plan,
                              void* workspace, cudaStream_t stream);

// Fills `num_pages` INT2 page bodies (all layers and heads) with random codes and sane fp16
// scale/offset, for benchmarks. Headers are left untouched.
cudaError_t FillRandomInt2Pages(uint8_t* pool, int64_t slot_stride, int num_pages,
                                const KvGeometry& geometry, uint32_t seed, cudaStream_t stream);

}  // namespace kvstrata::kernels

#pragma once

// Exact storage accounting: which tokens of a sequence sit in which segment of the split
// layout, and bits per element of every format, counting scales, offsets, norms, full-precision
// windows and page headers. docs/kv-format.md, "Bits per element", gives the formulas.

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

// Sink | INT2 history | recent window. sink_tokens is a multiple of page_tokens; the recent
// window holds the last >= recent_tokens tokens and demotes to INT2 one whole page at a time.
struct SplitLayout {
  int sink_tokens = 64;
  int recent_tokens = 256;
  int page_tokens = 64;
};

struct SplitSegments {
  int64_t sink = 0;     // tokens [0, sink)
  int64_t history = 0;  // tokens [sink, sink + history), INT2
  int64_t recent = 0;   // the rest, BF16
};

// The segments seen by a query that sees tokens 0..n-1 (n >= 0). The history ends at
// max(sink, page_tokens * floor(max(0, n - recent_tokens) / page_tokens)), clamped to n.
// Prefill uses this per query position, decode per step: that is the exactness principle.
SplitSegments SegmentsAt(const SplitLayout& layout, int64_t n);

// Bytes of KV data of one sequence of n tokens in the split format, all layers, heads, K and V:
// BF16 sink and recent tokens, INT2 codes + fp16 (scale, offset) per group for history tokens,
// and one page header per page touched (ceil(n / page_tokens) pages).
int64_t SplitSequenceBytes(const SplitLayout& layout, const KvGeometry& g, int64_t n);

// SplitSequenceBytes * 8 / (n * elements per token), elements per token = layers*2*heads*dim.
double SplitBitsPerElement(const SplitLayout& layout, const KvGeometry& g, int64_t n);

// The INT2 history alone: 2 + 32 / group_size.
double Int2HistoryBitsPerElement(int group_size);

// The baselines of kernels/baselines.h, per element, averaged over a sequence of n tokens
// (page headers are not counted: the baselines have no page format).
double Fp8E4M3BitsPerElement(int head_dim);      // 8 + 16 / head_dim
double Int4BitsPerElement(int group_size);       // 4 + 32 / group
double NaiveInt2BitsPerElement(int group_size);  // 2 + 32 / group
double Turbo3BitsPerElement(int head_dim);       // 3 + 16 / head_dim
// KIVI-2: quantised tokens at 2 + 32 / group bits (K per channel over token groups, V per
// token over channel groups, same group size), the residual at 16 bits.
double Kivi2BitsPerElement(int64_t n, int group, int residual);

}  // namespace kvstrata::kernels

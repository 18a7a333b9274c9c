#include "kernels/bits.h"

#include <algorithm>

#include "kernels/baselines.h"

namespace kvstrata::kernels {

SplitSegments SegmentsAt(const SplitLayout& layout, int64_t n) {
  SplitSegments s;
  if (n <= 0) return s;
  const int64_t p = layout.page_tokens;
  const int64_t history_end = std::max<int64_t>(
      layout.sink_tokens, p * (std::max<int64_t>(0, n - layout.recent_tokens) / p));
  s.sink = std::min<int64_t>(n, layout.sink_tokens);
  s.history = std::max<int64_t>(0, std::min(n, history_end) - s.sink);
  s.recent = n - s.sink - s.history;
  return s;
}

int64_t SplitSequenceBytes(const SplitLayout& layout, const KvGeometry& g, int64_t n) {
  const SplitSegments s = SegmentsAt(layout, n);
  const int64_t rows_per_token = NumBlocks(g);  // one row per (layer, K|V, kv head)
  const int64_t bf16_row = int64_t{g.head_dim} * 2;
  const int64_t int2_row = Int2CodeBytesPerToken(g) + Int2GroupsPerToken(g) * 4;
  const int64_t pages = (n + layout.page_tokens - 1) / layout.page_tokens;
  return rows_per_token * ((s.sink + s.recent) * bf16_row + s.history * int2_row) +
         pages * kPageHeaderBytes;
}

double SplitBitsPerElement(const SplitLayout& layout, const KvGeometry& g, int64_t n) {
  if (n <= 0) return 0.0;
  const double elements = static_cast<double>(n) * NumBlocks(g) * g.head_dim;
  return SplitSequenceBytes(layout, g, n) * 8.0 / elements;
}

double Int2HistoryBitsPerElement(int group_size) { return 2.0 + 32.0 / group_size; }
double Fp8E4M3BitsPerElement(int head_dim) { return 8.0 + 16.0 / head_dim; }
double Int4BitsPerElement(int group_size) { return 4.0 + 32.0 / group_size; }
double NaiveInt2BitsPerElement(int group_size) { return 2.0 + 32.0 / group_size; }
double Turbo3BitsPerElement(int head_dim) { return 3.0 + 16.0 / head_dim; }

double Kivi2BitsPerElement(int64_t n, int group, int residual) {
  if (n <= 0) return 0.0;
  const int64_t q = Kivi2QuantizedTokens(n, group, residual);
  return (q * (2.0 + 32.0 / group) + (n - q) * 16.0) / n;
}

}  // namespace kvstrata::kernels

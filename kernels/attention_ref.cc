#include "kernels/attention_ref.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/quant.h"

namespace kvstrata::kernels {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace

const char* ValidateSplitDecode(const SplitDecodeParams& p) {
  const KvGeometry& g = p.geometry;
  if (g.head_dim != 64 && g.head_dim != 128) return "unsupported head_dim (64 or 128)";
  if (g.num_kv_heads <= 0) return "num_kv_heads must be positive";
  if (p.num_q_heads <= 0 || p.num_q_heads % g.num_kv_heads != 0) {
    return "num_q_heads must be a positive multiple of num_kv_heads";
  }
  if (g.page_tokens <= 0) return "page_tokens must be positive";
  if (p.layer < 0 || p.layer >= g.num_layers) return "layer out of range";
  if (p.batch < 0) return "batch must be >= 0";
  if (!p.q || !p.out || !p.lse) return "q, out and lse are required";
  for (const PagedSegmentView& s : p.segments) {
    if (IsInt2(s.encoding) && (g.group_size < 16 || g.group_size > g.head_dim ||
                               g.head_dim % g.group_size != 0 || g.group_size % 16 != 0)) {
      return "unsupported group_size (a multiple of 16 dividing head_dim)";
    }
    if (!s.indptr) return "segment indptr is required";
    if (s.slot_stride < PageBytes(g, s.encoding))
      return "segment slot_stride is below the page size";
  }
  return nullptr;
}

void PartialAttentionRef(const float* q, const KvGeometry& g, const PagedSegmentView& segment,
                         int b, int layer, int kv_head, float sm_scale, float* o, float* lse) {
  const int d = g.head_dim;
  const int pages = segment.num_pages(b);
  std::vector<float> k(int64_t{g.page_tokens} * d), v(int64_t{g.page_tokens} * d);
  std::vector<double> acc(d, 0.0);
  double max_score = -std::numeric_limits<double>::infinity();
  double denom = 0.0;
  for (int page = 0; page < pages; ++page) {
    const int tokens = page + 1 == pages ? segment.last_page_len[b] : g.page_tokens;
    const uint8_t* kb = segment.block(g, b, page, layer, /*kind=*/0, kv_head);
    const uint8_t* vb = segment.block(g, b, page, layer, /*kind=*/1, kv_head);
    if (IsInt2(segment.encoding)) {
      DecodeInt2Block(kb, tokens, g, segment.encoding, /*kind=*/0, k.data());
      DecodeInt2Block(vb, tokens, g, segment.encoding, /*kind=*/1, v.data());
    } else {
      DecodeBf16Block(kb, tokens, g, k.data());
      DecodeBf16Block(vb, tokens, g, v.data());
    }
    for (int t = 0; t < tokens; ++t) {
      double s = 0.0;
      for (int i = 0; i < d; ++i) s += double{q[i]} * k[int64_t{t} * d + i];
      s *= sm_scale;
      // online softmax in double: rescale the running sums when the maximum grows
      if (s > max_score) {
        const double c = std::exp(max_score - s);
        for (double& a : acc) a *= c;
        denom *= c;
        max_score = s;
      }
      const double w = std::exp(s - max_score);
      denom += w;
      for (int i = 0; i < d; ++i) acc[i] += w * v[int64_t{t} * d + i];
    }
  }
  if (denom == 0.0) {
    for (int i = 0; i < d; ++i) o[i] = 0.0f;
    *lse = kNegInf;
    return;
  }
  for (int i = 0; i < d; ++i) o[i] = static_cast<float>(acc[i] / denom);
  *lse = static_cast<float>(max_score + std::log(denom));
}

void MergeAttentionStates(const float* o_a, float lse_a, const float* o_b, float lse_b, int d,
                          float* o, float* lse) {
  if (lse_a == kNegInf && lse_b == kNegInf) {
    for (int i = 0; i < d; ++i) o[i] = 0.0f;
    *lse = kNegInf;
    return;
  }
  const double m = std::max(lse_a, lse_b);
  const double wa = std::exp(double{lse_a} - m), wb = std::exp(double{lse_b} - m);
  const double total = wa + wb;
  for (int i = 0; i < d; ++i) o[i] = static_cast<float>((wa * o_a[i] + wb * o_b[i]) / total);
  *lse = static_cast<float>(m + std::log(total));
}

void SplitDecodeAttentionRef(const SplitDecodeParams& p) {
  const KvGeometry& g = p.geometry;
  const int d = g.head_dim;
  const int group = p.num_q_heads / g.num_kv_heads;
  std::vector<float> o(d), part(d);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.num_q_heads; ++h) {
      const float* q = p.q + (int64_t{b} * p.num_q_heads + h) * d;
      float lse = kNegInf;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int s = 0; s < kNumSplitSegments; ++s) {
        float part_lse;
        PartialAttentionRef(q, g, p.segments[s], b, p.layer, h / group, p.sm_scale, part.data(),
                            &part_lse);
        const int64_t row = (int64_t{s} * p.batch + b) * p.num_q_heads + h;
        if (p.partial_out) std::copy(part.begin(), part.end(), p.partial_out + row * d);
        if (p.partial_lse) p.partial_lse[row] = part_lse;
        MergeAttentionStates(o.data(), lse, part.data(), part_lse, d, o.data(), &lse);
      }
      std::copy(o.begin(), o.end(), p.out + (int64_t{b} * p.num_q_heads + h) * d);
      p.lse[int64_t{b} * p.num_q_heads + h] = lse;
    }
  }
}

}  // namespace kvstrata::kernels

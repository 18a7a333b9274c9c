#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/impl.h"
#include "kernels/quant.h"

namespace kvstrata::kernels::cpu {

void InitAttentionState(int rows, const AttentionState& st) {
  const int d = st.head_dim;
  std::fill(st.m, st.m + rows, -std::numeric_limits<float>::infinity());
  std::fill(st.l, st.l + rows, 0.0f);
  std::fill(st.acc, st.acc + int64_t{rows} * d, 0.0f);
  std::fill(st.lanes_used, st.lanes_used + rows, 0);  // lanes are zeroed when first used
}

void AttendBlock(CpuIsa isa, const KvGeometry& g, const KvBlockPair& block, const QueryRows& q,
                 const AttentionState& state) {
  if (q.rows <= 0) return;
  switch (isa) {
    case CpuIsa::kPortable:
      return portable::AttendBlock(g, block, q, state);
    case CpuIsa::kAvx2:
#if KVSTRATA_CPU_X86
      return avx2::AttendBlock(g, block, q, state);
#endif
    case CpuIsa::kAvx512:
#if KVSTRATA_CPU_X86
      return avx512::AttendBlock(g, block, q, state);
#endif
      break;
  }
  return portable::AttendBlock(g, block, q, state);
}

void FinishAttentionState(CpuIsa isa, const KvGeometry& g, int rows, const AttentionState& state) {
  switch (isa) {
    case CpuIsa::kPortable:
      return portable::FinishAttentionState(g, rows, state);
    case CpuIsa::kAvx2:
#if KVSTRATA_CPU_X86
      return avx2::FinishAttentionState(g, rows, state);
#endif
    case CpuIsa::kAvx512:
#if KVSTRATA_CPU_X86
      return avx512::FinishAttentionState(g, rows, state);
#endif
      break;
  }
  return portable::FinishAttentionState(g, rows, state);
}

void ExpInPlace(CpuIsa isa, float* x, int n) {
  switch (isa) {
    case CpuIsa::kPortable:
      return portable::ExpInPlace(x, n);
    case CpuIsa::kAvx2:
#if KVSTRATA_CPU_X86
      return avx2::ExpInPlace(x, n);
#endif
    case CpuIsa::kAvx512:
#if KVSTRATA_CPU_X86
      return avx512::ExpInPlace(x, n);
#endif
      break;
  }
  return portable::ExpInPlace(x, n);
}

float ScoreBias(const KvBlockPair& b, const QueryRows& q, int r, int t) {
  const float* f = q.bias_features + int64_t{r} * b.bias_terms;
  const float* c = b.score_bias + int64_t{t} * b.bias_terms;
  float sum = 0.0f;
  for (int j = 0; j < b.bias_terms; ++j) sum += f[j] * c[j];
  return sum;
}

void AttendBlocksRef(const KvGeometry& g, const KvBlockPair* blocks, int num_blocks, const float* q,
                     int rows, const int* visible, float scale, float* out,
                     const float* bias_features) {
  const int d = g.head_dim;
  std::vector<float> k(64 * static_cast<size_t>(d)), v(k.size());
  std::vector<std::vector<float>> keys(num_blocks), values(num_blocks);
  for (int b = 0; b < num_blocks; ++b) {
    const KvBlockPair& blk = blocks[b];
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<float>& rows_out = kind == 0 ? keys[b] : values[b];
      rows_out.assign(static_cast<size_t>(blk.num_tokens) * d, 0.0f);
      const uint8_t* src = kind == 0 ? blk.k : blk.v;
      switch (blk.format) {
        case BlockFormat::kBf16:
          DecodeBf16Block(src, blk.num_tokens, g, rows_out.data());
          break;
        case BlockFormat::kInt2Uniform:
          DecodeInt2Block(src, blk.num_tokens, g, PageEncoding::kInt2Uniform, kind,
                          rows_out.data());
          break;
        case BlockFormat::kInt2LloydMax:
          DecodeInt2Block(src, blk.num_tokens, g, PageEncoding::kInt2LloydMax, kind,
                          rows_out.data());
          break;
        case BlockFormat::kF32:
          std::memcpy(rows_out.data(), src, rows_out.size() * sizeof(float));
          break;
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    std::vector<double> s;
    std::vector<const float*> vrows;
    for (int b = 0; b < num_blocks; ++b) {
      const int seen = std::min(visible[r * num_blocks + b], blocks[b].num_tokens);
      for (int t = 0; t < seen; ++t) {
        double dot = 0.0;
        for (int c = 0; c < d; ++c) dot += double{q[r * d + c]} * keys[b][t * d + c];
        double bias = 0.0;
        if (blocks[b].score_bias != nullptr && bias_features != nullptr) {
          for (int j = 0; j < blocks[b].bias_terms; ++j) {
            bias += double{bias_features[r * blocks[b].bias_terms + j]} *
                    blocks[b].score_bias[t * blocks[b].bias_terms + j];
          }
        }
        s.push_back(dot * scale + bias);
        vrows.push_back(values[b].data() + int64_t{t} * d);
      }
    }
    const double mx = s.empty() ? 0.0 : *std::max_element(s.begin(), s.end());
    double sum = 0.0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int c = 0; c < d; ++c) {
      double o = 0.0;
      for (size_t i = 0; i < s.size(); ++i) o += s[i] * vrows[i][c];
      out[r * d + c] = s.empty() ? 0.0f : static_cast<float>(o / sum);
    }
  }
}

}  // namespace kvstrata::kernels::cpu

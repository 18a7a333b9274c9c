#pragma once

// The statistics OSCAR's rotations and clip ratios are fitted from, accumulated from the
// post-RoPE queries, keys and values of real sequences (research/oscar.md §1):
//
//   keys:   C_K = Σ_t Σ_j q_tj q_tjᵀ over the query heads j sharing the KV head (QᵀQ)
//   values: C_V = VᵀSᵀSV = Σ_t Σ_j o_tj o_tjᵀ, o_tj = Σ_s S_j[t][s] v_s, where S_j is the real
//           causal softmax of query head j (so C_V is the second moment of the attention
//           outputs, the directions through which a value error reaches the output)
//   proxy:  OSCAR's released code: Σ_s w_s v_s v_sᵀ with w_s = k_sᵀ C_h k_s (the mean squared
//           raw logit of key s over the sequence's queries, no softmax, no mask), w normalised
//           to mean 1 per sequence
//
// and the errors the clip ratios are searched against, with the split layout's semantics (a
// query at position t sees the keys of pages its recent window has left in INT2, the rest in
// BF16): attention-logit error for keys, attention-output error for values.
//
// Plain arrays, row-major; float64 accumulators. Thread-compatible.

#include <cstdint>
#include <vector>

#include "kernels/bits.h"
#include "kernels/kv_layout.h"

namespace kvstrata::calibration {

// Statistics of one (layer, KV head); every matrix [d][d] row-major.
struct HeadStats {
  std::vector<double> query_cov;    // Σ q qᵀ
  std::vector<double> value_cov;    // VᵀSᵀSV
  std::vector<double> value_proxy;  // OSCAR's proxy
  int64_t query_rows = 0;           // rows summed into query_cov (tokens × query heads)
  int64_t tokens = 0;               // tokens summed into the value statistics
};

// Adds one sequence's layer to per_head [num_kv_heads]: q [n][num_heads][d] and k, v
// [n][num_kv_heads][d] at positions 0..n-1, post-RoPE, unrotated. Query head h attends with
// KV head h / (num_heads / num_kv_heads), scores q·k · sm_scale, causal.
void AccumulateHeadStats(const float* q, const float* k, const float* v, int n, int num_heads,
                         int num_kv_heads, int d, float sm_scale, std::vector<HeadStats>* per_head);

// probs [rows][n] = causal softmax(q_rows · kᵀ · sm_scale): row r is query position
// positions[r] and sees keys 0..positions[r]. q rows and k rows are d floats at the given
// strides. Float math, float64 row sums.
void CausalSoftmax(const float* q, int64_t q_stride, const int* positions, int rows, const float* k,
                   int64_t k_stride, int n, int d, float sm_scale, float* probs);

// Clip ratio candidates for groups of `group` channels: ratio r picks the order statistic at
// index floor(r·group) (kernels/quant.h), so the candidates are (i + 0.5) / group for
// i = 5·group/8 .. group - 2 (clipping the largest group - i - 1 magnitudes), then 1 (none).
std::vector<float> ClipRatioCandidates(int group);

// The squared error of storing rows through the INT2 quantiser at each candidate ratio.
// `rows` [n][d] are rotated and already rounded as the cache holds them before demotion (BF16).
//   keys:   errors[c] += Σ_p Σ_{s in page p} Δk_sᵀ · weight_p · Δk_s, i.e. the attention-logit
//           error Σ (q·Δk)² summed over the queries that see page p in INT2 when
//           weight_p = Σ_{those queries} q qᵀ (rotated space, [d][d]). Pages are 64 rows;
//           weights [num_pages][d][d], a page with an all-zero weight is skipped.
//   values: errors[c] += ‖S ΔV‖²_F with S [rows][n] the attention probabilities restricted to
//           the keys each query sees in INT2 (zero elsewhere), i.e. the attention-output error.
void AccumulateKeyClipErrors(const float* rows, int n, int d, int group,
                             kernels::PageEncoding encoding, const std::vector<double>& weights,
                             const std::vector<float>& ratios, std::vector<double>* errors);
void AccumulateValueClipErrors(const float* probs, int prob_rows, const float* rows, int n, int d,
                               int group, kernels::PageEncoding encoding,
                               const std::vector<float>& ratios, std::vector<double>* errors);

// Quantise-dequantise rows [n][d] through the INT2 row quantiser (kernels/quant.h).
void QuantizeDequantizeRows(const float* rows, int64_t n, int d, int group, float ratio,
                            kernels::PageEncoding encoding, float* out);

}  // namespace kvstrata::calibration

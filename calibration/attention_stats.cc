#include "calibration/attention_stats.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/quant.h"

namespace kvstrata::calibration {

namespace {

// out [d][d] (float64) += xᵀx for x [m][d] (float), through a float GEMM.
void AddGram(const float* x, int m, int d, std::vector<double>* out, std::vector<float>* tmp) {
  if (m == 0) return;
  tmp->resize(static_cast<size_t>(d) * d);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, m, 1.0f, x, d, x, d, 0.0f, tmp->data(),
              d);
  out->resize(static_cast<size_t>(d) * d, 0.0);
  for (size_t i = 0; i < tmp->size(); ++i) (*out)[i] += (*tmp)[i];
}

}  // namespace

void CausalSoftmax(const float* q, int64_t q_stride, const int* positions, int rows, const float* k,
                   int64_t k_stride, int n, int d, float sm_scale, float* probs) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, n, d, sm_scale, q,
              static_cast<int>(q_stride), k, static_cast<int>(k_stride), 0.0f, probs, n);
  for (int r = 0; r < rows; ++r) {
    float* p = probs + static_cast<int64_t>(r) * n;
    const int visible = std::min(n, positions[r] + 1);
    float m = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < visible; ++s) m = std::max(m, p[s]);
    double z = 0.0;
    for (int s = 0; s < visible; ++s) z += (p[s] = std::exp(p[s] - m));
    const float inv = static_cast<float>(1.0 / z);
    for (int s = 0; s < visible; ++s) p[s] *= inv;
    for (int s = visible; s < n; ++s) p[s] = 0.0f;
  }
}

void AccumulateHeadStats(const float* q, const float* k, const float* v, int n, int num_heads,
                         int num_kv_heads, int d, float sm_scale,
                         std::vector<HeadStats>* per_head) {
  const int g = num_heads / num_kv_heads;
  per_head->resize(num_kv_heads);
  std::vector<float> qg(static_cast<size_t>(n) * g * d), kh(static_cast<size_t>(n) * d),
      vh(kh.size()), probs(static_cast<size_t>(n) * n), out(kh.size()), tmp;
  std::vector<int> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = t;
  for (int h = 0; h < num_kv_heads; ++h) {
    HeadStats& st = (*per_head)[h];
    for (std::vector<double>* m : {&st.query_cov, &st.value_cov, &st.value_proxy}) {
      m->resize(static_cast<size_t>(d) * d, 0.0);
    }
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < g; ++j) {
        std::copy_n(q + (static_cast<int64_t>(t) * num_heads + h * g + j) * d, d,
                    qg.data() + (static_cast<int64_t>(t) * g + j) * d);
      }
      std::copy_n(k + (static_cast<int64_t>(t) * num_kv_heads + h) * d, d,
                  kh.data() + static_cast<int64_t>(t) * d);
      std::copy_n(v + (static_cast<int64_t>(t) * num_kv_heads + h) * d, d,
                  vh.data() + static_cast<int64_t>(t) * d);
    }
    // Keys: the query covariance of the group (this sequence's share also feeds the proxy).
    std::vector<double> window_cov(static_cast<size_t>(d) * d, 0.0);
    AddGram(qg.data(), n * g, d, &window_cov, &tmp);
    for (size_t i = 0; i < window_cov.size(); ++i) st.query_cov[i] += window_cov[i];
    st.query_rows += static_cast<int64_t>(n) * g;
    // Values: VᵀSᵀSV summed over the group's query heads, S the causal softmax.
    for (int j = 0; j < g; ++j) {
      CausalSoftmax(qg.data() + static_cast<int64_t>(j) * d, static_cast<int64_t>(g) * d,
                    positions.data(), n, kh.data(), d, n, d, sm_scale, probs.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, n, 1.0f, probs.data(), n,
                  vh.data(), d, 0.0f, out.data(), d);
      AddGram(out.data(), n, d, &st.value_cov, &tmp);
    }
    // OSCAR's proxy: w_s = k_sᵀ C k_s with C = this sequence's query covariance / (n·g), then
    // normalised to mean 1; Σ w_s v_s v_sᵀ = (√w ⊙ V)ᵀ(√w ⊙ V).
    std::vector<double> w(n);
    double w_sum = 0.0;
    for (int s = 0; s < n; ++s) {
      const float* ks = kh.data() + static_cast<int64_t>(s) * d;
      double acc = 0.0;
      for (int a = 0; a < d; ++a) {
        double row = 0.0;
        for (int b = 0; b < d; ++b) row += window_cov[static_cast<int64_t>(a) * d + b] * ks[b];
        acc += ks[a] * row;
      }
      w[s] = std::max(0.0, acc / (static_cast<double>(n) * g));
      w_sum += w[s];
    }
    const double w_mean = w_sum / n;
    for (int s = 0; s < n; ++s) {
      const float scale = w_mean > 0 ? static_cast<float>(std::sqrt(w[s] / w_mean)) : 1.0f;
      for (int c = 0; c < d; ++c) {
        out[static_cast<int64_t>(s) * d + c] = vh[static_cast<int64_t>(s) * d + c] * scale;
      }
    }
    AddGram(out.data(), n, d, &st.value_proxy, &tmp);
    st.tokens += n;
  }
}

std::vector<float> ClipRatioCandidates(int group) {
  std::vector<float> ratios;
  for (int i = 5 * group / 8; i <= group - 2; ++i) {
    ratios.push_back((static_cast<float>(i) + 0.5f) / static_cast<float>(group));
  }
  ratios.push_back(1.0f);
  return ratios;
}

void QuantizeDequantizeRows(const float* rows, int64_t n, int d, int group, float ratio,
                            kernels::PageEncoding encoding, float* out) {
  std::vector<uint8_t> codes(d);
  std::vector<uint16_t> params(2 * (d / group));
  for (int64_t t = 0; t < n; ++t) {
    kernels::QuantizeRowInt2(rows + t * d, d, group, ratio, encoding, codes.data(), params.data());
    kernels::DequantizeRowInt2(codes.data(), params.data(), d, group, encoding, out + t * d);
  }
}

void AccumulateKeyClipErrors(const float* rows, int n, int d, int group,
                             kernels::PageEncoding encoding, const std::vector<double>& weights,
                             const std::vector<float>& ratios, std::vector<double>* errors) {
  constexpr int kPage = 64;
  errors->resize(ratios.size(), 0.0);
  const int pages = static_cast<int>(weights.size() / (static_cast<size_t>(d) * d));
  std::vector<float> deq(static_cast<size_t>(kPage) * d);
  std::vector<double> diff(d);
  for (int p = 0; p < pages && p * kPage < n; ++p) {
    const double* w = weights.data() + static_cast<int64_t>(p) * d * d;
    if (std::all_of(w, w + static_cast<int64_t>(d) * d, [](double x) { return x == 0.0; })) {
      continue;
    }
    const int rows_in_page = std::min(kPage, n - p * kPage);
    const float* page_rows = rows + static_cast<int64_t>(p) * kPage * d;
    for (size_t c = 0; c < ratios.size(); ++c) {
      QuantizeDequantizeRows(page_rows, rows_in_page, d, group, ratios[c], encoding, deq.data());
      double e = 0.0;
      for (int r = 0; r < rows_in_page; ++r) {
        for (int i = 0; i < d; ++i) {
          diff[i] = double{deq[static_cast<int64_t>(r) * d + i]} - page_rows[r * d + i];
        }
        for (int a = 0; a < d; ++a) {
          if (diff[a] == 0.0) continue;
          double row = 0.0;
          for (int b = 0; b < d; ++b) row += w[static_cast<int64_t>(a) * d + b] * diff[b];
          e += diff[a] * row;
        }
      }
      (*errors)[c] += e;
    }
  }
}

void AccumulateValueClipErrors(const float* probs, int prob_rows, const float* rows, int n, int d,
                               int group, kernels::PageEncoding encoding,
                               const std::vector<float>& ratios, std::vector<double>* errors) {
  errors->resize(ratios.size(), 0.0);
  if (prob_rows == 0 || n == 0) return;
  std::vector<float> delta(static_cast<size_t>(n) * d), out(static_cast<size_t>(prob_rows) * d);
  for (size_t c = 0; c < ratios.size(); ++c) {
    QuantizeDequantizeRows(rows, n, d, group, ratios[c], encoding, delta.data());
    for (size_t i = 0; i < delta.size(); ++i) delta[i] -= rows[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, prob_rows, d, n, 1.0f, probs, n,
                delta.data(), d, 0.0f, out.data(), d);
    double e = 0.0;
    for (float x : out) e += double{x} * x;
    (*errors)[c] += e;
  }
}

}  // namespace kvstrata::calibration

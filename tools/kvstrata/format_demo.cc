// kvstrata format-demo: the KV formats side by side on synthetic keys and values shaped like a
// real model's (low-rank structure, a few outlier channels, RoPE), for decode-time attention
// of many queries over one long context. It prints exact bits per element and the errors the
// fidelity evaluation measures on real models (docs/fidelity.md): K and V relative MSE,
// attention-score KL divergence and attention-output relative error.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "calibration/rotation_fit.h"
#include "core/page_format.h"
#include "kernels/baselines.h"
#include "kernels/bits.h"
#include "kernels/numeric.h"
#include "kernels/rotation.h"
#include "tools/kvstrata/commands.h"

ABSL_FLAG(int, context, 4096, "tokens of context the queries attend to (>= 1)");
ABSL_FLAG(int, head_dim, 128, "head dimension: 64 or 128");
ABSL_FLAG(int, queries, 256, "decode queries evaluated (and as many for calibration)");
ABSL_FLAG(float, key_clip, 0.96f, "clip ratio for keys in the OSCAR formats, in (0, 1]");
ABSL_FLAG(float, value_clip, 0.92f, "clip ratio for values in the OSCAR formats, in (0, 1]");
ABSL_FLAG(uint32_t, seed, 1,
          "random seed (format-demo: the synthetic data; generate: sampling, when temperature > 0)");

namespace kvstrata::cli {
namespace {

using Matrix = std::vector<float>;  // row-major [rows][d]

struct Synthetic {
  int d = 0;
  int n = 0;
  Matrix keys, values;   // [n][d], post-RoPE keys
  Matrix eval_queries;   // [q][d], at the last position
  Matrix calib_queries;  // [q][d], at random positions
  std::vector<int> calib_positions;
  float sm_scale = 0.0f;
};

void ApplyRope(float* x, int d, int pos) {
  for (int i = 0; i < d / 2; ++i) {
    const double theta = std::pow(10000.0, -2.0 * i / d) * pos;
    const double c = std::cos(theta), s = std::sin(theta);
    const double a = x[i], b = x[i + d / 2];
    x[i] = static_cast<float>(a * c - b * s);
    x[i + d / 2] = static_cast<float>(a * s + b * c);
  }
}

// Rows mean + scale ⊙ (B·w) + noise, w ~ N(0, I_rank): low rank with uneven channel scales.
class RowModel {
 public:
  RowModel(int d, int rank, double scale_sigma, std::vector<int> outliers, std::mt19937& rng)
      : d_(d), rank_(rank), mean_(d, 0.0), scale_(d), basis_(d * rank) {
    std::normal_distribution<double> normal;
    for (int i = 0; i < d; ++i) scale_[i] = std::exp(scale_sigma * normal(rng));
    for (int i : outliers) scale_[i] *= 8.0, mean_[i] = 6.0 * scale_[i];
    for (auto& b : basis_) b = normal(rng) / std::sqrt(static_cast<double>(rank));
  }
  void Sample(std::mt19937& rng, float* out) const {
    std::normal_distribution<double> normal;
    std::vector<double> w(rank_);
    for (auto& v : w) v = normal(rng);
    for (int i = 0; i < d_; ++i) {
      double acc = 0;
      for (int r = 0; r < rank_; ++r) acc += basis_[i * rank_ + r] * w[r];
      out[i] = static_cast<float>(mean_[i] + scale_[i] * (acc + 0.3 * normal(rng)));
    }
  }

 private:
  int d_, rank_;
  std::vector<double> mean_, scale_, basis_;
};

Synthetic MakeData(int n, int d, int num_queries, uint32_t seed) {
  std::mt19937 rng(seed);
  Synthetic s;
  s.d = d;
  s.n = n;
  const RowModel key_model(d, 16, 0.6, {3, d / 2 + 3}, rng);
  const RowModel query_model(d, 16, 0.6, {3, d / 2 + 3}, rng);
  const RowModel value_model(d, 24, 0.4, {d / 4}, rng);
  s.keys.resize(int64_t{n} * d);
  s.values.resize(int64_t{n} * d);
  for (int t = 0; t < n; ++t) {
    key_model.Sample(rng, &s.keys[int64_t{t} * d]);
    ApplyRope(&s.keys[int64_t{t} * d], d, t);
    value_model.Sample(rng, &s.values[int64_t{t} * d]);
  }
  s.eval_queries.resize(int64_t{num_queries} * d);
  s.calib_queries.resize(int64_t{num_queries} * d);
  std::uniform_int_distribution<int> pos(0, n - 1);
  for (int q = 0; q < num_queries; ++q) {
    query_model.Sample(rng, &s.eval_queries[int64_t{q} * d]);
    ApplyRope(&s.eval_queries[int64_t{q} * d], d, n - 1);
    s.calib_positions.push_back(pos(rng));
    query_model.Sample(rng, &s.calib_queries[int64_t{q} * d]);
    ApplyRope(&s.calib_queries[int64_t{q} * d], d, s.calib_positions.back());
  }
  // Scale queries so logits spread like a trained model's (std about 2.5): attention neither
  // uniform nor one-hot.
  double sum = 0, sum_sq = 0;
  int64_t count = 0;
  for (int q = 0; q < num_queries; ++q) {
    for (int t = 0; t < n; t += std::max(1, n / 512)) {
      double dot = 0;
      for (int i = 0; i < d; ++i)
        dot += s.eval_queries[int64_t{q} * d + i] * s.keys[int64_t{t} * d + i];
      sum += dot, sum_sq += dot * dot, ++count;
    }
  }
  const double sd = std::sqrt(std::max(1e-12, sum_sq / count - (sum / count) * (sum / count)));
  s.sm_scale = static_cast<float>(2.5 / sd);
  return s;
}

// softmax(q·Kᵀ·scale) over the first n rows, float64.
void Softmax(const float* q, const Matrix& k, int n, int d, double scale, std::vector<double>* p) {
  p->resize(n);
  double m = -1e300;
  for (int t = 0; t < n; ++t) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += double{q[i]} * k[int64_t{t} * d + i];
    (*p)[t] = dot * scale;
    m = std::max(m, (*p)[t]);
  }
  double z = 0;
  for (int t = 0; t < n; ++t) z += ((*p)[t] = std::exp((*p)[t] - m));
  for (int t = 0; t < n; ++t) (*p)[t] /= z;
}

struct Errors {
  double key_rel_mse = 0, value_rel_mse = 0, score_kl = 0, output_rel_err = 0;
};

double RelMse(const Matrix& x, const Matrix& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += x[i] * x[i];
  return num / den;
}

Errors Measure(const Synthetic& s, const Matrix& k_hat, const Matrix& v_hat) {
  Errors e;
  e.key_rel_mse = RelMse(s.keys, k_hat);
  e.value_rel_mse = RelMse(s.values, v_hat);
  const int nq = static_cast<int>(s.eval_queries.size()) / s.d;
  std::vector<double> p, p_hat;
  for (int q = 0; q < nq; ++q) {
    const float* qv = &s.eval_queries[int64_t{q} * s.d];
    Softmax(qv, s.keys, s.n, s.d, s.sm_scale, &p);
    Softmax(qv, k_hat, s.n, s.d, s.sm_scale, &p_hat);
    double kl = 0;
    std::vector<double> o(s.d, 0.0), o_hat(s.d, 0.0);
    for (int t = 0; t < s.n; ++t) {
      if (p[t] > 0) kl += p[t] * (std::log(p[t]) - std::log(std::max(p_hat[t], 1e-300)));
      for (int i = 0; i < s.d; ++i) {
        o[i] += p[t] * s.values[int64_t{t} * s.d + i];
        o_hat[i] += p_hat[t] * v_hat[int64_t{t} * s.d + i];
      }
    }
    double num = 0, den = 0;
    for (int i = 0; i < s.d; ++i) num += (o[i] - o_hat[i]) * (o[i] - o_hat[i]), den += o[i] * o[i];
    e.score_kl += kl / nq;
    e.output_rel_err += std::sqrt(num / den) / nq;
  }
  return e;
}

// Quantises rows [n][d] with `history` applied to the split format's INT2 history segment and
// BF16 for the sink and recent windows at context n.
Matrix WithWindows(const Matrix& x, int n, int d,
                   const std::function<void(const float*, int64_t, float*)>& history) {
  const kernels::SplitSegments seg = kernels::SegmentsAt(kernels::SplitLayout{}, n);
  Matrix y(x.size());
  kernels::FakeQuantBf16(x.data(), n, d, y.data());
  if (seg.history > 0) {
    history(x.data() + seg.sink * d, seg.history, y.data() + seg.sink * d);
  }
  return y;
}

struct Row {
  std::string name;
  double bits;
  Errors errors;
};

void PrintPageSizes() {
  struct Model {
    const char* name;
    kernels::KvGeometry g;
  };
  const Model models[] = {
      {"SmolLM2-135M (30 layers, 3 KV heads, dim 64)", {30, 3, 64, 64, 64}},
      {"Qwen3-8B (36 layers, 8 KV heads, dim 128)", {36, 8, 128, 128, 64}},
  };
  std::printf("\nPage sizes (64 tokens, every layer and KV head, K and V, 64-byte header):\n");
  for (const Model& m : models) {
    std::printf(
        "  %-46s BF16 %9lld B   INT2 %8lld B   (%.2fx smaller)\n", m.name,
        static_cast<long long>(kernels::PageBytes(m.g, kernels::PageEncoding::kBf16)),
        static_cast<long long>(kernels::PageBytes(m.g, kernels::PageEncoding::kInt2Uniform)),
        static_cast<double>(kernels::PageBytes(m.g, kernels::PageEncoding::kBf16)) /
            kernels::PageBytes(m.g, kernels::PageEncoding::kInt2Uniform));
  }
  std::printf(
      "\nExact bits per element of the split format (sink 64 + INT2 + recent >= 256, "
      "headers counted), Qwen3-8B shape:\n ");
  for (int64_t n : {1024, 8192, 32768, 102400, 131072}) {
    std::printf("  %lldK: %.4f", static_cast<long long>(n / 1024),
                kernels::SplitBitsPerElement(kernels::SplitLayout{}, models[1].g, n));
  }
  std::printf("\n");
}

// Encodes one INT2 page through the checked page format and parses it back: the path every
// page takes through the kvstore.
bool CheckPageRoundTrip(const Synthetic& s) {
  const kernels::KvGeometry g{1, 1, s.d, s.d, 64};
  std::vector<float> kv(2 * 64 * s.d);
  std::copy(s.keys.begin(), s.keys.begin() + 64 * s.d, kv.begin());
  std::copy(s.values.begin(), s.values.begin() + 64 * s.d, kv.begin() + 64 * s.d);
  absl::StatusOr<std::vector<uint8_t>> page =
      EncodePage({g, kernels::PageEncoding::kInt2Uniform, 1, PageKey{}, PageKey{}}, kv);
  if (!page.ok()) {
    std::fprintf(stderr, "format-demo: page encode failed: %s\n", page.status().ToString().c_str());
    return false;
  }
  absl::StatusOr<PageRef> ref = ParsePage(*page);
  if (!ref.ok()) {
    std::fprintf(stderr, "format-demo: page parse failed: %s\n", ref.status().ToString().c_str());
    return false;
  }
  std::printf("Page round trip: one INT2 page of this head, %zu bytes, parsed and validated.\n",
              page->size());
  return true;
}

}  // namespace

int RunFormatDemo();
KVSTRATA_COMMAND(format_demo, "format-demo",
                 "every KV format side by side on synthetic K/V with outlier channels: bits "
                 "per element and attention errors",
                 RunFormatDemo);

int RunFormatDemo() {
  const int n = absl::GetFlag(FLAGS_context);
  const int d = absl::GetFlag(FLAGS_head_dim);
  const int nq = absl::GetFlag(FLAGS_queries);
  const float key_clip = absl::GetFlag(FLAGS_key_clip);
  const float value_clip = absl::GetFlag(FLAGS_value_clip);
  if (n < 1 || n > (1 << 20)) {
    std::fprintf(stderr, "format-demo: --context=%d must be in 1..1048576\n", n);
    return 2;
  }
  if (d != 64 && d != 128) {
    std::fprintf(stderr, "format-demo: --head_dim=%d is unsupported (64 or 128)\n", d);
    return 2;
  }
  if (nq < 1 || nq > 4096) {
    std::fprintf(stderr, "format-demo: --queries=%d must be in 1..4096\n", nq);
    return 2;
  }
  if (!(key_clip > 0 && key_clip <= 1) || !(value_clip > 0 && value_clip <= 1)) {
    std::fprintf(stderr, "format-demo: --key_clip and --value_clip must be in (0, 1]\n");
    return 2;
  }

  std::printf(
      "kvstrata format-demo: one KV head, head_dim %d, %d-token context, %d decode "
      "queries (synthetic data: low-rank rows, outlier channels, RoPE)\n",
      d, n, nq);
  std::fflush(stdout);
  const Synthetic s = MakeData(n, d, nq, absl::GetFlag(FLAGS_seed));

  // OSCAR rotations: keys from the query covariance, values from the score-weighted value
  // covariance VᵀSᵀSV = Σ_q o_q o_qᵀ (o_q: attention outputs of calibration queries, causal).
  std::vector<double> cov_k, cov_v(int64_t{d} * d, 0.0);
  calibration::AccumulateCovariance(s.calib_queries.data(), nq, d, &cov_k);
  std::vector<double> p;
  std::vector<float> o(d);
  for (int q = 0; q < nq; ++q) {
    const int visible = s.calib_positions[q] + 1;
    Softmax(&s.calib_queries[int64_t{q} * d], s.keys, visible, d, s.sm_scale, &p);
    std::fill(o.begin(), o.end(), 0.0f);
    for (int t = 0; t < visible; ++t)
      for (int i = 0; i < d; ++i) o[i] += static_cast<float>(p[t] * s.values[int64_t{t} * d + i]);
    calibration::AccumulateCovariance(o.data(), 1, d, &cov_v);
  }
  const calibration::FittedRotation rk = calibration::FitRotation(cov_k, d);
  const calibration::FittedRotation rv = calibration::FitRotation(cov_v, d);
  std::vector<double> hd(int64_t{d} * d);
  kernels::HadamardMatrix(d, hd.data());
  std::vector<float> hadamard(hd.begin(), hd.end());

  const kernels::KvGeometry qwen{36, 8, d, d, 64};
  const double split_bits = kernels::SplitBitsPerElement(kernels::SplitLayout{}, qwen, n);
  const int64_t nn = n;
  std::vector<Row> rows;
  auto add = [&](std::string name, double bits, const Matrix& k, const Matrix& v) {
    rows.push_back({std::move(name), bits, Measure(s, k, v)});
    std::printf("  measured %s\n", rows.back().name.c_str());
    std::fflush(stdout);
  };
  Matrix k(s.keys.size()), v(s.values.size());

  kernels::FakeQuantBf16(s.keys.data(), nn, d, k.data());
  kernels::FakeQuantBf16(s.values.data(), nn, d, v.data());
  add("bf16", 16.0, k, v);
  kernels::FakeQuantFp8E4M3(s.keys.data(), nn, d, k.data());
  kernels::FakeQuantFp8E4M3(s.values.data(), nn, d, v.data());
  add("fp8-e4m3 (per-token scale)", kernels::Fp8E4M3BitsPerElement(d), k, v);
  kernels::FakeQuantInt4(s.keys.data(), nn, d, d, k.data());
  kernels::FakeQuantInt4(s.values.data(), nn, d, d, v.data());
  add("int4 (per-token)", kernels::Int4BitsPerElement(d), k, v);
  kernels::FakeQuantTurbo3(s.keys.data(), nn, d, 7, k.data());
  kernels::FakeQuantTurbo3(s.values.data(), nn, d, 8, v.data());
  add("turboquant-like 3-bit", kernels::Turbo3BitsPerElement(d), k, v);
  kernels::FakeQuantKivi2Keys(s.keys.data(), nn, d, 32, 128, k.data());
  kernels::FakeQuantKivi2Values(s.values.data(), nn, d, 32, 32, 128, v.data());
  add("kivi-2 (g32, residual 128)", kernels::Kivi2BitsPerElement(nn, 32, 128), k, v);

  auto naive = [&](const float* x, int64_t m, float* y) {
    kernels::FakeQuantNaiveInt2(x, m, d, d, y);
  };
  add("naive int2 + windows", split_bits, WithWindows(s.keys, n, d, naive),
      WithWindows(s.values, n, d, naive));
  auto rotated = [&](const std::vector<float>& r, float clip, kernels::PageEncoding e) {
    return [&r, clip, e, d](const float* x, int64_t m, float* y) {
      kernels::FakeQuantRotatedInt2(x, m, d, d, r.data(), clip, e, y);
    };
  };
  add("hadamard int2 + windows", split_bits,
      WithWindows(s.keys, n, d, rotated(hadamard, 1.0f, kernels::PageEncoding::kInt2Uniform)),
      WithWindows(s.values, n, d, rotated(hadamard, 1.0f, kernels::PageEncoding::kInt2Uniform)));
  add("oscar int2 (UHP rotation, clip) + windows", split_bits,
      WithWindows(s.keys, n, d,
                  rotated(rk.rotation, key_clip, kernels::PageEncoding::kInt2Uniform)),
      WithWindows(s.values, n, d,
                  rotated(rv.rotation, value_clip, kernels::PageEncoding::kInt2Uniform)));
  add("oscar int2 lloyd-max + windows", split_bits,
      WithWindows(s.keys, n, d, rotated(rk.rotation, 1.0f, kernels::PageEncoding::kInt2LloydMax)),
      WithWindows(s.values, n, d,
                  rotated(rv.rotation, 1.0f, kernels::PageEncoding::kInt2LloydMax)));

  std::printf("\n%-36s %9s %12s %12s %12s %12s\n", "format", "bits/elem", "K rel MSE", "V rel MSE",
              "score KL", "out rel err");
  for (const Row& r : rows) {
    std::printf("%-36s %9.4f %12.3e %12.3e %12.3e %12.3e\n", r.name.c_str(), r.bits,
                r.errors.key_rel_mse, r.errors.value_rel_mse, r.errors.score_kl,
                r.errors.output_rel_err);
  }
  std::printf(
      "\nbits/elem: exact for this context; the split formats count the BF16 sink and "
      "recent windows and page headers (Qwen3-8B shape).\n");
  PrintPageSizes();
  return CheckPageRoundTrip(s) ? 0 : 1;
}

}  // namespace kvstrata::cli

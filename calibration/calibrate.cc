#include "calibration/calibrate.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "calibration/attention_stats.h"
#include "calibration/fidelity_engine.h"
#include "calibration/rotation_fit.h"
#include "core/status_macros.h"
#include "kernels/numeric.h"
#include "kernels/rotation.h"

namespace kvstrata::calibration {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Step 1: the covariances of every (layer, KV head).
class StatsObserver final : public engine::ForwardObserver {
 public:
  StatsObserver(const model::ModelConfig& c, std::vector<std::vector<HeadStats>>* stats)
      : c_(c), stats_(stats), scale_(1.0f / std::sqrt(static_cast<float>(c.head_dim))) {}
  void OnQkv(int item, int layer, const float* q, const float* k, const float* v, int n) override {
    AccumulateHeadStats(q, k, v, n, c_.num_heads, c_.num_kv_heads, c_.head_dim, scale_,
                        &(*stats_)[layer]);
  }

 private:
  const model::ModelConfig& c_;
  std::vector<std::vector<HeadStats>>* stats_;
  float scale_;
};

// Step 3: the error of every clip candidate, per (layer, K|V, KV head), on held-out windows
// forwarded whole (positions 0..n-1).
class ClipObserver final : public engine::ForwardObserver {
 public:
  ClipObserver(const model::ModelConfig& c, const engine::RotationSet& rot,
               const kernels::SplitLayout& layout, int group, kernels::PageEncoding encoding,
               const std::vector<float>& ratios)
      : c_(c), rot_(rot), layout_(layout), group_(group), encoding_(encoding), ratios_(ratios) {
    const size_t heads = static_cast<size_t>(c.num_layers) * c.num_kv_heads;
    key_errors.assign(heads, std::vector<double>(ratios.size(), 0.0));
    value_errors = key_errors;
  }

  void OnQkv(int item, int layer, const float* q, const float* k, const float* v, int n) override {
    const int d = c_.head_dim, nh = c_.num_heads, nkv = c_.num_kv_heads, g = nh / nkv;
    const int P = layout_.page_tokens, pages = (n + P - 1) / P;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    // hist_end[t]: the query at t sees tokens [sink, hist_end[t]) as INT2 history.
    std::vector<int> hist_end(n), positions(n);
    for (int t = 0; t < n; ++t) {
      const kernels::SplitSegments s = kernels::SegmentsAt(layout_, t + 1);
      hist_end[t] = static_cast<int>(s.sink + s.history);
      positions[t] = t;
    }
    const int first_query =  // first query with any history
        static_cast<int>(std::find_if(hist_end.begin(), hist_end.end(),
                                      [&](int e) { return e > layout_.sink_tokens; }) -
                         hist_end.begin());
    if (first_query >= n) return;
    const int cols = hist_end[n - 1];  // keys that are history for some query
    std::vector<float> qg(static_cast<size_t>(n) * g * d), qr(qg.size());
    std::vector<float> kh(static_cast<size_t>(n) * d), vh(kh.size()), kr(kh.size()), vr(kh.size());
    std::vector<float> probs(static_cast<size_t>(n - first_query) * n);
    std::vector<float> hist_probs(static_cast<size_t>(n - first_query) * g * cols);
    std::vector<double> weights(static_cast<size_t>(pages) * d * d);
    std::vector<float> gram(static_cast<size_t>(d) * d);
    for (int h = 0; h < nkv; ++h) {
      for (int t = 0; t < n; ++t) {
        for (int j = 0; j < g; ++j) {
          std::copy_n(q + (static_cast<int64_t>(t) * nh + h * g + j) * d, d,
                      qg.data() + (static_cast<int64_t>(t) * g + j) * d);
        }
        std::copy_n(k + (static_cast<int64_t>(t) * nkv + h) * d, d, kh.data() + int64_t{t} * d);
        std::copy_n(v + (static_cast<int64_t>(t) * nkv + h) * d, d, vh.data() + int64_t{t} * d);
      }
      // Rotated as the engine stores them: k·R_K, v·R_V rounded to BF16 (demotion quantises
      // the BF16 values); queries rotated by R_K for the logit-error weights.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n * g, d, d, 1.0f, qg.data(), d,
                  rot_.k(layer, h), d, 0.0f, qr.data(), d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0f, kh.data(), d,
                  rot_.k(layer, h), d, 0.0f, kr.data(), d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0f, vh.data(), d,
                  rot_.v(layer, h), d, 0.0f, vr.data(), d);
      for (float& x : kr) x = kernels::RoundToBf16(x);
      for (float& x : vr) x = kernels::RoundToBf16(x);

      // Keys: page p is seen in INT2 by the queries t with hist_end[t] >= (p+1)·P, a suffix.
      std::fill(weights.begin(), weights.end(), 0.0);
      for (int p = layout_.sink_tokens / P; p < pages; ++p) {
        const int t0 = static_cast<int>(std::find_if(hist_end.begin(), hist_end.end(),
                                                     [&](int e) { return e >= (p + 1) * P; }) -
                                        hist_end.begin());
        if (t0 >= n) break;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, (n - t0) * g, 1.0f,
                    qr.data() + static_cast<int64_t>(t0) * g * d, d,
                    qr.data() + static_cast<int64_t>(t0) * g * d, d, 0.0f, gram.data(), d);
        std::copy(gram.begin(), gram.end(), weights.begin() + static_cast<int64_t>(p) * d * d);
      }
      AccumulateKeyClipErrors(kr.data(), n, d, group_, encoding_, weights, ratios_,
                              &key_errors[static_cast<size_t>(layer) * nkv + h]);

      // Values: the causal softmax of each query head, restricted to the keys it sees in INT2.
      const int rows = n - first_query;
      for (int j = 0; j < g; ++j) {
        CausalSoftmax(qg.data() + (static_cast<int64_t>(first_query) * g + j) * d,
                      static_cast<int64_t>(g) * d, positions.data() + first_query, rows, kh.data(),
                      d, n, d, scale, probs.data());
        for (int r = 0; r < rows; ++r) {
          const float* src = probs.data() + static_cast<int64_t>(r) * n;
          float* dst = hist_probs.data() + (static_cast<int64_t>(j) * rows + r) * cols;
          const int end = hist_end[first_query + r];
          for (int s = 0; s < cols; ++s) {
            dst[s] = s >= layout_.sink_tokens && s < end ? src[s] : 0.0f;
          }
        }
      }
      AccumulateValueClipErrors(hist_probs.data(), rows * g, vr.data(), cols, d, group_, encoding_,
                                ratios_, &value_errors[static_cast<size_t>(layer) * nkv + h]);
    }
  }

  std::vector<std::vector<double>> key_errors;    // [layer * kv_heads + head][candidate]
  std::vector<std::vector<double>> value_errors;  // same

 private:
  const model::ModelConfig& c_;
  const engine::RotationSet& rot_;
  kernels::SplitLayout layout_;
  int group_;
  kernels::PageEncoding encoding_;
  std::vector<float> ratios_;
};

absl::Status ForwardWindow(engine::Engine& e, const TokenWindow& w,
                           engine::ForwardObserver* observer) {
  engine::SequenceKv seq;
  const int n = static_cast<int>(w.tokens.size());
  KV_RETURN_IF_ERROR(e.cache().Reserve(seq, n));
  seq.tokens = w.tokens;
  std::vector<float> logits;
  const absl::Status s =
      e.backend().Forward({{&seq, /*pos0=*/0, n, /*all_logits=*/false}}, &logits, observer);
  e.cache().Release(seq);
  return s;
}

ClipChoice Choose(const std::vector<double>& errors, const std::vector<float>& ratios) {
  ClipChoice c;
  c.error_unclipped = errors.back();  // the last candidate is 1 (no clipping)
  size_t best = ratios.size() - 1;
  for (size_t i = 0; i < ratios.size(); ++i) {
    if (errors[i] < errors[best]) best = i;
  }
  c.ratio = ratios[best];
  c.error = errors[best];
  return c;
}

}  // namespace

absl::StatusOr<CalibrationResult> Calibrate(std::shared_ptr<const model::LoadedModel> model,
                                            const std::vector<TokenWindow>& covariance,
                                            const std::vector<TokenWindow>& heldout,
                                            const CalibrationOptions& options,
                                            const ProgressFn& progress) {
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  const model::ModelConfig& c = model->config;
  const int d = c.head_dim, L = c.num_layers, H = c.num_kv_heads;
  const int group = options.group_size > 0 ? options.group_size : d;
  if (covariance.empty()) return absl::InvalidArgumentError("no calibration windows");
  if (heldout.empty()) return absl::InvalidArgumentError("no held-out windows for the clip search");
  const int64_t min_heldout =
      options.layout.sink_tokens + options.layout.recent_tokens + options.layout.page_tokens;
  int max_len = 0;
  for (const auto* set : {&covariance, &heldout}) {
    for (const TokenWindow& w : *set) {
      max_len = std::max(max_len, static_cast<int>(w.tokens.size()));
    }
  }
  for (const TokenWindow& w : heldout) {
    if (static_cast<int64_t>(w.tokens.size()) < min_heldout) {
      return absl::InvalidArgumentError(
          absl::StrCat("held-out windows of ", w.tokens.size(),
                       " tokens are too short: a query needs more than ", min_heldout,
                       " tokens before it sees INT2 history"));
    }
  }
  KV_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> e,
                      CreateFidelityEngine(model, engine::KvCacheFormat::kBf16, options.layout, 0,
                                           "", max_len, max_len));

  // 1. Covariances.
  std::vector<std::vector<HeadStats>> stats(L, std::vector<HeadStats>(H));
  StatsObserver stats_observer(c, &stats);
  CalibrationResult result;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < covariance.size() && !options.hadamard_only; ++i) {
    KV_RETURN_IF_ERROR(ForwardWindow(*e, covariance[i], &stats_observer));
    result.covariance_tokens += static_cast<int64_t>(covariance[i].tokens.size());
    const double elapsed = Since(start);
    say(absl::StrFormat("calibrate: covariance window %d/%d, %d tokens, %.0f s, about %.0f s left",
                        i + 1, covariance.size(), result.covariance_tokens, elapsed,
                        elapsed / (i + 1) * (covariance.size() - i - 1)));
  }

  // 2. Rotations.
  engine::RotationSet& rot = result.rotations;
  rot.num_layers = L;
  rot.num_kv_heads = H;
  rot.head_dim = d;
  rot.identity = false;
  rot.k_rotation.resize(static_cast<size_t>(L) * H * d * d);
  rot.v_rotation.resize(rot.k_rotation.size());
  rot.model_fingerprint = model->fingerprint;
  auto value_stat = [&](const HeadStats& s) -> const std::vector<double>& {
    return options.value_proxy ? s.value_proxy : s.value_cov;
  };
  std::vector<double> hadamard(static_cast<size_t>(d) * d);
  kernels::HadamardMatrix(d, hadamard.data());
  for (int l = 0; l < L && options.hadamard_only; ++l) {
    for (int h = 0; h < H; ++h) {
      const int64_t off = (static_cast<int64_t>(l) * H + h) * d * d;
      for (int64_t i = 0; i < int64_t{d} * d; ++i) {
        rot.k_rotation[off + i] = rot.v_rotation[off + i] = static_cast<float>(hadamard[i]);
      }
    }
  }
  for (int l = 0; l < L && !options.hadamard_only; ++l) {
    std::vector<double> k_sum(static_cast<size_t>(d) * d, 0.0), v_sum(k_sum.size(), 0.0);
    for (int h = 0; h < H; ++h) {
      // Normalise each head's share so the shared fit weighs heads equally (OSCAR: the mean).
      const double kn = 1.0 / std::max<int64_t>(1, stats[l][h].query_rows);
      const double vn = 1.0 / std::max<int64_t>(1, stats[l][h].tokens);
      for (size_t i = 0; i < k_sum.size(); ++i) {
        k_sum[i] += stats[l][h].query_cov[i] * kn;
        v_sum[i] += value_stat(stats[l][h])[i] * vn;
      }
    }
    for (int h = 0; h < H; ++h) {
      const FittedRotation rk =
          FitRotation(options.shared_rotation ? k_sum : stats[l][h].query_cov, d);
      const FittedRotation rv =
          FitRotation(options.shared_rotation ? v_sum : value_stat(stats[l][h]), d);
      const int64_t off = (static_cast<int64_t>(l) * H + h) * d * d;
      std::copy(rk.rotation.begin(), rk.rotation.end(), rot.k_rotation.begin() + off);
      std::copy(rv.rotation.begin(), rv.rotation.end(), rot.v_rotation.begin() + off);
    }
  }
  rot.k_clip.assign(static_cast<size_t>(L) * H, 1.0f);
  rot.v_clip = rot.k_clip;
  if (options.hadamard_only) {
    say("calibrate: every rotation is the normalised Hadamard matrix (--hadamard-only)");
  } else {
    say(absl::StrFormat("calibrate: fitted %d %s rotations (keys from QᵀQ, values from %s)",
                        options.shared_rotation ? L : L * H,
                        options.shared_rotation ? "per-layer" : "per-(layer, KV head)",
                        options.value_proxy ? "OSCAR's proxy" : "VᵀSᵀSV"));
  }

  // 3. Clip ratios on held-out windows.
  const std::vector<float> ratios = ClipRatioCandidates(group);
  const kernels::PageEncoding encoding = options.lloyd_max ? kernels::PageEncoding::kInt2LloydMax
                                                           : kernels::PageEncoding::kInt2Uniform;
  ClipObserver clip_observer(c, rot, options.layout, group, encoding, ratios);
  const Clock::time_point clip_start = Clock::now();
  for (size_t i = 0; i < heldout.size(); ++i) {
    KV_RETURN_IF_ERROR(ForwardWindow(*e, heldout[i], &clip_observer));
    result.heldout_tokens += static_cast<int64_t>(heldout[i].tokens.size());
    const double elapsed = Since(clip_start);
    say(absl::StrFormat(
        "calibrate: clip search window %d/%d (%d candidates from %.3f to 1), %.0f s, about %.0f s "
        "left",
        i + 1, heldout.size(), ratios.size(), ratios.front(), elapsed,
        elapsed / (i + 1) * (heldout.size() - i - 1)));
  }
  double k_gain = 0, v_gain = 0;
  for (int m = 0; m < L * H; ++m) {
    result.key_clips.push_back(Choose(clip_observer.key_errors[m], ratios));
    result.value_clips.push_back(Choose(clip_observer.value_errors[m], ratios));
    rot.k_clip[m] = result.key_clips.back().ratio;
    rot.v_clip[m] = result.value_clips.back().ratio;
    k_gain +=
        result.key_clips.back().error / std::max(1e-30, result.key_clips.back().error_unclipped);
    v_gain += result.value_clips.back().error /
              std::max(1e-30, result.value_clips.back().error_unclipped);
  }
  say(absl::StrFormat(
      "calibrate: clip ratios chosen; mean error relative to no clipping: keys %.3f, values %.3f",
      k_gain / (L * H), v_gain / (L * H)));

  // Metadata.
  engine::RotationFileInfo& info = result.info;
  info.model_fingerprint = model->fingerprint;
  info.model_name = c.name;
  info.key_objective = options.hadamard_only ? "hadamard" : "qqt";
  info.value_objective = options.hadamard_only ? "hadamard" : options.value_proxy ? "proxy" : "sst";
  info.grouping = options.shared_rotation || options.hadamard_only ? "layer" : "head";
  info.levels = options.lloyd_max ? "lloyd-max" : "uniform";
  info.group_size = group;
  std::vector<TokenWindow> all = options.hadamard_only ? std::vector<TokenWindow>{} : covariance;
  all.insert(all.end(), heldout.begin(), heldout.end());
  info.calibration_digest = TokenDigest(all);
  info.calibration_tokens = options.hadamard_only ? 0 : result.covariance_tokens;
  info.heldout_tokens = result.heldout_tokens;
  nlohmann::json opts = {{"covariance_windows", covariance.size()},
                         {"heldout_windows", heldout.size()},
                         {"window_tokens", max_len},
                         {"layout",
                          {{"sink_tokens", options.layout.sink_tokens},
                           {"recent_tokens", options.layout.recent_tokens},
                           {"page_tokens", options.layout.page_tokens}}},
                         {"clip_candidates", ratios},
                         {"documents", options.documents}};
  info.options = opts.dump();
  rot.info = info;
  return result;
}

}  // namespace kvstrata::calibration

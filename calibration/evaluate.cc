#include "calibration/evaluate.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "calibration/fidelity_engine.h"
#include "core/status_macros.h"
#include "kernels/numeric.h"
#include "kernels/rotation.h"

namespace kvstrata::calibration {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

constexpr char kNoWindowsSuffix[] = "-nowin";

// Runs fn(0..count-1) on `threads` threads, item i on thread i % threads.
void ParallelFor(size_t count, int threads, const std::function<void(size_t)>& fn) {
  if (threads <= 1 || count <= 1) {
    for (size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::vector<std::thread> workers;
  for (int w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      for (size_t i = w; i < count; i += threads) fn(i);
    });
  }
  for (std::thread& t : workers) t.join();
}

// Single-threaded BLAS (the probes' own products) while the formats run on threads of their
// own; restored on scope exit. The engines get one CPU thread each then (CreateFidelityEngine).
class BlasThreads {
 public:
  explicit BlasThreads(int n) : saved_(openblas_get_num_threads()) { openblas_set_num_threads(n); }
  ~BlasThreads() { openblas_set_num_threads(saved_); }

 private:
  int saved_;
};

// Captures the reference run's k and v of every position and layer, and q at the sample
// positions (all unrotated, post-RoPE).
class AttentionProbe final : public engine::ForwardObserver {
 public:
  AttentionProbe(const model::ModelConfig& c, int context, std::vector<int> samples)
      : c_(c), context_(context), samples_(std::move(samples)) {
    const size_t kv = static_cast<size_t>(context) * c.num_kv_heads * c.head_dim;
    k.assign(c.num_layers, std::vector<float>(kv));
    v = k;
    q.assign(c.num_layers,
             std::vector<float>(samples_.size() * static_cast<size_t>(c.num_heads) * c.head_dim));
  }
  void set_pos0(int64_t pos0) { pos0_ = pos0; }

  void OnQkv(int item, int layer, const float* qp, const float* kp, const float* vp,
             int n) override {
    const int64_t kv_row = int64_t{c_.num_kv_heads} * c_.head_dim;
    const int64_t q_row = int64_t{c_.num_heads} * c_.head_dim;
    std::copy_n(kp, n * kv_row, k[layer].data() + pos0_ * kv_row);
    std::copy_n(vp, n * kv_row, v[layer].data() + pos0_ * kv_row);
    for (size_t i = 0; i < samples_.size(); ++i) {
      const int64_t t = samples_[i] - pos0_;
      if (t >= 0 && t < n) std::copy_n(qp + t * q_row, q_row, q[layer].data() + i * q_row);
    }
  }

  const std::vector<int>& samples() const { return samples_; }
  std::vector<std::vector<float>> q, k, v;  // [layer][...]

 private:
  const model::ModelConfig& c_;
  int context_;
  std::vector<int> samples_;
  int64_t pos0_ = 0;
};

struct LayerErrors {
  std::vector<double> score_kl, output_rel_error;  // [layers], sums over samples and heads
};

// The attention of sample queries over the probe's keys and values as `format` stores them
// (rotated, BF16 windows, history through EncodeHistoryBlock / DecodeHistoryBlock), against the
// BF16 reference (identity rotations, every token BF16). Per layer, the mean over sample
// positions and query heads.
void AttentionErrors(const AttentionProbe& probe, const model::ModelConfig& c,
                     const kernels::KvGeometry& g, const EvalFormat& f,
                     const engine::RotationSet& rot, const kernels::HistoryCodec* codec,
                     LayerErrors* out) {
  const int d = c.head_dim, nh = c.num_heads, nkv = c.num_kv_heads, group = nh / nkv;
  const int P = g.page_tokens;
  const int n = static_cast<int>(probe.k[0].size() / (static_cast<size_t>(nkv) * d));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const bool split = f.format != engine::KvCacheFormat::kBf16;
  out->score_kl.assign(c.num_layers, 0.0);
  out->output_rel_error.assign(c.num_layers, 0.0);
  std::vector<float> kh(static_cast<size_t>(n) * d), vh(kh.size()), kref(kh.size()),
      vref(kh.size()), kf(kh.size()), vf(kh.size()), tmp(kh.size());
  // (a codec block is never larger than a BF16 one; its size varies by layer)
  std::vector<uint8_t> block(f.format == engine::KvCacheFormat::kCodec
                                 ? kernels::BlockBytes(g, kernels::PageEncoding::kBf16)
                                 : engine::HistoryBlockBytes(f.format, g, 0, 0, codec));
  std::vector<float> qr(d), p(n), pf(n), o(d), of(d), ofr(d);
  // Pages that are history for the last query (their stored form does not depend on the query).
  const int64_t hist_pages_end =
      split ? (kernels::SegmentsAt(f.layout, n).sink + kernels::SegmentsAt(f.layout, n).history) / P
            : 0;
  auto softmax_out = [&](const float* qv, const std::vector<float>& keys,
                         const std::vector<float>& values, int visible, std::vector<float>& probs,
                         std::vector<float>& outv) {
    float m = -std::numeric_limits<float>::infinity();
    for (int s = 0; s < visible; ++s) {
      float dot = 0.0f;
      for (int i = 0; i < d; ++i) dot += qv[i] * keys[static_cast<int64_t>(s) * d + i];
      probs[s] = dot * scale;
      m = std::max(m, probs[s]);
    }
    double z = 0;
    for (int s = 0; s < visible; ++s) z += (probs[s] = std::exp(probs[s] - m));
    std::fill(outv.begin(), outv.end(), 0.0f);
    for (int s = 0; s < visible; ++s) {
      probs[s] = static_cast<float>(probs[s] / z);
      for (int i = 0; i < d; ++i) outv[i] += probs[s] * values[static_cast<int64_t>(s) * d + i];
    }
  };
  for (int l = 0; l < c.num_layers; ++l) {
    for (int h = 0; h < nkv; ++h) {
      for (int t = 0; t < n; ++t) {
        std::copy_n(probe.k[l].data() + (static_cast<int64_t>(t) * nkv + h) * d, d,
                    kh.data() + static_cast<int64_t>(t) * d);
        std::copy_n(probe.v[l].data() + (static_cast<int64_t>(t) * nkv + h) * d, d,
                    vh.data() + static_cast<int64_t>(t) * d);
      }
      for (size_t i = 0; i < kh.size(); ++i) {
        kref[i] = kernels::RoundToBf16(kh[i]);
        vref[i] = kernels::RoundToBf16(vh[i]);
      }
      // The format's BF16 rows: rotated as the engine rotates (fp32 GEMM), then rounded.
      if (rot.identity) {
        kf = kref;
        vf = vref;
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0f, kh.data(), d,
                    rot.k(l, h), d, 0.0f, kf.data(), d);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, d, d, 1.0f, vh.data(), d,
                    rot.v(l, h), d, 0.0f, vf.data(), d);
        for (size_t i = 0; i < kf.size(); ++i) {
          kf[i] = kernels::RoundToBf16(kf[i]);
          vf[i] = kernels::RoundToBf16(vf[i]);
        }
      }
      // The history form of every page that becomes history: [sink_pages, hist_pages_end).
      std::vector<float> kh_hist = kf, vh_hist = vf;
      for (int64_t pg = f.layout.sink_tokens / P; pg < hist_pages_end; ++pg) {
        for (int kind = 0; kind < 2; ++kind) {
          const std::vector<float>& src = kind == 0 ? kf : vf;
          std::vector<float>& dst = kind == 0 ? kh_hist : vh_hist;
          const float clip = kind == 0 ? rot.key_clip(l, h) : rot.value_clip(l, h);
          engine::EncodeHistoryBlock(f.format, g, src.data() + pg * P * d, l, kind, h, clip,
                                     block.data(), codec);
          engine::DecodeHistoryBlock(f.format, g, block.data(), P, l, kind, dst.data() + pg * P * d,
                                     codec);
        }
      }
      for (size_t si = 0; si < probe.samples().size(); ++si) {
        const int t = probe.samples()[si];
        const int visible = t + 1;
        // The keys and values this query sees: history pages as stored, the rest BF16.
        const kernels::SplitSegments seg =
            split ? kernels::SegmentsAt(f.layout, visible) : kernels::SplitSegments{visible, 0, 0};
        std::copy_n(kf.data(), static_cast<int64_t>(visible) * d, tmp.data());
        std::copy_n(kh_hist.data() + seg.sink * d, seg.history * d, tmp.data() + seg.sink * d);
        std::vector<float> vis_v(vf.begin(), vf.begin() + static_cast<int64_t>(visible) * d);
        std::copy_n(vh_hist.data() + seg.sink * d, seg.history * d, vis_v.data() + seg.sink * d);
        for (int j = 0; j < group; ++j) {
          const float* qv = probe.q[l].data() + (si * nh + h * group + j) * static_cast<size_t>(d);
          softmax_out(qv, kref, vref, visible, p, o);
          if (rot.identity) {
            std::copy_n(qv, d, qr.data());
          } else {
            for (int b = 0; b < d; ++b) {
              float acc = 0.0f;
              for (int a = 0; a < d; ++a) acc += qv[a] * rot.k(l, h)[a * d + b];
              qr[b] = acc;
            }
          }
          softmax_out(qr.data(), tmp, vis_v, visible, pf, ofr);
          if (rot.identity) {
            of = ofr;
          } else {
            for (int a = 0; a < d; ++a) {  // o = o'·R_Vᵀ
              float acc = 0.0f;
              for (int b = 0; b < d; ++b) acc += ofr[b] * rot.v(l, h)[a * d + b];
              of[a] = acc;
            }
          }
          double kl = 0.0, num = 0.0, den = 0.0;
          for (int s = 0; s < visible; ++s) {
            if (p[s] > 0.0f) {
              kl += p[s] * (std::log(double{p[s]}) - std::log(std::max(double{pf[s]}, 1e-300)));
            }
          }
          for (int i = 0; i < d; ++i) {
            num += (double{of[i]} - o[i]) * (double{of[i]} - o[i]);
            den += double{o[i]} * o[i];
          }
          out->score_kl[l] += std::max(0.0, kl);
          out->output_rel_error[l] += den > 0 ? std::sqrt(num / den) : 0.0;
        }
      }
    }
  }
}

// Per-format accumulators over the windows of one context.
struct Accumulator {
  std::vector<double> kl;  // per scored position
  double kl_history_sum = 0;
  int64_t history_positions = 0;
  double nll_sum = 0, nll_ref_sum = 0;
  int64_t top1 = 0;
  std::vector<uint8_t> same_top;  // per scored position
  LayerErrors layers;
  int64_t attention_samples = 0;
  double seconds = 0;
};

// log-softmax of a row of logits, in float64.
void LogSoftmax(const float* logits, int vocab, std::vector<double>* out, int* argmax) {
  out->resize(vocab);
  double m = -std::numeric_limits<double>::infinity();
  int best = 0;
  for (int i = 0; i < vocab; ++i) {
    if (logits[i] > m) m = logits[i], best = i;
  }
  double z = 0.0;
  for (int i = 0; i < vocab; ++i) z += std::exp(double{logits[i]} - m);
  const double lse = m + std::log(z);
  for (int i = 0; i < vocab; ++i) (*out)[i] = double{logits[i]} - lse;
  *argmax = best;
}

std::string LayoutName(const kernels::SplitLayout& l) {
  return absl::StrCat("sink", l.sink_tokens, "-recent", l.recent_tokens);
}

// The history codec a rotation file carries; errors name the format and the file.
absl::StatusOr<std::string> CarriedCodec(const std::string& format, const std::string& path) {
  absl::StatusOr<engine::RotationFileInfo> info = engine::ReadRotationFileInfo(path);
  if (!info.ok()) {
    return absl::Status(info.status().code(),
                        absl::StrCat("format ", format, ": ", info.status().message()));
  }
  if (info->history_codec.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("format ", format, ": ", path, " carries no history_codec"));
  }
  return info->history_codec;
}

}  // namespace

absl::StatusOr<EvalFormat> ResolveEvalFormat(const std::string& name,
                                             const EvalRotationFiles& files) {
  EvalFormat f;
  f.name = name;
  if (const size_t eq = name.find('='); eq != std::string::npos) {
    // label=FILE: the split INT2 format with any rotation file, at the levels its clips were
    // searched for.
    f.name = name.substr(0, eq);
    f.rotations_path = name.substr(eq + 1);
    if (absl::StartsWith(f.rotations_path, "codec-pages:")) {
      // label=codec-pages:FILE: the served codec KV format, packed pages and all, with the
      // codec FILE carries (the engine folds its eigenbasis into FILE's rotations).
      f.format = engine::KvCacheFormat::kCodec;
      f.rotations_path = f.rotations_path.substr(12);
      f.rotations = f.rotations_path.substr(f.rotations_path.find_last_of('/') + 1);
      KV_ASSIGN_OR_RETURN(f.codec, CarriedCodec(f.name, f.rotations_path));
      return f;
    }
    if (absl::StartsWith(f.rotations_path, "codec:")) {
      // label=codec:SPEC[@FILE]: a candidate codec, parsed once the head_dim is known.
      const std::string rest = f.rotations_path.substr(6);
      const size_t at = rest.find('@');
      f.format = engine::KvCacheFormat::kEvalCodec;
      f.codec = rest.substr(0, at);
      f.rotations_path = at == std::string::npos ? "" : rest.substr(at + 1);
      f.rotations = f.rotations_path.empty()
                        ? "identity"
                        : f.rotations_path.substr(f.rotations_path.find_last_of('/') + 1);
      if (f.codec.empty() && !f.rotations_path.empty()) {
        // label=codec:@FILE: the codec the rotation file carries (docs/rotation-file.md).
        KV_ASSIGN_OR_RETURN(f.codec, CarriedCodec(f.name, f.rotations_path));
      }
      if (f.name.empty() || f.codec.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "format \"", name, "\" is not label=codec:SPEC[@FILE] or label=codec:@FILE"));
      }
      return f;
    }
    f.rotations = f.rotations_path.substr(f.rotations_path.find_last_of('/') + 1);
    if (f.name.empty() || f.rotations_path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("format \"", name, "\" is not label=FILE"));
    }
    absl::StatusOr<engine::RotationFileInfo> info = engine::ReadRotationFileInfo(f.rotations_path);
    if (!info.ok()) {
      return absl::Status(info.status().code(),
                          absl::StrCat("format ", f.name, ": ", info.status().message()));
    }
    f.format = info->levels == "lloyd-max" ? engine::KvCacheFormat::kInt2LloydMax
                                           : engine::KvCacheFormat::kInt2;
    return f;
  }
  std::string base = name;
  const bool nowin = absl::EndsWith(name, kNoWindowsSuffix);
  if (nowin) base = name.substr(0, name.size() - std::string(kNoWindowsSuffix).size());
  auto need = [&](const std::string& path, const char* flag) -> absl::Status {
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("format ", name, " needs a rotation file: pass --", flag));
    }
    f.rotations_path = path;
    f.rotations = path.substr(path.find_last_of('/') + 1);
    return absl::OkStatus();
  };
  f.rotations = "identity";
  using engine::KvCacheFormat;
  if (base == "bf16") {
    f.format = KvCacheFormat::kBf16;
  } else if (base == "fp8") {
    f.format = KvCacheFormat::kEvalFp8;
  } else if (base == "int4") {
    f.format = KvCacheFormat::kEvalInt4;
  } else if (base == "kivi2") {
    f.format = KvCacheFormat::kEvalKivi2;
  } else if (base == "turbo3") {
    f.format = KvCacheFormat::kEvalTurbo3;
  } else if (base == "int2-naive") {
    f.format = KvCacheFormat::kInt2;
  } else if (base == "int2-hadamard") {
    f.format = KvCacheFormat::kInt2;
    KV_RETURN_IF_ERROR(need(files.hadamard, "hadamard"));
    f.rotations = "hadamard";
  } else if (base == "oscar") {
    f.format = KvCacheFormat::kInt2;
    KV_RETURN_IF_ERROR(need(files.per_head, "rotations"));
  } else if (base == "oscar-shared") {
    f.format = KvCacheFormat::kInt2;
    KV_RETURN_IF_ERROR(need(files.shared, "shared-rotations"));
  } else if (base == "oscar-proxy") {
    f.format = KvCacheFormat::kInt2;
    KV_RETURN_IF_ERROR(need(files.proxy, "proxy-rotations"));
  } else if (base == "oscar-lm") {
    f.format = KvCacheFormat::kInt2LloydMax;
    KV_RETURN_IF_ERROR(need(files.lloyd_max, "lloyd-max-rotations"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown format \"", name,
        "\" (bf16, fp8, int4, kivi2, turbo3, int2-naive, int2-hadamard, oscar, oscar-shared, "
        "oscar-proxy, oscar-lm; split formats may end in -nowin)"));
  }
  if (nowin) {
    if (f.format == KvCacheFormat::kBf16) {
      return absl::InvalidArgumentError("bf16-nowin: bf16 has no windows to remove");
    }
    f.layout.sink_tokens = 0;
    f.layout.recent_tokens = 1;
  }
  return f;
}

absl::Status WriteHadamardRotationFile(const std::string& path, const model::LoadedModel& model) {
  const model::ModelConfig& c = model.config;
  const int d = c.head_dim;
  std::vector<double> h(static_cast<size_t>(d) * d);
  kernels::HadamardMatrix(d, h.data());
  engine::RotationSet r;
  r.num_layers = c.num_layers;
  r.num_kv_heads = c.num_kv_heads;
  r.head_dim = d;
  r.identity = false;
  for (int m = 0; m < c.num_layers * c.num_kv_heads; ++m) {
    for (double x : h) r.k_rotation.push_back(static_cast<float>(x));
  }
  r.v_rotation = r.k_rotation;
  r.k_clip.assign(static_cast<size_t>(c.num_layers) * c.num_kv_heads, 1.0f);
  r.v_clip = r.k_clip;
  engine::RotationFileInfo info;
  info.model_fingerprint = model.fingerprint;
  info.model_name = c.name;
  info.key_objective = info.value_objective = "hadamard";
  info.grouping = "layer";
  info.levels = "uniform";
  info.group_size = d;
  return engine::WriteRotationFile(path, r, info);
}

absl::Status ForwardChunk(engine::Engine& engine, engine::SequenceKv& seq,
                          std::span<const int32_t> tokens, int64_t pos0, int n,
                          std::vector<float>* logits, engine::ForwardObserver* observer) {
  if (pos0 + n > static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError("chunk runs past the tokens");
  }
  seq.tokens.assign(tokens.begin(), tokens.begin() + pos0 + n);
  return engine.backend().Forward({{&seq, pos0, n, /*all_logits=*/true}}, logits, observer);
}

absl::StatusOr<EvalReport> Evaluate(std::shared_ptr<const model::LoadedModel> model,
                                    const std::vector<TextDocument>& documents,
                                    const std::vector<EvalFormat>& formats,
                                    const EvalOptions& options, const EvalProgressFn& progress) {
  auto say = [&](const std::string& line) {
    if (progress) progress(line);
  };
  const model::ModelConfig& c = model->config;
  const int group = options.group_size > 0 ? options.group_size : c.head_dim;
  const kernels::KvGeometry geometry{c.num_layers, c.num_kv_heads, c.head_dim, group, 64};
  if (options.chunk < 1) return absl::InvalidArgumentError("chunk must be >= 1");
  const int threads = std::max(1, options.threads);
  std::vector<std::shared_ptr<const kernels::HistoryCodec>> codecs(formats.size());
  for (size_t fi = 0; fi < formats.size(); ++fi) {
    if (formats[fi].format != engine::KvCacheFormat::kEvalCodec &&
        formats[fi].format != engine::KvCacheFormat::kCodec) {
      continue;
    }
    auto codec = std::make_shared<kernels::HistoryCodec>();
    std::string error;
    if (!kernels::ParseHistoryCodec(formats[fi].codec, c.head_dim, codec.get(), &error)) {
      return absl::InvalidArgumentError(absl::StrCat("format ", formats[fi].name, ": ", error));
    }
    codecs[fi] = std::move(codec);
  }
  std::optional<BlasThreads> blas;
  if (threads > 1) blas.emplace(1);
  EvalReport report;
  report.model_name = c.name;
  report.model_fingerprint = model->fingerprint;
  report.options = options;
  for (const TextDocument& d : documents) report.documents.push_back(d.name);
  const Clock::time_point start = Clock::now();

  if (options.windows.size() != 1 && options.windows.size() != options.contexts.size()) {
    return absl::InvalidArgumentError("give one window count, or one per context");
  }
  for (size_t ci = 0; ci < options.contexts.size(); ++ci) {
    const int context = options.contexts[ci];
    const int want = options.windows.size() == 1 ? options.windows[0] : options.windows[ci];
    if (context < 2) return absl::InvalidArgumentError("contexts must be >= 2 tokens");
    if (want < 1) return absl::InvalidArgumentError("window counts must be >= 1");
    const std::vector<TokenWindow> windows =
        MakeWindows(documents, context, options.first_window, want);
    if (static_cast<int>(windows.size()) < want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "context ", context, ": the evaluation text has only ", windows.size(),
          " windows of that length after the first ", options.first_window, ", ", want, " asked"));
    }
    report.data_digests.emplace_back(context, TokenDigest(windows));
    const int chunk = std::min(options.chunk, context);
    // Formats run concurrently on `threads` threads, an engine each: one CPU thread apiece.
    const int engine_threads = threads > 1 ? 1 : 0;
    KV_ASSIGN_OR_RETURN(
        std::unique_ptr<engine::Engine> ref,
        CreateFidelityEngine(model, engine::KvCacheFormat::kBf16, kernels::SplitLayout{}, group, "",
                             context, chunk, engine_threads));
    std::vector<std::unique_ptr<engine::Engine>> engines;
    for (size_t fi = 0; fi < formats.size(); ++fi) {
      const EvalFormat& f = formats[fi];
      absl::StatusOr<std::unique_ptr<engine::Engine>> e =
          CreateFidelityEngine(model, f.format, f.layout, group, f.rotations_path, context, chunk,
                               engine_threads, codecs[fi]);
      if (!e.ok()) {
        return absl::Status(e.status().code(),
                            absl::StrCat("format ", f.name, ": ", e.status().message()));
      }
      engines.push_back(std::move(*e));
    }
    std::vector<Accumulator> acc(formats.size());
    double ref_seconds = 0.0;
    // Sample positions for the per-layer metrics: spread over the second half of the window.
    std::vector<int> samples;
    for (int i = 0; i < options.attention_samples; ++i) {
      samples.push_back(
          context - 1 -
          static_cast<int>(int64_t{i} * (context / 2) / std::max(1, options.attention_samples)));
    }
    const int vocab = ref->backend().vocab_size();
    std::vector<float> ref_logits;
    std::vector<std::vector<double>> ref_lp;
    std::vector<int> ref_argmax;
    for (size_t wi = 0; wi < windows.size(); ++wi) {
      const std::vector<int32_t>& tokens = windows[wi].tokens;
      AttentionProbe probe(c, context, samples);
      engine::SequenceKv ref_seq;
      KV_RETURN_IF_ERROR(ref->cache().Reserve(ref_seq, context));
      std::vector<engine::SequenceKv> seqs(formats.size());
      for (size_t fi = 0; fi < formats.size(); ++fi) {
        KV_RETURN_IF_ERROR(engines[fi]->cache().Reserve(seqs[fi], context));
      }
      const Clock::time_point window_start = Clock::now();
      for (int64_t pos0 = 0; pos0 < context; pos0 += chunk) {
        const int n = static_cast<int>(std::min<int64_t>(chunk, context - pos0));
        probe.set_pos0(pos0);
        const Clock::time_point t0 = Clock::now();
        KV_RETURN_IF_ERROR(ForwardChunk(*ref, ref_seq, tokens, pos0, n, &ref_logits, &probe));
        ref_seconds += Since(t0);
        ref_lp.resize(n);
        ref_argmax.resize(n);
        for (int r = 0; r < n && !options.attention_only; ++r) {
          LogSoftmax(ref_logits.data() + static_cast<int64_t>(r) * vocab, vocab, &ref_lp[r],
                     &ref_argmax[r]);
        }
        // The formats, on `threads` workers (each engine is driven by one thread at a time).
        std::vector<absl::Status> status(formats.size());
        ParallelFor(options.attention_only ? 0 : formats.size(), threads, [&](size_t fi) {
          const EvalFormat& f = formats[fi];
          Accumulator& a = acc[fi];
          std::vector<float> logits;
          std::vector<double> lp;
          const Clock::time_point t1 = Clock::now();
          status[fi] = ForwardChunk(*engines[fi], seqs[fi], tokens, pos0, n, &logits, nullptr);
          a.seconds += Since(t1);
          if (!status[fi].ok()) return;
          for (int r = 0; r < n; ++r) {
            const int64_t t = pos0 + r;
            if (t + 1 >= context) continue;  // no next token to score
            int argmax = 0;
            LogSoftmax(logits.data() + static_cast<int64_t>(r) * vocab, vocab, &lp, &argmax);
            double kl = 0.0;
            for (int i = 0; i < vocab; ++i) kl += std::exp(ref_lp[r][i]) * (ref_lp[r][i] - lp[i]);
            kl = std::max(0.0, kl);
            a.kl.push_back(kl);
            const int32_t target = tokens[t + 1];
            a.nll_sum -= lp[target];
            a.nll_ref_sum -= ref_lp[r][target];
            a.top1 += argmax == ref_argmax[r];
            a.same_top.push_back(argmax == ref_argmax[r]);
            if (f.format != engine::KvCacheFormat::kBf16 &&
                kernels::SegmentsAt(f.layout, t + 1).history > 0) {
              a.kl_history_sum += kl;
              ++a.history_positions;
            }
          }
        });
        for (size_t fi = 0; fi < formats.size(); ++fi) {
          if (!status[fi].ok()) {
            return absl::Status(status[fi].code(), absl::StrCat("format ", formats[fi].name, ": ",
                                                                status[fi].message()));
          }
        }
        say(absl::StrFormat("eval: context %d, window %d/%d, positions %d..%d done, %.0f s",
                            context, wi + 1, windows.size(), pos0, pos0 + n - 1,
                            Since(window_start)));
      }
      std::vector<LayerErrors> layer_errors(formats.size());
      ParallelFor(formats.size(), threads, [&](size_t fi) {
        AttentionErrors(probe, c, geometry, formats[fi], engines[fi]->rotations(), codecs[fi].get(),
                        &layer_errors[fi]);
      });
      for (size_t fi = 0; fi < formats.size(); ++fi) {
        const LayerErrors& e = layer_errors[fi];
        Accumulator& a = acc[fi];
        a.layers.score_kl.resize(c.num_layers, 0.0);
        a.layers.output_rel_error.resize(c.num_layers, 0.0);
        for (int l = 0; l < c.num_layers; ++l) {
          a.layers.score_kl[l] += e.score_kl[l];
          a.layers.output_rel_error[l] += e.output_rel_error[l];
        }
        a.attention_samples += static_cast<int64_t>(samples.size()) * c.num_heads;
        engines[fi]->cache().Release(seqs[fi]);
      }
      ref->cache().Release(ref_seq);
    }
    report.reference_seconds.emplace_back(context, ref_seconds);
    for (size_t fi = 0; fi < formats.size(); ++fi) {
      const EvalFormat& f = formats[fi];
      Accumulator& a = acc[fi];
      EvalResult r;
      r.format = f.name;
      r.kv_format = engine::KvCacheFormatName(f.format);
      r.rotations = f.rotations;
      r.layout = f.format == engine::KvCacheFormat::kBf16 ? "all-bf16" : LayoutName(f.layout);
      r.context = context;
      r.windows = static_cast<int>(windows.size());
      r.positions = static_cast<int64_t>(a.kl.size());
      r.history_positions = a.history_positions;
      r.bits_per_element =
          engine::SequenceBitsPerElement(f.format, f.layout, geometry, context, codecs[fi].get());
      r.history_bits_per_element =
          f.format == engine::KvCacheFormat::kBf16
              ? 16.0
              : engine::HistoryBitsPerElement(f.format, geometry, codecs[fi].get());
      const double positions = std::max<int64_t>(1, r.positions);
      r.ppl = std::exp(a.nll_sum / positions);
      r.ppl_reference = std::exp(a.nll_ref_sum / positions);
      r.ppl_change = r.ppl / r.ppl_reference - 1.0;
      double kl_sum = 0.0;
      for (double x : a.kl) kl_sum += x;
      r.kl_mean = kl_sum / positions;
      std::vector<double> sorted = a.kl;
      std::sort(sorted.begin(), sorted.end());
      r.kl_p99 =
          sorted.empty()
              ? 0.0
              : sorted[std::min(sorted.size() - 1, static_cast<size_t>(0.99 * sorted.size()))];
      r.kl_history_mean = a.history_positions > 0 ? a.kl_history_sum / a.history_positions : 0.0;
      r.top1 = static_cast<double>(a.top1) / positions;
      const size_t per_window = static_cast<size_t>(context - 1);
      for (size_t w0 = 0; w0 + per_window <= a.kl.size(); w0 += per_window) {
        double kl_w = 0.0, top_w = 0.0;
        for (size_t i = w0; i < w0 + per_window; ++i) kl_w += a.kl[i], top_w += a.same_top[i];
        r.window_kl.push_back(kl_w / per_window);
        r.window_top1.push_back(top_w / per_window);
      }
      const double per_layer = static_cast<double>(std::max<int64_t>(1, a.attention_samples));
      for (int l = 0; l < c.num_layers; ++l) {
        r.layer_score_kl.push_back(a.layers.score_kl[l] / per_layer);
        r.layer_output_rel_error.push_back(a.layers.output_rel_error[l] / per_layer);
        r.score_kl += r.layer_score_kl.back() / c.num_layers;
        r.output_rel_error += r.layer_output_rel_error.back() / c.num_layers;
      }
      r.seconds = a.seconds;
      report.results.push_back(std::move(r));
    }
    say(absl::StrFormat("eval: context %d done (%d formats, %d windows), %.0f s so far", context,
                        formats.size(), windows.size(), Since(start)));
  }
  report.seconds = Since(start);
  return report;
}

std::string EvalReportJson(const EvalReport& report) {
  nlohmann::json j;
  j["model"] = {{"name", report.model_name}, {"fingerprint", report.model_fingerprint}};
  j["documents"] = report.documents;
  nlohmann::json digests = nlohmann::json::object();
  for (const auto& [ctx, digest] : report.data_digests) digests[std::to_string(ctx)] = digest;
  j["data_digests"] = digests;
  j["options"] = {{"contexts", report.options.contexts},
                  {"windows", report.options.windows},
                  {"first_window", report.options.first_window},
                  {"chunk", report.options.chunk},
                  {"attention_samples", report.options.attention_samples},
                  {"group_size", report.options.group_size},
                  {"threads", report.options.threads},
                  {"attention_only", report.options.attention_only}};
  nlohmann::json ref = nlohmann::json::object();
  for (const auto& [ctx, s] : report.reference_seconds) ref[std::to_string(ctx)] = s;
  j["reference_seconds"] = ref;
  j["seconds"] = report.seconds;
  nlohmann::json results = nlohmann::json::array();
  for (const EvalResult& r : report.results) {
    results.push_back({{"format", r.format},
                       {"kv_format", r.kv_format},
                       {"rotations", r.rotations},
                       {"layout", r.layout},
                       {"context", r.context},
                       {"windows", r.windows},
                       {"positions", r.positions},
                       {"history_positions", r.history_positions},
                       {"bits_per_element", r.bits_per_element},
                       {"history_bits_per_element", r.history_bits_per_element},
                       {"ppl", r.ppl},
                       {"ppl_reference", r.ppl_reference},
                       {"ppl_change", r.ppl_change},
                       {"kl_mean", r.kl_mean},
                       {"kl_p99", r.kl_p99},
                       {"kl_history_mean", r.kl_history_mean},
                       {"top1", r.top1},
                       {"window_kl", r.window_kl},
                       {"window_top1", r.window_top1},
                       {"attention_score_kl", r.score_kl},
                       {"attention_output_rel_error", r.output_rel_error},
                       {"layer_attention_score_kl", r.layer_score_kl},
                       {"layer_attention_output_rel_error", r.layer_output_rel_error},
                       {"seconds", r.seconds}});
  }
  j["results"] = results;
  return j.dump(1);
}

absl::StatusOr<EvalReport> ParseEvalReportJson(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("results") || !j["results"].is_array()) {
    return absl::InvalidArgumentError("not a kvstrata eval JSON report (no results array)");
  }
  EvalReport report;
  if (j.contains("options") && j["options"].is_object()) {
    const nlohmann::json& o = j["options"];
    report.options.attention_only = o.contains("attention_only") &&
                                    o["attention_only"].is_boolean() &&
                                    o["attention_only"].get<bool>();
  }
  auto numbers = [](const nlohmann::json& r, const char* key, std::vector<double>* out) -> bool {
    if (!r.contains(key) || !r[key].is_array()) return false;
    for (const nlohmann::json& x : r[key]) {
      if (!x.is_number()) return false;
      out->push_back(x.get<double>());
    }
    return true;
  };
  for (const nlohmann::json& r : j["results"]) {
    EvalResult e;
    if (!r.is_object() || !r.contains("format") || !r["format"].is_string() ||
        !r.contains("context") || !r["context"].is_number_integer() || !r.contains("windows") ||
        !r["windows"].is_number_integer() || !r.contains("kl_mean") || !r["kl_mean"].is_number() ||
        !numbers(r, "layer_attention_score_kl", &e.layer_score_kl) ||
        !numbers(r, "layer_attention_output_rel_error", &e.layer_output_rel_error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("result ", report.results.size(),
                       ": needs format, context, windows, kl_mean and the per-layer attention "
                       "errors"));
    }
    e.format = r["format"].get<std::string>();
    e.context = r["context"].get<int>();
    e.windows = r["windows"].get<int>();
    e.kl_mean = r["kl_mean"].get<double>();
    report.results.push_back(std::move(e));
  }
  return report;
}

std::string EvalReportTable(const EvalReport& report) {
  std::string out = absl::StrFormat("%-20s %6s %6s %6s %8s %8s %10s %10s %10s %7s %10s %8s %7s\n",
                                    "format", "ctx", "bpe", "hist", "ppl", "dppl%", "KL mean",
                                    "KL p99", "KL hist", "top1", "attn KL", "attn err", "sec");
  for (const EvalResult& r : report.results) {
    out += absl::StrFormat(
        "%-20s %6d %6.3f %6.3f %8.3f %+8.3f %10.3e %10.3e %10.3e %7.4f %10.3e %8.4f %7.1f\n",
        r.format, r.context, r.bits_per_element, r.history_bits_per_element, r.ppl,
        100.0 * r.ppl_change, r.kl_mean, r.kl_p99, r.kl_history_mean, r.top1, r.score_kl,
        r.output_rel_error, r.seconds);
  }
  return out;
}

}  // namespace kvstrata::calibration

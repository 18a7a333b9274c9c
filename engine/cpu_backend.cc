#include "engine/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "engine/attention.h"
#include "kernels/quant.h"

namespace kvstrata::engine {

namespace {

using model::ModelConfig;
using model::WeightMatrix;

// The layer's matrices dequantised to fp32 (this backend computes in fp32 through OpenBLAS).
struct Fp32Layer {
  const float* wq;
  const float* wk;
  const float* wv;
  const float* wo;
  const float* w_gate;
  const float* w_up;
  const float* w_down;
};

// y [rows][out] = x [rows][in] · Wᵀ, W [out][in]; with bias [out] when given.
void Linear(const float* x, int rows, int in, const float* w, int out, const float* bias,
            float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, w, in, 0.0f, y,
              out);
  if (bias) {
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < out; ++o) y[static_cast<int64_t>(r) * out + o] += bias[o];
  }
}

// y [rows][dim] = x / rms(x) * weight, per row of `dim` values (rows may be heads).
void RmsNorm(const float* x, int rows, int dim, const float* weight, float eps, float* y) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += double{xr[i]} * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    float* yr = y + static_cast<int64_t>(r) * dim;
    for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(const model::LoadedModel& model, const RotationSet& rotations, KvCache* cache)
      : model_(model), cfg_(model.config), rot_(rotations), cache_(cache) {
    const model::ModelWeights& w = model.weights;
    int64_t total = w.token_embedding.rows * w.token_embedding.cols;
    if (w.lm_head.data != w.token_embedding.data) total += w.lm_head.rows * w.lm_head.cols;
    for (const model::LayerWeights& l : w.layers) {
      for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        total += m->rows * m->cols;
      }
    }
    fp32_.resize(static_cast<size_t>(total));
    float* next = fp32_.data();
    const auto take = [&](const WeightMatrix& m) {
      float* p = next;
      m.DequantizeRows(0, m.rows, p);
      next += m.rows * m.cols;
      return p;
    };
    token_embedding_ = take(w.token_embedding);
    lm_head_ = w.lm_head.data == w.token_embedding.data ? token_embedding_ : take(w.lm_head);
    for (const model::LayerWeights& l : w.layers) {
      layers_.push_back(Fp32Layer{take(l.wq), take(l.wk), take(l.wv), take(l.wo), take(l.w_gate),
                                  take(l.w_up), take(l.w_down)});
    }
    const int d = cfg_.head_dim;
    inv_freq_.resize(d / 2);
    for (int i = 0; i < d / 2; ++i) {
      inv_freq_[i] = static_cast<float>(std::pow(double{cfg_.rope_theta}, -2.0 * i / d));
    }
  }

  int vocab_size() const override { return cfg_.vocab_size; }
  std::string Describe() const override { return "cpu (fp32 weights, OpenBLAS)"; }

  absl::Status Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                       ForwardObserver* observer) override;

 private:
  void Rope(float* x, int heads, const float* cos, const float* sin) const;
  // y [rows][d] = x [rows][d] (row stride `stride`) · R [d][d]
  static void RotateRows(const float* x, int rows, int stride, const float* r, int d, float* y,
                         int y_stride) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, d, 1.0f, x, stride, r, d, 0.0f,
                y, y_stride);
  }

  const model::LoadedModel& model_;
  const ModelConfig& cfg_;
  const RotationSet& rot_;
  KvCache* cache_;
  std::vector<float> inv_freq_;
  std::vector<float> fp32_;  // every matrix dequantised
  const float* token_embedding_ = nullptr;
  const float* lm_head_ = nullptr;
  std::vector<Fp32Layer> layers_;
};

void CpuBackend::Rope(float* x, int heads, const float* cos, const float* sin) const {
  const int d = cfg_.head_dim;
  const int half = d / 2;
  for (int h = 0; h < heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * d;
    for (int i = 0; i < half; ++i) {
      float* a;
      float* b;
      if (cfg_.rope_layout == model::RopeLayout::kInterleaved) {
        a = v + 2 * i, b = v + 2 * i + 1;
      } else {
        a = v + i, b = v + i + half;
      }
      const float x0 = *a, x1 = *b;
      *a = x0 * cos[i] - x1 * sin[i];
      *b = x0 * sin[i] + x1 * cos[i];
    }
  }
}

absl::Status CpuBackend::Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                                 ForwardObserver* observer) {
  const int H = cfg_.hidden_size, d = cfg_.head_dim, nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
  const int group = nh / nkv;
  const int qdim = nh * d, kvdim = nkv * d, inter = cfg_.intermediate_size;
  const kernels::KvGeometry& geo = cache_->geometry();
  int T = 0;
  std::vector<int> offset(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& it = batch[i];
    if (it.n <= 0) return absl::InvalidArgumentError("forward item with no tokens");
    if (it.pos0 != it.seq->num_tokens ||
        static_cast<int64_t>(it.seq->tokens.size()) < it.pos0 + it.n) {
      return absl::InternalError(
          absl::StrCat("forward item ", i, " does not continue its sequence"));
    }
    for (int t = 0; t < it.n; ++t) {
      const int32_t token = it.seq->tokens[it.pos0 + t];
      if (token < 0 || token >= cfg_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("token id ", token, " at position ",
                                                       it.pos0 + t, " is outside the vocabulary"));
      }
    }
    offset[i] = T;
    T += it.n;
  }
  for (const ForwardItem& it : batch)
    KV_RETURN_IF_ERROR(cache_->BeginAppend(*it.seq, it.pos0 + it.n));

  std::vector<float> x(static_cast<size_t>(T) * H), hn(x.size());
  std::vector<float> q(static_cast<size_t>(T) * qdim), k(static_cast<size_t>(T) * kvdim),
      v(static_cast<size_t>(T) * kvdim), qr(q.size()), attn(q.size()), o(q.size());
  std::vector<float> gate(static_cast<size_t>(T) * inter), up(gate.size());
  std::vector<float> cos(static_cast<size_t>(T) * (d / 2)), sin(cos.size());
  std::vector<float> rows(static_cast<size_t>(geo.page_tokens) * d),
      kv_rot(static_cast<size_t>(T) * d);

  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& it = batch[i];
    for (int t = 0; t < it.n; ++t) {
      const int32_t token = it.seq->tokens[it.pos0 + t];
      std::copy_n(token_embedding_ + static_cast<int64_t>(token) * H, H,
                  x.data() + static_cast<int64_t>(offset[i] + t) * H);
      const double pos = static_cast<double>(it.pos0 + t);
      for (int f = 0; f < d / 2; ++f) {
        const double angle = pos * inv_freq_[f];
        cos[static_cast<int64_t>(offset[i] + t) * (d / 2) + f] =
            static_cast<float>(std::cos(angle));
        sin[static_cast<int64_t>(offset[i] + t) * (d / 2) + f] =
            static_cast<float>(std::sin(angle));
      }
    }
  }

  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    const model::LayerWeights& lw = model_.weights.layers[layer];
    const Fp32Layer& w = layers_[layer];
    RmsNorm(x.data(), T, H, lw.attn_norm, cfg_.rms_norm_eps, hn.data());
    Linear(hn.data(), T, H, w.wq, qdim, lw.bq, q.data());
    Linear(hn.data(), T, H, w.wk, kvdim, lw.bk, k.data());
    Linear(hn.data(), T, H, w.wv, kvdim, lw.bv, v.data());
    if (cfg_.qk_norm) {
      RmsNorm(q.data(), T * nh, d, lw.q_norm, cfg_.rms_norm_eps, q.data());
      RmsNorm(k.data(), T * nkv, d, lw.k_norm, cfg_.rms_norm_eps, k.data());
    }
    for (int t = 0; t < T; ++t) {
      const float* c = cos.data() + static_cast<int64_t>(t) * (d / 2);
      const float* s = sin.data() + static_cast<int64_t>(t) * (d / 2);
      Rope(q.data() + static_cast<int64_t>(t) * qdim, nh, c, s);
      Rope(k.data() + static_cast<int64_t>(t) * kvdim, nkv, c, s);
    }
    if (observer) {
      for (size_t i = 0; i < batch.size(); ++i) {
        observer->OnQkv(static_cast<int>(i), layer,
                        q.data() + static_cast<int64_t>(offset[i]) * qdim,
                        k.data() + static_cast<int64_t>(offset[i]) * kvdim,
                        v.data() + static_cast<int64_t>(offset[i]) * kvdim, batch[i].n);
      }
    }
    // Rotate q by R_K of its KV head; k by R_K, v by R_V; the identity skips the GEMMs.
    if (rot_.identity) {
      qr = q;
    } else {
      for (int hq = 0; hq < nh; ++hq) {
        RotateRows(q.data() + hq * d, T, qdim, rot_.k(layer, hq / group), d, qr.data() + hq * d,
                   qdim);
      }
    }
    // Append K'/V' to the BF16 pages: token at position p goes to page p/64, row p%64.
    for (int kind = 0; kind < 2; ++kind) {
      const std::vector<float>& src = kind == 0 ? k : v;
      for (int h = 0; h < nkv; ++h) {
        const float* rows_in = src.data() + h * d;
        int stride = kvdim;
        if (!rot_.identity) {
          RotateRows(src.data() + h * d, T, kvdim, kind == 0 ? rot_.k(layer, h) : rot_.v(layer, h),
                     d, kv_rot.data(), d);
          rows_in = kv_rot.data();
          stride = d;
        }
        for (size_t i = 0; i < batch.size(); ++i) {
          const ForwardItem& it = batch[i];
          for (int t = 0; t < it.n; ++t) {
            const int64_t pos = it.pos0 + t;
            uint8_t* block = cache_->Bf16Block(*it.seq, pos / geo.page_tokens, layer, kind, h);
            kernels::EncodeBf16Block(rows_in + static_cast<int64_t>(offset[i] + t) * stride, 1, geo,
                                     block + (pos % geo.page_tokens) * d * 2);
          }
        }
      }
    }
    // Quantise the pages this append demotes, from their BF16 values (so the codes do not
    // depend on how the sequence was chunked).
    for (const ForwardItem& it : batch) {
      SequenceKv& seq = *it.seq;
      const int64_t sink_pages = cache_->options().layout.sink_tokens / geo.page_tokens;
      for (int64_t p = std::max(sink_pages, cache_->DemotedPagesEnd(it.pos0));
           p < cache_->DemotedPagesEnd(it.pos0 + it.n); ++p) {
        for (int kind = 0; kind < 2; ++kind) {
          for (int h = 0; h < nkv; ++h) {
            kernels::DecodeBf16Block(cache_->Bf16Block(seq, p, layer, kind, h), geo.page_tokens,
                                     geo, rows.data());
            const float clip = kind == 0 ? rot_.key_clip(layer, h) : rot_.value_clip(layer, h);
            cache_->EncodeHistory(seq, p, layer, kind, h, rows.data(), clip);
          }
        }
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const ForwardItem& it = batch[i];
      ChunkAttention(*cache_, *it.seq, layer, qr.data() + static_cast<int64_t>(offset[i]) * qdim,
                     it.n, it.pos0, nh, sm_scale,
                     attn.data() + static_cast<int64_t>(offset[i]) * qdim);
    }
    // Back from rotated value space: o = o'·R_Vᵀ.
    if (rot_.identity) {
      o = attn;
    } else {
      for (int hq = 0; hq < nh; ++hq) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, d, d, 1.0f, attn.data() + hq * d,
                    qdim, rot_.v(layer, hq / group), d, 0.0f, o.data() + hq * d, qdim);
      }
    }
    // x += o·Woᵀ
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, H, qdim, 1.0f, o.data(), qdim, w.wo,
                qdim, 1.0f, x.data(), H);
    RmsNorm(x.data(), T, H, lw.ffn_norm, cfg_.rms_norm_eps, hn.data());
    Linear(hn.data(), T, H, w.w_gate, inter, nullptr, gate.data());
    Linear(hn.data(), T, H, w.w_up, inter, nullptr, up.data());
    for (size_t j = 0; j < gate.size(); ++j) {
      const float g = gate[j];
      gate[j] = g / (1.0f + std::exp(-g)) * up[j];
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, H, inter, 1.0f, gate.data(), inter,
                w.w_down, inter, 1.0f, x.data(), H);
  }

  // Logits for the requested rows.
  std::vector<int> out_rows;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].all_logits) {
      for (int t = 0; t < batch[i].n; ++t) out_rows.push_back(offset[i] + t);
    } else {
      out_rows.push_back(offset[i] + batch[i].n - 1);
    }
  }
  std::vector<float> final_rows(out_rows.size() * static_cast<size_t>(H));
  for (size_t r = 0; r < out_rows.size(); ++r) {
    RmsNorm(x.data() + static_cast<int64_t>(out_rows[r]) * H, 1, H, model_.weights.output_norm,
            cfg_.rms_norm_eps, final_rows.data() + r * H);
  }
  logits->resize(out_rows.size() * static_cast<size_t>(cfg_.vocab_size));
  Linear(final_rows.data(), static_cast<int>(out_rows.size()), H, lm_head_, cfg_.vocab_size,
         nullptr, logits->data());
  for (const ForwardItem& it : batch) {
    KV_RETURN_IF_ERROR(cache_->EndAppend(*it.seq, it.pos0 + it.n));
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(const model::LoadedModel& model,
                                          const RotationSet& rotations, KvCache* cache,
                                          int threads) {
  openblas_set_num_threads(threads);
  return std::make_unique<CpuBackend>(model, rotations, cache);
}

}  // namespace kvstrata::engine

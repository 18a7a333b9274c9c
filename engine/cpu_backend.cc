#include "engine/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/status_macros.h"
#include "engine/attention.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/scratch.h"
#include "kernels/quant.h"

namespace kvstrata::engine {

namespace {

using kernels::cpu::CpuIsa;
using kernels::cpu::WeightFormat;
using kernels::cpu::WeightView;
using model::ModelConfig;

WeightFormat FormatOf(model::GgmlType type) {
  switch (type) {
    case model::GgmlType::kF32:
      return WeightFormat::kF32;
    case model::GgmlType::kF16:
      return WeightFormat::kF16;
    case model::GgmlType::kBF16:
      return WeightFormat::kBF16;
    case model::GgmlType::kQ8_0:
      return WeightFormat::kQ8_0;
    case model::GgmlType::kQ4_0:
      return WeightFormat::kQ4_0;
    case model::GgmlType::kQ4_1:
      return WeightFormat::kQ4_1;
    // The loaders accept no other matrix type (model::CanDequantize); one that starts to must
    // get a kernel here.
    case model::GgmlType::kQ5_0:
    case model::GgmlType::kQ5_1:
    case model::GgmlType::kQ8_1:
    case model::GgmlType::kQ2_K:
    case model::GgmlType::kQ3_K:
    case model::GgmlType::kQ4_K:
    case model::GgmlType::kQ5_K:
    case model::GgmlType::kQ6_K:
    case model::GgmlType::kQ8_K:
    case model::GgmlType::kIQ2_XXS:
    case model::GgmlType::kIQ2_XS:
    case model::GgmlType::kIQ3_XXS:
    case model::GgmlType::kIQ1_S:
    case model::GgmlType::kIQ4_NL:
    case model::GgmlType::kIQ3_S:
    case model::GgmlType::kIQ2_S:
    case model::GgmlType::kIQ4_XS:
    case model::GgmlType::kI8:
    case model::GgmlType::kI16:
    case model::GgmlType::kI32:
    case model::GgmlType::kI64:
    case model::GgmlType::kF64:
    case model::GgmlType::kIQ1_M:
    case model::GgmlType::kTQ1_0:
    case model::GgmlType::kTQ2_0:
    case model::GgmlType::kMXFP4:
    case model::GgmlType::kNVFP4:
    case model::GgmlType::kQ1_0:
      break;
  }
  KV_CHECK(false) << "weight type " << model::GetGgmlTypeInfo(type).name << " has no CPU kernel";
  return WeightFormat::kF32;
}

WeightView ViewOf(const model::WeightMatrix& m) {
  return WeightView{FormatOf(m.type), m.rows, m.cols, m.data};
}

// The instruction set of the kernels: the best this CPU has, or $KVSTRATA_CPU_ISA (portable,
// avx2, avx512) to measure or test a slower path on a faster machine.
CpuIsa ChooseIsa() {
  const CpuIsa best = kernels::cpu::DetectCpuIsa();
  const char* env = std::getenv("KVSTRATA_CPU_ISA");
  if (env == nullptr || *env == '\0') return best;
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (std::string(env) != kernels::cpu::CpuIsaName(isa)) continue;
    if (kernels::cpu::CpuSupports(isa)) return isa;
    std::fprintf(stderr, "kvstrata: KVSTRATA_CPU_ISA=%s is not supported by this CPU; using %s\n",
                 env, kernels::cpu::CpuIsaName(best));
    return best;
  }
  std::fprintf(stderr, "kvstrata: KVSTRATA_CPU_ISA=%s is not portable, avx2 or avx512; using %s\n",
               env, kernels::cpu::CpuIsaName(best));
  return best;
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

// The matrices of one layer as the kernels read them.
struct LayerViews {
  WeightView wq, wk, wv, wo, w_gate, w_up, w_down;
};

// One product of a batch of products that share their input: y [T][y_stride] (=, or += when
// `accumulate`) x·Wᵀ (+ bias).
struct Product {
  const WeightView* w;
  const float* bias;  // [w->rows] or nullptr
  float* y;
  int64_t y_stride;
  bool accumulate;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const model::LoadedModel& model, const RotationSet& rotations, KvCache* cache,
             int threads)
      : model_(model),
        cfg_(model.config),
        rot_(rotations),
        cache_(cache),
        isa_(ChooseIsa()),
        pool_(threads),
        attention_(isa_, model.config.num_heads) {
    const model::ModelWeights& w = model.weights;
    token_embedding_ = ViewOf(w.token_embedding);
    lm_head_ = ViewOf(w.lm_head);
    for (const model::LayerWeights& l : w.layers) {
      layers_.push_back(LayerViews{ViewOf(l.wq), ViewOf(l.wk), ViewOf(l.wv), ViewOf(l.wo),
                                   ViewOf(l.w_gate), ViewOf(l.w_up), ViewOf(l.w_down)});
    }
    const int d = cfg_.head_dim;
    inv_freq_.resize(d / 2);
    for (int i = 0; i < d / 2; ++i) {
      inv_freq_[i] = static_cast<float>(std::pow(double{cfg_.rope_theta}, -2.0 * i / d));
    }
    if (!rot_.identity) {
      // As weight matrices (y = x·Wᵀ): q·R_K and k·R_K use W = R_Kᵀ, v·R_V uses R_Vᵀ, and the
      // way back o'·R_Vᵀ uses W = R_V itself.
      const int64_t n = int64_t{cfg_.num_layers} * cfg_.num_kv_heads;
      rot_t_.resize(static_cast<size_t>(2 * n * d * d));
      for (int64_t i = 0; i < 2 * n; ++i) {
        const float* r =
            i < n ? rot_.k_rotation.data() + i * d * d : rot_.v_rotation.data() + (i - n) * d * d;
        float* t = rot_t_.data() + i * d * d;
        for (int a = 0; a < d; ++a) {
          for (int b = 0; b < d; ++b) t[b * d + a] = r[a * d + b];
        }
      }
      for (int l = 0; l < cfg_.num_layers; ++l) {
        for (int which = 0; which < 3; ++which) {
          for (int h = 0; h < cfg_.num_kv_heads; ++h) {
            const int64_t lh = int64_t{l} * cfg_.num_kv_heads + h;
            rot_ptrs_.push_back(which == 0   ? rot_t_.data() + lh * d * d
                                : which == 1 ? rot_t_.data() + (n + lh) * d * d
                                             : rot_.v(l, h));
          }
        }
      }
    }
  }

  int vocab_size() const override { return cfg_.vocab_size; }
  std::string Describe() const override {
    return absl::StrCat("cpu (weights as stored, ", kernels::cpu::CpuIsaName(isa_), " kernels, ",
                        pool_.threads(), " threads)");
  }

  absl::Status Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                       ForwardObserver* observer) override;

 private:
  void Rope(float* x, int heads, const float* cos, const float* sin) const;
  // Runs the products (each over T rows of x) as one parallel loop.
  void Products(const float* x, int T, int64_t x_stride, std::initializer_list<Product> products);
  // One rotation of activations per head: y [T][..] = x [T][..] · R for `heads` blocks of
  // head_dim columns, head h using rotation[h / heads_per_rotation] (each [d][d], given as
  // W = Rᵀ so that y = x·Wᵀ).
  struct Rotation {
    const float* x;
    int64_t x_stride;
    int heads;
    float* y;
    int64_t y_stride;
    const float* const* rotations;
    int heads_per_rotation;
  };
  // Runs the rotations (each over T rows) as one parallel loop, a task per head.
  void RotateHeads(int T, std::initializer_list<Rotation> rotations);
  WeightView RotationView(const float* w) const {
    const int d = cfg_.head_dim;
    return WeightView{WeightFormat::kF32, d, d, reinterpret_cast<const uint8_t*>(w)};
  }
  // Per layer, the [kv_heads] rotations as weight matrices: R_Kᵀ, R_Vᵀ, and R_V itself.
  const float* const* KRotT(int layer) const { return rot_ptrs_.data() + layer * 3 * kv_heads(); }
  const float* const* VRotT(int layer) const { return KRotT(layer) + kv_heads(); }
  const float* const* VRot(int layer) const { return KRotT(layer) + 2 * kv_heads(); }
  int kv_heads() const { return cfg_.num_kv_heads; }

  const model::LoadedModel& model_;
  const ModelConfig& cfg_;
  const RotationSet& rot_;
  KvCache* cache_;
  const CpuIsa isa_;
  ThreadPool pool_;
  LayerAttention attention_;
  WeightView token_embedding_;
  WeightView lm_head_;
  std::vector<LayerViews> layers_;
  std::vector<float> inv_freq_;
  std::vector<float> rot_t_;  // R_Kᵀ then R_Vᵀ, [2][layers][kv_heads][d][d]; empty if identity
  std::vector<const float*> rot_ptrs_;  // [layers][R_Kᵀ, R_Vᵀ, R_V][kv_heads]
  struct Task {
    const Product* product;
    int64_t row_begin;
    int64_t row_end;
  };
  std::vector<Task> tasks_;  // reused by Products
  struct RotationTask {
    const Rotation* rotation;
    int head;
  };
  std::vector<RotationTask> rotation_tasks_;  // reused by RotateHeads
};

void CpuBackend::Products(const float* x, int T, int64_t x_stride,
                          std::initializer_list<Product> products) {
  // One contiguous slice of each matrix's rows per thread: the weights stream from memory
  // fastest in long runs (measured on the default model: 30 GB/s per step against 24 GB/s with
  // four slices per thread).
  tasks_.clear();
  for (const Product& p : products) {
    const int64_t rows = p.w->rows;
    const int64_t chunk = std::max<int64_t>(16, (rows + pool_.threads() - 1) / pool_.threads());
    for (int64_t r = 0; r < rows; r += chunk) {
      tasks_.push_back(Task{&p, r, std::min(rows, r + chunk)});
    }
  }
  pool_.ParallelFor(static_cast<int>(tasks_.size()), [&](int task, int) {
    const Task& t = tasks_[task];
    const Product& p = *t.product;
    const int64_t nr = t.row_end - t.row_begin;
    if (p.accumulate) {
      float* tmp = kernels::cpu::ThreadScratch(T * nr, /*which=*/1);
      kernels::cpu::MatmulRows(isa_, *p.w, x, T, x_stride, t.row_begin, t.row_end, tmp, nr);
      for (int i = 0; i < T; ++i) {
        float* yi = p.y + i * p.y_stride + t.row_begin;
        for (int64_t j = 0; j < nr; ++j) yi[j] += tmp[i * nr + j];
      }
    } else {
      kernels::cpu::MatmulRows(isa_, *p.w, x, T, x_stride, t.row_begin, t.row_end,
                               p.y + t.row_begin, p.y_stride);
    }
    if (p.bias != nullptr) {
      for (int i = 0; i < T; ++i) {
        float* yi = p.y + i * p.y_stride;
        for (int64_t j = t.row_begin; j < t.row_end; ++j) yi[j] += p.bias[j];
      }
    }
  });
}

void CpuBackend::RotateHeads(int T, std::initializer_list<Rotation> rotations) {
  const int d = cfg_.head_dim;
  rotation_tasks_.clear();
  for (const Rotation& r : rotations) {
    for (int h = 0; h < r.heads; ++h) rotation_tasks_.push_back(RotationTask{&r, h});
  }
  pool_.ParallelFor(static_cast<int>(rotation_tasks_.size()), [&](int task, int) {
    const Rotation& r = *rotation_tasks_[task].rotation;
    const int h = rotation_tasks_[task].head;
    kernels::cpu::MatmulRows(isa_, RotationView(r.rotations[h / r.heads_per_rotation]), r.x + h * d,
                             T, r.x_stride, 0, d, r.y + h * d, r.y_stride);
  });
}

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
  std::vector<int> offset;
  KV_RETURN_IF_ERROR(CheckForwardBatch(batch, cfg_.vocab_size, &offset, &T));
  for (const ForwardItem& it : batch)
    KV_RETURN_IF_ERROR(cache_->BeginAppend(*it.seq, it.pos0 + it.n));

  std::vector<float> x(static_cast<size_t>(T) * H), hn(x.size());
  std::vector<float> q(static_cast<size_t>(T) * qdim), k(static_cast<size_t>(T) * kvdim),
      v(static_cast<size_t>(T) * kvdim), qr(q.size()), attn(q.size()), o(q.size());
  std::vector<float> kr(k.size()), vr(v.size());
  std::vector<float> gate(static_cast<size_t>(T) * inter), up(gate.size()), silu(gate.size());
  std::vector<float> cos(static_cast<size_t>(T) * (d / 2)), sin(cos.size());

  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& it = batch[i];
    for (int t = 0; t < it.n; ++t) {
      const int32_t token = it.seq->tokens[it.pos0 + t];
      kernels::cpu::DequantizeRows(isa_, token_embedding_, token, token + 1,
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

  std::vector<AttentionChunk> chunks;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int64_t at = static_cast<int64_t>(offset[i]) * qdim;
    chunks.push_back(
        AttentionChunk{batch[i].seq, qr.data() + at, batch[i].n, batch[i].pos0, attn.data() + at});
  }
  // The pages this forward demotes, a task per (page, K|V, head).
  struct DemotionTask {
    const ForwardItem* item;
    int64_t page;
    int kind;
    int head;
  };
  std::vector<DemotionTask> demotions;
  const int64_t sink_pages = cache_->options().layout.sink_tokens / geo.page_tokens;
  for (const ForwardItem& it : batch) {
    for (int64_t p = std::max(sink_pages, cache_->DemotedPagesEnd(it.pos0));
         p < cache_->DemotedPagesEnd(it.pos0 + it.n); ++p) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int h = 0; h < nkv; ++h) demotions.push_back(DemotionTask{&it, p, kind, h});
      }
    }
  }

  const float sm_scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int layer = 0; layer < cfg_.num_layers; ++layer) {
    const model::LayerWeights& lw = model_.weights.layers[layer];
    const LayerViews& w = layers_[layer];
    RmsNorm(x.data(), T, H, lw.attn_norm, cfg_.rms_norm_eps, hn.data());
    Products(hn.data(), T, H,
             {{&w.wq, lw.bq, q.data(), qdim, false},
              {&w.wk, lw.bk, k.data(), kvdim, false},
              {&w.wv, lw.bv, v.data(), kvdim, false}});
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
    // Rotate q by R_K of its KV head; k by R_K, v by R_V; the identity skips the products.
    const float* k_in = k.data();
    const float* v_in = v.data();
    if (rot_.identity) {
      qr = q;
    } else {
      const float* const* k_rot = KRotT(layer);
      const float* const* v_rot = VRotT(layer);
      RotateHeads(T, {{q.data(), qdim, nh, qr.data(), qdim, k_rot, group},
                      {k.data(), kvdim, nkv, kr.data(), kvdim, k_rot, 1},
                      {v.data(), kvdim, nkv, vr.data(), kvdim, v_rot, 1}});
      k_in = kr.data();
      v_in = vr.data();
    }
    // Append K'/V' to the BF16 pages: token at position p goes to page p/64, row p%64.
    for (int kind = 0; kind < 2; ++kind) {
      const float* src = kind == 0 ? k_in : v_in;
      for (int h = 0; h < nkv; ++h) {
        for (size_t i = 0; i < batch.size(); ++i) {
          const ForwardItem& it = batch[i];
          for (int t = 0; t < it.n; ++t) {
            const int64_t pos = it.pos0 + t;
            uint8_t* block = cache_->Bf16Block(*it.seq, pos / geo.page_tokens, layer, kind, h);
            kernels::EncodeBf16Block(src + static_cast<int64_t>(offset[i] + t) * kvdim + h * d, 1,
                                     geo, block + (pos % geo.page_tokens) * d * 2);
          }
        }
      }
    }
    // Quantise the pages this append demotes, from their BF16 values (so the codes do not
    // depend on how the sequence was chunked).
    pool_.ParallelFor(static_cast<int>(demotions.size()), [&](int task, int) {
      const DemotionTask& dt = demotions[task];
      float* rows = kernels::cpu::ThreadScratch(int64_t{geo.page_tokens} * d, /*which=*/2);
      kernels::DecodeBf16Block(cache_->Bf16Block(*dt.item->seq, dt.page, layer, dt.kind, dt.head),
                               geo.page_tokens, geo, rows);
      const float clip =
          dt.kind == 0 ? rot_.key_clip(layer, dt.head) : rot_.value_clip(layer, dt.head);
      cache_->EncodeHistory(*dt.item->seq, dt.page, layer, dt.kind, dt.head, rows, clip);
    });
    attention_.Run(*cache_, layer, chunks, sm_scale, &pool_);
    // Back from rotated value space: o = o'·R_Vᵀ.
    const float* o_in = attn.data();
    if (!rot_.identity) {
      RotateHeads(T, {{attn.data(), qdim, nh, o.data(), qdim, VRot(layer), group}});
      o_in = o.data();
    }
    // x += o·Woᵀ
    Products(o_in, T, qdim, {{&w.wo, nullptr, x.data(), H, true}});
    RmsNorm(x.data(), T, H, lw.ffn_norm, cfg_.rms_norm_eps, hn.data());
    Products(hn.data(), T, H,
             {{&w.w_gate, nullptr, gate.data(), inter, false},
              {&w.w_up, nullptr, up.data(), inter, false}});
    // SwiGLU: silu(g)·up = g / (1 + exp(-g))·up, with the kernels' vectorised exp.
    for (size_t j = 0; j < gate.size(); ++j) silu[j] = -gate[j];
    kernels::cpu::ExpInPlace(isa_, silu.data(), static_cast<int>(silu.size()));
    for (size_t j = 0; j < gate.size(); ++j) gate[j] = gate[j] / (1.0f + silu[j]) * up[j];
    Products(gate.data(), T, inter, {{&w.w_down, nullptr, x.data(), H, true}});
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
  Products(final_rows.data(), static_cast<int>(out_rows.size()), H,
           {{&lm_head_, nullptr, logits->data(), cfg_.vocab_size, false}});
  for (const ForwardItem& it : batch) {
    KV_RETURN_IF_ERROR(cache_->EndAppend(*it.seq, it.pos0 + it.n));
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(const model::LoadedModel& model,
                                          const RotationSet& rotations, KvCache* cache,
                                          int threads) {
  return std::make_unique<CpuBackend>(model, rotations, cache, std::max(1, threads));
}

}  // namespace kvstrata::engine

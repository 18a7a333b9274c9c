// The launches of one forward pass of the CUDA backend: the embedding, each layer (norms, GEMMs,
// the per-head steps, the KV append and demotion, attention, the MLP) and the logits. What a
// decode step's CUDA graph captures, and its capture and replay; the pass's plan comes from
// cuda_backend_plan.cc.

#include <algorithm>
#include <cstring>

#include "core/status_macros.h"
#include "engine/cuda/cuda_backend_internal.h"
#include "kernels/cuda/append.h"
#include "kernels/cuda/gemv.h"

namespace kvstrata::engine::cuda_internal {

absl::Status CudaBackend::Gemm(const void* x, int rows, int in, const void* w, int out, float* y,
                               bool accumulate) {
  // A decode step of a few sequences reads each weight once: a GEMV streams it faster.
  if (options_.small_batch_gemv && kernels::GemvSupports(rows, in, type_, x, w)) {
    kernels::GemvVariant variant;
    // Overlapping the kernel before wins at 1-2 rows and loses at 4 (the early CTAs crowd the
    // wider kernels in front); one wave bought nothing beside it (kvstrata_bench_gemv,
    // docs/benchmarks/engine-gpu.md).
    variant.overlap_previous = options_.gemv_overlap && rows <= 2;
    KV_CUDA_RETURN_IF_ERROR(
        kernels::Gemv(x, rows, in, w, out, y, accumulate, type_, stream_, variant), "Gemv");
    return absl::OkStatus();
  }
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cudaDataType_t t = type_ == GemmType::kBf16   ? CUDA_R_16BF
                           : type_ == GemmType::kFp16 ? CUDA_R_16F
                                                      : CUDA_R_32F;
  KV_CUBLAS_RETURN_IF_ERROR(
      blas_lib_->gemm_ex(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w, t, in, x, t, in,
                   &beta, y, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
  return absl::OkStatus();
}

bool CudaBackend::DemoteAtPassStart(const Plan& plan) const {
  return options_.fused_kv_writes && plan.demote_pages > 0 && codec_layouts_.empty() &&
         plan.DecodeOnly();
}

bool CudaBackend::LaunchAhead(const Plan& plan) const {
  return options_.launch_ahead_at_batch_1 && options_.early_launches && plan.decode_items == 1 &&
         plan.DecodeOnly();
}

bool CudaBackend::HeadsWriteCache(const Plan& plan) const {
  return options_.fused_kv_writes && options_.fused_layer_ops && rot_.identity &&
         plan.DecodeOnly() && (plan.demote_pages == 0 || DemoteAtPassStart(plan));
}

uint8_t* CudaBackend::Bf16PoolAt(int layer) const {
  const int64_t block = kernels::BlockBytes(cache_->geometry(), kernels::PageEncoding::kBf16);
  return const_cast<uint8_t*>(cache_->bf16_pool().base()) +
         int64_t{layer} * 2 * cfg_.num_kv_heads * block;
}

absl::Status CudaBackend::Demote(const Plan& plan, int layer, bool early) {
  const kernels::KvGeometry& geo = cache_->geometry();
  const int nkv = cfg_.num_kv_heads;
  // A launch sees one layer (its pools offset to it), or all of them.
  kernels::KvGeometry seen = geo;
  if (layer >= 0) seen.num_layers = 1;
  const int first = std::max(layer, 0);
  const uint8_t* bf16 = Bf16PoolAt(first);
  uint8_t* history = const_cast<uint8_t*>(cache_->int2_pool()->base());
  if (!codec_layouts_.empty()) {  // its blocks are laid out per layer: one layer a launch
    kernels::DemoteCodecParams dp;
    dp.bf16_pool = bf16;
    dp.bf16_stride = cache_->bf16_pool().slot_bytes();
    dp.history_pool = history;
    dp.history_stride = cache_->int2_pool()->slot_bytes();
    dp.src_slot = plan.demote_src;
    dp.dst_slot = plan.demote_dst;
    dp.num_pages = plan.demote_pages;
    dp.num_pages_device = plan.demote_count;
    dp.geometry = seen;
    dp.codec = codec_layouts_[first];
    if (codec_fragment_) {
      dp.fragment = true;
      std::memcpy(dp.fragment_levels, fragment_levels_, sizeof(fragment_levels_));
    }
    dp.overlap_previous = early;
    KV_CUDA_RETURN_IF_ERROR(kernels::DemoteCodecPages(dp, stream_), "DemoteCodecPages");
    return absl::OkStatus();
  }
  const int64_t int2_block = kernels::BlockBytes(geo, cache_->int2_encoding());
  kernels::DemoteParams dp;
  dp.bf16_pool = bf16;
  dp.bf16_stride = cache_->bf16_pool().slot_bytes();
  dp.int2_pool = history + first * 2 * nkv * int2_block;
  dp.int2_stride = cache_->int2_pool()->slot_bytes();
  dp.src_slot = plan.demote_src;
  dp.dst_slot = plan.demote_dst;
  dp.num_pages = plan.demote_pages;
  dp.num_pages_device = plan.demote_count;
  dp.clip = clips_.as<float>() + first * 2 * nkv;
  dp.geometry = seen;
  dp.overlap_previous = early;
  KV_CUDA_RETURN_IF_ERROR(kernels::DemotePages(dp, stream_), "DemotePages");
  return absl::OkStatus();
}

absl::Status CudaBackend::RunPass(const Plan& plan) {
  const int T = plan.tokens, H = cfg_.hidden_size;
  if (DemoteAtPassStart(plan)) KV_RETURN_IF_ERROR(Demote(plan, /*layer=*/-1, /*early=*/false));
  KV_CUDA_RETURN_IF_ERROR(kernels::EmbeddingGather(embedding_, type_, cfg_.vocab_size, H,
                                                   plan.ids, T, x_.as<float>(), stream_),
                          "EmbeddingGather");
  KV_CUDA_RETURN_IF_ERROR(kernels::RopeTables(plan.positions, T, cfg_.head_dim, cfg_.rope_theta,
                                              cos_.as<float>(), sin_.as<float>(), stream_),
                          "RopeTables");
  for (int layer = 0; layer < cfg_.num_layers; ++layer) KV_RETURN_IF_ERROR(Layer(layer, plan));
  // Logits of the requested rows.
  const int R = plan.logit_rows;
  KV_CUDA_RETURN_IF_ERROR(kernels::GatherRows(x_.as<float>(), H, plan.logit_row_ids, R,
                                              final_rows_.as<float>(), stream_),
                          "GatherRows");
  KV_CUDA_RETURN_IF_ERROR(kernels::RmsNormTo(final_rows_.as<float>(), H, R, H, output_norm_,
                                             cfg_.rms_norm_eps, final_half_.as<void>(), type_,
                                             stream_),
                          "RmsNormTo");
  return Gemm(final_half_.as<void>(), R, H, lm_head_, cfg_.vocab_size, logits_.as<float>(),
              /*accumulate=*/false);
}

absl::Status CudaBackend::LaunchDecodeGraph(const Plan& plan, int items, int history_bucket) {
  auto it = decode_graphs_.find({items, history_bucket});
  if (it == decode_graphs_.end()) {
    KV_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                            "cudaStreamBeginCapture");
    const absl::Status captured = RunPass(plan);
    cudaGraph_t g = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &g);
    KV_RETURN_IF_ERROR(captured);
    KV_CUDA_RETURN_IF_ERROR(ended, "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    KV_CUDA_RETURN_IF_ERROR(made, "cudaGraphInstantiate");
    it = decode_graphs_.emplace(std::make_pair(items, history_bucket), exec).first;
  }
  KV_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
  return absl::OkStatus();
}

absl::Status CudaBackend::Layer(int layer, const Plan& plan) {
  const LayerDeviceWeights& w = layers_[layer];
  const int T = plan.tokens, H = cfg_.hidden_size, d = cfg_.head_dim;
  const int nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, group = nh / nkv;
  const int qdim = nh * d;
  const GemmType ht = type_;
  const float eps = cfg_.rms_norm_eps;
  const kernels::KvGeometry& geo = cache_->geometry();

  const bool norm_in_gemv = NormInGemv(T, w);
  // Launches that overlap the end of the kernel before (each waits for it before touching
  // memory; CudaBackendOptions::early_launches).
  const bool early = options_.early_launches;
  if (!norm_in_gemv) {
    KV_CUDA_RETURN_IF_ERROR(kernels::RmsNormTo(x_.as<float>(), H, T, H, w.attn_norm, eps,
                                               hn_.as<void>(), ht, stream_),
                            "RmsNormTo");
  }
  const bool heads_write_cache = HeadsWriteCache(plan);
  KV_RETURN_IF_ERROR(AttentionInputs(w, T, norm_in_gemv, plan, layer, heads_write_cache));
  const int64_t per_layer = int64_t{nkv} * d * d;
  const int64_t all_layers = int64_t{cfg_.num_layers} * per_layer;
  const float* rk = rot_.identity ? nullptr : rotations_.as<float>() + layer * per_layer;
  const float* rv =
      rot_.identity ? nullptr : rotations_.as<float>() + all_layers + layer * per_layer;
  // q·R_K of its KV head.
  const float* qr = q_.as<float>();
  if (rk) {
    KV_CUDA_RETURN_IF_ERROR(kernels::RotateHeads(q_.as<float>(), T, nh, d, rk, group,
                                                 /*transpose=*/false, qr_.as<float>(), stream_),
                            "RotateHeads");
    qr = qr_.as<float>();
  }
  if (!heads_write_cache) {
    // This layer's K'/V' into the BF16 pages: the launch sees one layer (its pools offset to it).
    kernels::KvGeometry one_layer = geo;
    one_layer.num_layers = 1;
    kernels::AppendParams a;
    a.k_f32 = k_.as<float>();
    a.v_f32 = v_.as<float>();
    a.num_tokens = T;
    a.k_rotation = rk;
    a.v_rotation = rv;
    a.slot = plan.append_slot;
    a.row = plan.append_row;
    a.bf16_pool = Bf16PoolAt(layer);
    a.slot_stride = cache_->bf16_pool().slot_bytes();
    a.geometry = one_layer;
    a.overlap_previous = early;
    KV_CUDA_RETURN_IF_ERROR(kernels::AppendRotatedRows(a, stream_), "AppendRotatedRows");
  }
  if (plan.demote_pages > 0 && !DemoteAtPassStart(plan)) {
    KV_RETURN_IF_ERROR(Demote(plan, layer, early));
  }
  // Attention, in rotated value space, into attn_. A pass of decode rows only, with no rotation
  // back, scatters them straight into the Wo GEMM's operand.
  const bool o_is_rows = options_.fused_layer_ops && plan.DecodeOnly() && rv == nullptr;
  if (plan.chunk.num_items > 0) {
    kernels::ChunkAttentionParams c = plan.chunk;
    c.q = qr;
    c.layer = layer;
    if (!codec_layouts_.empty()) c.codec = codec_layouts_[layer];
    KV_CUDA_RETURN_IF_ERROR(kernels::LaunchChunkAttention(c, stream_), "LaunchChunkAttention");
  }
  if (plan.decode_items > 0) {
    const int nd = plan.decode_items;
    if (heads_write_cache) {
      // The per-head launch wrote decode_q_half_ (the rows are the pass's tokens, in order).
    } else if (options_.fused_layer_ops) {
      KV_CUDA_RETURN_IF_ERROR(kernels::GatherRowsTo(qr, qdim, plan.decode_rows, nd,
                                                    decode_q_half_.as<void>(), GemmType::kBf16,
                                                    stream_, early),
                              "GatherRowsTo");
    } else {
      KV_CUDA_RETURN_IF_ERROR(kernels::GatherRows(qr, qdim, plan.decode_rows, nd,
                                                  decode_q_.as<float>(), stream_),
                              "GatherRows");
      KV_CUDA_RETURN_IF_ERROR(kernels::ConvertFloat(decode_q_.as<float>(), int64_t{nd} * qdim,
                                                    decode_q_half_.as<void>(), GemmType::kBf16,
                                                    stream_),
                              "ConvertFloat");
    }
    kernels::SplitDecodeCudaParams dpar = plan.decode;
    dpar.layer = layer;
    if (!codec_layouts_.empty()) dpar.codec = codec_layouts_[layer];
    // With early launches, a 16-bit Wo operand comes straight from the merge (the same rounding
    // as the scatter's), so Wo's GEMV starts its weights while the merge runs.
    const bool merge_to_rows = o_is_rows && early && ht != GemmType::kFp32;
    if (merge_to_rows) {
      dpar.out_rows = o_half_.as<uint16_t>();
      dpar.out_row_ids = plan.decode_rows;
      dpar.out_rows_fp16 = ht == GemmType::kFp16;
    }
    KV_CUDA_RETURN_IF_ERROR(kernels::LaunchSplitDecode(dpar, plan.decode_plan,
                                                       split_workspace_.as<void>(), stream_),
                            "LaunchSplitDecode");
    if (merge_to_rows) {
      // Written by the merge.
    } else if (o_is_rows) {
      KV_CUDA_RETURN_IF_ERROR(kernels::ScatterRowsTo(decode_out_.as<float>(), qdim,
                                                     plan.decode_rows, nd, o_half_.as<void>(), ht,
                                                     stream_, early),
                              "ScatterRowsTo");
    } else {
      KV_CUDA_RETURN_IF_ERROR(kernels::ScatterRows(decode_out_.as<float>(), qdim,
                                                   plan.decode_rows, nd, attn_.as<float>(),
                                                   stream_),
                              "ScatterRows");
    }
  }
  // Back from rotated value space, o = o'·R_Vᵀ, then x += o·Woᵀ.
  if (o_is_rows) {
    // The decode rows went straight into o_half_.
  } else if (rv && options_.fused_layer_ops) {
    KV_CUDA_RETURN_IF_ERROR(kernels::RotateHeadsTo(attn_.as<float>(), T, nh, d, rv, group,
                                                   /*transpose=*/true, o_half_.as<void>(), ht,
                                                   stream_),
                            "RotateHeadsTo");
  } else {
    const float* o = attn_.as<float>();
    if (rv) {
      KV_CUDA_RETURN_IF_ERROR(kernels::RotateHeads(attn_.as<float>(), T, nh, d, rv, group,
                                                   /*transpose=*/true, o_.as<float>(), stream_),
                              "RotateHeads");
      o = o_.as<float>();
    }
    KV_CUDA_RETURN_IF_ERROR(kernels::ConvertFloat(o, int64_t{T} * qdim, o_half_.as<void>(), ht,
                                                  stream_),
                            "ConvertFloat");
  }
  KV_RETURN_IF_ERROR(Gemm(o_half_.as<void>(), T, qdim, w.wo, H, x_.as<float>(), true));
  if (!norm_in_gemv) {
    KV_CUDA_RETURN_IF_ERROR(kernels::RmsNormTo(x_.as<float>(), H, T, H, w.ffn_norm, eps,
                                               hn_.as<void>(), ht, stream_),
                            "RmsNormTo");
  }
  return Mlp(w, T, norm_in_gemv);
}

bool CudaBackend::NormInGemv(int T, const LayerDeviceWeights& w) const {
  // The fused GEMV is a programmatic dependent launch of the GEMV kind: it goes with the
  // GEMV, its overlap and the fused q/k/v and gate/up matrices (bf16 or fp16 weights).
  if (!options_.gemv_fused_norm || !options_.small_batch_gemv || !options_.gemv_overlap ||
      !options_.fused_layer_ops) {
    return false;
  }
  return kernels::GemvRmsNormedSupports(T, cfg_.hidden_size, type_, x_.as<float>(), w.attn_norm,
                                        w.wq) &&
         kernels::GemvRmsNormedSupports(T, cfg_.hidden_size, type_, x_.as<float>(), w.ffn_norm,
                                        w.w_gate);
}

absl::Status CudaBackend::AttentionInputs(const LayerDeviceWeights& w, int T, bool norm_in_gemv,
                                          const Plan& plan, int layer, bool write_cache) {
  const int H = cfg_.hidden_size, d = cfg_.head_dim;
  const int nh = cfg_.num_heads, nkv = cfg_.num_kv_heads;
  const int qdim = nh * d, kvdim = nkv * d;
  const float eps = cfg_.rms_norm_eps;
  const bool interleaved = cfg_.rope_layout == model::RopeLayout::kInterleaved;
  if (options_.fused_layer_ops) {
    // wq, wk and wv lie back to back (UploadWeights): one GEMM, then one launch for the heads.
    if (norm_in_gemv) {
      KV_CUDA_RETURN_IF_ERROR(
          kernels::GemvRmsNormed(x_.as<float>(), T, H, w.attn_norm, eps, w.wq, qdim + 2 * kvdim,
                                 qkv_.as<float>(), type_, stream_, NormedGemv(T)),
          "GemvRmsNormed");
    } else {
      KV_RETURN_IF_ERROR(
          Gemm(hn_.as<void>(), T, H, w.wq, qdim + 2 * kvdim, qkv_.as<float>(), false));
    }
    kernels::QkvHeadsParams p;
    p.qkv = qkv_.as<float>();
    p.tokens = T;
    p.q_heads = nh;
    p.kv_heads = nkv;
    p.head_dim = d;
    p.bq = w.bq;
    p.bk = w.bk;
    p.bv = w.bv;
    if (cfg_.qk_norm) {
      p.q_norm = w.q_norm;
      p.k_norm = w.k_norm;
    }
    p.eps = eps;
    p.cos = cos_.as<float>();
    p.sin = sin_.as<float>();
    p.interleaved = interleaved;
    p.q = q_.as<float>();
    p.k = k_.as<float>();
    p.v = v_.as<float>();
    if (write_cache) {
      const kernels::KvGeometry& geo = cache_->geometry();
      p.geometry = geo;
      p.geometry.num_layers = 1;  // the pool offset to the layer, as the append's
      p.bf16_pool = Bf16PoolAt(layer);
      p.slot_stride = cache_->bf16_pool().slot_bytes();
      p.slot = plan.append_slot;
      p.row = plan.append_row;
      p.q_bf16 = decode_q_half_.as<uint16_t>();
    }
    p.overlap_previous = options_.early_launches;
    // The launch after it is attention's when the per-head launch writes the cache.
    p.dependents_at_start = write_cache && LaunchAhead(plan);
    KV_CUDA_RETURN_IF_ERROR(kernels::SplitQkvHeads(p, stream_), "SplitQkvHeads");
    return absl::OkStatus();
  }
  KV_RETURN_IF_ERROR(Gemm(hn_.as<void>(), T, H, w.wq, qdim, q_.as<float>(), false));
  KV_RETURN_IF_ERROR(Gemm(hn_.as<void>(), T, H, w.wk, kvdim, k_.as<float>(), false));
  KV_RETURN_IF_ERROR(Gemm(hn_.as<void>(), T, H, w.wv, kvdim, v_.as<float>(), false));
  if (w.bq) {
    KV_CUDA_RETURN_IF_ERROR(kernels::AddBias(q_.as<float>(), T, qdim, w.bq, stream_), "AddBias");
    KV_CUDA_RETURN_IF_ERROR(kernels::AddBias(k_.as<float>(), T, kvdim, w.bk, stream_), "AddBias");
    KV_CUDA_RETURN_IF_ERROR(kernels::AddBias(v_.as<float>(), T, kvdim, w.bv, stream_), "AddBias");
  }
  if (cfg_.qk_norm) {
    KV_CUDA_RETURN_IF_ERROR(kernels::RmsNormInPlace(q_.as<float>(), T * nh, d, w.q_norm, eps,
                                                    stream_),
                            "RmsNormInPlace");
    KV_CUDA_RETURN_IF_ERROR(kernels::RmsNormInPlace(k_.as<float>(), T * nkv, d, w.k_norm, eps,
                                                    stream_),
                            "RmsNormInPlace");
  }
  KV_CUDA_RETURN_IF_ERROR(kernels::ApplyRope(q_.as<float>(), T, nh, d, cos_.as<float>(),
                                             sin_.as<float>(), interleaved, stream_),
                          "ApplyRope");
  KV_CUDA_RETURN_IF_ERROR(kernels::ApplyRope(k_.as<float>(), T, nkv, d, cos_.as<float>(),
                                             sin_.as<float>(), interleaved, stream_),
                          "ApplyRope");
  return absl::OkStatus();
}

absl::Status CudaBackend::Mlp(const LayerDeviceWeights& w, int T, bool norm_in_gemv) {
  const int H = cfg_.hidden_size, inter = cfg_.intermediate_size;
  if (norm_in_gemv) {
    // w_gate and w_up lie back to back: one launch gives silu(gate)·up of RMSNorm(x_).
    KV_CUDA_RETURN_IF_ERROR(
        kernels::GemvRmsNormedSwiGlu(x_.as<float>(), T, H, w.ffn_norm, cfg_.rms_norm_eps, w.w_gate,
                                     inter, act_.as<void>(), type_, stream_, NormedGemv(T)),
        "GemvRmsNormedSwiGlu");
  } else if (options_.fused_layer_ops) {
    // w_gate and w_up lie back to back: one GEMM gives each row's [gate | up].
    KV_RETURN_IF_ERROR(Gemm(hn_.as<void>(), T, H, w.w_gate, 2 * inter, gate_.as<float>(), false));
    KV_CUDA_RETURN_IF_ERROR(kernels::SwiGluTo(gate_.as<float>(), gate_.as<float>() + inter, T,
                                              inter, 2 * int64_t{inter}, act_.as<void>(), type_,
                                              stream_),
                            "SwiGluTo");
  } else {
    KV_RETURN_IF_ERROR(Gemm(hn_.as<void>(), T, H, w.w_gate, inter, gate_.as<float>(), false));
    KV_RETURN_IF_ERROR(Gemm(hn_.as<void>(), T, H, w.w_up, inter, up_.as<float>(), false));
    KV_CUDA_RETURN_IF_ERROR(kernels::SwiGluTo(gate_.as<float>(), up_.as<float>(), T, inter, inter,
                                              act_.as<void>(), type_, stream_),
                            "SwiGluTo");
  }
  return Gemm(act_.as<void>(), T, inter, w.w_down, H, x_.as<float>(), true);
}

}  // namespace kvstrata::engine::cuda_internal

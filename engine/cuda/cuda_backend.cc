// The CUDA backend: start-up (device, cuBLAS, weights, buffers) and each forward pass's plan
// (page tables, segments, metadata staging, the decode graphs); the launches of a pass are in
// cuda_backend_layers.cc.

#include "engine/cuda/cuda_backend.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/status_macros.h"
#include "engine/cuda/cuda_backend_internal.h"
#include "kernels/numeric.h"

namespace kvstrata::engine {
namespace cuda_internal {

absl::Status CudaBackend::Init() {
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  KV_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_),
                          "cudaDeviceGetAttribute");
  decode_ctas_per_sm_ = kernels::SplitDecodeCtasPerSm(
      cfg_.head_dim, cache_->split() ? cache_->int2_encoding() : kernels::PageEncoding::kBf16);
  KV_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream_), "cudaStreamCreate");
  page_access_ = std::make_unique<CudaDevicePageAccess>(device_, stream_);
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start_), "cudaEventCreate");
  KV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop_), "cudaEventCreate");
  KV_ASSIGN_OR_RETURN(blas_lib_, OpenCublas());
  KV_CUBLAS_RETURN_IF_ERROR(blas_lib_->create(&blas_), "cublasCreate");
  KV_CUBLAS_RETURN_IF_ERROR(blas_lib_->set_stream(blas_, stream_), "cublasSetStream");
  // A fixed workspace, so cuBLAS allocates nothing per call (and graph capture works).
  KV_CUDA_RETURN_IF_ERROR(blas_workspace_.Allocate(size_t{32} << 20), "cudaMalloc (cuBLAS)");
  KV_CUBLAS_RETURN_IF_ERROR(
      blas_lib_->set_workspace(blas_, blas_workspace_.as<void>(), blas_workspace_.bytes()),
      "cublasSetWorkspace");
  KV_RETURN_IF_ERROR(UploadWeights());
  KV_RETURN_IF_ERROR(AllocateActivations());
  return absl::OkStatus();
}

absl::Status CudaBackend::UploadWeights() {
  const int H = cfg_.hidden_size, d = cfg_.head_dim;
  const int64_t qdim = int64_t{cfg_.num_heads} * d, kvdim = int64_t{cfg_.num_kv_heads} * d;
  const int64_t inter = cfg_.intermediate_size, V = cfg_.vocab_size;
  // Sizes first, so each arena is one allocation.
  const int64_t matrix_elements = MatrixParameters(cfg_);
  const int elem = kernels::GemmTypeBytes(type_);
  int64_t floats = H;  // output norm
  for (const model::LayerWeights& w : model_.weights.layers) {
    floats += 2 * H;
    if (w.bq) floats += qdim + 2 * kvdim;
    if (w.q_norm) floats += 2 * d;
  }
  if (cudaError_t e = matrices_.Allocate(static_cast<size_t>(matrix_elements) * elem);
      e != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda:", device_, ": cannot allocate ", (matrix_elements * elem) >> 20, " MiB for the "
        "model's weights in ", GemmTypeName(type_), ": ", cudaGetErrorString(e)));
  }
  KV_CUDA_RETURN_IF_ERROR(float_weights_.Allocate(static_cast<size_t>(floats) * 4),
                          "cudaMalloc (weights)");
  uint8_t* mnext = matrices_.as<uint8_t>();
  float* fnext = float_weights_.as<float>();
  std::vector<float> values;
  std::vector<uint16_t> staging;
  auto put_matrix = [&](const model::WeightMatrix& m, int64_t n) -> absl::StatusOr<const void*> {
    KV_CHECK(m.rows * m.cols == n) << "a matrix of " << m.rows << "x" << m.cols << ", expected "
                                   << n << " elements";
    // The matrix's exact fp32 values (what the loaders once kept in memory), then as before.
    const float* src = m.f32();
    if (src == nullptr) {
      values.resize(static_cast<size_t>(n));
      m.DequantizeRows(0, m.rows, values.data());
      src = values.data();
    }
    const void* host = src;
    if (type_ != GemmType::kFp32) {
      staging.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        staging[i] = type_ == GemmType::kBf16 ? kernels::FloatToBf16(src[i])
                                              : kernels::FloatToFp16(src[i]);
      }
      host = staging.data();
    }
    uint8_t* dst = mnext;
    mnext += n * elem;
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, host, n * elem, cudaMemcpyHostToDevice),
                            "cudaMemcpy (weights)");
    return dst;
  };
  auto put_float = [&](const float* src, int64_t n) -> absl::StatusOr<const float*> {
    if (src == nullptr) return nullptr;
    float* dst = fnext;
    fnext += n;
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, src, n * 4, cudaMemcpyHostToDevice),
                            "cudaMemcpy (weights)");
    return dst;
  };
  const model::ModelWeights& mw = model_.weights;
  KV_ASSIGN_OR_RETURN(embedding_, put_matrix(mw.token_embedding, V * H));
  if (cfg_.tied_embeddings || mw.lm_head.data == mw.token_embedding.data) {
    lm_head_ = embedding_;
  } else {
    KV_ASSIGN_OR_RETURN(lm_head_, put_matrix(mw.lm_head, V * H));
  }
  KV_ASSIGN_OR_RETURN(output_norm_, put_float(mw.output_norm, H));
  for (const model::LayerWeights& w : mw.layers) {
    LayerDeviceWeights l;
    KV_ASSIGN_OR_RETURN(l.wq, put_matrix(w.wq, qdim * H));
    KV_ASSIGN_OR_RETURN(l.wk, put_matrix(w.wk, kvdim * H));
    KV_ASSIGN_OR_RETURN(l.wv, put_matrix(w.wv, kvdim * H));
    // The fused passes multiply [wq; wk; wv] and [w_gate; w_up] as one matrix each.
    KV_CHECK(static_cast<const uint8_t*>(l.wk) == static_cast<const uint8_t*>(l.wq) + qdim * H * elem &&
             static_cast<const uint8_t*>(l.wv) == static_cast<const uint8_t*>(l.wk) + kvdim * H * elem);
    KV_ASSIGN_OR_RETURN(l.wo, put_matrix(w.wo, H * qdim));
    KV_ASSIGN_OR_RETURN(l.w_gate, put_matrix(w.w_gate, inter * H));
    KV_ASSIGN_OR_RETURN(l.w_up, put_matrix(w.w_up, inter * H));
    KV_CHECK(static_cast<const uint8_t*>(l.w_up) ==
             static_cast<const uint8_t*>(l.w_gate) + inter * H * elem);
    KV_ASSIGN_OR_RETURN(l.w_down, put_matrix(w.w_down, H * inter));
    KV_ASSIGN_OR_RETURN(l.attn_norm, put_float(w.attn_norm, H));
    KV_ASSIGN_OR_RETURN(l.ffn_norm, put_float(w.ffn_norm, H));
    KV_ASSIGN_OR_RETURN(l.bq, put_float(w.bq, qdim));
    KV_ASSIGN_OR_RETURN(l.bk, put_float(w.bk, kvdim));
    KV_ASSIGN_OR_RETURN(l.bv, put_float(w.bv, kvdim));
    KV_ASSIGN_OR_RETURN(l.q_norm, put_float(w.q_norm, d));
    KV_ASSIGN_OR_RETURN(l.k_norm, put_float(w.k_norm, d));
    layers_.push_back(l);
  }
  const int64_t per = int64_t{cfg_.num_layers} * cfg_.num_kv_heads * d * d;
  if (!rot_.identity) {
    KV_CUDA_RETURN_IF_ERROR(rotations_.Allocate(static_cast<size_t>(per) * 2 * 4),
                            "cudaMalloc (rotations)");
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(rotations_.as<float>(), rot_.k_rotation.data(), per * 4,
                                       cudaMemcpyHostToDevice),
                            "cudaMemcpy (rotations)");
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpy(rotations_.as<float>() + per, rot_.v_rotation.data(),
                                       per * 4, cudaMemcpyHostToDevice),
                            "cudaMemcpy (rotations)");
  }
  // Clips as DemotePages wants them: [layers][2][kv_heads].
  std::vector<float> clips(static_cast<size_t>(cfg_.num_layers) * 2 * cfg_.num_kv_heads, 1.0f);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    for (int h = 0; h < cfg_.num_kv_heads; ++h) {
      clips[(l * 2 + 0) * cfg_.num_kv_heads + h] = rot_.key_clip(l, h);
      clips[(l * 2 + 1) * cfg_.num_kv_heads + h] = rot_.value_clip(l, h);
    }
  }
  KV_CUDA_RETURN_IF_ERROR(clips_.Allocate(clips.size() * 4), "cudaMalloc (clips)");
  KV_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(clips_.as<float>(), clips.data(), clips.size() * 4, cudaMemcpyHostToDevice),
      "cudaMemcpy (clips)");
  return absl::OkStatus();
}

absl::Status CudaBackend::AllocateActivations() {
  const int64_t T = options_.max_step_tokens, H = cfg_.hidden_size, d = cfg_.head_dim;
  // Logits for every item, or every position of passes of up to 512 tokens (evaluation).
  max_logit_rows_ = static_cast<int>(std::max<int64_t>(options_.max_items, std::min<int64_t>(T, 512)));
  const int64_t qdim = int64_t{cfg_.num_heads} * d, kvdim = int64_t{cfg_.num_kv_heads} * d;
  const int64_t inter = cfg_.intermediate_size;
  struct {
    DeviceBuffer* b;
    int64_t bytes;
  } buffers[] = {{&x_, T * H * 4},          {&hn_, T * H * 4},         {&q_, T * qdim * 4},
                 {&qkv_, T * (qdim + 2 * kvdim) * 4},
                 {&k_, T * kvdim * 4},      {&v_, T * kvdim * 4},      {&qr_, T * qdim * 4},
                 {&attn_, T * qdim * 4},    {&o_, T * qdim * 4},       {&o_half_, T * qdim * 4},
                 {&gate_, T * 2 * inter * 4},   {&up_, T * inter * 4},     {&act_, T * inter * 4},
                 {&cos_, T * d / 2 * 4},    {&sin_, T * d / 2 * 4},    {&decode_q_, T * qdim * 4},
                 {&decode_q_half_, T * qdim * 2}, {&decode_out_, T * qdim * 4},
                 {&final_rows_, T * H * 4}, {&final_half_, T * H * 4},
                 {&logits_, int64_t{max_logit_rows_} * cfg_.vocab_size * 4}};
  for (auto& [b, bytes] : buffers) {
    if (cudaError_t e = b->Allocate(static_cast<size_t>(bytes)); e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", device_, ": cannot allocate the activations for ", T,
          " tokens per step (scheduler.max_step_tokens): ", cudaGetErrorString(e)));
    }
  }
  // The split decode workspace for the largest plan: every item a decode, every page history.
  const kernels::KvGeometry& g = cache_->geometry();
  const int64_t max_pages = (cfg_.max_context + g.page_tokens - 1) / g.page_tokens;
  const int64_t window = cache_->options().layout.sink_tokens / g.page_tokens +
                         (cache_->options().layout.recent_tokens + g.page_tokens - 1) /
                             g.page_tokens +
                         2;
  const int64_t rows = int64_t{options_.max_items} * cfg_.num_kv_heads *
                       (window + std::min<int64_t>(max_pages, 512)) * 8;
  max_split_workspace_ = rows * d * 4 + rows * 4;
  KV_CUDA_RETURN_IF_ERROR(split_workspace_.Allocate(static_cast<size_t>(max_split_workspace_)),
                          "cudaMalloc (split decode workspace)");
  // Metadata: per token 4 ints, per item and page a few more; sized generously.
  pinned_bytes_ = static_cast<size_t>(
      (T * 8 + int64_t{options_.max_items} * (max_pages * 6 + 64)) * 4 + 4096);
  KV_CUDA_RETURN_IF_ERROR(metadata_.Allocate(pinned_bytes_), "cudaMalloc (metadata)");
  KV_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_, pinned_bytes_), "cudaMallocHost");
  return absl::OkStatus();
}

absl::Status CudaBackend::Forward(const std::vector<ForwardItem>& batch,
                                  std::vector<float>* logits, ForwardObserver* observer) {
  if (observer != nullptr) {
    return absl::UnimplementedError(
        "the CUDA backend does not observe the forward pass; calibrate and evaluate on the CPU");
  }
  return Run(batch, nullptr, /*host_logits=*/true, logits, nullptr);
}

absl::Status CudaBackend::Run(const std::vector<ForwardItem>& batch,
                              const std::vector<const DeviceDraw*>* draws, bool host_logits,
                              std::vector<float>* logits, std::vector<DeviceSampled>* sampled) {
  const kernels::KvGeometry& geo = cache_->geometry();
  const int P = geo.page_tokens;
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
  if (T > options_.max_step_tokens || static_cast<int>(batch.size()) > options_.max_items) {
    return absl::InternalError(absl::StrCat("a forward pass of ", T, " tokens and ", batch.size(),
                                            " items exceeds the CUDA backend's buffers (",
                                            options_.max_step_tokens, " tokens, ",
                                            options_.max_items, " items)"));
  }
  KV_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  for (const ForwardItem& it : batch) {
    KV_RETURN_IF_ERROR(cache_->BeginAppend(*it.seq, it.pos0 + it.n));
  }

  // A decode step (one token per sequence, nothing but the last logits) runs as a CUDA graph
  // captured for its batch size: every array then sits at a fixed offset with room for the
  // largest sequence, and the launches are sized for it too.
  const int B = static_cast<int>(batch.size());
  bool graph = options_.decode_graphs;
  for (const ForwardItem& it : batch) graph = graph && it.n == 1 && !it.all_logits;
  const kernels::SplitLayout& layout = cache_->options().layout;
  const int max_pages = (cfg_.max_context + P - 1) / P;
  const int max_window = layout.sink_tokens / P + (layout.recent_tokens + P - 1) / P + 1;
  auto cap = [&](int64_t n) { return graph ? static_cast<size_t>(n) : size_t{0}; };

  // The pass's arrays, on the host.
  const bool split = cache_->split();
  const int64_t sink_pages = layout.sink_tokens / P;
  std::vector<int32_t> ids, positions, append_slot, append_row, demote_src, demote_dst;
  std::vector<int32_t> c_offset, c_len, c_pos0, c_indptr{0}, c_bf16, c_int2;
  std::vector<int32_t> d_rows, seg_indptr[3], seg_indices[3], seg_last[3];
  for (int s = 0; s < 3; ++s) seg_indptr[s].push_back(0);
  std::vector<int32_t> logit_rows, last_logit_row;
  int max_len = 0, max_history = 0, max_window_pages = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& it = batch[i];
    const SequenceKv& seq = *it.seq;
    const int64_t end = it.pos0 + it.n;
    for (int t = 0; t < it.n; ++t) {
      const int64_t pos = it.pos0 + t;
      ids.push_back(seq.tokens[pos]);
      positions.push_back(static_cast<int32_t>(pos));
      append_slot.push_back(seq.bf16_slot[pos / P]);
      append_row.push_back(static_cast<int32_t>(pos % P));
    }
    for (int64_t p = std::max(sink_pages, cache_->DemotedPagesEnd(it.pos0));
         p < cache_->DemotedPagesEnd(end); ++p) {
      demote_src.push_back(seq.bf16_slot[p]);
      demote_dst.push_back(seq.int2_slot[p]);
    }
    const int64_t pages = (end + P - 1) / P;
    if (it.n == 1) {
      // Split decode: the sink, the history and the recent window of the one query at end - 1.
      // In the BF16 format every page is BF16: the history is every full page after the sink.
      d_rows.push_back(offset[i]);
      const int64_t sink_end = std::min<int64_t>(sink_pages, pages);
      const int64_t hist_end =
          std::max(sink_end, split ? cache_->DemotedPagesEnd(end) : (end - 1) / P);
      auto last_len = [&](int64_t page_end) {
        return static_cast<int32_t>(std::min<int64_t>(P, end - (page_end - 1) * P));
      };
      for (int64_t p = 0; p < sink_end; ++p) seg_indices[0].push_back(seq.bf16_slot[p]);
      seg_last[0].push_back(sink_end > 0 ? last_len(sink_end) : P);
      for (int64_t p = sink_end; p < hist_end; ++p) {
        seg_indices[1].push_back(split ? seq.int2_slot[p] : seq.bf16_slot[p]);
      }
      seg_last[1].push_back(P);
      for (int64_t p = hist_end; p < pages; ++p) seg_indices[2].push_back(seq.bf16_slot[p]);
      seg_last[2].push_back(pages > hist_end ? last_len(pages) : P);
      for (int s = 0; s < 3; ++s) {
        seg_indptr[s].push_back(static_cast<int32_t>(seg_indices[s].size()));
      }
      max_history = std::max<int>(max_history, static_cast<int>(hist_end - sink_end));
      max_window_pages = std::max<int>(max_window_pages, static_cast<int>(sink_end + pages - hist_end));
    } else {
      c_offset.push_back(offset[i]);
      c_len.push_back(it.n);
      c_pos0.push_back(static_cast<int32_t>(it.pos0));
      for (int64_t p = 0; p < pages; ++p) {
        c_bf16.push_back(p < static_cast<int64_t>(seq.bf16_slot.size()) ? seq.bf16_slot[p] : -1);
        c_int2.push_back(p < static_cast<int64_t>(seq.int2_slot.size()) ? seq.int2_slot[p] : -1);
      }
      c_indptr.push_back(static_cast<int32_t>(c_bf16.size()));
      max_len = std::max(max_len, it.n);
    }
    if (it.all_logits) {
      for (int t = 0; t < it.n; ++t) logit_rows.push_back(offset[i] + t);
    } else {
      logit_rows.push_back(offset[i] + it.n - 1);
    }
    last_logit_row.push_back(static_cast<int32_t>(logit_rows.size()) - 1);
  }
  // Split decode is planned for a history length: the batch's longest, rounded up to
  // 1/graph_history_buckets of the model's context, so a step replays the graph of its bucket;
  // planning for the whole context would spread a short history over a grid sized for the
  // longest. Launched steps plan the same way, so a batch's tokens do not depend on whether
  // graphs are on (the split plan decides the order partials are summed in).
  const int buckets = options_.graph_history_buckets;
  const int bucket_step = std::max(1, (max_pages + buckets - 1) / buckets);
  const int history_bucket =
      std::min(max_pages, std::max(1, (max_history + bucket_step - 1) / bucket_step) * bucket_step);
  max_history = history_bucket;
  max_window_pages = max_window;
  if (graph) max_len = c_len.empty() ? 0 : 1;
  meta_.Clear();
  const std::vector<int32_t> demote_count = {static_cast<int32_t>(demote_src.size())};
  const int64_t o_ids = meta_.Add(ids, cap(B)), o_pos = meta_.Add(positions, cap(B));
  const int64_t o_aslot = meta_.Add(append_slot, cap(B)), o_arow = meta_.Add(append_row, cap(B));
  const int64_t o_dcount = meta_.Add(demote_count);
  const int64_t o_dsrc = meta_.Add(demote_src, cap(B)), o_ddst = meta_.Add(demote_dst, cap(B));
  const int64_t o_coff = meta_.Add(c_offset, cap(B)), o_clen = meta_.Add(c_len, cap(B));
  const int64_t o_cpos = meta_.Add(c_pos0, cap(B)), o_cptr = meta_.Add(c_indptr, cap(B + 1));
  const int64_t o_cbf = meta_.Add(c_bf16, cap(int64_t{B} * max_pages));
  const int64_t o_ci2 = meta_.Add(c_int2, cap(int64_t{B} * max_pages));
  const int64_t o_drows = meta_.Add(d_rows, cap(B)), o_logit = meta_.Add(logit_rows, cap(B));
  int64_t o_seg[3][3];
  for (int s = 0; s < 3; ++s) {
    o_seg[s][0] = meta_.Add(seg_indptr[s], cap(B + 1));
    o_seg[s][1] = meta_.Add(seg_indices[s], cap(int64_t{B} * max_pages));
    o_seg[s][2] = meta_.Add(seg_last[s], cap(B));
  }
  if (meta_.bytes().size() > pinned_bytes_) {
    return absl::InternalError(absl::StrCat("forward metadata of ", meta_.bytes().size(),
                                            " bytes exceeds the staging buffer"));
  }
  std::memcpy(pinned_, meta_.bytes().data(), meta_.bytes().size());
  KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(metadata_.as<uint8_t>(), pinned_, meta_.bytes().size(),
                                          cudaMemcpyHostToDevice, stream_),
                          "cudaMemcpyAsync (metadata)");
  const uint8_t* dm = metadata_.as<uint8_t>();
  auto dev = [&](int64_t at) { return reinterpret_cast<const int32_t*>(dm + at); };

  Plan plan;
  plan.tokens = T;
  plan.ids = dev(o_ids);
  plan.positions = dev(o_pos);
  plan.append_slot = dev(o_aslot);
  plan.append_row = dev(o_arow);
  plan.demote_pages = graph && split ? B : static_cast<int>(demote_src.size());
  plan.demote_count = graph ? dev(o_dcount) : nullptr;
  plan.demote_src = dev(o_dsrc);
  plan.demote_dst = dev(o_ddst);
  kernels::ChunkAttentionParams& c = plan.chunk;
  c.out = attn_.as<float>();
  c.num_q_heads = cfg_.num_heads;
  c.sm_scale = 1.0f / std::sqrt(static_cast<float>(cfg_.head_dim));
  c.geometry = geo;
  c.num_items = static_cast<int>(c_len.size());
  c.max_len = max_len;
  c.q_offset = dev(o_coff);
  c.len = dev(o_clen);
  c.pos0 = dev(o_cpos);
  c.page_indptr = dev(o_cptr);
  c.bf16_slot = dev(o_cbf);
  c.int2_slot = dev(o_ci2);
  c.bf16_pool = cache_->bf16_pool().base();
  c.bf16_stride = cache_->bf16_pool().slot_bytes();
  if (split) {
    c.int2_pool = cache_->int2_pool()->base();
    c.int2_stride = cache_->int2_pool()->slot_bytes();
  }
  c.int2_encoding = cache_->int2_encoding();
  c.split = split;
  c.sink_pages = static_cast<int>(sink_pages);
  c.recent_tokens = layout.recent_tokens;
  plan.decode_items = static_cast<int>(d_rows.size());
  plan.decode_rows = dev(o_drows);
  if (plan.decode_items > 0) {
    kernels::SplitDecodeCudaParams& d = plan.decode;
    d.q = decode_q_half_.as<uint16_t>();
    d.batch = plan.decode_items;
    d.num_q_heads = cfg_.num_heads;
    d.sm_scale = c.sm_scale;
    d.geometry = geo;
    const kernels::PageEncoding encodings[3] = {
        kernels::PageEncoding::kBf16,
        split ? cache_->int2_encoding() : kernels::PageEncoding::kBf16,
        kernels::PageEncoding::kBf16};
    for (int s = 0; s < 3; ++s) {
      kernels::PagedSegmentView& v = d.segments[s];
      const PagePool& pool = s == 1 && split ? *cache_->int2_pool() : cache_->bf16_pool();
      v.pool = pool.base();
      v.slot_stride = pool.slot_bytes();
      v.indptr = dev(o_seg[s][0]);
      v.indices = dev(o_seg[s][1]);
      v.last_page_len = dev(o_seg[s][2]);
      v.encoding = encodings[s];
    }
    d.out = decode_out_.as<float>();
    d.lse = nullptr;
    plan.decode_plan = kernels::PlanSplitDecode(plan.decode_items, cfg_.num_kv_heads,
                                                cfg_.head_dim, max_history, max_window_pages,
                                                num_sms_, decode_ctas_per_sm_, encodings[1]);
    if (plan.decode_plan.workspace_bytes > max_split_workspace_) {
      return absl::InternalError("split decode workspace too small for this batch");
    }
  }
  plan.logit_rows = static_cast<int>(logit_rows.size());
  if (plan.logit_rows > max_logit_rows_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a forward pass asking for ", plan.logit_rows, " rows of logits; the CUDA backend returns "
        "at most ", max_logit_rows_, " (evaluate all positions in chunks of at most 512 tokens)"));
  }
  plan.logit_row_ids = dev(o_logit);

  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream_), "cudaEventRecord");
  if (graph) {
    auto it = decode_graphs_.find({B, history_bucket});
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
      it = decode_graphs_.emplace(std::make_pair(B, history_bucket), exec).first;
    }
    KV_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
  } else {
    KV_RETURN_IF_ERROR(RunPass(plan));
  }
  if (draws != nullptr) {
    KV_RETURN_IF_ERROR(sampler_.Enqueue(logits_.as<float>(), cfg_.vocab_size, last_logit_row,
                                        *draws, stream_));
  }
  if (host_logits) {
    logits->resize(static_cast<size_t>(plan.logit_rows) * cfg_.vocab_size);
    KV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), logits_.as<float>(),
                                            logits->size() * sizeof(float),
                                            cudaMemcpyDeviceToHost, stream_),
                            "cudaMemcpyAsync (logits)");
  } else {
    logits->clear();
  }
  KV_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream_), "cudaEventRecord");
  KV_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the forward pass");
  float ms = 0.0f;
  KV_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
  timing_.device_seconds = ms * 1e-3;
  if (draws != nullptr) sampler_.Collect(*draws, sampled);
  for (const ForwardItem& it : batch) {
    KV_RETURN_IF_ERROR(cache_->EndAppend(*it.seq, it.pos0 + it.n));
  }
  return absl::OkStatus();
}

}  // namespace cuda_internal

absl::StatusOr<std::string> DescribeCudaDevice(int device) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no CUDA device is usable here (", cudaGetErrorString(e), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", device, " does not exist (this machine has ", count,
                     count == 1 ? " CUDA device)" : " CUDA devices)"));
  }
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("cuda:", device, ": cudaGetDeviceProperties: ", cudaGetErrorString(e)));
  }
  return absl::StrFormat("cuda:%d (%s, %.0f GiB, compute %d.%d)", device, prop.name,
                         static_cast<double>(prop.totalGlobalMem) / (1 << 30), prop.major,
                         prop.minor);
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const model::LoadedModel& model,
                                                           const RotationSet& rotations,
                                                           KvCache* cache,
                                                           const CudaBackendOptions& options) {
  KV_RETURN_IF_ERROR(DescribeCudaDevice(options.device).status());
  if (cache->host_memory()) {
    return absl::InvalidArgumentError(
        "the CUDA backend needs the KV cache in device page memory (DevicePageMemoryAllocator)");
  }
  if (cache->options().format == KvCacheFormat::kInt2LloydMax ||
      IsEvaluationFormat(cache->options().format)) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend serves the bf16 and int2 KV formats, not ",
        KvCacheFormatName(cache->options().format)));
  }
  const kernels::KvGeometry& g = cache->geometry();
  if (cache->split() && g.group_size != g.head_dim) {
    return absl::UnimplementedError(absl::StrCat(
        "the CUDA backend's INT2 kernels need kv_cache.group_size = head_dim (", g.head_dim,
        "), not ", g.group_size));
  }
  if (g.head_dim != 64 && g.head_dim != 128) {
    return absl::UnimplementedError(
        absl::StrCat("unsupported head_dim=", g.head_dim, " on CUDA (64 or 128)"));
  }
  if (model.config.num_heads / model.config.num_kv_heads > 8) {
    return absl::UnimplementedError("the CUDA decode kernel supports GQA groups of up to 8");
  }
  auto backend = std::make_unique<cuda_internal::CudaBackend>(model, rotations, cache, options);
  KV_RETURN_IF_ERROR(backend->Init());
  return backend;
}

}  // namespace kvstrata::engine

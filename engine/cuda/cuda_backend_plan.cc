// The CUDA backend's plan of one forward pass, built on the host: the batch's checks, the host
// arrays (tokens, positions, append slots, demotions, chunk page tables, split-decode segments,
// logit rows), their staging into one metadata copy, and the launches' parameters. Run
// (cuda_backend.cc) takes these steps in order; the launches are in cuda_backend_layers.cc.

#include <cmath>

#include "core/status_macros.h"
#include "engine/cuda/cuda_backend_internal.h"

namespace kvstrata::engine::cuda_internal {

absl::Status CudaBackend::CheckBatch(const std::vector<ForwardItem>& batch, HostPlan* host) const {
  int T = 0;
  KV_RETURN_IF_ERROR(CheckForwardBatch(batch, cfg_.vocab_size, &host->offset, &T));
  if (T > options_.max_step_tokens || static_cast<int>(batch.size()) > options_.max_items) {
    return absl::InternalError(absl::StrCat("a forward pass of ", T, " tokens and ", batch.size(),
                                            " items exceeds the CUDA backend's buffers (",
                                            options_.max_step_tokens, " tokens, ",
                                            options_.max_items, " items)"));
  }
  host->tokens = T;
  host->items = static_cast<int>(batch.size());
  return absl::OkStatus();
}

void CudaBackend::BuildHostArrays(const std::vector<ForwardItem>& batch, HostPlan* host) const {
  HostPlan& h = *host;
  const int P = cache_->geometry().page_tokens;
  const kernels::SplitLayout& layout = cache_->options().layout;
  const int64_t sink_pages = layout.sink_tokens / P;
  // A decode step (one token per sequence, nothing but the last logits) runs as a CUDA graph
  // captured for its batch size: every array then sits at a fixed offset with room for the
  // largest sequence, and the launches are sized for it too.
  h.graph = options_.decode_graphs;
  for (const ForwardItem& it : batch) h.graph = h.graph && it.n == 1 && !it.all_logits;
  h.max_pages = (cfg_.max_context + P - 1) / P;
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardItem& it = batch[i];
    const SequenceKv& seq = *it.seq;
    const int64_t end = it.pos0 + it.n;
    for (int t = 0; t < it.n; ++t) {
      const int64_t pos = it.pos0 + t;
      h.ids.push_back(seq.tokens[pos]);
      h.positions.push_back(static_cast<int32_t>(pos));
      h.append_slot.push_back(seq.bf16_slot[pos / P]);
      h.append_row.push_back(static_cast<int32_t>(pos % P));
    }
    for (int64_t p = std::max(sink_pages, cache_->DemotedPagesEnd(it.pos0));
         p < cache_->DemotedPagesEnd(end); ++p) {
      h.demote_src.push_back(seq.bf16_slot[p]);
      h.demote_dst.push_back(seq.int2_slot[p]);
    }
    if (it.n == 1) {
      AddDecodeSegments(seq, end, h.offset[i], &h);
    } else {
      const int64_t pages = (end + P - 1) / P;
      h.c_offset.push_back(h.offset[i]);
      h.c_len.push_back(it.n);
      h.c_pos0.push_back(static_cast<int32_t>(it.pos0));
      for (int64_t p = 0; p < pages; ++p) {
        h.c_bf16.push_back(p < static_cast<int64_t>(seq.bf16_slot.size()) ? seq.bf16_slot[p] : -1);
        h.c_int2.push_back(HistoryIndex(seq, p));
      }
      h.c_indptr.push_back(static_cast<int32_t>(h.c_bf16.size()));
      h.max_len = std::max(h.max_len, it.n);
    }
    if (it.all_logits) {
      for (int t = 0; t < it.n; ++t) h.logit_rows.push_back(h.offset[i] + t);
    } else {
      h.logit_rows.push_back(h.offset[i] + it.n - 1);
    }
    h.last_logit_row.push_back(static_cast<int32_t>(h.logit_rows.size()) - 1);
  }
  // Split decode is planned for a history length: the batch's longest, rounded up to
  // 1/graph_history_buckets of the model's context, so a step replays the graph of its bucket;
  // planning for the whole context would spread a short history over a grid sized for the
  // longest. Launched steps plan the same way, so a batch's tokens do not depend on whether
  // graphs are on (the split plan decides the order partials are summed in).
  const int max_window = layout.sink_tokens / P + (layout.recent_tokens + P - 1) / P + 1;
  const int buckets = options_.graph_history_buckets;
  const int bucket_step = std::max(1, (h.max_pages + buckets - 1) / buckets);
  h.history_bucket = std::min(
      h.max_pages, std::max(1, (h.max_history + bucket_step - 1) / bucket_step) * bucket_step);
  h.max_history = h.history_bucket;
  h.max_window_pages = max_window;
  if (h.graph) h.max_len = h.c_len.empty() ? 0 : 1;
}

void CudaBackend::AddDecodeSegments(const SequenceKv& seq, int64_t end, int row,
                                    HostPlan* host) const {
  // Split decode: the sink, the history and the recent window of the one query at end - 1.
  // In the BF16 format every page is BF16: the history is every full page after the sink.
  HostPlan& h = *host;
  const int P = cache_->geometry().page_tokens;
  const bool split = cache_->split();
  const int64_t sink_pages = cache_->options().layout.sink_tokens / P;
  const int64_t pages = (end + P - 1) / P;
  h.d_rows.push_back(row);
  const int64_t sink_end = std::min<int64_t>(sink_pages, pages);
  const int64_t hist_end = std::max(sink_end, split ? cache_->DemotedPagesEnd(end) : (end - 1) / P);
  auto last_len = [&](int64_t page_end) {
    return static_cast<int32_t>(std::min<int64_t>(P, end - (page_end - 1) * P));
  };
  for (int64_t p = 0; p < sink_end; ++p) h.seg_indices[0].push_back(seq.bf16_slot[p]);
  h.seg_last[0].push_back(sink_end > 0 ? last_len(sink_end) : P);
  for (int64_t p = sink_end; p < hist_end; ++p) {
    h.seg_indices[1].push_back(split ? HistoryIndex(seq, p) : seq.bf16_slot[p]);
  }
  h.seg_last[1].push_back(P);
  for (int64_t p = hist_end; p < pages; ++p) h.seg_indices[2].push_back(seq.bf16_slot[p]);
  h.seg_last[2].push_back(pages > hist_end ? last_len(pages) : P);
  for (int s = 0; s < 3; ++s) {
    h.seg_indptr[s].push_back(static_cast<int32_t>(h.seg_indices[s].size()));
  }
  h.max_history = std::max<int>(h.max_history, static_cast<int>(hist_end - sink_end));
  h.max_window_pages =
      std::max<int>(h.max_window_pages, static_cast<int>(sink_end + pages - hist_end));
}

int32_t CudaBackend::HistoryIndex(const SequenceKv& seq, int64_t page) const {
  if (!cache_->split()) return -1;
  if (page < static_cast<int64_t>(seq.int2_slot.size()) && seq.int2_slot[page] >= 0) {
    return static_cast<int32_t>(int64_t{seq.int2_slot[page]} *
                                (cache_->int2_pool()->slot_bytes() / kHistoryUnitBytes));
  }
  if (page < static_cast<int64_t>(seq.int2_in_place.size()) &&
      seq.int2_in_place[page].bytes != nullptr) {
    // Within reach: KvCache imported it only where page_access_->CanReadInPlace.
    return static_cast<int32_t>((seq.int2_in_place[page].bytes - cache_->int2_pool()->base()) /
                                kHistoryUnitBytes);
  }
  return -1;
}

absl::Status CudaBackend::StageMetadata(const HostPlan& h, Plan* plan) {
  const int B = h.items;
  // A graph step gives every array its room for the largest batch of B items.
  auto cap = [&](int64_t n) { return h.graph ? static_cast<size_t>(n) : size_t{0}; };
  meta_.Clear();
  const int32_t demote_count[1] = {static_cast<int32_t>(h.demote_src.size())};
  const int64_t o_ids = meta_.Add(h.ids, cap(B)), o_pos = meta_.Add(h.positions, cap(B));
  const int64_t o_aslot = meta_.Add(h.append_slot, cap(B));
  const int64_t o_arow = meta_.Add(h.append_row, cap(B));
  const int64_t o_dcount = meta_.Add(demote_count);
  const int64_t o_dsrc = meta_.Add(h.demote_src, cap(B)), o_ddst = meta_.Add(h.demote_dst, cap(B));
  const int64_t o_coff = meta_.Add(h.c_offset, cap(B)), o_clen = meta_.Add(h.c_len, cap(B));
  const int64_t o_cpos = meta_.Add(h.c_pos0, cap(B)), o_cptr = meta_.Add(h.c_indptr, cap(B + 1));
  const int64_t o_cbf = meta_.Add(h.c_bf16, cap(int64_t{B} * h.max_pages));
  const int64_t o_ci2 = meta_.Add(h.c_int2, cap(int64_t{B} * h.max_pages));
  const int64_t o_drows = meta_.Add(h.d_rows, cap(B)), o_logit = meta_.Add(h.logit_rows, cap(B));
  int64_t o_seg[3][3];
  for (int s = 0; s < 3; ++s) {
    o_seg[s][0] = meta_.Add(h.seg_indptr[s], cap(B + 1));
    o_seg[s][1] = meta_.Add(h.seg_indices[s], cap(int64_t{B} * h.max_pages));
    o_seg[s][2] = meta_.Add(h.seg_last[s], cap(B));
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
  plan->tokens = h.tokens;
  plan->ids = dev(o_ids);
  plan->positions = dev(o_pos);
  plan->append_slot = dev(o_aslot);
  plan->append_row = dev(o_arow);
  plan->demote_pages = h.graph && cache_->split() ? B : static_cast<int>(h.demote_src.size());
  plan->demote_count = h.graph ? dev(o_dcount) : nullptr;
  plan->demote_src = dev(o_dsrc);
  plan->demote_dst = dev(o_ddst);
  kernels::ChunkAttentionParams& c = plan->chunk;
  c.q_offset = dev(o_coff);
  c.len = dev(o_clen);
  c.pos0 = dev(o_cpos);
  c.page_indptr = dev(o_cptr);
  c.bf16_slot = dev(o_cbf);
  c.int2_slot = dev(o_ci2);
  plan->decode_rows = dev(o_drows);
  for (int s = 0; s < 3; ++s) {
    kernels::PagedSegmentView& v = plan->decode.segments[s];
    v.indptr = dev(o_seg[s][0]);
    v.indices = dev(o_seg[s][1]);
    v.last_page_len = dev(o_seg[s][2]);
  }
  plan->logit_row_ids = dev(o_logit);
  return absl::OkStatus();
}

void CudaBackend::PlanChunkAttention(const HostPlan& h, Plan* plan) const {
  const kernels::KvGeometry& geo = cache_->geometry();
  const kernels::SplitLayout& layout = cache_->options().layout;
  const bool split = cache_->split();
  kernels::ChunkAttentionParams& c = plan->chunk;
  c.out = attn_.as<float>();
  c.num_q_heads = cfg_.num_heads;
  c.sm_scale = 1.0f / std::sqrt(static_cast<float>(cfg_.head_dim));
  c.geometry = geo;
  c.num_items = static_cast<int>(h.c_len.size());
  c.max_len = h.max_len;
  c.bf16_pool = cache_->bf16_pool().base();
  c.bf16_stride = cache_->bf16_pool().slot_bytes();
  if (split) {
    c.int2_pool = cache_->int2_pool()->base();
    c.int2_stride = kHistoryUnitBytes;  // HistoryIndex's units
  }
  c.int2_encoding = cache_->int2_encoding();
  if (codec_fragment_) std::memcpy(c.fragment_levels, fragment_levels_, sizeof(fragment_levels_));
  c.split = split;
  c.sink_pages = static_cast<int>(layout.sink_tokens / geo.page_tokens);
  c.recent_tokens = layout.recent_tokens;
}

kernels::SplitDecodeVariant CudaBackend::AttentionVariant() const {
  kernels::SplitDecodeVariant variant;
  variant.int2_quick_start = options_.int2_quick_start;
  variant.int2_slots_ahead = options_.int2_slots_ahead;
  // Safe: before its wait the split decode reads only history pages, and nothing in a pass
  // writes them once the pass has begun (Layer: the launch just before it is the query gather,
  // which writes no page and waits for the demotion before it; or, with fused_kv_writes, the
  // per-head launch, whose page writes are window rows, read by window CTAs after their wait,
  // the demotion having run at the pass's start).
  variant.early_launch = options_.early_launches;
  variant.window_pages_per_cta = options_.window_pages_per_cta;
  variant.merge_early_loads = options_.merge_early_loads;
  if (!options_.int2_int8_keys) variant.int2_int8_keys_min_pages = 1 << 30;  // fp16 pairs only
  return variant;
}

absl::Status CudaBackend::PlanDecodeAttention(const HostPlan& h, Plan* plan) const {
  plan->decode_items = static_cast<int>(h.d_rows.size());
  if (plan->decode_items == 0) return absl::OkStatus();
  const bool split = cache_->split();
  kernels::SplitDecodeCudaParams& d = plan->decode;
  d.q = decode_q_half_.as<uint16_t>();
  d.batch = plan->decode_items;
  d.num_q_heads = cfg_.num_heads;
  d.sm_scale = plan->chunk.sm_scale;
  d.geometry = cache_->geometry();
  const kernels::PageEncoding encodings[3] = {
      kernels::PageEncoding::kBf16,
      split ? cache_->int2_encoding() : kernels::PageEncoding::kBf16,
      kernels::PageEncoding::kBf16,
  };
  for (int s = 0; s < 3; ++s) {
    kernels::PagedSegmentView& v = d.segments[s];
    const PagePool& pool = s == 1 && split ? *cache_->int2_pool() : cache_->bf16_pool();
    v.pool = pool.base();
    v.slot_stride = s == 1 && split ? kHistoryUnitBytes : pool.slot_bytes();  // HistoryIndex
    v.encoding = encodings[s];
  }
  d.out = decode_out_.as<float>();
  d.lse = nullptr;
  kernels::SplitDecodeVariant variant = AttentionVariant();
  variant.dependents_at_start = LaunchAhead(*plan);
  plan->decode_plan = kernels::PlanSplitDecode(plan->decode_items, cfg_.num_kv_heads, cfg_.head_dim,
                                               h.max_history, h.max_window_pages, num_sms_,
                                               decode_ctas_per_sm_, encodings[1], variant);
  if (plan->decode_plan.workspace_bytes > max_split_workspace_) {
    return absl::InternalError("split decode workspace too small for this batch");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::PlanLogits(const HostPlan& h, Plan* plan) const {
  plan->logit_rows = static_cast<int>(h.logit_rows.size());
  if (plan->logit_rows > max_logit_rows_) {
    return absl::InvalidArgumentError(
        absl::StrCat("a forward pass asking for ", plan->logit_rows,
                     " rows of logits; the CUDA backend returns at most ", max_logit_rows_,
                     " (evaluate all positions in chunks of at most 512 tokens)"));
  }
  return absl::OkStatus();
}

}  // namespace kvstrata::engine::cuda_internal

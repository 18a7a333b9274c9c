#include "calibration/fidelity_engine.h"

#include <algorithm>

namespace kvstrata::calibration {

absl::StatusOr<std::unique_ptr<engine::Engine>> CreateFidelityEngine(
    std::shared_ptr<const model::LoadedModel> model, engine::KvCacheFormat format,
    const kernels::SplitLayout& layout, int group_size, const std::string& rotations_path,
    int64_t max_tokens, int chunk, int cpu_threads,
    std::shared_ptr<const kernels::HistoryCodec> codec) {
  const model::ModelConfig& c = model->config;
  kernels::KvGeometry g{c.num_layers, c.num_kv_heads, c.head_dim,
                        group_size > 0 ? group_size : c.head_dim, layout.page_tokens};
  const int64_t P = layout.page_tokens;
  const int64_t pages = (max_tokens + P - 1) / P;
  // BF16: every page, or the split layout's working set (sink, recent window, one chunk);
  // history: every page. Untouched slots cost address space only.
  const int64_t bf16_pages =
      pages + layout.sink_tokens / P + (layout.recent_tokens + P + chunk) / P + 2;
  engine::EngineOptions o;
  o.rotations_path = rotations_path;
  o.kv_cache.format = format;

  o.kv_cache.layout = layout;
  o.kv_cache.group_size = group_size;
  o.kv_cache.max_sequences = 1;
  o.kv_cache.max_chunk_tokens = chunk;
  // A history block of the codec format is never larger than a BF16 one (kernels/codec_page.h).
  const int64_t history_block = format == engine::KvCacheFormat::kCodec
                                    ? kernels::BlockBytes(g, kernels::PageEncoding::kBf16)
                                    : engine::HistoryBlockBytes(format, g, 0, 0, codec.get());
  o.kv_cache.capacity_bytes =
      bf16_pages * kernels::PageBytes(g, kernels::PageEncoding::kBf16) +
      (pages + 1) * (kernels::kPageHeaderBytes + kernels::NumBlocks(g) * history_block);
  o.scheduler.max_running = 1;
  o.scheduler.max_waiting = 1;
  o.scheduler.prefill_chunk = chunk;
  o.scheduler.max_step_tokens = std::max(chunk, 1);
  o.cpu_threads = cpu_threads;
  o.kv_cache.codec = std::move(codec);
  return engine::Engine::Create(std::move(model), o);
}

}  // namespace kvstrata::calibration

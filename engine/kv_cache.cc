#include "engine/kv_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/page_format.h"
#include "core/status_macros.h"
#include "kernels/baselines.h"
#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "kernels/quant.h"

namespace kvstrata::engine {

namespace {

class HostPageMemory final : public PageMemory {
 public:
  explicit HostPageMemory(int64_t bytes)
      : size_(bytes),
        data_(static_cast<uint8_t*>(
            std::aligned_alloc(256, std::max<int64_t>(256, (bytes + 255) / 256 * 256)))) {}
  ~HostPageMemory() override { std::free(data_); }
  uint8_t* data() override { return data_; }
  int64_t size() const override { return size_; }

 private:
  int64_t size_;
  uint8_t* data_;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr KvCacheFormat kAllFormats[] = {
    KvCacheFormat::kBf16,      KvCacheFormat::kInt2,       KvCacheFormat::kInt2LloydMax,
    KvCacheFormat::kCodec,     KvCacheFormat::kEvalFp8,    KvCacheFormat::kEvalInt4,
    KvCacheFormat::kEvalKivi2, KvCacheFormat::kEvalTurbo3, KvCacheFormat::kEvalCodec};

// The seed of turbo3's random rotation for one (layer, K|V, head): fixed, so a page's stored
// values depend on its tokens only.
uint64_t Turbo3Seed(int layer, int kind, int head) {
  return 0x7475726230ull + (uint64_t(layer) * 2 + uint64_t(kind)) * 1000003ull + uint64_t(head);
}

}  // namespace

bool IsEvaluationFormat(KvCacheFormat format) {
  switch (format) {
    case KvCacheFormat::kBf16:
    case KvCacheFormat::kInt2:
    case KvCacheFormat::kInt2LloydMax:
    case KvCacheFormat::kCodec:
      return false;
    case KvCacheFormat::kEvalFp8:
    case KvCacheFormat::kEvalInt4:
    case KvCacheFormat::kEvalKivi2:
    case KvCacheFormat::kEvalTurbo3:
    case KvCacheFormat::kEvalCodec:
      return true;
  }
  return false;
}

int64_t HistoryBlockBytes(KvCacheFormat format, const kernels::KvGeometry& g, int layer, int kind,
                          const kernels::HistoryCodec* codec) {
  if (format == KvCacheFormat::kCodec) {
    const kernels::SideRecipe& r = codec->Side(layer, kind);
    return r.uniform_levels ? kernels::CodecFragmentBlockLayoutFor(r).bytes
                            : kernels::CodecBlockLayoutFor(r, g.page_tokens).bytes;
  }
  if (format == KvCacheFormat::kEvalCodec) {
    return int64_t{g.page_tokens} * (g.head_dim + kernels::kCodecBiasTerms) * 4;
  }
  if (IsEvaluationFormat(format)) return int64_t{g.page_tokens} * g.head_dim * 4;
  const kernels::PageEncoding e = format == KvCacheFormat::kInt2LloydMax
                                      ? kernels::PageEncoding::kInt2LloydMax
                                      : kernels::PageEncoding::kInt2Uniform;
  return kernels::BlockBytes(g, e);
}

void EncodeHistoryBlock(KvCacheFormat format, const kernels::KvGeometry& g, const float* rows,
                        int layer, int kind, int head, float clip_ratio, uint8_t* block,
                        const kernels::HistoryCodec* codec) {
  const int d = g.head_dim, n = g.page_tokens;
  float* out = reinterpret_cast<float*>(block);
  switch (format) {
    case KvCacheFormat::kBf16:
      return;  // no history
    case KvCacheFormat::kInt2:
      kernels::EncodeInt2Block(rows, n, g, clip_ratio, kernels::PageEncoding::kInt2Uniform, kind,
                               block);
      return;
    case KvCacheFormat::kInt2LloydMax:
      kernels::EncodeInt2Block(rows, n, g, clip_ratio, kernels::PageEncoding::kInt2LloydMax, kind,
                               block);
      return;
    case KvCacheFormat::kCodec:
      if (codec->Side(layer, kind).uniform_levels) {
        kernels::EncodeCodecFragmentBlock(rows, d, codec->Side(layer, kind), kind, block);
      } else {
        kernels::EncodeCodecBlock(rows, n, d, codec->Side(layer, kind), block);
      }
      return;
    case KvCacheFormat::kEvalFp8:
      kernels::FakeQuantFp8E4M3(rows, n, d, out);
      return;
    case KvCacheFormat::kEvalInt4:
      kernels::FakeQuantInt4(rows, n, d, g.group_size, out);
      return;
    case KvCacheFormat::kEvalKivi2:
      // The page is KIVI's token group: a whole page leaves the recent window at once.
      if (kind == 0) {
        kernels::FakeQuantKivi2Keys(rows, n, d, /*token_group=*/n, /*residual=*/0, out);
      } else {
        kernels::FakeQuantKivi2Values(rows, n, d, g.group_size, /*token_group=*/n,
                                      /*residual=*/0, out);
      }
      return;
    case KvCacheFormat::kEvalTurbo3:
      kernels::FakeQuantTurbo3(rows, n, d, Turbo3Seed(layer, kind, head), out);
      return;
    case KvCacheFormat::kEvalCodec:
      kernels::FakeQuantSide(rows, n, d, g.group_size, codec->Side(layer, kind), clip_ratio,
                             Turbo3Seed(layer, kind, head), out, out + int64_t{n} * d);
      return;
  }
}

void DecodeHistoryBlock(KvCacheFormat format, const kernels::KvGeometry& g, const uint8_t* block,
                        int num_tokens, int layer, int kind, float* rows,
                        const kernels::HistoryCodec* codec) {
  switch (format) {
    case KvCacheFormat::kBf16:
      return;
    case KvCacheFormat::kInt2:
      kernels::DecodeInt2Block(block, num_tokens, g, kernels::PageEncoding::kInt2Uniform, kind,
                               rows);
      return;
    case KvCacheFormat::kInt2LloydMax:
      kernels::DecodeInt2Block(block, num_tokens, g, kernels::PageEncoding::kInt2LloydMax, kind,
                               rows);
      return;
    case KvCacheFormat::kCodec:
      if (codec->Side(layer, kind).uniform_levels) {
        kernels::DecodeCodecFragmentBlock(block, num_tokens, g.head_dim, codec->Side(layer, kind),
                                          kind, rows);
      } else {
        kernels::DecodeCodecBlock(block, num_tokens, g.page_tokens, g.head_dim,
                                  codec->Side(layer, kind), rows);
      }
      return;
    case KvCacheFormat::kEvalFp8:
    case KvCacheFormat::kEvalInt4:
    case KvCacheFormat::kEvalKivi2:
    case KvCacheFormat::kEvalTurbo3:
    case KvCacheFormat::kEvalCodec:
      std::memcpy(rows, block, static_cast<size_t>(num_tokens) * g.head_dim * sizeof(float));
      return;
  }
}

double HistoryBitsPerElement(KvCacheFormat format, const kernels::KvGeometry& g,
                             const kernels::HistoryCodec* codec) {
  const int d = g.head_dim, group = g.group_size > 0 ? g.group_size : g.head_dim;
  switch (format) {
    case KvCacheFormat::kBf16:
      return 16.0;
    case KvCacheFormat::kInt2:
    case KvCacheFormat::kInt2LloydMax:
      return kernels::Int2HistoryBitsPerElement(group);
    case KvCacheFormat::kEvalFp8:
      return kernels::Fp8E4M3BitsPerElement(d);
    case KvCacheFormat::kEvalInt4:
      return kernels::Int4BitsPerElement(group);
    case KvCacheFormat::kEvalKivi2:
      // K: fp16 scale and offset per channel per page of tokens; V: per token per group.
      return 2.0 + 0.5 * (32.0 / g.page_tokens + 32.0 / group);
    case KvCacheFormat::kEvalTurbo3:
      return kernels::Turbo3BitsPerElement(d);
    case KvCacheFormat::kCodec:
    case KvCacheFormat::kEvalCodec:
      return codec == nullptr ? 0.0 : kernels::HistoryCodecBits(*codec, g.num_layers, d, group);
  }
  return 0.0;
}

double SequenceBitsPerElement(KvCacheFormat format, const kernels::SplitLayout& layout,
                              const kernels::KvGeometry& g, int64_t n,
                              const kernels::HistoryCodec* codec) {
  if (n <= 0) return 0.0;
  kernels::SplitSegments s;
  if (format == KvCacheFormat::kBf16) {
    s.sink = n;
  } else {
    s = kernels::SegmentsAt(layout, n);
  }
  const double elements_per_token = static_cast<double>(kernels::NumBlocks(g)) * g.head_dim;
  const double bits = elements_per_token * (static_cast<double>(s.sink + s.recent) * 16.0 +
                                            static_cast<double>(s.history) *
                                                HistoryBitsPerElement(format, g, codec)) +
                      8.0 * kernels::kPageHeaderBytes * CeilDiv(n, layout.page_tokens);
  return bits / (elements_per_token * static_cast<double>(n));
}

const char* KvCacheFormatName(KvCacheFormat format) {
  switch (format) {
    case KvCacheFormat::kBf16:
      return "bf16";
    case KvCacheFormat::kInt2:
      return "int2";
    case KvCacheFormat::kInt2LloydMax:
      return "int2-lloyd-max";
    case KvCacheFormat::kCodec:
      return "codec";
    case KvCacheFormat::kEvalFp8:
      return "eval-fp8";
    case KvCacheFormat::kEvalInt4:
      return "eval-int4";
    case KvCacheFormat::kEvalKivi2:
      return "eval-kivi2";
    case KvCacheFormat::kEvalTurbo3:
      return "eval-turbo3";
    case KvCacheFormat::kEvalCodec:
      return "eval-codec";
  }
  return "unknown";
}

absl::StatusOr<KvCacheFormat> ParseKvCacheFormat(const std::string& name, bool allow_evaluation) {
  for (KvCacheFormat f : kAllFormats) {
    if (name == KvCacheFormatName(f) && (allow_evaluation || !IsEvaluationFormat(f))) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown KV format \"", name, "\" (bf16, int2, int2-lloyd-max, codec",
      allow_evaluation ? ", eval-fp8, eval-int4, eval-kivi2, eval-turbo3, eval-codec" : "", ")"));
}

std::unique_ptr<PageMemory> AllocateHostPageMemory(int64_t bytes) {
  return std::make_unique<HostPageMemory>(bytes);
}

absl::Status PageMemory::Write(int64_t offset, const void* src, int64_t n) {
  std::memcpy(data() + offset, src, static_cast<size_t>(n));
  return absl::OkStatus();
}

absl::Status PageMemory::Read(int64_t offset, void* dst, int64_t n) const {
  std::memcpy(dst, const_cast<PageMemory*>(this)->data() + offset, static_cast<size_t>(n));
  return absl::OkStatus();
}

PagePool::PagePool(std::shared_ptr<PageMemory> memory, int64_t offset, int64_t bytes,
                   int64_t slot_bytes)
    : memory_(std::move(memory)),
      offset_(offset),
      base_(memory_->data() + offset),
      slot_bytes_(slot_bytes),
      num_slots_(bytes / slot_bytes) {
  free_.reserve(num_slots_);
  for (int64_t s = num_slots_ - 1; s >= 0; --s) free_.push_back(static_cast<int32_t>(s));
}

absl::Status PagePool::Write(int32_t s, int64_t offset, const void* src, int64_t n) {
  return memory_->Write(offset_ + int64_t{s} * slot_bytes_ + offset, src, n);
}

absl::Status PagePool::Read(int32_t s, int64_t offset, void* dst, int64_t n) const {
  return memory_->Read(offset_ + int64_t{s} * slot_bytes_ + offset, dst, n);
}

std::optional<int32_t> PagePool::Allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t s = free_.back();
  free_.pop_back();
  return s;
}

void PagePool::Free(int32_t slot) { free_.push_back(slot); }

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const kernels::KvGeometry& geometry,
                                                         const KvCacheOptions& options) {
  kernels::KvGeometry g = geometry;
  KvCacheOptions o = options;
  if (o.group_size == 0) o.group_size = g.head_dim;
  g.group_size = o.group_size;
  g.page_tokens = o.layout.page_tokens;
  KV_RETURN_IF_ERROR(ValidateGeometry(g, kernels::PageEncoding::kInt2Uniform));
  if (o.layout.page_tokens != 64) {
    return absl::InvalidArgumentError("page_tokens must be 64 (the page format's page size)");
  }
  if (o.layout.sink_tokens < 0 || o.layout.sink_tokens % o.layout.page_tokens != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sink_tokens=", o.layout.sink_tokens, " must be a multiple of the page size"));
  }
  if (o.layout.recent_tokens < 1) {
    return absl::InvalidArgumentError("recent_tokens must be at least 1");
  }
  if ((o.format == KvCacheFormat::kEvalCodec || o.format == KvCacheFormat::kCodec) &&
      o.codec == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(KvCacheFormatName(o.format), " needs KvCacheOptions::codec"));
  }
  if (o.format == KvCacheFormat::kCodec) {
    // Uniform levels (u) are served as codec fragment blocks, Lloyd-Max levels as codec blocks:
    // one page encoding per cache, so every recipe of the codec takes the same one.
    const bool fragments = o.codec->Side(0, 0).uniform_levels;
    for (int layer = 0; layer < g.num_layers; ++layer) {
      for (int kind = 0; kind < 2; ++kind) {
        const kernels::SideRecipe& r = o.codec->Side(layer, kind);
        const std::string why =
            r.uniform_levels != fragments
                ? std::string("a served codec's recipes all code uniform levels (u) or none does")
            : fragments ? kernels::CodecFragmentRecipeUnservable(r, g.head_dim)
                        : kernels::CodecRecipeUnservable(r, g.head_dim);
        if (!why.empty()) {
          return absl::InvalidArgumentError(
              absl::StrCat("codec: layer ", layer, kind == 0 ? " keys" : " values", ": ", why));
        }
      }
    }
  }
  if (o.max_sequences < 1 || o.max_chunk_tokens < 1) {
    return absl::InvalidArgumentError("max_sequences and max_chunk_tokens must be positive");
  }
  const size_t clips = static_cast<size_t>(g.num_layers) * g.num_kv_heads;
  if ((!o.demotion_key_clip.empty() || !o.demotion_value_clip.empty()) &&
      (o.demotion_key_clip.size() != clips || o.demotion_value_clip.size() != clips)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "demotion clips: ", o.demotion_key_clip.size(), " key and ", o.demotion_value_clip.size(),
        " value ratios for ", clips, " (layer, KV head) pairs"));
  }
  std::unique_ptr<KvCache> cache(new KvCache(g, o));
  // The history page: after the header, every block in (layer, K|V, head) order.
  int64_t at = kernels::kPageHeaderBytes;
  for (int layer = 0; layer < g.num_layers; ++layer) {
    for (int kind = 0; kind < 2; ++kind) {
      const int64_t b = HistoryBlockBytes(o.format, g, layer, kind, o.codec.get());
      cache->history_block_offset_.push_back(at);
      cache->history_block_bytes_.push_back(b);
      at += b * g.num_kv_heads;
    }
  }
  cache->history_page_bytes_ = at;
  const int64_t bf16_bytes = kernels::PageBytes(g, kernels::PageEncoding::kBf16);
  int64_t bf16_budget = o.capacity_bytes;
  if (cache->split()) {
    // BF16 pages are the working set: sink + recent window + one chunk, per sequence. When the
    // working set of max_sequences does not fit in the capacity it would leave no room for INT2
    // history, which is what long prompts need: then it gets half the capacity (but always one
    // sequence's worth), and admission is bounded by free pages as usual.
    const int64_t per_seq = cache->Bf16SlotsNeeded(std::numeric_limits<int32_t>::max());
    const int64_t working_set = per_seq * o.max_sequences * bf16_bytes;
    bf16_budget =
        std::min(o.capacity_bytes, working_set < o.capacity_bytes
                                       ? working_set
                                       : std::max(per_seq * bf16_bytes, o.capacity_bytes / 2));
  }
  if (bf16_budget < bf16_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache capacity ", o.capacity_bytes,
                                                   " bytes is below one page (", bf16_bytes, ")"));
  }
  // One arena: the BF16 pool, then (split formats) the history pool from a 256-byte boundary.
  const int64_t int2_bytes = cache->history_page_bytes_;
  const int64_t bf16_pool_bytes = bf16_budget / bf16_bytes * bf16_bytes;
  const int64_t int2_offset = (bf16_pool_bytes + 255) / 256 * 256;
  const int64_t rest =
      cache->split() ? std::max<int64_t>(int2_bytes, o.capacity_bytes - bf16_budget) : 0;
  const int64_t arena_bytes = cache->split() ? int2_offset + rest : bf16_pool_bytes;
  std::shared_ptr<PageMemory> arena;
  if (o.allocate_page_memory) {
    absl::StatusOr<std::unique_ptr<PageMemory>> m = o.allocate_page_memory(arena_bytes);
    if (!m.ok()) return m.status();
    arena = *std::move(m);
  } else {
    arena = AllocateHostPageMemory(arena_bytes);
  }
  cache->bf16_pool_ = std::make_unique<PagePool>(arena, 0, bf16_pool_bytes, bf16_bytes);
  if (cache->split()) {
    cache->int2_pool_ = std::make_unique<PagePool>(arena, int2_offset, rest, int2_bytes);
  }
  return cache;
}

kernels::PageEncoding KvCache::int2_encoding() const {
  if (options_.format == KvCacheFormat::kCodec) {
    return options_.codec->Side(0, 0).uniform_levels ? kernels::PageEncoding::kCodecFragment
                                                     : kernels::PageEncoding::kCodec;
  }
  return options_.format == KvCacheFormat::kInt2LloydMax ? kernels::PageEncoding::kInt2LloydMax
                                                         : kernels::PageEncoding::kInt2Uniform;
}

int64_t KvCache::HistoryBlockOffset(int layer, int kind, int head) const {
  const int i = layer * 2 + kind;
  return history_block_offset_[i] + head * history_block_bytes_[i];
}

void KvCache::DecodeHistoryPage(const uint8_t* page, float* kv) const {
  const int64_t rows = int64_t{geometry_.page_tokens} * geometry_.head_dim;
  for (int layer = 0; layer < geometry_.num_layers; ++layer) {
    for (int kind = 0; kind < 2; ++kind) {
      for (int h = 0; h < geometry_.num_kv_heads; ++h) {
        const int64_t b = (int64_t{layer} * 2 + kind) * geometry_.num_kv_heads + h;
        DecodeHistoryBlock(options_.format, geometry_, page + HistoryBlockOffset(layer, kind, h),
                           geometry_.page_tokens, layer, kind, kv + b * rows, options_.codec.get());
      }
    }
  }
}

int64_t KvCache::DemotedPagesEnd(int64_t n) const {
  if (!split()) return 0;
  const kernels::SplitSegments s = kernels::SegmentsAt(options_.layout, n);
  return (s.sink + s.history) / options_.layout.page_tokens;
}

int64_t KvCache::FirstInt2Query(int64_t page) const {
  const int64_t P = options_.layout.page_tokens;
  if (!split() || page < options_.layout.sink_tokens / P)
    return std::numeric_limits<int64_t>::max();
  // Page p is history for a query seeing n tokens once n >= (p+1)*P + recent_tokens.
  return (page + 1) * P + options_.layout.recent_tokens - 1;
}

int64_t KvCache::Bf16SlotsNeeded(int64_t total_tokens) const {
  const int64_t P = options_.layout.page_tokens;
  const int64_t pages = CeilDiv(total_tokens, P);
  if (!split()) return pages;
  // sink + the pages that may hold BF16 at once: the recent window (< recent + P tokens),
  // plus a chunk appended before the pages it demotes are freed, plus a partial page each side.
  const int64_t working =
      options_.layout.sink_tokens / P +
      CeilDiv(options_.layout.recent_tokens + P - 1 + options_.max_chunk_tokens, P) + 1;
  return std::min(pages, working);
}

int64_t KvCache::Int2SlotsNeeded(int64_t total_tokens) const {
  if (!split()) return 0;
  return std::max<int64_t>(
      0, DemotedPagesEnd(total_tokens) - options_.layout.sink_tokens / options_.layout.page_tokens);
}

int64_t KvCache::free_int2_slots() const {
  return int2_pool_ ? int2_pool_->num_slots() - reserved_int2_ : 0;
}

absl::Status KvCache::Reserve(SequenceKv& seq, int64_t total_tokens) {
  const int64_t need_bf16 = Bf16SlotsNeeded(total_tokens);
  const int64_t need_int2 = Int2SlotsNeeded(total_tokens);
  const int64_t cap_int2 = int2_pool_ ? int2_pool_->num_slots() : 0;
  if (need_bf16 > bf16_pool_->num_slots() || need_int2 > cap_int2) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sequence of ", total_tokens, " tokens needs ", need_bf16, " BF16 and ",
                     need_int2, " INT2 pages but the KV cache holds only ", bf16_pool_->num_slots(),
                     " and ", cap_int2, " (raise the KV cache capacity or lower max_tokens)"));
  }
  if (need_bf16 > free_bf16_slots() || need_int2 > free_int2_slots()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: need ", need_bf16, " BF16 + ",
                                                     need_int2, " INT2 pages, free ",
                                                     free_bf16_slots(), " + ", free_int2_slots()));
  }
  reserved_bf16_ += need_bf16;
  reserved_int2_ += need_int2;
  seq.reserved_bf16 = need_bf16;
  seq.reserved_int2 = need_int2;
  return absl::OkStatus();
}

void KvCache::Release(SequenceKv& seq) {
  for (int32_t& s : seq.bf16_slot) {
    if (s >= 0) bf16_pool_->Free(s), s = -1;
  }
  for (int32_t& s : seq.int2_slot) {
    if (s >= 0) int2_pool_->Free(s), s = -1;
  }
  reserved_bf16_ -= seq.reserved_bf16;
  reserved_int2_ -= seq.reserved_int2;
  seq.reserved_bf16 = seq.reserved_int2 = 0;
  seq.bf16_slot.clear();
  seq.int2_slot.clear();
  seq.int2_in_place.clear();
  seq.in_place_pages = 0;
  seq.in_place_hold.reset();  // the pages read in place: their memory and lease may go now
  seq.num_tokens = 0;
}

kernels::PageHeader KvCache::Header(const SequenceKv& seq, int64_t page,
                                    kernels::PageEncoding encoding) const {
  kernels::PageHeader h{};
  h.magic = kernels::kPageMagic;
  h.version = kernels::kPageFormatVersion;
  h.encoding = static_cast<uint8_t>(encoding);
  h.page_tokens = static_cast<uint16_t>(geometry_.page_tokens);
  h.num_layers = static_cast<uint16_t>(geometry_.num_layers);
  h.num_kv_heads = static_cast<uint16_t>(geometry_.num_kv_heads);
  h.head_dim = static_cast<uint16_t>(geometry_.head_dim);
  h.group_size = kernels::IsInt2(encoding) ? static_cast<uint16_t>(geometry_.group_size) : 0;
  h.page_index = static_cast<uint32_t>(page);
  h.body_bytes = (encoding == kernels::PageEncoding::kBf16 ? kernels::PageBytes(geometry_, encoding)
                                                           : history_page_bytes_) -
                 kernels::kPageHeaderBytes;
  if (page < static_cast<int64_t>(seq.page_keys.size())) {
    std::memcpy(h.key, seq.page_keys[page].bytes.data(), kPageKeyBytes);
    const PageKey& parent = page == 0 ? seq.namespace_key : seq.page_keys[page - 1];
    std::memcpy(h.parent_key, parent.bytes.data(), kPageKeyBytes);
  }
  if (IsEvaluationFormat(options_.format) && encoding != kernels::PageEncoding::kBf16) {
    // Not a page format encoding: such pages fail ParsePage and cannot leave the engine.
    h.encoding = 0;
    h.body_bytes = static_cast<uint64_t>(int2_pool_->slot_bytes() - kernels::kPageHeaderBytes);
  }
  return h;
}

absl::Status KvCache::WriteHeader(const SequenceKv& seq, int64_t page,
                                  kernels::PageEncoding encoding, PagePool& pool,
                                  int32_t slot) const {
  const kernels::PageHeader h = Header(seq, page, encoding);
  return pool.Write(slot, 0, &h, sizeof(h));
}

absl::Status KvCache::BeginAppend(SequenceKv& seq, int64_t new_total) {
  const int64_t P = options_.layout.page_tokens;
  const int64_t pages = CeilDiv(new_total, P);
  if (static_cast<int64_t>(seq.bf16_slot.size()) < pages) {
    seq.bf16_slot.resize(pages, -1);
    seq.int2_slot.resize(pages, -1);
  }
  // BF16 slots for every page receiving tokens.
  for (int64_t p = seq.num_tokens / P; p < pages; ++p) {
    if (seq.bf16_slot[p] >= 0) continue;
    std::optional<int32_t> s = bf16_pool_->Allocate();
    if (!s) return absl::ResourceExhaustedError("BF16 page pool exhausted (reservation broken)");
    seq.bf16_slot[p] = *s;
    KV_RETURN_IF_ERROR(WriteHeader(seq, p, kernels::PageEncoding::kBf16, *bf16_pool_, *s));
  }
  // INT2 slots for the pages this append demotes; the forward pass encodes them per layer.
  const int64_t sink_pages = options_.layout.sink_tokens / P;
  for (int64_t p = std::max(sink_pages, DemotedPagesEnd(seq.num_tokens));
       p < DemotedPagesEnd(new_total); ++p) {
    std::optional<int32_t> s = int2_pool_->Allocate();
    if (!s) return absl::ResourceExhaustedError("INT2 page pool exhausted (reservation broken)");
    seq.int2_slot[p] = *s;
  }
  return absl::OkStatus();
}

absl::Status KvCache::EndAppend(SequenceKv& seq, int64_t new_total) {
  const int64_t P = options_.layout.page_tokens;
  const int64_t old_pages_end = DemotedPagesEnd(seq.num_tokens);
  const int64_t sink_pages = options_.layout.sink_tokens / P;
  // Keys of pages that became full.
  for (int64_t p = static_cast<int64_t>(seq.page_keys.size()); (p + 1) * P <= new_total; ++p) {
    std::vector<uint32_t> ids(seq.tokens.begin() + p * P, seq.tokens.begin() + (p + 1) * P);
    const PageKey& parent = p == 0 ? seq.namespace_key : seq.page_keys[p - 1];
    seq.page_keys.push_back(ChainPageKey(parent, ids));
    if (seq.bf16_slot[p] >= 0) {
      KV_RETURN_IF_ERROR(
          WriteHeader(seq, p, kernels::PageEncoding::kBf16, *bf16_pool_, seq.bf16_slot[p]));
    }
  }
  for (int64_t p = std::max(sink_pages, old_pages_end); p < DemotedPagesEnd(new_total); ++p) {
    KV_RETURN_IF_ERROR(WriteHeader(seq, p, int2_encoding(), *int2_pool_, seq.int2_slot[p]));
    bf16_pool_->Free(seq.bf16_slot[p]);
    seq.bf16_slot[p] = -1;
  }
  seq.num_tokens = new_total;
  return absl::OkStatus();
}

uint8_t* KvCache::Bf16Block(const SequenceKv& seq, int64_t page, int layer, int kind, int head) {
  return bf16_pool_->slot(seq.bf16_slot[page]) +
         kernels::BlockOffset(geometry_, kernels::PageEncoding::kBf16, layer, kind, head);
}

const uint8_t* KvCache::HistoryPage(const SequenceKv& seq, int64_t page) const {
  if (seq.int2_slot[page] >= 0) return int2_pool_->slot(seq.int2_slot[page]);
  return seq.int2_in_place[page].bytes;  // a page read where it lies
}

// The history blocks of a page read in place are never written: the const_cast only lets
// readers and writers of the cache's own slots share these accessors.
uint8_t* KvCache::Int2Block(const SequenceKv& seq, int64_t page, int layer, int kind, int head) {
  return const_cast<uint8_t*>(HistoryPage(seq, page)) +
         kernels::BlockOffset(geometry_, int2_encoding(), layer, kind, head);
}

uint8_t* KvCache::HistoryBlock(const SequenceKv& seq, int64_t page, int layer, int kind, int head) {
  return const_cast<uint8_t*>(HistoryPage(seq, page)) + HistoryBlockOffset(layer, kind, head);
}

void KvCache::EncodeHistory(const SequenceKv& seq, int64_t page, int layer, int kind, int head,
                            const float* rows, float clip_ratio) {
  EncodeHistoryBlock(options_.format, geometry_, rows, layer, kind, head, clip_ratio,
                     HistoryBlock(seq, page, layer, kind, head), options_.codec.get());
}

void KvCache::DecodeHistory(const SequenceKv& seq, int64_t page, int layer, int kind, int head,
                            int num_tokens, float* rows) {
  DecodeHistoryBlock(options_.format, geometry_, HistoryBlock(seq, page, layer, kind, head),
                     num_tokens, layer, kind, rows, options_.codec.get());
}

absl::StatusOr<std::vector<ExportedPage>> KvCache::ExportPages(const SequenceKv& seq,
                                                               DevicePageAccess* access) const {
  if (IsEvaluationFormat(options_.format)) {
    return absl::FailedPreconditionError(absl::StrCat("KV format ",
                                                      KvCacheFormatName(options_.format),
                                                      " is for evaluation; its pages cannot "
                                                      "be exported"));
  }
  const int64_t P = options_.layout.page_tokens;
  const int64_t full =
      std::min<int64_t>(seq.num_tokens / P, static_cast<int64_t>(seq.page_keys.size()));
  std::vector<ExportedPage> out;
  out.reserve(full);
  for (int64_t p = 0; p < full; ++p) {
    ExportedPage e;
    e.page_index = p;
    e.key = seq.page_keys[p];
    const PagePool* pool = nullptr;
    int32_t slot = -1;
    if (p < static_cast<int64_t>(seq.int2_slot.size()) && seq.int2_slot[p] >= 0) {
      e.encoding = int2_encoding();
      pool = int2_pool_.get();
      slot = seq.int2_slot[p];
    } else if (p < static_cast<int64_t>(seq.bf16_slot.size()) && seq.bf16_slot[p] >= 0) {
      e.encoding = kernels::PageEncoding::kBf16;
      pool = bf16_pool_.get();
      slot = seq.bf16_slot[p];
    } else if (p < static_cast<int64_t>(seq.int2_in_place.size()) &&
               seq.int2_in_place[p].bytes != nullptr) {
      if (access == nullptr) {
        return absl::InternalError(absl::StrCat(
            "page ", p, " of the sequence is read in place; exporting it needs the device access"));
      }
      e.encoding = int2_encoding();
      KV_ASSIGN_OR_RETURN(e.bytes, access->ReadPage(seq.int2_in_place[p]));
      out.push_back(std::move(e));
      continue;
    } else {
      return absl::InternalError(absl::StrCat("page ", p, " of a sequence holds no slot"));
    }
    e.bytes.resize(static_cast<size_t>(pool->slot_bytes()));
    KV_RETURN_IF_ERROR(pool->Read(slot, 0, e.bytes.data(), pool->slot_bytes()));
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SharedPageMemory>> DevicePageAccess::MapShared(int fd,
                                                                              int64_t bytes) {
  (void)bytes;
  close(fd);
  return absl::UnimplementedError("this backend cannot map another process's memory");
}

int64_t KvCache::SequenceBytes(const SequenceKv& seq) const {
  int64_t bytes = 0;
  for (int32_t s : seq.bf16_slot) bytes += s >= 0 ? bf16_pool_->slot_bytes() : 0;
  for (int32_t s : seq.int2_slot) bytes += s >= 0 ? int2_pool_->slot_bytes() : 0;
  return bytes;
}

}  // namespace kvstrata::engine

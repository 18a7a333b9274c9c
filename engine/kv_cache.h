#pragma once

// The paged KV cache of the engine: two page pools (BF16 pages for the sink and recent window,
// INT2 pages for the history; docs/kv-format.md) and per-sequence page tables.
//
// A page slot holds a whole page — 64 tokens of every layer and KV head, K and V — header
// included, so pages move to and from the kvstore byte for byte. Tokens enter their page in
// BF16 (rotated); when the recent window has moved past a page, the page is quantised to INT2
// from its BF16 values and the BF16 slot is freed. Thread-compatible: one engine thread uses it.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/radix_hash.h"
#include "kernels/bits.h"
#include "kernels/history_codec.h"
#include "kernels/kv_layout.h"

namespace kvstrata::engine {

enum class KvCacheFormat {
  kBf16,          // every page stays BF16 (no history segment): the reference format
  kInt2,          // split layout, INT2 history with uniform levels
  kInt2LloydMax,  // split layout, INT2 history with Gaussian Lloyd-Max levels
  // Split layout whose history is coded by a history codec (KvCacheOptions::codec, from the
  // rotation file): per (layer, K|V) regions of 4/3/2/1-bit codes. Lloyd-Max levels are stored
  // as codec blocks (page encoding 4, kernels/codec_page.h), uniform levels (recipes with `u`)
  // as codec fragment blocks (page encoding 5, kernels/codec_fragment.h). Its rows are in the
  // codec's basis (the engine folds it into the rotations).
  kCodec,
  // Evaluation only (kvstrata eval). Split layout whose history pages hold, in fp32, what a
  // baseline format would reconstruct (kernels/baselines.h, fake quantisation). The memory is
  // not saved: these pools are as large as fp32 pages, and HistoryBitsPerElement gives what the
  // format would honestly cost. Their page headers carry encoding 0, so ParsePage rejects
  // them and they can never be published. Use them with identity rotations (the baselines
  // quantise the unrotated keys and values; turbo3 draws its own random rotation).
  kEvalFp8,     // FP8 E4M3, one fp16 scale per token and head
  kEvalInt4,    // INT4 per token, fp16 scale and offset per group of group_size channels
  kEvalKivi2,   // KIVI-2: K per channel over the page's 64 tokens, V per token per group
  kEvalTurbo3,  // TurboQuant-like 3-bit: random-sign Hadamard + 8-level Lloyd-Max
  kEvalCodec,   // a candidate history codec (kernels/history_codec.h), KvCacheOptions::codec
};

const char* KvCacheFormatName(KvCacheFormat format);
// Serving formats (bf16, int2, int2-lloyd-max, codec); with allow_evaluation also the eval-*
// formats.
absl::StatusOr<KvCacheFormat> ParseKvCacheFormat(const std::string& name,
                                                 bool allow_evaluation = false);
bool IsEvaluationFormat(KvCacheFormat format);

// The history segment of one (layer, K|V, KV head) page, whatever the format stores there:
// `rows` [64][head_dim] are the page's rotated values as its BF16 page holds them (so the
// stored history depends on the tokens only). INT2 formats write the page format's INT2 block
// (kernels/quant.h), kCodec the codec's packed block of that layer and side
// (kernels/codec_page.h, or kernels/codec_fragment.h for uniform levels); evaluation formats write the fp32 reconstruction [64][head_dim], and
// kEvalCodec after it the codec's score-bias coefficients [64][kernels::kCodecBiasTerms]
// (kernels/history_codec.h, "jb"; zeros without it). `block` has HistoryBlockBytes bytes. Decode
// writes rows [num_tokens][head_dim] in rotated space. `codec` is the recipe of kCodec and
// kEvalCodec (ignored by the other formats, whose blocks are the same for every layer).
int64_t HistoryBlockBytes(KvCacheFormat format, const kernels::KvGeometry& g, int layer = 0,
                          int kind = 0, const kernels::HistoryCodec* codec = nullptr);
void EncodeHistoryBlock(KvCacheFormat format, const kernels::KvGeometry& g, const float* rows,
                        int layer, int kind, int head, float clip_ratio, uint8_t* block,
                        const kernels::HistoryCodec* codec = nullptr);
void DecodeHistoryBlock(KvCacheFormat format, const kernels::KvGeometry& g, const uint8_t* block,
                        int num_tokens, int layer, int kind, float* rows,
                        const kernels::HistoryCodec* codec = nullptr);

// Honest storage cost, in bits per element, of one history token of `format` (its codes and
// every scale, offset or norm; K and V averaged): 2 + 32/G for INT2, 8 + 16/d for FP8,
// 4 + 32/G for INT4, 2 + (32/64 + 32/G)/2 for KIVI-2 with 64-token key groups, 3 + 16/d for
// turbo3; 16 for BF16 (which has no history); kernels::HistoryCodecBits for the codec formats
// (for kCodec the blocks' padding to 16 bytes adds less than 0.01 bit).
double HistoryBitsPerElement(KvCacheFormat format, const kernels::KvGeometry& g,
                             const kernels::HistoryCodec* codec = nullptr);
// Bits per element of a sequence of n tokens: BF16 sink and recent tokens, history tokens at
// HistoryBitsPerElement, plus one 64-byte page header per page (ceil(n / 64)). For the INT2
// formats this is kernels::SplitBitsPerElement; for BF16 every token is BF16.
double SequenceBitsPerElement(KvCacheFormat format, const kernels::SplitLayout& layout,
                              const kernels::KvGeometry& g, int64_t n,
                              const kernels::HistoryCodec* codec = nullptr);

// Page memory behind a seam: host memory here, device memory for the CUDA backend
// (engine/cuda/device_page_memory.h). Both pools of a cache are carved from one PageMemory.
class PageMemory {
 public:
  virtual ~PageMemory() = default;
  // The memory's address: a host pointer, or a device pointer when !host_accessible().
  virtual uint8_t* data() = 0;
  virtual int64_t size() const = 0;
  // False for device memory: data() may not be dereferenced on the host; use Write and Read.
  virtual bool host_accessible() const { return true; }
  // Copies host bytes in, or out, at `offset` (offset + n <= size()). Synchronous.
  virtual absl::Status Write(int64_t offset, const void* src, int64_t n);
  virtual absl::Status Read(int64_t offset, void* dst, int64_t n) const;
};
std::unique_ptr<PageMemory> AllocateHostPageMemory(int64_t bytes);

// Makes the cache's page memory (one arena for both pools); KvCacheOptions::allocate_page_memory.
using PageMemoryAllocator =
    std::function<absl::StatusOr<std::unique_ptr<PageMemory>>(int64_t bytes)>;

// Fixed-size slots carved from [offset, offset + bytes) of a PageMemory.
class PagePool {
 public:
  PagePool(std::shared_ptr<PageMemory> memory, int64_t offset, int64_t bytes, int64_t slot_bytes);
  std::optional<int32_t> Allocate();
  void Free(int32_t slot);
  // The slot's address (a device address for device memory).
  uint8_t* slot(int32_t s) { return base_ + int64_t{s} * slot_bytes_; }
  const uint8_t* slot(int32_t s) const { return base_ + int64_t{s} * slot_bytes_; }
  const uint8_t* base() const { return base_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t num_slots() const { return num_slots_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_.size()); }
  bool host_accessible() const { return memory_->host_accessible(); }
  const std::shared_ptr<PageMemory>& memory() const { return memory_; }
  // Copies into, or out of, slot s at `offset` within it.
  absl::Status Write(int32_t s, int64_t offset, const void* src, int64_t n);
  absl::Status Read(int32_t s, int64_t offset, void* dst, int64_t n) const;

 private:
  std::shared_ptr<PageMemory> memory_;
  int64_t offset_;
  uint8_t* base_;
  int64_t slot_bytes_;
  int64_t num_slots_;
  std::vector<int32_t> free_;
};

struct KvCacheOptions {
  KvCacheFormat format = KvCacheFormat::kInt2;
  kernels::SplitLayout layout;  // sink 64, recent >= 256, pages of 64
  int group_size = 0;           // INT2 channels per scale/offset; 0 = head_dim
  int64_t capacity_bytes = int64_t{1} << 30;
  // Sequences holding pages at once: sizes the BF16 pool (sink, recent window and one chunk
  // each); the rest of capacity_bytes is history. When that working set does not fit, the BF16
  // pool takes half the capacity (at least one sequence's worth) instead.
  int max_sequences = 16;
  int max_chunk_tokens = 512;  // largest prefill chunk (sizes the BF16 working set)
  // Clip ratios the backend applies when it demotes a BF16 page to INT2, [layers][kv_heads]
  // (RotationSet::k_clip / v_clip). With them an imported page that is history at the imported
  // length but came only as BF16 is demoted exactly as a running sequence would have done;
  // without them (empty) such a prefix is refused.
  std::vector<float> demotion_key_clip;
  std::vector<float> demotion_value_clip;
  // kCodec and kEvalCodec: the codec's recipe (required). kCodec needs every layer's recipes
  // to be servable (kernels::CodecRecipeUnservable, or CodecFragmentRecipeUnservable when they
  // code uniform levels: all of them or none), in the basis the rows are in.
  std::shared_ptr<const kernels::HistoryCodec> codec;
  // The page memory; empty: host memory (what the CPU backend needs).
  PageMemoryAllocator allocate_page_memory;
};

// A cached page whose bytes lie in device memory this process has mapped (the GPU kvstore's
// HBM pool, same-GPU transport): what the store said about it, and where it is. The store
// checked the page on Put; its digest (core/page_digest.h) is checked where it lands.
struct DevicePage {
  PageKey key;
  PageKey parent_key;  // the namespace key for page 0
  int64_t page_index = 0;
  kernels::PageEncoding encoding = kernels::PageEncoding::kBf16;
  const uint8_t* bytes = nullptr;  // device address of the whole page, header included
  int64_t byte_length = 0;
  uint64_t digest64 = 0;
};

// The pages of one sequence. Page i covers tokens [i*64, (i+1)*64).
struct SequenceKv {
  int64_t num_tokens = 0;          // tokens whose K/V are in the cache
  std::vector<int32_t> bf16_slot;  // per page: BF16 slot or -1
  std::vector<int32_t> int2_slot;  // per page: INT2 slot or -1
  std::vector<int32_t> tokens;     // the token ids, for page keys
  PageKey namespace_key;           // root of the radix chain (docs/hashing.md)
  std::vector<PageKey> page_keys;  // keys of the full pages so far
  int64_t reserved_bf16 = 0;       // slots reserved at admission
  int64_t reserved_int2 = 0;
  // Per page (empty, or as long as int2_slot): a history page the sequence reads where it lies,
  // in memory the cache does not own (a GPU kvstore's pool on this GPU, mapped here), or one
  // with null bytes. Such a page has no INT2 slot. KvCache::ImportPrefix fills it.
  std::vector<DevicePage> int2_in_place;
  int64_t in_place_pages = 0;
  // Keeps what those pages lie in mapped, and leased from its owner, until the sequence is
  // released.
  std::shared_ptr<void> in_place_hold;
};

// One full page of a sequence as the kvstore stores it: the whole page, header included
// (docs/kv-format.md), ready for core ParsePage. INT2 for demoted (history) pages, BF16 for the
// sink pages and the pages still in the recent window (the "BF16 recent copies").
struct ExportedPage {
  int64_t page_index = 0;
  PageKey key;
  kernels::PageEncoding encoding = kernels::PageEncoding::kBf16;
  std::string bytes;
};

// Memory of another process on the same device, mapped into this one
// (DevicePageAccess::MapShared): its pages' addresses are valid while this object lives.
class SharedPageMemory {
 public:
  virtual ~SharedPageMemory() = default;
  virtual const uint8_t* data() const = 0;
  virtual int64_t size() const = 0;
};

// How a cache on a device moves DevicePages (the CUDA backend implements it).
class DevicePageAccess {
 public:
  struct Copy {
    const uint8_t* src = nullptr;  // device
    uint8_t* dst = nullptr;        // device
    int64_t bytes = 0;
    uint64_t digest64 = 0;
  };
  virtual ~DevicePageAccess() = default;
  // Copies every page device to device; DataLoss naming the page when a digest differs. A copy
  // with a null `dst` only checks its source's digest (a page read in place).
  virtual absl::Status CopyPages(std::span<const Copy> copies) = 0;
  // A page's bytes in host memory (for a page that must be converted on import), digest checked.
  virtual absl::StatusOr<std::string> ReadPage(const DevicePage& page) = 0;
  // Maps `bytes` of memory that another process on this device exported as a POSIX file
  // descriptor (taken here, and closed), for its pages to be copied (CopyPages) or, where
  // CanReadInPlace says so, read where they lie. Placed, when it can be, where the backend's
  // kernels reach pages in place. Unimplemented where the backend cannot map such memory.
  virtual absl::StatusOr<std::unique_ptr<SharedPageMemory>> MapShared(int fd, int64_t bytes);
  // Whether the backend's kernels can read this page where it lies, for as long as its memory
  // stays mapped, instead of from a slot of the cache: an INT2 history page of the cache's
  // geometry in memory placed within the backend's reach.
  virtual bool CanReadInPlace(const DevicePage& page) const { return false; }
};

class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const kernels::KvGeometry& geometry,
                                                         const KvCacheOptions& options);

  const kernels::KvGeometry& geometry() const { return geometry_; }
  const KvCacheOptions& options() const { return options_; }
  bool split() const { return options_.format != KvCacheFormat::kBf16; }
  // The INT2 encoding of history pages (uniform for the evaluation formats, which have none).
  kernels::PageEncoding int2_encoding() const;

  // Slots a sequence of `total_tokens` needs at most over its life, in each pool.
  int64_t Bf16SlotsNeeded(int64_t total_tokens) const;
  int64_t Int2SlotsNeeded(int64_t total_tokens) const;
  // Reserves those slots; ResourceExhausted when they are not free now (the caller may queue),
  // InvalidArgument naming the numbers when even an empty cache could never hold them.
  absl::Status Reserve(SequenceKv& seq, int64_t total_tokens);
  // Frees every slot and reservation of the sequence.
  void Release(SequenceKv& seq);

  // Before a forward pass appends tokens [seq.num_tokens, new_total): allocates BF16 slots for
  // new pages and INT2 slots for the pages this append demotes (BeginAppend), then the pass
  // fills them layer by layer; EndAppend frees the BF16 slots of demoted pages and writes the
  // headers of pages that became full.
  absl::Status BeginAppend(SequenceKv& seq, int64_t new_total);
  absl::Status EndAppend(SequenceKv& seq, int64_t new_total);

  // Pages demoted to INT2 once the sequence holds n tokens: [sink_pages, DemotedPagesEnd(n)).
  int64_t DemotedPagesEnd(int64_t n) const;
  // First query position that sees page p in INT2 (INT64_MAX when it never does).
  int64_t FirstInt2Query(int64_t page) const;

  // Block addresses, and encoding or decoding history blocks in place: host page memory only
  // (the CPU backend; a device cache is read and written by its kernels).
  uint8_t* Bf16Block(const SequenceKv& seq, int64_t page, int layer, int kind, int head);
  // INT2 formats only: the page's INT2 block.
  uint8_t* Int2Block(const SequenceKv& seq, int64_t page, int layer, int kind, int head);
  // Any split format: the page's history block (an INT2 or codec block, or fp32 rows for
  // evaluation formats), and its encoding and decoding (EncodeHistoryBlock / DecodeHistoryBlock).
  uint8_t* HistoryBlock(const SequenceKv& seq, int64_t page, int layer, int kind, int head);
  void EncodeHistory(const SequenceKv& seq, int64_t page, int layer, int kind, int head,
                     const float* rows, float clip_ratio);
  void DecodeHistory(const SequenceKv& seq, int64_t page, int layer, int kind, int head,
                     int num_tokens, float* rows);
  // Where the history block of (layer, K|V, head) starts within a history page, header
  // included, and the bytes of a whole history page.
  int64_t HistoryBlockOffset(int layer, int kind, int head) const;
  int64_t history_page_bytes() const { return history_page_bytes_; }
  bool host_memory() const { return bf16_pool_->host_accessible(); }
  const PagePool& bf16_pool() const { return *bf16_pool_; }
  // The history pool (INT2 pages, or fp32 pages for the evaluation formats).
  const PagePool* int2_pool() const { return int2_pool_.get(); }
  int64_t free_bf16_slots() const { return bf16_pool_->num_slots() - reserved_bf16_; }
  int64_t free_int2_slots() const;

  // Page export and import (the kvstore's page exchange). A page's bytes depend on its tokens
  // alone (the exactness principle), so importing the pages another sequence exported equals
  // computing them.
  //
  // The full pages of `seq` [floor(num_tokens / 64)] in order, each with its current copy.
  // FailedPrecondition for the evaluation formats (their pages can never be published). Pages
  // read in place are read through `access` (digest checked); Internal without it.
  absl::StatusOr<std::vector<ExportedPage>> ExportPages(const SequenceKv& seq,
                                                        DevicePageAccess* access = nullptr) const;
  // Checks a cached prefix for a prompt: `pages` (whole page bytes, any order, one or two
  // copies — INT2 and/or BF16 — per page) must cover pages 0..N-1 with N*64 <= prompt size - 1,
  // parse (ParsePage), match this cache's geometry and encodings and carry the radix keys of the
  // prompt under `namespace_key` (CheckPageMatches), with the right page index and parent key.
  // A page that is INT2 history at N*64 tokens needs an INT2 copy unless the demotion clips are
  // set (then a BF16 copy is demoted on import). Returns N (0 for no pages);
  // InvalidArgument naming the page and the problem otherwise.
  // `device_pages` come after `pages` in the same roles (moved by the backend's DevicePageAccess).
  absl::StatusOr<int64_t> CheckCachedPrefix(const PageKey& namespace_key,
                                            std::span<const int32_t> prompt,
                                            std::span<const std::string> pages,
                                            std::span<const DevicePage> device_pages = {}) const;
  // Loads a prefix CheckCachedPrefix accepted into a reserved, empty sequence whose tokens and
  // namespace_key are set: afterwards it holds N*64 tokens exactly as if it had computed them.
  // A page that must be BF16 at that length but came only as INT2 is dequantised into BF16
  // (not exact); the count of those is returned. A page that is history at that length but came
  // only as BF16 is quantised from its BF16 values with the demotion clips, which is bit for bit
  // what the sequence that computed it would have stored once the page left its window.
  // Device pages already in the form the sequence needs are copied into their slots device to
  // device through `access` (one gather, digests checked); one that needs converting is read to
  // the host first. A failed copy is DataLoss and the sequence keeps no slot of the prefix.
  // With `in_place_hold` (what keeps the device pages' memory mapped and the pages leased), the
  // INT2 history pages that access->CanReadInPlace are not copied: their digests are checked
  // where they lie, the sequence reads them there (SequenceKv::int2_in_place) and keeps
  // `in_place_hold` until it is released, and its reservation shrinks by their number.
  absl::StatusOr<int64_t> ImportPrefix(SequenceKv& seq, std::span<const std::string> pages,
                                       std::span<const DevicePage> device_pages = {},
                                       DevicePageAccess* access = nullptr,
                                       std::shared_ptr<void> in_place_hold = nullptr);

  // Bytes of KV data held by a sequence (its slots, headers included; not the pages it reads
  // in place, which are its owner's).
  int64_t SequenceBytes(const SequenceKv& seq) const;
  // The start of page `page`'s history copy: its slot, or where it is read in place.
  const uint8_t* HistoryPage(const SequenceKv& seq, int64_t page) const;

 private:
  KvCache(const kernels::KvGeometry& g, const KvCacheOptions& o) : geometry_(g), options_(o) {}
  kernels::PageHeader Header(const SequenceKv& seq, int64_t page,
                             kernels::PageEncoding encoding) const;
  absl::Status WriteHeader(const SequenceKv& seq, int64_t page, kernels::PageEncoding encoding,
                           PagePool& pool, int32_t slot) const;

  // Every history block of a page, decoded into kv [num_blocks][page_tokens][head_dim].
  void DecodeHistoryPage(const uint8_t* page, float* kv) const;

  kernels::KvGeometry geometry_;
  KvCacheOptions options_;
  // Per (layer * 2 + kind): the offset of head 0's history block and the bytes of each.
  std::vector<int64_t> history_block_offset_;
  std::vector<int64_t> history_block_bytes_;
  int64_t history_page_bytes_ = 0;
  std::unique_ptr<PagePool> bf16_pool_;
  std::unique_ptr<PagePool> int2_pool_;  // history pages; null for the BF16 format
  int64_t reserved_bf16_ = 0;
  int64_t reserved_int2_ = 0;
};

}  // namespace kvstrata::engine

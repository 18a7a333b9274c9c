#pragma once

// The paged KV cache of the engine: two page pools (BF16 pages for the sink and recent window,
// INT2 pages for the history; docs/kv-format.md) and per-sequence page tables.
//
// A page slot holds a whole page — 64 tokens of every layer and KV head, K and V — header
// included, so pages move to and from the kvstore byte for byte. Tokens enter their page in
// BF16 (rotated); when the recent window has moved past a page, the page is quantised to INT2
// from its BF16 values and the BF16 slot is freed. Thread-compatible: one engine thread uses it.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/radix_hash.h"
#include "kernels/bits.h"
#include "kernels/kv_layout.h"

namespace kvstrata::engine {

enum class KvCacheFormat {
  kBf16,          // every page stays BF16 (no history segment): the reference format
  kInt2,          // split layout, INT2 history with uniform levels
  kInt2LloydMax,  // split layout, INT2 history with Gaussian Lloyd-Max levels
};

const char* KvCacheFormatName(KvCacheFormat format);
absl::StatusOr<KvCacheFormat> ParseKvCacheFormat(const std::string& name);

struct KvCacheOptions {
  KvCacheFormat format = KvCacheFormat::kInt2;
  kernels::SplitLayout layout;  // sink 64, recent >= 256, pages of 64
  int group_size = 0;           // INT2 channels per scale/offset; 0 = head_dim
  int64_t capacity_bytes = int64_t{1} << 30;
  int max_sequences = 16;      // sequences holding pages at once (sizes the BF16 pool)
  int max_chunk_tokens = 512;  // largest prefill chunk (sizes the BF16 working set)
};

// Page memory behind a seam: host memory here, device memory for the CUDA backend.
class PageMemory {
 public:
  virtual ~PageMemory() = default;
  virtual uint8_t* data() = 0;
  virtual int64_t size() const = 0;
};
std::unique_ptr<PageMemory> AllocateHostPageMemory(int64_t bytes);

// Fixed-size slots carved from one PageMemory.
class PagePool {
 public:
  PagePool(std::unique_ptr<PageMemory> memory, int64_t slot_bytes);
  std::optional<int32_t> Allocate();
  void Free(int32_t slot);
  uint8_t* slot(int32_t s) { return base_ + int64_t{s} * slot_bytes_; }
  const uint8_t* slot(int32_t s) const { return base_ + int64_t{s} * slot_bytes_; }
  const uint8_t* base() const { return base_; }
  int64_t slot_bytes() const { return slot_bytes_; }
  int64_t num_slots() const { return num_slots_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_.size()); }

 private:
  std::unique_ptr<PageMemory> memory_;
  uint8_t* base_;
  int64_t slot_bytes_;
  int64_t num_slots_;
  std::vector<int32_t> free_;
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
};

class KvCache {
 public:
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const kernels::KvGeometry& geometry,
                                                         const KvCacheOptions& options);

  const kernels::KvGeometry& geometry() const { return geometry_; }
  const KvCacheOptions& options() const { return options_; }
  bool split() const { return options_.format != KvCacheFormat::kBf16; }
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
  void EndAppend(SequenceKv& seq, int64_t new_total);

  // Pages demoted to INT2 once the sequence holds n tokens: [sink_pages, DemotedPagesEnd(n)).
  int64_t DemotedPagesEnd(int64_t n) const;
  // First query position that sees page p in INT2 (INT64_MAX when it never does).
  int64_t FirstInt2Query(int64_t page) const;

  uint8_t* Bf16Block(const SequenceKv& seq, int64_t page, int layer, int kind, int head);
  uint8_t* Int2Block(const SequenceKv& seq, int64_t page, int layer, int kind, int head);
  const PagePool& bf16_pool() const { return *bf16_pool_; }
  const PagePool* int2_pool() const { return int2_pool_.get(); }
  int64_t free_bf16_slots() const { return bf16_pool_->num_slots() - reserved_bf16_; }
  int64_t free_int2_slots() const;

  // Bytes of KV data held by a sequence (its slots, headers included).
  int64_t SequenceBytes(const SequenceKv& seq) const;

 private:
  KvCache(const kernels::KvGeometry& g, const KvCacheOptions& o) : geometry_(g), options_(o) {}
  void WriteHeader(const SequenceKv& seq, int64_t page, kernels::PageEncoding encoding,
                   uint8_t* slot) const;

  kernels::KvGeometry geometry_;
  KvCacheOptions options_;
  std::unique_ptr<PagePool> bf16_pool_;
  std::unique_ptr<PagePool> int2_pool_;  // null for the BF16 format
  int64_t reserved_bf16_ = 0;
  int64_t reserved_int2_ = 0;
};

}  // namespace kvstrata::engine

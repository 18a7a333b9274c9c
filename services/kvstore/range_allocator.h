#pragma once

// Byte ranges of one fixed region (the kvstore's HBM pool): first fit over a free list,
// neighbours merged on free, every range aligned. Page sizes of one model come in two or three
// sizes, so first fit keeps fragmentation low; when it still fails, the store demotes pages to
// the host tier until a range fits. Thread-compatible (the page store's mutex guards it).

#include <cstdint>
#include <map>
#include <optional>

namespace kvstrata::kvstore {

class RangeAllocator {
 public:
  // `size` bytes, ranges aligned to `alignment` (a power of two).
  explicit RangeAllocator(uint64_t size, uint64_t alignment = 256);

  // The offset of a free range of at least `bytes` (rounded up to the alignment), or nullopt.
  std::optional<uint64_t> Allocate(uint64_t bytes);
  // Returns a range Allocate gave out, with the same `bytes`.
  void Free(uint64_t offset, uint64_t bytes);

  uint64_t size() const { return size_; }
  uint64_t used() const { return used_; }
  uint64_t largest_free() const;

 private:
  uint64_t Round(uint64_t bytes) const { return (bytes + alignment_ - 1) & ~(alignment_ - 1); }

  uint64_t size_;
  uint64_t alignment_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, disjoint and never adjacent
};

}  // namespace kvstrata::kvstore

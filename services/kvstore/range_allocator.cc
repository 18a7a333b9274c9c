#include "services/kvstore/range_allocator.h"

#include <algorithm>
#include <iterator>

#include "core/check.h"

namespace kvstrata::kvstore {

RangeAllocator::RangeAllocator(uint64_t size, uint64_t alignment)
    : size_(size & ~(alignment - 1)), alignment_(alignment) {
  KV_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0) << "alignment " << alignment;
  if (size_ > 0) free_[0] = size_;
}

std::optional<uint64_t> RangeAllocator::Allocate(uint64_t bytes) {
  const uint64_t n = Round(std::max<uint64_t>(bytes, 1));
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - n;
    free_.erase(it);
    if (rest > 0) free_[offset + n] = rest;
    used_ += n;
    return offset;
  }
  return std::nullopt;
}

void RangeAllocator::Free(uint64_t offset, uint64_t bytes) {
  const uint64_t n = Round(std::max<uint64_t>(bytes, 1));
  KV_CHECK(offset + n <= size_) << "range " << offset << "+" << n << " outside " << size_;
  auto next = free_.lower_bound(offset);
  KV_CHECK(next == free_.end() || next->first >= offset + n) << "double free at " << offset;
  uint64_t start = offset;
  uint64_t length = n;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    KV_CHECK(prev->first + prev->second <= offset) << "double free at " << offset;
    if (prev->first + prev->second == offset) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + n) {
    length += next->second;
    free_.erase(next);
  }
  free_[start] = length;
  used_ -= n;
}

uint64_t RangeAllocator::largest_free() const {
  uint64_t best = 0;
  for (const auto& [offset, length] : free_) best = std::max(best, length);
  return best;
}

}  // namespace kvstrata::kvstore

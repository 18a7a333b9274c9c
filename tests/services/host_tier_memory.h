#pragma once

// A kvstore fast tier in host memory, for tests of the tier logic and of OpenTransfer's
// same-GPU answers on machines without a GPU (the GPU test uses the real HBM pool), and for the
// CPU benchmark of that handshake (bench/handshake_bench.cc).

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore::testing {

// A fast tier in host memory: real bytes at real offsets, and a switch that makes reads fail
// (what a lost GPU context would do).
class HostTierMemory final : public TierMemory {
 public:
  explicit HostTierMemory(uint64_t size) : bytes_(size) {}
  uint64_t size() const override { return bytes_.size(); }
  absl::Status Write(uint64_t offset, const void* src, uint64_t n) override {
    if (offset + n > bytes_.size()) return absl::OutOfRangeError("write past the tier");
    std::memcpy(bytes_.data() + offset, src, n);
    return absl::OkStatus();
  }
  absl::Status Read(uint64_t offset, void* dst, uint64_t n) const override {
    if (fail_reads) return absl::InternalError("device lost");
    if (offset + n > bytes_.size()) return absl::OutOfRangeError("read past the tier");
    std::memcpy(dst, bytes_.data() + offset, n);
    return absl::OkStatus();
  }
  std::string Describe() const override { return "test tier"; }
  uint8_t* base() const override { return const_cast<uint8_t*>(bytes_.data()); }
  const uint8_t* at(uint64_t offset) const { return bytes_.data() + offset; }
  bool fail_reads = false;

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace kvstrata::kvstore::testing

#include "services/kvstore/gpu_tier.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

#ifdef KVSTRATA_HAVE_CUDA
#include "engine/cuda/device_page_memory.h"
#endif

namespace kvstrata::kvstore {

#ifdef KVSTRATA_HAVE_CUDA
namespace {

class HbmTierMemory final : public TierMemory {
 public:
  HbmTierMemory(std::unique_ptr<engine::DevicePageMemory> memory, std::string describe)
      : memory_(std::move(memory)), describe_(std::move(describe)) {}
  uint64_t size() const override { return static_cast<uint64_t>(memory_->size()); }
  absl::Status Write(uint64_t offset, const void* src, uint64_t n) override {
    return memory_->Write(static_cast<int64_t>(offset), src, static_cast<int64_t>(n));
  }
  absl::Status Read(uint64_t offset, void* dst, uint64_t n) const override {
    return memory_->Read(static_cast<int64_t>(offset), dst, static_cast<int64_t>(n));
  }
  std::string Describe() const override { return describe_; }
  uint8_t* base() const override { return memory_->data(); }
  const engine::DevicePageMemory& memory() const { return *memory_; }

 private:
  std::unique_ptr<engine::DevicePageMemory> memory_;
  std::string describe_;
};

}  // namespace

absl::StatusOr<GpuTier> MakeGpuTier(int device, uint64_t bytes, const std::string& socket_path) {
  absl::StatusOr<std::pair<std::string, std::string>> id = engine::GpuUuidAndName(device);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::unique_ptr<engine::DevicePageMemory>> memory =
      engine::DevicePageMemory::Allocate(device, static_cast<int64_t>(bytes));
  if (!memory.ok()) return memory.status();
  GpuTier tier;
  tier.gpu_uuid = id->first;
  tier.gpu_name = id->second;
  tier.pool_id = absl::Uniform<uint64_t>(absl::BitGen(), 1, UINT64_MAX);
  auto hbm = std::make_shared<HbmTierMemory>(
      *std::move(memory), absl::StrCat("cuda:", device, " (", id->second, ") HBM"));
  tier.memory = hbm;
  absl::StatusOr<std::unique_ptr<transport::PoolSocketServer>> socket =
      transport::PoolSocketServer::Start(socket_path, tier.pool_id, bytes,
                                         [hbm] { return hbm->memory().ExportHandle(); });
  if (!socket.ok()) return socket.status();
  tier.socket = *std::move(socket);
  return tier;
}

#else

absl::StatusOr<GpuTier> MakeGpuTier(int device, uint64_t, const std::string&) {
  return absl::UnavailableError(
      absl::StrCat("cuda:", device, ": this kvstrata-kvstore was built without CUDA"));
}

#endif

}  // namespace kvstrata::kvstore

#include "services/decode/same_gpu_pools.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/radix_hash.h"
#include "transport/pool_socket.h"

#ifdef KVSTRATA_HAVE_CUDA
#include "engine/cuda/device_page_memory.h"
#endif

namespace kvstrata::decode {

#ifdef KVSTRATA_HAVE_CUDA
struct SameGpuPools::Mapping {
  std::unique_ptr<engine::ImportedPageMemory> memory;
};
#else
struct SameGpuPools::Mapping {};
#endif

absl::StatusOr<v1::OpenTransferResponse> OpenTransferOfChain(kvstore::KvStoreClient& client,
                                                             v1::OpenTransferRequest request,
                                                             std::span<const PageKey> keys,
                                                             const PageKey& first_parent,
                                                             bool* every_key) {
  *every_key = false;
  if (keys.empty()) return absl::InvalidArgumentError("no pages to transfer");
  v1::PageChain* chain = request.mutable_chain();
  chain->set_last_key(keys.back().ToBytes());
  chain->set_page_count(static_cast<uint32_t>(keys.size()));
  chain->set_first_parent_key(first_parent.ToBytes());
  absl::StatusOr<v1::OpenTransferResponse> answer = client.OpenTransfer(request);
  if (answer.ok() || answer.status().code() != absl::StatusCode::kInvalidArgument) return answer;
  *every_key = true;
  request.clear_chain();
  request.mutable_pages()->Reserve(static_cast<int>(keys.size()));
  for (const PageKey& key : keys) request.add_pages()->set_key(key.ToBytes());
  return client.OpenTransfer(request);
}

SameGpuPools::SameGpuPools(int cuda_device, kernels::PageEncoding int2_encoding)
    : device_(cuda_device), int2_encoding_(int2_encoding) {
#ifdef KVSTRATA_HAVE_CUDA
  if (device_ < 0) return;
  absl::StatusOr<std::pair<std::string, std::string>> id = engine::GpuUuidAndName(device_);
  if (!id.ok()) return;
  gpu_uuid_ = id->first;
  boot_id_ = transport::HostBootId();
  enabled_ = !boot_id_.empty();
#endif
}

SameGpuPools::~SameGpuPools() = default;

void SameGpuPools::Describe(v1::OpenTransferRequest* request) const {
  request->mutable_device()->set_cuda_device(static_cast<uint32_t>(std::max(device_, 0)));
  request->mutable_device()->set_gpu_uuid(gpu_uuid_);
  request->mutable_device()->set_host_boot_id(boot_id_);
  if (enabled_) request->add_transports(v1::TRANSPORT_SAME_GPU_POOL);
  request->add_transports(v1::TRANSPORT_GRPC_STREAM);
}

int SameGpuPools::pools_mapped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(pools_.size());
}

absl::StatusOr<std::vector<engine::DevicePage>> SameGpuPools::Pages(
    const v1::OpenTransferResponse& answer, std::span<const PageKey> keys,
    const PageKey& first_parent, int64_t first_index) {
#ifdef KVSTRATA_HAVE_CUDA
  const v1::SameGpuPool& pool = answer.pool();
  const uint8_t* base = nullptr;
  int64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(pool.pool_id());
    if (it == pools_.end()) {
      absl::StatusOr<transport::PoolHandle> handle =
          transport::ReceivePoolHandle(pool.socket_path());
      if (!handle.ok()) return handle.status();
      if (handle->pool_id != pool.pool_id()) {
        close(handle->fd);
        return absl::FailedPreconditionError(
            absl::StrCat("pool socket ", pool.socket_path(), " hands out pool ", handle->pool_id,
                         ", not ", pool.pool_id(), " (the store restarted)"));
      }
      absl::StatusOr<std::unique_ptr<engine::ImportedPageMemory>> memory =
          engine::ImportedPageMemory::Import(device_, handle->fd,
                                             static_cast<int64_t>(handle->pool_bytes));
      if (!memory.ok()) return memory.status();
      fprintf(stderr, "kvstrata-decode: mapped the kvstore pool %016llx (%s, %.1f GiB) on cuda:%d\n",
              static_cast<unsigned long long>(pool.pool_id()), pool.socket_path().c_str(),
              handle->pool_bytes / double(1 << 30), device_);
      // A worker maps each store's pool once; stale pools (a restarted store) stay mapped until
      // the worker exits, which keeps their memory allocated on the GPU.
      auto mapping = std::make_unique<Mapping>();
      mapping->memory = *std::move(memory);
      it = pools_.emplace(pool.pool_id(), std::move(mapping)).first;
    }
    base = it->second->memory->data();
    size = it->second->memory->size();
  }
  // The worker asks for compact answers (OpenSameGpuTransfer): placements, never segments.
  if (!answer.has_placements()) {
    return absl::DataLossError("the same-GPU answer has no placements (an older kvstore?)");
  }
  const v1::PoolPlacements& p = answer.placements();
  const int n = p.offset_bytes_size();
  if (n != static_cast<int>(keys.size()) || p.digest64_size() != n ||
      p.byte_length_size() != n || p.encoding_size() != n) {
    return absl::DataLossError("the transfer's placements do not match the pages asked for");
  }
  std::vector<engine::DevicePage> pages;
  pages.reserve(n);
  PageKey parent = first_parent;
  for (int i = 0; i < n; ++i) {
    if (p.offset_bytes(i) + p.byte_length(i) > static_cast<uint64_t>(size)) {
      return absl::DataLossError("a transfer's page lies outside the kvstore pool");
    }
    kernels::PageEncoding encoding = kernels::PageEncoding::kBf16;
    if (p.encoding(i) == v1::PAGE_ENCODING_INT2) {
      encoding = int2_encoding_;
    } else if (p.encoding(i) != v1::PAGE_ENCODING_BF16 &&
               p.encoding(i) != v1::PAGE_ENCODING_BF16_RECENT) {
      return absl::DataLossError("a transfer's page encoding");
    }
    pages.push_back({.key = keys[i],
                     .parent_key = parent,
                     .page_index = first_index + i,
                     .encoding = encoding,
                     .bytes = base + p.offset_bytes(i),
                     .byte_length = static_cast<int64_t>(p.byte_length(i)),
                     .digest64 = p.digest64(i)});
    parent = keys[i];
  }
  return pages;
#else
  (void)answer;
  (void)keys;
  (void)first_parent;
  (void)first_index;
  return absl::UnimplementedError("built without CUDA");
#endif
}

}  // namespace kvstrata::decode

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

struct SameGpuPools::Mapping {
  std::unique_ptr<engine::SharedPageMemory> memory;
  std::unique_ptr<transport::PoolHolder> holder;  // the connection kept open (hold_)
  std::string store;
};

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

SameGpuPools::SameGpuPools(int cuda_device, kernels::PageEncoding int2_encoding,
                           MapShared map_shared, bool hold)
    : device_(cuda_device),
      int2_encoding_(int2_encoding),
      map_shared_(std::move(map_shared)),
      hold_(hold) {
#ifdef KVSTRATA_HAVE_CUDA
  if (device_ < 0 || !map_shared_) return;
  absl::StatusOr<std::pair<std::string, std::string>> id = engine::GpuUuidAndName(device_);
  if (!id.ok()) return;
  gpu_uuid_ = id->first;
  boot_id_ = transport::HostBootId();
  enabled_ = !boot_id_.empty();
#endif
}

SameGpuPools::~SameGpuPools() = default;

void SameGpuPools::Describe(v1::OpenTransferRequest* request, const std::string& store) const {
  request->mutable_device()->set_cuda_device(static_cast<uint32_t>(std::max(device_, 0)));
  request->mutable_device()->set_gpu_uuid(gpu_uuid_);
  request->mutable_device()->set_host_boot_id(boot_id_);
  if (enabled_) request->add_transports(v1::TRANSPORT_SAME_GPU_POOL);
  request->add_transports(v1::TRANSPORT_GRPC_STREAM);
  if (!enabled_ || !hold_ || store.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto pool = store_pool_.find(store);
  if (pool == store_pool_.end()) return;
  auto mapping = pools_.find(pool->second);
  if (mapping != pools_.end() && mapping->second->holder != nullptr) {
    request->set_pool_holder(mapping->second->holder->holder());
  }
}

int SameGpuPools::pools_mapped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(pools_.size());
}

void SameGpuPools::ForgetGonePoolsLocked() {
  for (auto it = pools_.begin(); it != pools_.end();) {
    const transport::PoolHolder* h = it->second->holder.get();
    // Only a connection that held can tell: a store older than holders closes every connection.
    if (h != nullptr && h->holder() != 0 && !h->open()) {
      fprintf(stderr,
              "kvstrata-decode: the kvstore pool %016llx (%s) is gone; unmapping it once no "
              "request reads from it\n",
              static_cast<unsigned long long>(it->first), it->second->store.c_str());
      std::erase_if(store_pool_, [&](const auto& sp) { return sp.second == it->first; });
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<SameGpuPools::Placed> SameGpuPools::Pages(const v1::OpenTransferResponse& answer,
                                                         std::span<const PageKey> keys,
                                                         const PageKey& first_parent,
                                                         int64_t first_index,
                                                         const std::string& store) {
#ifdef KVSTRATA_HAVE_CUDA
  const v1::SameGpuPool& pool = answer.pool();
  Placed placed;
  const uint8_t* base = nullptr;
  int64_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ForgetGonePoolsLocked();
    auto it = pools_.find(pool.pool_id());
    if (it == pools_.end()) {
      transport::PoolHandle handle;
      std::unique_ptr<transport::PoolHolder> holder;
      if (hold_) {
        auto held = transport::ConnectPoolHolder(pool.socket_path());
        if (!held.ok()) return held.status();
        handle = held->first;
        holder = std::move(held->second);
      } else {
        absl::StatusOr<transport::PoolHandle> received =
            transport::ReceivePoolHandle(pool.socket_path());
        if (!received.ok()) return received.status();
        handle = *received;
      }
      if (handle.pool_id != pool.pool_id()) {
        close(handle.fd);
        return absl::FailedPreconditionError(
            absl::StrCat("pool socket ", pool.socket_path(), " hands out pool ", handle.pool_id,
                         ", not ", pool.pool_id(), " (the store restarted)"));
      }
      absl::StatusOr<std::unique_ptr<engine::SharedPageMemory>> memory =
          map_shared_(handle.fd, static_cast<int64_t>(handle.pool_bytes));
      if (!memory.ok()) return memory.status();
      fprintf(stderr,
              "kvstrata-decode: mapped the kvstore pool %016llx (%s, %.1f GiB) on cuda:%d%s\n",
              static_cast<unsigned long long>(pool.pool_id()), pool.socket_path().c_str(),
              handle.pool_bytes / double(1 << 30), device_,
              holder == nullptr       ? ""
              : holder->holder() != 0 ? "; holding its leases by the pool connection"
                                      : "; the store holds no leases by connection (pages are "
                                        "copied, not read in place)");
      auto mapping = std::make_shared<Mapping>();
      mapping->memory = *std::move(memory);
      mapping->holder = std::move(holder);
      mapping->store = store;
      it = pools_.emplace(pool.pool_id(), std::move(mapping)).first;
    }
    if (!store.empty()) store_pool_[store] = pool.pool_id();
    base = it->second->memory->data();
    size = it->second->memory->size();
    placed.mapping = it->second;
    if (it->second->holder != nullptr) placed.holder = it->second->holder->holder();
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
  std::vector<engine::DevicePage>& pages = placed.pages;
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
  return placed;
#else
  (void)answer;
  (void)keys;
  (void)first_parent;
  (void)first_index;
  (void)store;
  return absl::UnimplementedError("built without CUDA");
#endif
}

}  // namespace kvstrata::decode

// OpenTransfer's TRANSPORT_NCCL: the setup of a worker's communicator with this store and the
// queuing of one transfer's sends (the handshake: proto/kvstrata/v1/kvstore.proto at
// OpenTransfer, docs/kvstore.md#nccl-between-gpus). Member functions of KvStoreService
// (kvstore_service.h); the rest of OpenTransfer is in kvstore_service.cc.

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "services/kvstore/kvstore_service.h"

namespace kvstrata::kvstore {
namespace {

// Each page of a transfer starts at a multiple of this (the digest kernel reads 16-byte
// vectors; 256 keeps NCCL's copies aligned too).
constexpr uint64_t kTransferAlign = 256;

}  // namespace

bool KvStoreService::NcclPossible(const v1::OpenTransferRequest& request, std::string* why) const {
  const std::string& store_gpu = options_.same_gpu_pool.gpu_uuid;
  if (options_.nccl == nullptr || !store_->has_fast_tier() ||
      store_->fast_tier()->base() == nullptr || store_gpu.empty()) {
    *why = "this store has no GPU tier with NCCL";
    return false;
  }
  if (request.device().gpu_uuid().empty()) {
    *why = "device.gpu_uuid is empty";
    return false;
  }
  if (request.device().gpu_uuid() == store_gpu) {
    *why = absl::StrCat("device.gpu_uuid is the store's own GPU ", store_gpu,
                        " (NCCL needs two GPUs; use TRANSPORT_SAME_GPU_POOL)");
    return false;
  }
  return true;
}

absl::Status KvStoreService::OpenNcclSetup(const v1::OpenTransferRequest& request,
                                           v1::OpenTransferResponse* response) {
  if (request.has_chain() || !request.pages().empty()) {
    return absl::InvalidArgumentError("nccl.setup: a setup names no pages (no chain, no pages)");
  }
  if (request.nccl().communicator_id() != 0) {
    return absl::InvalidArgumentError("nccl.communicator_id: must be 0 with nccl.setup");
  }
  if (std::find(request.transports().begin(), request.transports().end(), v1::TRANSPORT_NCCL) ==
      request.transports().end()) {
    return absl::InvalidArgumentError("transports: nccl.setup needs TRANSPORT_NCCL listed");
  }
  if (request.client_id().empty()) {
    return absl::InvalidArgumentError(
        "client_id: needed for nccl.setup (communicators are kept "
        "per client)");
  }
  std::string why;
  if (!NcclPossible(request, &why)) {
    return absl::FailedPreconditionError(
        absl::StrCat("transports: TRANSPORT_NCCL is not possible here: ", why));
  }
  KV_ASSIGN_OR_RETURN(NcclSetup setup, options_.nccl->Setup(request.client_id()));
  response->set_transport(v1::TRANSPORT_NCCL);
  response->set_transfer_id(0);
  response->set_nccl_unique_id(setup.unique_id);
  response->set_communicator_id(setup.communicator_id);
  response->set_num_ranks(static_cast<uint32_t>(setup.num_ranks));
  response->set_store_rank(static_cast<uint32_t>(setup.store_rank));
  response->set_client_rank(static_cast<uint32_t>(setup.client_rank));
  response->set_total_bytes(transport::kNcclWarmupBytes);
  response->set_transfer_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(setup.timeout)));
  fprintf(stderr, "kvstrata-kvstore: NCCL communicator %llu for %s (GPU %s): joining\n",
          static_cast<unsigned long long>(setup.communicator_id), request.client_id().c_str(),
          request.device().gpu_uuid().c_str());
  return absl::OkStatus();
}

absl::StatusOr<bool> KvStoreService::QueueNcclTransfer(const v1::OpenTransferRequest& request,
                                                       const std::vector<FormRef>& refs,
                                                       uint64_t lease_id,
                                                       v1::OpenTransferResponse* response) {
  const uint64_t communicator = request.nccl().communicator_id();
  KV_ASSIGN_OR_RETURN(std::vector<FastTierPlacement> placed,
                      store_->PlaceInFastTier(refs, lease_id));
  uint64_t total = 0;
  std::vector<uint64_t> offsets;
  offsets.reserve(placed.size());
  for (const FastTierPlacement& p : placed) {
    offsets.push_back(total);
    total += (p.meta.byte_length + kTransferAlign - 1) / kTransferAlign * kTransferAlign;
  }
  if (total > request.device().free_memory_bytes()) {
    response->set_communicator_id(communicator);  // still good: only this transfer is too big
    return false;
  }
  std::vector<transport::DeviceRange> sends;
  sends.reserve(placed.size());
  for (const FastTierPlacement& p : placed) {
    sends.push_back(options_.nccl->PoolRange(p.offset, p.meta.byte_length));
  }
  // The pages stay pinned by the client's lease, which it releases once it holds the bytes.
  absl::StatusOr<NcclQueued> queued = options_.nccl->Queue(communicator, request.client_id(),
                                                           std::move(sends), /*on_done=*/nullptr);
  if (absl::IsFailedPrecondition(queued.status())) {
    response->set_communicator_id(0);  // aborted since ChooseTransport: set up again
    return false;
  }
  if (!queued.ok()) return queued.status();
  response->set_transfer_id(queued->transfer_id);
  response->set_communicator_id(communicator);
  response->set_num_ranks(2);
  response->set_store_rank(0);
  response->set_client_rank(1);
  response->set_total_bytes(total);
  response->set_transfer_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(queued->timeout)));
  v1::PoolPlacements* out = response->mutable_placements();
  for (size_t i = 0; i < placed.size(); ++i) {
    out->add_offset_bytes(offsets[i]);
    out->add_digest64(placed[i].meta.digest64);
    out->add_byte_length(placed[i].meta.byte_length);
    out->add_encoding(ToProto(placed[i].meta.form));
  }
  return true;
}

}  // namespace kvstrata::kvstore

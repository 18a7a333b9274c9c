#pragma once

// kvstrata.v1.KvStore (proto/kvstrata/v1/kvstore.proto) on a PageStore, with the sync gRPC API.
// The handlers validate requests (INVALID_ARGUMENT naming the field), map absl::Status to
// grpc::Status, and keep the kvstrata_kvstore_* Prometheus metrics. Thread-safe: gRPC calls the
// handlers concurrently; all shared state is in the PageStore and the metrics.

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include "core/metrics.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/peer_auth.h"
#include "services/kvstore/nccl_sender.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore {

// What a GPU store tells clients on its GPU about its HBM pool (OpenTransfer).
struct SameGpuPoolOffer {
  std::string socket_path;   // where the pool's file descriptor is handed out; empty: no offer
  uint64_t pool_id = 0;
  std::string gpu_uuid;      // "GPU-..."
  std::string host_boot_id;  // /proc/sys/kernel/random/boot_id
};

struct KvStoreServiceOptions {
  // Identity reported by Stats; a random one is made when empty.
  std::string store_id;
  // Most page keys (or refs) in one Lookup, Pin or Fetch request.
  uint32_t max_keys_per_request = 4096;
  // Largest Fetch chunk sent, in bytes; also the default chunk.
  uint32_t max_chunk_bytes = 1 << 20;
  // Set by a store with a GPU tier.
  SameGpuPoolOffer same_gpu_pool;
  // TRANSPORT_NCCL to workers on other GPUs: set by a store with a GPU tier whose NCCL opened
  // (borrowed; its pool is the fast tier's memory). Null: not offered.
  NcclSender* nccl = nullptr;
  // Who may publish: Put, Pin, Release, OpenTransfer and a Lookup that asks for a lease need
  // the worker role (rpc/peer_auth.h).
  // Borrowed; null: every caller may (plaintext).
  const rpc::PeerAuthorizer* authorizer = nullptr;
};

class KvStoreMetrics;

// The wire encoding of a stored page form (PAGE_ENCODING_BF16, _INT2, _BF16_RECENT).
v1::PageEncoding ToProto(PageForm form);

class KvStoreService final : public v1::KvStore::Service {
 public:
  // `store` and `registry` are borrowed and must outlive the service; the metrics are added to
  // `registry` once, here.
  KvStoreService(PageStore* store, const KvStoreServiceOptions& options, MetricsRegistry* registry);
  ~KvStoreService() override;

  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status Fetch(grpc::ServerContext* context, const v1::FetchRequest* request,
                     grpc::ServerWriter<v1::FetchResponse>* writer) override;
  grpc::Status Pin(grpc::ServerContext* context, const v1::PinRequest* request,
                   v1::PinResponse* response) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;
  grpc::Status WatchEvents(grpc::ServerContext* context, const v1::WatchEventsRequest* request,
                           grpc::ServerWriter<v1::WatchEventsResponse>* writer) override;
  grpc::Status OpenTransfer(grpc::ServerContext* context, const v1::OpenTransferRequest* request,
                            v1::OpenTransferResponse* response) override;

 private:
  // Put reads its messages as bytes and parses them itself: gRPC's own reader reports a message
  // that does not parse as the end of the stream, which would commit a Put that was cut short.
  using PutStream = grpc::ServerReaderWriter<v1::PutResponse, grpc::ByteBuffer>;
  grpc::Status Put(grpc::ServerContext* context, PutStream* stream);

  // (key, BF16_RECENT copy?) per page ref; INVALID_ARGUMENT naming the ref.
  using FormRef = std::pair<PageKey, bool>;
  absl::StatusOr<std::vector<FormRef>> ParsePageRefs(
      const google::protobuf::RepeatedPtrField<v1::PageRef>& pages) const;
  // The pages an OpenTransfer names, in order: its chain walked in the store (primary forms), or
  // its list of refs. INVALID_ARGUMENT naming the field; NOT_FOUND for a chain the store's links
  // do not confirm.
  absl::StatusOr<std::vector<FormRef>> TransferRefs(const v1::OpenTransferRequest& request) const;
  // `allow_nccl` false: the choice after an NCCL transfer did not fit.
  v1::Transport ChooseTransport(const v1::OpenTransferRequest& request, bool allow_nccl) const;
  // TRANSPORT_NCCL (open_transfer_nccl.cc). Whether this store could send to the request's
  // device at all (a GPU tier, NCCL, another GPU); `why` says why not.
  bool NcclPossible(const v1::OpenTransferRequest& request, std::string* why) const;
  // A setup (nccl.setup): validated, the communicator made, its fields answered.
  absl::Status OpenNcclSetup(const v1::OpenTransferRequest& request,
                             v1::OpenTransferResponse* response);
  // The sends of pinned `refs` queued on the request's communicator and the answer filled;
  // false (nothing queued) when the transfer does not fit the client's memory or the
  // communicator went away meanwhile: the caller falls back.
  absl::StatusOr<bool> QueueNcclTransfer(const v1::OpenTransferRequest& request,
                                         const std::vector<FormRef>& refs, uint64_t lease_id,
                                         v1::OpenTransferResponse* response);

  // Records latency and outcome of one call and refreshes the store gauges.
  grpc::Status Finish(const char* method, absl::Time start, const absl::Status& status);
  // OK when the caller holds the worker role (or nothing is enforced).
  grpc::Status CheckRole(const grpc::ServerContext& context, const char* method) const;

  PageStore* store_;
  const KvStoreServiceOptions options_;
  const std::string store_id_;
  const uint64_t start_time_unix_ms_;
  std::unique_ptr<KvStoreMetrics> metrics_;
};

}  // namespace kvstrata::kvstore

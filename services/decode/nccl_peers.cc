#include "services/decode/nccl_peers.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvstrata::decode {
namespace {

// The store places each page of a transfer at a multiple of this (OpenTransferResponse).
constexpr uint64_t kTransferPageAlign = 256;

}  // namespace

struct NcclPeers::Peer {
  std::string address;
  std::shared_ptr<transport::DeviceRange> slab;       // made at the first setup, kept
  std::unique_ptr<transport::DigestChecker> checker;  // for the slab's pages: made with it, kept
  std::shared_ptr<transport::NcclCommunicator> comm;  // set when ready
  // Joined, not yet warmed up: the destructor aborts it, so that a warm-up the store never
  // sends ends now rather than at the setup's deadline (the store's init timeout, 30 s).
  std::shared_ptr<transport::NcclCommunicator> warming;
  uint64_t communicator_id = 0;
  uint64_t next_transfer_id = 1;
  bool setting_up = false;
  bool busy = false;  // a Lane holds it
  absl::Time retry_after = absl::InfinitePast();
  std::atomic<bool> cancel{false};
  std::thread thread;
};

class NcclPeers::Lane {
 public:
  Lane(NcclPeers* owner, Peer* peer) : owner_(owner), peer_(peer) {}
  ~Lane() {
    std::lock_guard<std::mutex> lock(owner_->mu_);
    peer_->busy = false;
  }
  Peer* peer() const { return peer_; }

 private:
  NcclPeers* owner_;
  Peer* peer_;
};

NcclPeers::NcclPeers(transport::NcclRuntime* runtime, const NcclPeersOptions& options)
    : runtime_(runtime), options_(options) {}

NcclPeers::~NcclPeers() {
  std::vector<std::shared_ptr<transport::NcclCommunicator>> warming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [address, peer] : peers_) {
      peer->cancel = true;  // a join in progress
      if (peer->warming != nullptr) warming.push_back(peer->warming);
    }
  }
  for (const auto& comm : warming) comm->Abort();
  for (auto& [address, peer] : peers_) {
    if (peer->thread.joinable()) peer->thread.join();
  }
}

NcclPeers::Peer* NcclPeers::PeerLocked(kvstore::KvStoreClient* client) {
  std::unique_ptr<Peer>& slot = peers_[client->address()];
  if (slot == nullptr) {
    slot = std::make_unique<Peer>();
    slot->address = client->address();
  }
  return slot.get();
}

void NcclPeers::StartSetupLocked(Peer* peer, kvstore::KvStoreClient* client) {
  if (peer->comm != nullptr || peer->setting_up || absl::Now() < peer->retry_after) return;
  if (peer->thread.joinable()) peer->thread.join();  // the last setup has ended
  peer->setting_up = true;
  peer->thread = std::thread([this, peer, client] { Setup(peer, client); });
}

void NcclPeers::Prepare(kvstore::KvStoreClient* client) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;
  StartSetupLocked(PeerLocked(client), client);
}

std::shared_ptr<NcclPeers::Lane> NcclPeers::Acquire(kvstore::KvStoreClient* client) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return nullptr;
  Peer* peer = PeerLocked(client);
  if (peer->busy) {
    if (peer->comm != nullptr) ++counts_.busy;
    return nullptr;
  }
  if (peer->comm != nullptr) {
    peer->busy = true;
    return std::make_shared<Lane>(this, peer);
  }
  // No communicator: make one in the background (this fetch goes another way).
  StartSetupLocked(peer, client);
  return nullptr;
}

void NcclPeers::Offer(const Lane& lane, v1::OpenTransferRequest* request) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Peer* peer = lane.peer();
  // Before the byte stream, after the same-GPU pool (which a store on this GPU prefers).
  google::protobuf::RepeatedField<int>* t = request->mutable_transports();
  auto grpc = std::find(t->begin(), t->end(), v1::TRANSPORT_GRPC_STREAM);
  const int at = static_cast<int>(grpc - t->begin());
  t->Add(v1::TRANSPORT_NCCL);
  for (int i = t->size() - 1; i > at; --i) t->SwapElements(i, i - 1);
  request->mutable_nccl()->set_communicator_id(peer->communicator_id);
  request->mutable_device()->set_free_memory_bytes(peer->slab->bytes);
  request->mutable_device()->set_gpu_uuid(options_.gpu_uuid);
  request->mutable_device()->set_nccl_version(runtime_->version());
}

void NcclPeers::NotChosen(Lane& lane, const v1::OpenTransferResponse& answer) {
  if (answer.communicator_id() != 0) return;  // still good (the transfer did not fit)
  std::lock_guard<std::mutex> lock(mu_);
  Forget(lane.peer(), "the kvstore no longer has the communicator");
}

void NcclPeers::Forget(Peer* peer, const char* why) {
  if (peer->comm == nullptr) return;
  fprintf(stderr, "kvstrata-decode: NCCL communicator %llu with kvstore %s: %s; making a new one\n",
          static_cast<unsigned long long>(peer->communicator_id), peer->address.c_str(), why);
  if (!peer->comm->broken()) ++counts_.aborts;  // a broken one was aborted (and counted) already
  peer->comm.reset();                           // aborts
  peer->communicator_id = 0;
  peer->retry_after = absl::InfinitePast();  // the next fetch starts the new setup
}

absl::StatusOr<std::vector<engine::DevicePage>> NcclPeers::Receive(
    Lane& lane, const v1::OpenTransferResponse& answer, std::span<const PageKey> keys,
    const PageKey& first_parent, int64_t first_index, absl::Time request_deadline) {
  Peer* peer = lane.peer();
  transport::NcclCommunicator* comm;
  uint64_t expected_transfer;
  uint64_t expected_communicator;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = peer->comm.get();
    expected_transfer = peer->next_transfer_id++;
    expected_communicator = peer->communicator_id;
    if (comm == nullptr) return absl::UnavailableError("the NCCL communicator is gone");
  }
  // The store has queued its sends: from here on, any answer this side cannot receive loses
  // the communicator's order, so the communicator goes (the store's sends then time out).
  auto fail = [&](absl::Status why) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.transfer_failures;
    if (peer->comm != nullptr && peer->comm->broken()) ++counts_.aborts;  // aborted by Transfer
    Forget(peer, std::string(why.message()).c_str());
    return why;
  };
  const v1::PoolPlacements& p = answer.placements();
  const int n = p.offset_bytes_size();
  if (answer.communicator_id() != expected_communicator ||
      answer.transfer_id() != expected_transfer) {
    return fail(
        absl::DataLossError(absl::StrCat("NCCL transfer ", answer.transfer_id(), " answered where ",
                                         expected_transfer, " was next")));
  }
  if (n != static_cast<int>(keys.size()) || p.digest64_size() != n || p.byte_length_size() != n ||
      p.encoding_size() != n) {
    return fail(absl::DataLossError("the NCCL transfer's placements do not match the pages"));
  }
  if (static_cast<size_t>(n) > peer->checker->max_pages()) {
    return fail(absl::DataLossError(absl::StrCat("the NCCL transfer's ", n, " pages exceed the ",
                                                 peer->checker->max_pages(),
                                                 " this worker checks at once")));
  }
  if (answer.total_bytes() > peer->slab->bytes) {
    return fail(absl::DataLossError(absl::StrCat("the NCCL transfer's ", answer.total_bytes(),
                                                 " bytes exceed the receive slab")));
  }
  std::vector<transport::DeviceRange> recvs;
  std::vector<transport::DigestCheck> checks;
  recvs.reserve(n);
  checks.reserve(n);
  for (int i = 0; i < n; ++i) {
    // Written so that no sum can wrap: a page must lie inside total_bytes, hence the slab.
    const uint64_t offset = p.offset_bytes(i);
    const uint64_t length = p.byte_length(i);
    if (length > answer.total_bytes() || offset > answer.total_bytes() - length ||
        offset % 16 != 0) {
      return fail(absl::DataLossError(absl::StrCat("NCCL transfer page ", i, " is misplaced")));
    }
    uint8_t* at = peer->slab->data + p.offset_bytes(i);
    recvs.push_back({at, p.byte_length(i)});
    checks.push_back({at, p.byte_length(i), p.digest64(i)});
  }
  // The store's deadline is its own to keep; this worker waits no longer than its own cap and
  // than its request has left (a request past its deadline is better computed than waited on).
  const absl::Time now = absl::Now();
  const absl::Time store_deadline = now + absl::Milliseconds(answer.transfer_timeout_ms());
  const absl::Time cap = now + options_.max_receive_wait;
  const absl::Time deadline = std::min({store_deadline, cap, request_deadline});
  if (absl::Status s = comm->Transfer(static_cast<int>(answer.store_rank()), {}, recvs, deadline);
      !s.ok()) {
    if (absl::IsDeadlineExceeded(s) && deadline < store_deadline) {
      const char* bound = deadline == request_deadline ? "the request's deadline"
                                                       : "the worker's --nccl_receive_timeout_ms";
      return fail(absl::DeadlineExceededError(absl::StrCat(s.message(), " (", bound, ", ",
                                                           absl::FormatDuration(deadline - now),
                                                           ", came before the store's)")));
    }
    return fail(s);
  }
  if (absl::Status s = peer->checker->Check(checks); !s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::IsDataLoss(s)) {
      ++counts_.digest_failures;
    } else {
      ++counts_.transfer_failures;
    }
    return s;
  }
  std::vector<engine::DevicePage> pages;
  pages.reserve(n);
  PageKey parent = first_parent;
  uint64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    kernels::PageEncoding encoding = kernels::PageEncoding::kBf16;
    if (p.encoding(i) == v1::PAGE_ENCODING_INT2) {
      encoding = options_.int2_encoding;
    } else if (p.encoding(i) != v1::PAGE_ENCODING_BF16 &&
               p.encoding(i) != v1::PAGE_ENCODING_BF16_RECENT) {
      return absl::DataLossError(absl::StrCat("NCCL transfer page ", i, ": unknown encoding"));
    }
    pages.push_back({.key = keys[i],
                     .parent_key = parent,
                     .page_index = first_index + i,
                     .encoding = encoding,
                     .bytes = recvs[i].data,
                     .byte_length = static_cast<int64_t>(p.byte_length(i)),
                     .digest64 = p.digest64(i)});
    parent = keys[i];
    bytes += p.byte_length(i);
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_.transfers;
  counts_.transfer_bytes += bytes;
  return pages;
}

void NcclPeers::Setup(Peer* peer, kvstore::KvStoreClient* client) {
  absl::Status s = SetupOnce(peer, client);
  std::lock_guard<std::mutex> lock(mu_);
  peer->setting_up = false;
  if (s.ok()) return;
  ++counts_.setup_failures;
  // A store that cannot do NCCL with this worker (a CPU store, or one on this GPU, which the
  // same-GPU pool serves) is asked again only rarely; a failure is retried soon.
  const bool unsupported = absl::IsFailedPrecondition(s);
  const absl::Duration pause = unsupported ? options_.unsupported_retry : options_.setup_retry;
  peer->retry_after = absl::Now() + pause;
  if (!stopping_) {
    fprintf(stderr, "kvstrata-decode: %sNCCL setup with kvstore %s %s (asked again in %s): %s\n",
            unsupported ? "" : "WARNING: ", peer->address.c_str(),
            unsupported ? "not possible" : "failed; its prefixes come by gRPC meanwhile",
            absl::FormatDuration(pause).c_str(), s.ToString().c_str());
  }
}

absl::Status NcclPeers::SetupOnce(Peer* peer, kvstore::KvStoreClient* client) {
  v1::OpenTransferRequest request;
  request.set_client_id(options_.client_id);
  request.mutable_device()->set_cuda_device(static_cast<uint32_t>(std::max(options_.device, 0)));
  request.mutable_device()->set_gpu_uuid(options_.gpu_uuid);
  request.mutable_device()->set_nccl_version(runtime_->version());
  request.add_transports(v1::TRANSPORT_NCCL);
  request.mutable_nccl()->set_setup(true);
  absl::StatusOr<v1::OpenTransferResponse> answer = client->OpenTransfer(request);
  if (!answer.ok()) return answer.status();
  if (answer->transport() != v1::TRANSPORT_NCCL ||
      answer->nccl_unique_id().size() != transport::kNcclUniqueIdBytes ||
      answer->client_rank() >= answer->num_ranks() || answer->store_rank() >= answer->num_ranks() ||
      answer->total_bytes() != transport::kNcclWarmupBytes || answer->communicator_id() == 0) {
    return absl::DataLossError("the kvstore's NCCL setup answer is malformed");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (peer->slab == nullptr) {
      absl::StatusOr<std::shared_ptr<transport::DeviceRange>> slab = runtime_->Allocate(
          options_.device, std::max(options_.receive_bytes, transport::kNcclWarmupBytes));
      if (!slab.ok()) return slab.status();
      // The digest check's scratch, once, for the most pages the slab takes: no transfer
      // allocates device memory or waits on another stream than the checker's.
      const size_t max_pages = options_.max_transfer_pages > 0
                                   ? options_.max_transfer_pages
                                   : std::max<size_t>(1, (*slab)->bytes / kTransferPageAlign);
      absl::StatusOr<std::unique_ptr<transport::DigestChecker>> checker =
          runtime_->NewDigestChecker(options_.device, max_pages);
      if (!checker.ok()) return checker.status();
      peer->slab = *std::move(slab);
      peer->checker = *std::move(checker);
    }
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(answer->transfer_timeout_ms());
  absl::StatusOr<std::unique_ptr<transport::NcclCommunicator>> comm = runtime_->Join(
      answer->nccl_unique_id(), static_cast<int>(answer->num_ranks()),
      static_cast<int>(answer->client_rank()), options_.device, deadline, &peer->cancel);
  if (!comm.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.aborts;  // a join that fails is aborted
    return comm.status();
  }
  std::shared_ptr<transport::NcclCommunicator> joined = *std::move(comm);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::CancelledError("the worker is stopping");
    peer->warming = joined;
  }
  absl::Status reg = joined->Register(*peer->slab);
  if (!reg.ok() && !absl::IsUnimplemented(reg)) {
    fprintf(stderr, "kvstrata-decode: NCCL with kvstore %s: registering the receive slab: %s\n",
            peer->address.c_str(), reg.ToString().c_str());
  }
  const transport::DeviceRange warm{peer->slab->data, transport::kNcclWarmupBytes};
  absl::Status warmed =
      joined->Transfer(static_cast<int>(answer->store_rank()), {}, {&warm, 1}, deadline);
  std::lock_guard<std::mutex> lock(mu_);
  peer->warming.reset();
  if (!warmed.ok()) {
    ++counts_.aborts;
    return warmed;
  }
  peer->comm = std::move(joined);
  peer->communicator_id = answer->communicator_id();
  peer->next_transfer_id = 1;
  ++counts_.communicators_made;
  fprintf(stderr, "kvstrata-decode: NCCL communicator %llu with kvstore %s ready\n",
          static_cast<unsigned long long>(peer->communicator_id), peer->address.c_str());
  return absl::OkStatus();
}

NcclPeersCounts NcclPeers::Counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

bool NcclPeers::Ready(const std::string& address) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(address);
  return it != peers_.end() && it->second->comm != nullptr;
}

}  // namespace kvstrata::decode

// kvstrata.v1.WorkerRegistry at the router: workers join the pool, report their load and the
// net changes of their local page tier, and leave when they drain.

#include <grpcpp/grpcpp.h>

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "rpc/status.h"
#include "services/router/router_internal.h"

namespace kvstrata::router {
namespace {

// GPU UUIDs are "GPU-" or "MIG-" and a 36-character UUID; this only bounds what a peer sends.
constexpr size_t kMaxGpuUuidBytes = 128;

}  // namespace

grpc::Status RegistryService::RegisterWorker(grpc::ServerContext* context,
                                             const v1::RegisterWorkerRequest* request,
                                             v1::RegisterWorkerResponse* response) {
  Router& r = *router_;
  if (r.options_.authorizer != nullptr) {
    if (grpc::Status s =
            r.options_.authorizer->Require(*context, "RegisterWorker", rpc::PeerRole::kWorker);
        !s.ok()) {
      return s;
    }
  }
  if (request->worker_id().empty()) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("worker_id: must not be empty"));
  }
  if (request->address().empty()) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("address: must not be empty"));
  }
  if (request->capacity_pages() == 0) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError("capacity_pages: must be > 0"));
  }
  if (request->same_gpu_uuid().size() > kMaxGpuUuidBytes) {
    return rpc::ToGrpcStatus(absl::InvalidArgumentError(
        absl::StrCat("same_gpu_uuid: at most ", kMaxGpuUuidBytes, " bytes, got ",
                     request->same_gpu_uuid().size())));
  }
  if (absl::Status s = r.CheckTokenizer(request->tokenizer()); !s.ok()) {
    fprintf(stderr, "kvstrata-router: refused worker %s (%s): %s\n",
            request->worker_id().c_str(), request->address().c_str(),
            std::string(s.message()).c_str());
    return rpc::ToGrpcStatus(s);
  }
  absl::StatusOr<PoolIdentity> id =
      IdentityFrom(request->model(), request->model_fingerprint(), request->kv_format());
  if (!id.ok()) return rpc::ToGrpcStatus(id.status());
  if (absl::Status s = r.CheckIdentity(*id); !s.ok()) {
    fprintf(stderr, "kvstrata-router: refused worker %s (%s): %s\n",
            request->worker_id().c_str(), request->address().c_str(),
            std::string(s.message()).c_str());
    return rpc::ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<PageKey>> keys =
      KeysFromBytes(request->local_page_keys(), "local_page_keys");
  if (!keys.ok()) return rpc::ToGrpcStatus(keys.status());

  WorkerLoad load;
  load.total_pages = static_cast<int64_t>(request->capacity_pages());
  load.free_pages = load.total_pages;
  if (absl::Status s = r.workers_.Register(request->worker_id(), request->address(), load,
                                           request->same_gpu_uuid());
      !s.ok()) {
    return rpc::ToGrpcStatus(s);
  }
  // A registration carries the worker's whole local tier: replace what the index believed.
  r.index_.ForgetWorker(request->worker_id());
  if (!keys->empty()) r.index_.OnWorkerStored(request->worker_id(), *keys);
  bool known;
  std::string colocated;
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    colocated = r.ColocatedKvStoreLocked(request->same_gpu_uuid());
    auto [it, inserted] = r.worker_states_.try_emplace(request->worker_id());
    known = !inserted && it->second.incarnation == request->incarnation();
    it->second.incarnation = request->incarnation();
    it->second.identity_checked = true;
    it->second.keeps_local_pages = request->local_page_capacity_bytes() > 0 || !keys->empty();
    it->second.limits.reset();
    if (request->has_limits() && request->limits().max_context_tokens() > 0) {
      it->second.limits = request->limits();
    }
  }
  r.metrics_->registrations.Get().Increment();
  fprintf(stderr,
          "kvstrata-router: worker %s %s at %s (incarnation %016llx, %llu pages, %d local page "
          "keys)\n",
          request->worker_id().c_str(), known ? "registered again" : "joined",
          request->address().c_str(), static_cast<unsigned long long>(request->incarnation()),
          static_cast<unsigned long long>(request->capacity_pages()),
          static_cast<int>(keys->size()));
  if (!request->same_gpu_uuid().empty()) {
    fprintf(stderr, "kvstrata-router: worker %s maps kvstore pools on %s: %s\n",
            request->worker_id().c_str(), request->same_gpu_uuid().c_str(),
            colocated.empty() ? "no kvstore node is known on that GPU (yet)"
                              : absl::StrCat("co-located with kvstore ", colocated).c_str());
  }
  response->set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(r.options_.worker_table.heartbeat_interval)));
  response->set_max_missed_heartbeats(
      static_cast<uint32_t>(r.options_.worker_table.max_missed_heartbeats));
  response->set_router_id(r.options_.router_id);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const v1::HeartbeatRequest* request,
                                        v1::HeartbeatResponse* response) {
  Router& r = *router_;
  if (r.options_.authorizer != nullptr) {
    if (grpc::Status s =
            r.options_.authorizer->Require(*context, "Heartbeat", rpc::PeerRole::kWorker);
        !s.ok()) {
      return s;
    }
  }
  const std::string& worker = request->worker_id();
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    auto it = r.worker_states_.find(worker);
    if (it == r.worker_states_.end() || it->second.incarnation != request->incarnation()) {
      return rpc::ToGrpcStatus(absl::NotFoundError(
          absl::StrCat("worker_id: '", worker,
                       "' with this incarnation is not registered; call RegisterWorker")));
    }
  }
  absl::StatusOr<std::vector<PageKey>> stored =
      KeysFromBytes(request->stored_page_keys(), "stored_page_keys");
  if (!stored.ok()) return rpc::ToGrpcStatus(stored.status());
  absl::StatusOr<std::vector<PageKey>> removed =
      KeysFromBytes(request->removed_page_keys(), "removed_page_keys");
  if (!removed.ok()) return rpc::ToGrpcStatus(removed.status());

  if (request->load().draining()) {
    if (r.workers_.Remove(worker)) {
      fprintf(stderr, "kvstrata-router: worker %s is draining; no new requests go to it\n",
              worker.c_str());
      r.metrics_->dropped.With({"draining"}).Increment();
      r.ForgetWorker(worker);
    }
    std::lock_guard<std::mutex> lock(r.mu_);
    r.worker_states_.erase(worker);
    response->set_heartbeat_interval_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(r.options_.worker_table.heartbeat_interval)));
    return grpc::Status::OK;
  }
  WorkerLoad load;
  load.running = request->load().running_requests();
  load.waiting = request->load().waiting_requests();
  load.free_pages = static_cast<int64_t>(request->load().free_pages());
  load.total_pages = static_cast<int64_t>(request->load().total_pages());
  if (absl::Status s = r.workers_.Heartbeat(worker, load); !s.ok()) {
    return rpc::ToGrpcStatus(absl::NotFoundError(absl::StrCat(
        "worker_id: '", worker, "' was dropped from the pool; call RegisterWorker")));
  }
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    r.ended_since_heartbeat_.erase(worker);
  }
  if (!stored->empty()) {
    r.index_.OnWorkerStored(worker, *stored);
    std::lock_guard<std::mutex> lock(r.mu_);
    r.worker_states_[worker].keeps_local_pages = true;
  }
  if (!removed->empty()) r.index_.OnWorkerRemoved(worker, *removed);
  response->set_heartbeat_interval_ms(static_cast<uint32_t>(
      absl::ToInt64Milliseconds(r.options_.worker_table.heartbeat_interval)));
  return grpc::Status::OK;
}


}  // namespace kvstrata::router

#pragma once

// A test-only kvstrata.v1.WorkerRegistry that records what workers send and answers as told.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "kvstrata/v1/worker.grpc.pb.h"

namespace kvstrata::decode {

class FakeWorkerRegistry final : public v1::WorkerRegistry::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (unavailable_calls_ > 0) {
      --unavailable_calls_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "starting");
    }
    registers_.push_back(*request);
    response->set_heartbeat_interval_ms(interval_ms_);
    response->set_max_missed_heartbeats(3);
    response->set_router_id("fake-router");
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override {
    std::lock_guard<std::mutex> lock(mu_);
    failed_heartbeats_.push_back(*request);
    if (not_found_heartbeats_ > 0) {
      --not_found_heartbeats_;
      cv_.notify_all();
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
    }
    if (unavailable_calls_ > 0) {
      --unavailable_calls_;
      cv_.notify_all();
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "busy");
    }
    failed_heartbeats_.pop_back();
    heartbeats_.push_back(*request);
    response->set_heartbeat_interval_ms(interval_ms_);
    cv_.notify_all();
    return grpc::Status::OK;
  }

  // The next n heartbeats answer NOT_FOUND; the next n calls of either kind UNAVAILABLE.
  void FailHeartbeatsWithNotFound(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    not_found_heartbeats_ = n;
  }
  void FailCallsWithUnavailable(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    unavailable_calls_ = n;
  }

  // Waits (up to 20 s) until `done` holds over the recorded calls; returns whether it did.
  bool WaitFor(const std::function<bool(const std::vector<v1::RegisterWorkerRequest>&,
                                        const std::vector<v1::HeartbeatRequest>&)>& done) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20),
                        [&] { return done(registers_, heartbeats_); });
  }
  std::vector<v1::RegisterWorkerRequest> registers() {
    std::lock_guard<std::mutex> lock(mu_);
    return registers_;
  }
  std::vector<v1::HeartbeatRequest> heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return heartbeats_;
  }
  std::vector<v1::HeartbeatRequest> failed_heartbeats() {
    std::lock_guard<std::mutex> lock(mu_);
    return failed_heartbeats_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t interval_ms_ = 100;
  int not_found_heartbeats_ = 0;
  int unavailable_calls_ = 0;
  std::vector<v1::RegisterWorkerRequest> registers_;
  std::vector<v1::HeartbeatRequest> heartbeats_;
  std::vector<v1::HeartbeatRequest> failed_heartbeats_;
};

}  // namespace kvstrata::decode

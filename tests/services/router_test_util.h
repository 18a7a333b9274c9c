#pragma once

// What the router's in-process tests share: a scripted worker (the router's answers to its
// failures are what these tests are about, so the workers are fakes), and a fixture that starts
// the router's services on loopback with a fake clock for the worker table.

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/metrics.h"
#include "core/radix_hash.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "kvstrata/v1/worker.grpc.pb.h"
#include "model/tiny_model.h"
#include "rpc/server.h"
#include "tests/testing/wait_until.h"
#include "services/router/router_service.h"
#include "tests/testing/fake_clock.h"
#include "tokenizer/prompt_encoder.h"

namespace kvstrata::router::test {

inline constexpr char kFingerprint[] = "f00d";
inline constexpr char kFormat[] = "int2-g64-sink64-recent256-p64";
inline constexpr uint32_t kPage = 64;

using ::kvstrata::test_util::FakeClock;

// How a ScriptedWorker answers every Generate.
struct Script {
  grpc::Status fail = grpc::Status::OK;  // fail with this before any message
  bool hang = false;                     // a long prefill: no message until cancelled
  int tokens = 1;                        // tokens streamed before the final message
  // Between tokens. The worker ignores deadlines: only a cancel stops it.
  absl::Duration token_interval = absl::ZeroDuration();
  // After the tokens, end with UNAVAILABLE instead of a final message (a worker that died).
  bool fail_after_output = false;
};

// A worker that answers every Generate the same scripted way and records what it was sent.
class ScriptedWorker final : public v1::Generation::Service {
 public:
  explicit ScriptedWorker(std::string id, grpc::Status fail = grpc::Status::OK, bool hang = false)
      : ScriptedWorker(std::move(id), Script{.fail = std::move(fail), .hang = hang}) {}
  ScriptedWorker(std::string id, Script script) : id_(std::move(id)), script_(std::move(script)) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(*request);
    }
    if (script_.hang) {
      const absl::Time give_up = absl::Now() + absl::Seconds(20);
      while (!context->IsCancelled() && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      cancelled_ = context->IsCancelled();
      return grpc::Status::CANCELLED;
    }
    if (!script_.fail.ok()) return script_.fail;
    v1::GenerateResponse m;
    for (int i = 0; i < script_.tokens; ++i) {
      if (i > 0) absl::SleepFor(script_.token_interval);
      if (context->IsCancelled()) {
        cancelled_ = true;
        return grpc::Status::CANCELLED;
      }
      m.Clear();
      m.set_request_id(request->request_id());
      m.set_worker_id(id_);
      m.add_token_ids(7);
      m.set_text("hi");
      if (!writer->Write(m)) {  // the stream is gone: the router or the client ended it
        cancelled_ = true;
        return grpc::Status::CANCELLED;
      }
    }
    if (script_.fail_after_output) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed");
    }
    m.Clear();
    m.set_request_id(request->request_id());
    m.set_worker_id(id_);
    m.set_finish_reason(v1::FINISH_REASON_LENGTH);
    v1::Usage* u = m.mutable_usage();
    u->set_prompt_tokens(static_cast<uint32_t>(request->token_ids().ids_size()));
    u->set_completion_tokens(static_cast<uint32_t>(script_.tokens));
    u->set_cached_local_tokens(request->routing().predicted_local_cached_tokens());
    u->set_uncached_tokens(u->prompt_tokens() - u->cached_local_tokens());
    m.mutable_timings()->set_time_to_first_token_us(10);
    writer->Write(m);
    return grpc::Status::OK;
  }

  std::vector<v1::GenerateRequest> received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }
  bool cancelled() const { return cancelled_.load(); }

 private:
  const std::string id_;
  const Script script_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::vector<v1::GenerateRequest> received_;
};

struct Worker {
  std::unique_ptr<ScriptedWorker> service;
  std::unique_ptr<rpc::Server> server;
};

inline Worker StartWorker(const std::string& id, Script script) {
  Worker w;
  w.service = std::make_unique<ScriptedWorker>(id, std::move(script));
  absl::StatusOr<std::unique_ptr<rpc::Server>> s =
      rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {w.service.get()}});
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) w.server = *std::move(s);
  return w;
}

inline Worker StartWorker(const std::string& id, grpc::Status fail = grpc::Status::OK,
                          bool hang = false) {
  return StartWorker(id, Script{.fail = std::move(fail), .hang = hang});
}

inline tokenizer::PromptEncoder TinyEncoder() {
  absl::StatusOr<model::LoadedModel> m = model::MakeTinyModel({});
  EXPECT_TRUE(m.ok()) << m.status();
  absl::StatusOr<tokenizer::PromptEncoder> e = tokenizer::PromptEncoder::Create(m->tokenizer);
  EXPECT_TRUE(e.ok()) << e.status();
  return *std::move(e);
}

// Polls `done` until it holds or 5 s have passed; returns whether it held.
template <typename Done>
bool WaitUntil(Done done) {
  return test_util::WaitUntil(done, absl::Seconds(5));
}

// A kvstore node as the router sees it: Stats names its GPU, and WatchEvents sends a snapshot
// of `pages` (stored events), then holds the stream open until it is cancelled.
class FakeKvStoreNode final : public v1::KvStore::Service {
 public:
  FakeKvStoreNode(std::string gpu_uuid, std::vector<PageKey> pages)
      : gpu_uuid_(std::move(gpu_uuid)), pages_(std::move(pages)) {}

  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse* response) override {
    response->set_gpu_uuid(gpu_uuid_);
    return grpc::Status::OK;
  }
  grpc::Status WatchEvents(grpc::ServerContext* context, const v1::WatchEventsRequest*,
                           grpc::ServerWriter<v1::WatchEventsResponse>* writer) override {
    v1::WatchEventsResponse response;
    response.set_store_epoch(7);
    for (const PageKey& key : pages_) {
      v1::PageEvent* e = response.add_events();
      e->set_snapshot(true);
      e->mutable_stored()->set_key(key.ToBytes());
    }
    writer->Write(response);
    while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status::OK;
  }

 private:
  const std::string gpu_uuid_;
  const std::vector<PageKey> pages_;
};

struct KvStoreNode {
  std::unique_ptr<FakeKvStoreNode> service;
  std::unique_ptr<rpc::Server> server;
};

inline KvStoreNode StartKvStoreNode(std::string gpu_uuid, std::vector<PageKey> pages) {
  KvStoreNode n;
  n.service = std::make_unique<FakeKvStoreNode>(std::move(gpu_uuid), std::move(pages));
  absl::StatusOr<std::unique_ptr<rpc::Server>> s =
      rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {n.service.get()}});
  EXPECT_TRUE(s.ok()) << s.status();
  if (s.ok()) n.server = *std::move(s);
  return n;
}

// A Generate call left running (on a hanging worker) until the test ends it.
struct OpenCall {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;

  OpenCall(v1::Generation::Stub& stub, const v1::GenerateRequest& request) {
    reader = stub.Generate(&context, request);
  }
  // Cancels the call, reads what is left and returns its status.
  grpc::Status CancelAndFinish() {
    context.TryCancel();
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  }
};

class RouterServiceTest : public ::testing::Test {
 protected:
  void Start(RouterOptions options) {
    options.worker_table.heartbeat_interval = absl::Milliseconds(20);
    options.log_requests = false;
    absl::StatusOr<std::unique_ptr<Router>> r =
        Router::Create(TinyEncoder(), options, &registry_, &clock_);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    generation_ = std::make_unique<RouterService>(router_.get());
    workers_ = std::make_unique<RegistryService>(router_.get());
    absl::StatusOr<std::unique_ptr<rpc::Server>> s = rpc::Server::Start(
        {.listen_address = "127.0.0.1:0", .services = {generation_.get(), workers_.get()}});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    gen_stub_ = v1::Generation::NewStub(channel);
    reg_stub_ = v1::WorkerRegistry::NewStub(channel);
  }

  void TearDown() override {
    if (server_) server_->Shutdown(absl::Seconds(1));
  }

  v1::RegisterWorkerRequest Registration(const std::string& id, const std::string& address) {
    v1::RegisterWorkerRequest r;
    r.set_worker_id(id);
    r.set_incarnation(42);
    r.set_address(address);
    r.set_model("tiny");
    r.set_model_fingerprint(kFingerprint);
    r.mutable_kv_format()->set_name(kFormat);
    r.mutable_kv_format()->set_page_size_tokens(kPage);
    r.set_capacity_pages(100);
    return r;
  }

  // Registers a worker that keeps a local page tier.
  grpc::Status RegisterWithLocalTier(const std::string& id, const Worker& w) {
    v1::RegisterWorkerRequest r = Registration(id, w.server->address());
    r.set_local_page_capacity_bytes(1 << 30);
    return Register(r);
  }

  grpc::Status Register(const v1::RegisterWorkerRequest& r) {
    grpc::ClientContext c;
    v1::RegisterWorkerResponse response;
    return reg_stub_->RegisterWorker(&c, r, &response);
  }

  grpc::Status Heartbeat(const v1::HeartbeatRequest& r) {
    grpc::ClientContext c;
    v1::HeartbeatResponse response;
    return reg_stub_->Heartbeat(&c, r, &response);
  }

  struct Result {
    grpc::Status status;
    std::vector<v1::GenerateResponse> messages;
  };
  Result Generate(const v1::GenerateRequest& request) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = gen_stub_->Generate(&c, request);
    Result r;
    v1::GenerateResponse m;
    while (reader->Read(&m)) r.messages.push_back(m);
    r.status = reader->Finish();
    return r;
  }

  uint32_t AvailableWorkers() {
    grpc::ClientContext c;
    v1::ServerInfo info;
    EXPECT_TRUE(gen_stub_->GetServerInfo(&c, {}, &info).ok());
    return info.available_workers();
  }

  // The keys the router should compute for a prompt in the shared namespace.
  std::vector<PageKey> KeysOf(const std::vector<int32_t>& prompt) {
    HashNamespace ns{.model_fingerprint = kFingerprint,
                     .kv_format = kFormat,
                     .rotation_digest = "identity",
                     .page_tokens = kPage};
    const size_t pages = (prompt.size() - 1) / kPage;
    absl::StatusOr<std::vector<PageKey>> k =
        PrefixPageKeys(ns, std::span<const int32_t>(prompt).first(pages * kPage));
    EXPECT_TRUE(k.ok());
    return *k;
  }

  static std::string Text(int pages) {
    std::string s;
    for (int i = 0; i < pages * static_cast<int>(kPage); ++i) s += static_cast<char>('a' + i % 26);
    return s;
  }

  MetricsRegistry registry_;
  FakeClock clock_;
  std::unique_ptr<Router> router_;
  std::unique_ptr<RouterService> generation_;
  std::unique_ptr<RegistryService> workers_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<v1::Generation::Stub> gen_stub_;
  std::unique_ptr<v1::WorkerRegistry::Stub> reg_stub_;
};

}  // namespace kvstrata::router::test

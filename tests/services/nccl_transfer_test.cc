// OpenTransfer's TRANSPORT_NCCL against a kvstore in process whose NCCL is a fake in host memory
// (tests/testing/fake_nccl.h; the real NCCL on a GPU: tests/transport/nccl_gpu_test.cc): the
// negotiation, the setup's fields, validation errors naming the field, the transfer order and
// bytes, and failures (a worker that never joins, a transfer no one receives) aborted, counted
// and answered with another transport.

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/metrics.h"
#include "core/page_digest.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/server.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/nccl_sender.h"
#include "tests/services/host_tier_memory.h"
#include "tests/services/test_pages.h"
#include "tests/testing/fake_nccl.h"
#include "tests/testing/wait_until.h"

namespace kvstrata::kvstore {
namespace {

using ::kvstrata::kvstore::testing::HostTierMemory;
using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::TestPage;
using ::testing::HasSubstr;

constexpr char kStoreGpu[] = "GPU-5e1f0c2a-0000-4000-8000-000000000001";
constexpr char kWorkerGpu[] = "GPU-5e1f0c2a-0000-4000-8000-000000000002";
constexpr char kBoot[] = "0b8d4c4e-1111-4222-8333-444455556666";

using ::kvstrata::test_util::WaitUntil;

class NcclTransferTest : public ::testing::Test {
 protected:
  void Start(bool with_nccl = true, NcclSenderOptions nccl_options = {}) {
    PageStoreOptions options;
    options.capacity_bytes = 8 * 16448;
    options.max_lease_ttl = absl::Seconds(30);
    tier_ = std::make_shared<HostTierMemory>(4 * 16640);
    options.fast_tier = tier_;
    store_ = std::make_unique<PageStore>(options, &clock_);
    KvStoreServiceOptions service_options{.store_id = "test-store"};
    service_options.same_gpu_pool = {.socket_path = "/tmp/test-pool.sock",
                                     .pool_id = 77,
                                     .gpu_uuid = kStoreGpu,
                                     .host_boot_id = kBoot};
    if (with_nccl) {
      sender_ = std::make_unique<NcclSender>(&nccl_, tier_->base(), tier_->size(), nccl_options);
      service_options.nccl = sender_.get();
    }
    service_ = std::make_unique<KvStoreService>(store_.get(), service_options, &registry_);
    absl::StatusOr<std::unique_ptr<rpc::Server>> server =
        rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {service_.get()}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::KvStore::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    chain_ = MakeChain({1, 2, 3});
    for (const TestPage& page : chain_) ASSERT_TRUE(store_->Put(page.meta, page.bytes).ok());
  }

  void TearDown() override {
    server_.reset();
    worker_comm_.reset();
    sender_.reset();
  }

  v1::OpenTransferRequest Setup(const char* gpu = kWorkerGpu) {
    v1::OpenTransferRequest request;
    request.set_client_id("worker-0");
    request.mutable_device()->set_gpu_uuid(gpu);
    request.mutable_device()->set_host_boot_id(kBoot);
    request.add_transports(v1::TRANSPORT_NCCL);
    request.add_transports(v1::TRANSPORT_GRPC_STREAM);
    request.mutable_nccl()->set_setup(true);
    return request;
  }

  v1::OpenTransferRequest Transfer(uint64_t communicator, uint64_t room = 1 << 20) {
    v1::OpenTransferRequest request = Setup();
    request.mutable_nccl()->set_setup(false);
    request.mutable_nccl()->set_communicator_id(communicator);
    request.mutable_device()->set_free_memory_bytes(room);
    request.set_compact(true);
    request.mutable_chain()->set_last_key(chain_.back().meta.key.ToBytes());
    request.mutable_chain()->set_page_count(static_cast<uint32_t>(chain_.size()));
    request.mutable_chain()->set_first_parent_key(chain_[0].meta.parent_key.ToBytes());
    return request;
  }

  grpc::Status Open(const v1::OpenTransferRequest& request, v1::OpenTransferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->OpenTransfer(&context, request, response);
  }

  // Plays the worker's side of a setup: joins as the client rank and receives the warm-up.
  uint64_t JoinAsWorker() {
    v1::OpenTransferResponse setup;
    grpc::Status s = Open(Setup(), &setup);
    EXPECT_TRUE(s.ok()) << s.error_message();
    absl::StatusOr<std::unique_ptr<transport::NcclCommunicator>> comm =
        nccl_.Join(setup.nccl_unique_id(), static_cast<int>(setup.num_ranks()),
                   static_cast<int>(setup.client_rank()), 0, absl::Now() + absl::Seconds(10),
                   /*cancel=*/nullptr);
    EXPECT_TRUE(comm.ok()) << comm.status();
    if (!comm.ok()) return 0;
    worker_comm_ = *std::move(comm);
    std::vector<uint8_t> warm(setup.total_bytes());
    const transport::DeviceRange recv{warm.data(), warm.size()};
    EXPECT_TRUE(worker_comm_->Transfer(0, {}, {&recv, 1}, absl::Now() + absl::Seconds(10)).ok());
    const uint64_t id = setup.communicator_id();
    EXPECT_TRUE(WaitUntil([&] { return sender_->Ready(id); }));
    return id;
  }

  double Metric(const std::string& line_start) const {
    const std::string text = registry_.Render();
    size_t at = text.find("\n" + line_start + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + line_start.size() + 2));
  }

  SystemClock clock_;
  MetricsRegistry registry_;
  ::kvstrata::testing::FakeNccl nccl_;
  std::shared_ptr<HostTierMemory> tier_;
  std::unique_ptr<PageStore> store_;
  std::unique_ptr<NcclSender> sender_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<v1::KvStore::Stub> stub_;
  std::unique_ptr<transport::NcclCommunicator> worker_comm_;
  std::vector<TestPage> chain_;
};

TEST_F(NcclTransferTest, ASetupAnswersWhatTheWorkerNeedsToJoin) {
  NcclSenderOptions options;
  options.init_timeout = absl::Milliseconds(4321);
  Start(/*with_nccl=*/true, options);
  v1::OpenTransferResponse setup;
  ASSERT_TRUE(Open(Setup(), &setup).ok());
  EXPECT_EQ(setup.transport(), v1::TRANSPORT_NCCL);
  EXPECT_EQ(setup.nccl_unique_id().size(), transport::kNcclUniqueIdBytes);
  EXPECT_NE(setup.communicator_id(), 0u);
  EXPECT_EQ(setup.num_ranks(), 2u);
  EXPECT_EQ(setup.store_rank(), 0u);
  EXPECT_EQ(setup.client_rank(), 1u);
  EXPECT_EQ(setup.transfer_id(), 0u);
  EXPECT_EQ(setup.total_bytes(), transport::kNcclWarmupBytes);
  EXPECT_EQ(setup.transfer_timeout_ms(), 4321u);
  EXPECT_EQ(setup.lease_id(), 0u);  // a setup pins nothing
  EXPECT_EQ(store_->Stats().pinned_pages, 0u);
}

TEST_F(NcclTransferTest, BadSetupsAreRefusedNamingTheField) {
  Start();
  auto expect = [&](v1::OpenTransferRequest request, grpc::StatusCode code, const char* field) {
    v1::OpenTransferResponse response;
    grpc::Status s = Open(request, &response);
    EXPECT_EQ(s.error_code(), code) << field << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(field));
  };
  v1::OpenTransferRequest with_pages = Setup();
  with_pages.add_pages()->set_key(chain_[0].meta.key.ToBytes());
  expect(with_pages, grpc::StatusCode::INVALID_ARGUMENT, "nccl.setup");
  v1::OpenTransferRequest with_id = Setup();
  with_id.mutable_nccl()->set_communicator_id(5);
  expect(with_id, grpc::StatusCode::INVALID_ARGUMENT, "nccl.communicator_id");
  v1::OpenTransferRequest no_nccl = Setup();
  no_nccl.clear_transports();
  no_nccl.add_transports(v1::TRANSPORT_GRPC_STREAM);
  expect(no_nccl, grpc::StatusCode::INVALID_ARGUMENT, "transports");
  v1::OpenTransferRequest no_client = Setup();
  no_client.clear_client_id();
  expect(no_client, grpc::StatusCode::INVALID_ARGUMENT, "client_id");
  // NCCL is for another GPU: the store's own GPU, or none named, is refused.
  expect(Setup(kStoreGpu), grpc::StatusCode::FAILED_PRECONDITION, "store's own GPU");
  expect(Setup(""), grpc::StatusCode::FAILED_PRECONDITION, "device.gpu_uuid");
}

TEST_F(NcclTransferTest, AStoreWithoutNcclRefusesASetupAndServesTheStream) {
  Start(/*with_nccl=*/false);
  v1::OpenTransferResponse response;
  grpc::Status s = Open(Setup(), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("transports: TRANSPORT_NCCL is not possible"));
  ASSERT_TRUE(Open(Transfer(/*communicator=*/42), &response).ok());
  EXPECT_EQ(response.transport(), v1::TRANSPORT_GRPC_STREAM);
  EXPECT_EQ(response.communicator_id(), 0u);
}

TEST_F(NcclTransferTest, WithoutAReadyCommunicatorTheNextTransportIsChosen) {
  Start();
  v1::OpenTransferResponse response;
  // Not offered: gRPC as before.
  v1::OpenTransferRequest plain = Transfer(0);
  plain.clear_transports();
  plain.add_transports(v1::TRANSPORT_GRPC_STREAM);
  ASSERT_TRUE(Open(plain, &response).ok());
  EXPECT_EQ(response.transport(), v1::TRANSPORT_GRPC_STREAM);
  // Offered with a communicator the store does not know: the next transport, id 0 (set up).
  ASSERT_TRUE(Open(Transfer(/*communicator=*/12345), &response).ok());
  EXPECT_EQ(response.transport(), v1::TRANSPORT_GRPC_STREAM);
  EXPECT_EQ(response.communicator_id(), 0u);
  EXPECT_NE(response.lease_id(), 0u);
  // Offered alone: no transport is possible.
  v1::OpenTransferRequest only_nccl = Transfer(12345);
  only_nccl.clear_transports();
  only_nccl.add_transports(v1::TRANSPORT_NCCL);
  grpc::Status s = Open(only_nccl, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("transports"));
  // What the store offers names NCCL and what it needs.
  EXPECT_THAT(s.error_message(), HasSubstr("TRANSPORT_NCCL"));
  EXPECT_THAT(s.error_message(), HasSubstr("nccl.communicator_id"));
}

TEST_F(NcclTransferTest, TransfersMoveThePagesInOrderAndCount) {
  Start();
  const uint64_t id = JoinAsWorker();
  ASSERT_NE(id, 0u);
  for (uint64_t expected_transfer = 1; expected_transfer <= 2; ++expected_transfer) {
    v1::OpenTransferResponse answer;
    ASSERT_TRUE(Open(Transfer(id), &answer).ok());
    ASSERT_EQ(answer.transport(), v1::TRANSPORT_NCCL);
    EXPECT_EQ(answer.transfer_id(), expected_transfer);
    EXPECT_EQ(answer.communicator_id(), id);
    EXPECT_GT(answer.transfer_timeout_ms(), 0u);
    const v1::PoolPlacements& p = answer.placements();
    ASSERT_EQ(p.offset_bytes_size(), 3);
    std::vector<uint8_t> slab(answer.total_bytes());
    std::vector<transport::DeviceRange> recvs;
    std::vector<transport::DigestCheck> checks;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(p.offset_bytes(i) % 256, 0u);
      EXPECT_EQ(p.byte_length(i), chain_[i].bytes.size());
      EXPECT_EQ(p.digest64(i), PageDigest64(chain_[i].bytes.data(), chain_[i].bytes.size()));
      recvs.push_back({slab.data() + p.offset_bytes(i), p.byte_length(i)});
      checks.push_back({slab.data() + p.offset_bytes(i), p.byte_length(i), p.digest64(i)});
    }
    ASSERT_TRUE(worker_comm_->Transfer(0, {}, recvs, absl::Now() + absl::Seconds(10)).ok());
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(0, std::memcmp(slab.data() + p.offset_bytes(i), chain_[i].bytes.data(),
                               chain_[i].bytes.size()))
          << "page " << i;
    }
    absl::StatusOr<std::unique_ptr<transport::DigestChecker>> checker =
        nccl_.NewDigestChecker(/*device=*/0, /*max_pages=*/checks.size());
    ASSERT_TRUE(checker.ok()) << checker.status();
    EXPECT_TRUE((*checker)->Check(checks).ok());
    EXPECT_EQ(store_->Stats().pinned_pages, 3u);  // under the answered lease until released
    EXPECT_TRUE(store_->Release(answer.lease_id()));
  }
  ASSERT_TRUE(WaitUntil([&] { return sender_->Counts().transfers == 2; }));
  v1::OpenTransferResponse stats;
  ASSERT_TRUE(Open(Transfer(id, /*room=*/0), &stats).ok());  // any call syncs the metrics
  EXPECT_EQ(Metric("kvstrata_kvstore_nccl_transfers_total"), 2);
  EXPECT_EQ(Metric("kvstrata_kvstore_nccl_communicators_made_total"), 1);
  EXPECT_EQ(Metric("kvstrata_kvstore_transfers_total{transport=\"nccl\"}"), 2);
  EXPECT_EQ(Metric("kvstrata_kvstore_nccl_communicators"), 1);
}

// The service only queues ranges of pool placements it made: one outside the pool is the store's
// own bug, not the worker's request, and must not be answered as the worker's bad argument.
TEST_F(NcclTransferTest, ASendOutsideThePoolIsAnInternalErrorAndQueuesNothing) {
  Start();
  const uint64_t id = JoinAsWorker();
  ASSERT_NE(id, 0u);
  const transport::DeviceRange in_pool = sender_->PoolRange(0, 256);
  const std::vector<std::vector<transport::DeviceRange>> bad = {
      {in_pool, {tier_->base() + tier_->size() - 16, 32}},  // runs off the end
      {{tier_->base() + 16, ~uint64_t{0} - 8}},             // its end wraps past 2^64
      {{tier_->base() + tier_->size(), 1}},                 // starts at the end
  };
  for (size_t b = 0; b < bad.size(); ++b) {
    absl::StatusOr<NcclQueued> queued = sender_->Queue(id, "worker-0", bad[b], /*on_done=*/nullptr);
    EXPECT_EQ(queued.status().code(), absl::StatusCode::kInternal) << b << ": " << queued.status();
    EXPECT_THAT(std::string(queued.status().message()), HasSubstr("lies outside the pool")) << b;
  }
  EXPECT_TRUE(sender_->Ready(id));  // nothing was queued: the communicator's order is intact
  v1::OpenTransferResponse answer;
  ASSERT_TRUE(Open(Transfer(id), &answer).ok());
  EXPECT_EQ(answer.transfer_id(), 1u);
}

TEST_F(NcclTransferTest, AnotherWorkersCommunicatorIsRefusedAndKeepsItsOrder) {
  Start();
  const uint64_t id = JoinAsWorker();  // worker-0's
  ASSERT_NE(id, 0u);
  for (const char* other : {"worker-1", ""}) {
    v1::OpenTransferRequest request = Transfer(id);
    request.set_client_id(other);
    v1::OpenTransferResponse answer;
    grpc::Status s = Open(request, &answer);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other;
    EXPECT_THAT(s.error_message(), HasSubstr("nccl.communicator_id")) << other;
    EXPECT_EQ(store_->Stats().pinned_pages, 0u) << other;  // the lease it made went with it
  }
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    EXPECT_EQ(nccl_.record().sends_posted, 1);  // the warm-up only
  }
  // Nothing was queued on it: its worker's next transfer is still number 1.
  EXPECT_TRUE(sender_->Ready(id));
  v1::OpenTransferResponse answer;
  ASSERT_TRUE(Open(Transfer(id), &answer).ok());
  ASSERT_EQ(answer.transport(), v1::TRANSPORT_NCCL);
  EXPECT_EQ(answer.transfer_id(), 1u);
}

TEST_F(NcclTransferTest, ATransferLargerThanTheWorkersRoomFallsBackKeepingTheCommunicator) {
  Start();
  const uint64_t id = JoinAsWorker();
  ASSERT_NE(id, 0u);
  v1::OpenTransferResponse answer;
  ASSERT_TRUE(Open(Transfer(id, /*room=*/1000), &answer).ok());
  EXPECT_EQ(answer.transport(), v1::TRANSPORT_GRPC_STREAM);
  EXPECT_EQ(answer.communicator_id(), id);  // still good
  EXPECT_TRUE(sender_->Ready(id));
  EXPECT_EQ(Metric("kvstrata_kvstore_nccl_fallbacks_total"), 1);
}

TEST_F(NcclTransferTest, AWorkerThatNeverJoinsIsAbortedAtTheDeadlineAndCounted) {
  NcclSenderOptions options;
  options.init_timeout = absl::Milliseconds(200);
  Start(/*with_nccl=*/true, options);
  v1::OpenTransferResponse setup;
  ASSERT_TRUE(Open(Setup(), &setup).ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(WaitUntil([&] { return sender_->Counts().init_failures == 1; }));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(sender_->Counts().aborts, 1u);
  EXPECT_FALSE(sender_->Ready(setup.communicator_id()));
  v1::OpenTransferResponse answer;
  ASSERT_TRUE(Open(Transfer(setup.communicator_id()), &answer).ok());
  EXPECT_EQ(answer.transport(), v1::TRANSPORT_GRPC_STREAM);
  EXPECT_EQ(answer.communicator_id(), 0u);  // set up again
  EXPECT_EQ(Metric("kvstrata_kvstore_nccl_init_failures_total"), 1);
  EXPECT_EQ(Metric("kvstrata_kvstore_nccl_aborts_total"), 1);
  EXPECT_EQ(Metric("kvstrata_kvstore_nccl_communicators"), 0);
}

TEST_F(NcclTransferTest, ATransferNoOneReceivesAbortsTheCommunicatorAtItsDeadline) {
  NcclSenderOptions options;
  options.transfer_timeout = absl::Milliseconds(200);
  Start(/*with_nccl=*/true, options);
  const uint64_t id = JoinAsWorker();
  ASSERT_NE(id, 0u);
  v1::OpenTransferResponse answer;
  ASSERT_TRUE(Open(Transfer(id), &answer).ok());
  ASSERT_EQ(answer.transport(), v1::TRANSPORT_NCCL);
  // The worker went away: nothing receives.
  ASSERT_TRUE(WaitUntil([&] { return sender_->Counts().transfer_failures == 1; }));
  EXPECT_EQ(sender_->Counts().aborts, 1u);
  EXPECT_FALSE(sender_->Ready(id));
  ASSERT_TRUE(Open(Transfer(id), &answer).ok());
  EXPECT_EQ(answer.transport(), v1::TRANSPORT_GRPC_STREAM);
  EXPECT_EQ(answer.communicator_id(), 0u);
  // The worker's end sees the abort at its next transfer, and a new setup works.
  std::vector<uint8_t> sink(1 << 16);
  const transport::DeviceRange r{sink.data(), chain_[0].bytes.size()};
  EXPECT_FALSE(worker_comm_->Transfer(0, {}, {&r, 1}, absl::Now() + absl::Seconds(2)).ok());
  const uint64_t again = JoinAsWorker();
  EXPECT_NE(again, 0u);
  EXPECT_NE(again, id);
}

TEST_F(NcclTransferTest, ShutdownAbortsATransferInProgressRatherThanAwaitingItsDeadline) {
  NcclSenderOptions options;
  options.transfer_timeout = absl::Seconds(30);
  Start(/*with_nccl=*/true, options);
  const uint64_t id = JoinAsWorker();
  ASSERT_NE(id, 0u);
  auto posted = [&] {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    return nccl_.record().sends_posted;
  };
  const int before = posted();
  v1::OpenTransferResponse answer;
  ASSERT_TRUE(Open(Transfer(id), &answer).ok());
  ASSERT_EQ(answer.transport(), v1::TRANSPORT_NCCL);
  // The store's thread is sending; the worker never receives.
  ASSERT_TRUE(WaitUntil([&] { return posted() > before; }));
  server_.reset();
  const absl::Time start = absl::Now();
  sender_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(NcclTransferTest, ANewSetupAbortsTheOldCommunicatorsTransferInProgress) {
  NcclSenderOptions options;
  options.transfer_timeout = absl::Seconds(30);
  Start(/*with_nccl=*/true, options);
  const uint64_t first = JoinAsWorker();
  ASSERT_NE(first, 0u);
  v1::OpenTransferResponse answer;
  ASSERT_TRUE(Open(Transfer(first), &answer).ok());
  ASSERT_EQ(answer.transport(), v1::TRANSPORT_NCCL);
  // The worker sets up again (its end of the old communicator is kept, so only the store's
  // abort can end the old transfer): the old transfer ends now, not in 30 s.
  std::unique_ptr<transport::NcclCommunicator> old_end = std::move(worker_comm_);
  const absl::Time start = absl::Now();
  ASSERT_NE(JoinAsWorker(), 0u);
  ASSERT_TRUE(WaitUntil([&] { return sender_->Counts().transfer_failures == 1; }));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(NcclTransferTest, ANewSetupFromTheSameWorkerEndsItsOldCommunicator) {
  Start();
  const uint64_t first = JoinAsWorker();
  ASSERT_NE(first, 0u);
  worker_comm_.reset();
  const uint64_t second = JoinAsWorker();
  ASSERT_NE(second, 0u);
  EXPECT_FALSE(sender_->Ready(first));
  EXPECT_TRUE(sender_->Ready(second));
  EXPECT_TRUE(WaitUntil([&] { return sender_->Counts().live_communicators == 1; }));
}

TEST_F(NcclTransferTest, SetupsBeyondMaxCommunicatorsAreRefused) {
  NcclSenderOptions options;
  options.max_communicators = 1;
  Start(/*with_nccl=*/true, options);
  v1::OpenTransferResponse response;
  ASSERT_TRUE(Open(Setup(), &response).ok());
  v1::OpenTransferRequest other = Setup();
  other.set_client_id("worker-1");
  grpc::Status s = Open(other, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("max_communicators"));
}

}  // namespace
}  // namespace kvstrata::kvstore

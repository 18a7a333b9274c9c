// The decode worker's side of TRANSPORT_NCCL (services/decode/nccl_peers.h) against a kvstore in
// process, both ends on one fake NCCL in host memory (tests/testing/fake_nccl.h): the setup in
// the background when the worker first meets the store, transfers with their digests checked,
// one transfer per store at a time, and failures as misses: a corrupt page, a transfer past its
// deadline (aborted, then a new communicator), a store without NCCL, a join that fails.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "core/metrics.h"
#include "rpc/server.h"
#include "services/decode/nccl_peers.h"
#include "services/decode/same_gpu_pools.h"
#include "services/kvstore/client.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/nccl_sender.h"
#include "tests/services/host_tier_memory.h"
#include "tests/services/test_pages.h"
#include "tests/testing/fake_nccl.h"
#include "tests/testing/wait_until.h"

namespace kvstrata::decode {
namespace {

using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::TestPage;

constexpr char kStoreGpu[] = "GPU-5e1f0c2a-0000-4000-8000-000000000001";
constexpr char kWorkerGpu[] = "GPU-5e1f0c2a-0000-4000-8000-000000000002";

using ::kvstrata::test_util::WaitUntil;

class DecodeNcclTest : public ::testing::Test {
 protected:
  void Start(bool store_has_nccl = true, kvstore::NcclSenderOptions sender_options = {},
             NcclPeersOptions peers_options = {}) {
    kvstore::PageStoreOptions options;
    options.capacity_bytes = 8 * 16448;
    options.max_lease_ttl = absl::Seconds(30);
    tier_ = std::make_shared<kvstore::testing::HostTierMemory>(tier_bytes_);
    options.fast_tier = tier_;
    store_ = std::make_unique<kvstore::PageStore>(options, &clock_);
    kvstore::KvStoreServiceOptions service_options{.store_id = "test-store"};
    service_options.same_gpu_pool = {.socket_path = "/tmp/test-pool.sock",
                                     .pool_id = 77,
                                     .gpu_uuid = kStoreGpu,
                                     .host_boot_id = "boot"};
    if (store_has_nccl) {
      sender_ = std::make_unique<kvstore::NcclSender>(&nccl_, tier_->base(), tier_->size(),
                                                      sender_options);
      service_options.nccl = sender_.get();
    }
    service_ = std::make_unique<kvstore::KvStoreService>(store_.get(), service_options, &registry_);
    absl::StatusOr<std::unique_ptr<rpc::Server>> server =
        rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {service_.get()}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<kvstore::KvStoreClient>(server_->address());
    chain_ = MakeChain({1, 2, 3});
    for (const TestPage& page : chain_) ASSERT_TRUE(store_->Put(page.meta, page.bytes).ok());
    for (const TestPage& page : chain_) keys_.push_back(page.meta.key);
    peers_options.device = 0;
    peers_options.gpu_uuid = kWorkerGpu;
    peers_options.client_id = "worker-0";
    if (peers_options.receive_bytes == uint64_t{1} << 30) peers_options.receive_bytes = 1 << 20;
    peers_ = std::make_unique<NcclPeers>(&nccl_, peers_options);
  }

  void TearDown() override {
    peers_.reset();
    server_.reset();
    sender_.reset();
  }

  std::shared_ptr<NcclPeers::Lane> ReadyLane() {
    EXPECT_EQ(peers_->Acquire(client_.get()), nullptr);  // the first meeting starts the setup
    EXPECT_TRUE(WaitUntil([&] { return peers_->Ready(client_->address()); }));
    std::shared_ptr<NcclPeers::Lane> lane = peers_->Acquire(client_.get());
    if (lane != nullptr) WaitForTheStoresSide(*lane);
    return lane;
  }

  // The worker's side is ready once the warm-up has arrived; the store marks its own side only
  // after its send returns, and until then a transfer fairly goes by gRPC.
  void WaitForTheStoresSide(const NcclPeers::Lane& lane) {
    if (sender_ == nullptr) return;
    v1::OpenTransferRequest probe;
    peers_->Offer(lane, &probe);
    const uint64_t id = probe.nccl().communicator_id();
    EXPECT_TRUE(WaitUntil([&] { return sender_->Ready(id); })) << "communicator " << id;
  }

  // OpenTransfer for the chain as the worker sends it (the pool offered first, then NCCL).
  absl::StatusOr<v1::OpenTransferResponse> Open(const NcclPeers::Lane& lane) {
    return Open(lane, chain_, /*lease_id=*/nullptr);
  }
  // The same for `chain`; *lease_id, when asked, is the lookup's lease (the caller releases it).
  absl::StatusOr<v1::OpenTransferResponse> Open(const NcclPeers::Lane& lane,
                                                const std::vector<TestPage>& chain,
                                                uint64_t* lease_id) {
    std::vector<PageKey> keys;
    for (const TestPage& page : chain) keys.push_back(page.meta.key);
    absl::StatusOr<kvstore::LookupReply> lookup = client_->Lookup(keys, /*lease_ttl_ms=*/10000);
    if (!lookup.ok()) return lookup.status();
    if (lease_id != nullptr) *lease_id = lookup->lease_id;
    v1::OpenTransferRequest request;
    request.set_client_id("worker-0");
    request.set_compact(true);
    request.set_lease_id(lookup->lease_id);
    request.add_transports(v1::TRANSPORT_SAME_GPU_POOL);
    request.add_transports(v1::TRANSPORT_GRPC_STREAM);
    peers_->Offer(lane, &request);
    EXPECT_EQ(request.transports(1), v1::TRANSPORT_NCCL);
    bool every_key = false;
    return OpenTransferOfChain(*client_, request, keys, chain[0].meta.parent_key, &every_key);
  }

  uint64_t tier_bytes_ = 4 * 16640;  // the store's fast tier: 4 pages
  SystemClock clock_;
  MetricsRegistry registry_;
  ::kvstrata::testing::FakeNccl nccl_;
  std::shared_ptr<kvstore::testing::HostTierMemory> tier_;
  std::unique_ptr<kvstore::PageStore> store_;
  std::unique_ptr<kvstore::NcclSender> sender_;
  std::unique_ptr<kvstore::KvStoreService> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<kvstore::KvStoreClient> client_;
  std::unique_ptr<NcclPeers> peers_;
  std::vector<TestPage> chain_;
  std::vector<PageKey> keys_;
};

TEST_F(DecodeNcclTest, AFetchIsOneTransferOfTheWholePrefixIntoTheWorkersMemory) {
  Start();
  for (int round = 0; round < 2; ++round) {
    std::shared_ptr<NcclPeers::Lane> lane =
        round == 0 ? ReadyLane() : peers_->Acquire(client_.get());
    ASSERT_NE(lane, nullptr);
    // While a request holds the lane, another gets none (and counts it).
    EXPECT_EQ(peers_->Acquire(client_.get()), nullptr);
    absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
    absl::StatusOr<std::vector<engine::DevicePage>> pages =
        peers_->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, /*first_index=*/0,
                        /*request_deadline=*/absl::InfiniteFuture());
    ASSERT_TRUE(pages.ok()) << pages.status();
    ASSERT_EQ(pages->size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const engine::DevicePage& p = (*pages)[i];
      EXPECT_EQ(p.key, keys_[i]);
      EXPECT_EQ(p.page_index, static_cast<int64_t>(i));
      EXPECT_EQ(p.parent_key, i == 0 ? chain_[0].meta.parent_key : keys_[i - 1]);
      ASSERT_EQ(p.byte_length, static_cast<int64_t>(chain_[i].bytes.size()));
      EXPECT_EQ(0, std::memcmp(p.bytes, chain_[i].bytes.data(), chain_[i].bytes.size()));
    }
  }
  const NcclPeersCounts c = peers_->Counts();
  EXPECT_EQ(c.communicators_made, 1u);
  EXPECT_EQ(c.transfers, 2u);
  EXPECT_EQ(c.busy, 2u);
  EXPECT_EQ(c.transfer_bytes, 2 * (chain_[0].bytes.size() * 3));
}

// How the decode worker uses a lane: it holds it only until the engine has copied the received
// pages out of the slab into its own KV cache (GenerationRequest::cached_pages_owner), not for
// the whole request. So a second request to the same store, while the first still runs and
// holds its lease, takes the lane too: both come by NCCL (no busy fallback to gRPC), and the
// second transfer, into the same slab, leaves what the first copied out intact.
// What a worker does for every store of its ring at start-up: the communicator is made in the
// background before any request, so the first prefix found there already comes by NCCL.
TEST_F(DecodeNcclTest, PreparingAStoreMakesItsCommunicatorBeforeAnyRequest) {
  Start();
  peers_->Prepare(client_.get());
  peers_->Prepare(client_.get());  // one setup, however often asked
  ASSERT_TRUE(WaitUntil([&] { return peers_->Ready(client_->address()); }));
  std::shared_ptr<NcclPeers::Lane> lane = peers_->Acquire(client_.get());
  ASSERT_NE(lane, nullptr) << "the first request finds a ready communicator";
  WaitForTheStoresSide(*lane);
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
  EXPECT_TRUE(peers_
                  ->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, /*first_index=*/0,
                            /*request_deadline=*/absl::InfiniteFuture())
                  .ok());
  EXPECT_EQ(peers_->Counts().communicators_made, 1u);
  peers_->Prepare(client_.get());  // a ready store: nothing more
  EXPECT_EQ(peers_->Counts().communicators_made, 1u);
}

TEST_F(DecodeNcclTest, ASecondRequestTakesTheLaneOnceTheFirstCopiedItsPagesOut) {
  tier_bytes_ = 8 * 16640;  // room in the pool for both chains' leased pages
  Start();
  const std::vector<TestPage> other = MakeChain({4, 5, 6});
  for (const TestPage& page : other) ASSERT_TRUE(store_->Put(page.meta, page.bytes).ok());
  // What a request's KV cache holds once its pages are imported (the engine's device copy).
  auto copy_out = [](const std::vector<engine::DevicePage>& pages) {
    std::vector<std::vector<uint8_t>> slots;
    for (const engine::DevicePage& p : pages) slots.emplace_back(p.bytes, p.bytes + p.byte_length);
    return slots;
  };
  auto expect_chain = [](const std::vector<std::vector<uint8_t>>& slots,
                         const std::vector<TestPage>& chain, const char* request) {
    ASSERT_EQ(slots.size(), chain.size()) << request;
    for (size_t i = 0; i < chain.size(); ++i) {
      EXPECT_TRUE(slots[i] == chain[i].bytes) << request << ", page " << i;
    }
  };
  ASSERT_NE(chain_[0].bytes, other[0].bytes);  // the two requests' data can be told apart

  // Request 1: receives, copies out, lets go of the lane; it runs on under its lease.
  uint64_t first_lease = 0;
  std::vector<std::vector<uint8_t>> first_slots;
  {
    std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
    ASSERT_NE(lane, nullptr);
    absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane, chain_, &first_lease);
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
    absl::StatusOr<std::vector<engine::DevicePage>> pages = peers_->Receive(
        *lane, *answer, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture());
    ASSERT_TRUE(pages.ok()) << pages.status();
    first_slots = copy_out(*pages);
  }
  ASSERT_NE(first_lease, 0u);

  // Request 2, while request 1 holds its lease: the lane is free, and its data is its own.
  std::shared_ptr<NcclPeers::Lane> lane = peers_->Acquire(client_.get());
  ASSERT_NE(lane, nullptr) << "the second request found the lane busy";
  uint64_t second_lease = 0;
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane, other, &second_lease);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
  std::vector<PageKey> other_keys;
  for (const TestPage& page : other) other_keys.push_back(page.meta.key);
  absl::StatusOr<std::vector<engine::DevicePage>> pages = peers_->Receive(
      *lane, *answer, other_keys, other[0].meta.parent_key, 0, absl::InfiniteFuture());
  ASSERT_TRUE(pages.ok()) << pages.status();
  const std::vector<std::vector<uint8_t>> second_slots = copy_out(*pages);
  lane.reset();
  expect_chain(first_slots, chain_, "request 1");
  expect_chain(second_slots, other, "request 2");
  for (size_t i = 0; i < other.size(); ++i) EXPECT_EQ((*pages)[i].key, other_keys[i]);

  const NcclPeersCounts c = peers_->Counts();
  EXPECT_EQ(c.transfers, 2u);
  EXPECT_EQ(c.busy, 0u);
  EXPECT_EQ(c.transfer_failures, 0u);
  EXPECT_EQ(c.communicators_made, 1u);
  EXPECT_TRUE(client_->Release(first_lease).ok());
  EXPECT_TRUE(client_->Release(second_lease).ok());
}

// The digest check's scratch is the peer's, made once with its slab and sized for the most pages
// the slab takes: no fetch allocates for it.
TEST_F(DecodeNcclTest, TheDigestCheckerIsMadeOncePerStoreForTheSlabsMostPages) {
  Start();  // a receive slab of 1 MiB
  for (int round = 0; round < 2; ++round) {
    std::shared_ptr<NcclPeers::Lane> lane =
        round == 0 ? ReadyLane() : peers_->Acquire(client_.get());
    ASSERT_NE(lane, nullptr);
    absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_TRUE(
        peers_->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture())
            .ok());
  }
  std::lock_guard<std::mutex> lock(nccl_.mu());
  EXPECT_EQ(nccl_.record().digest_checkers, 1);
  EXPECT_EQ(nccl_.record().digest_checker_pages, size_t{(1 << 20) / 256});
  EXPECT_EQ(nccl_.record().digest_checks, 2);
}

TEST_F(DecodeNcclTest, ATransferOfMorePagesThanTheCheckerHoldsIsAMissBeforeAnyReceive) {
  NcclPeersOptions peers;
  peers.max_transfer_pages = 2;  // the chain has 3
  Start(/*store_has_nccl=*/true, {}, peers);
  std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
  ASSERT_NE(lane, nullptr);
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    EXPECT_EQ(nccl_.record().digest_checker_pages, 2u);
  }
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
  absl::StatusOr<std::vector<engine::DevicePage>> pages =
      peers_->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture());
  EXPECT_TRUE(absl::IsDataLoss(pages.status())) << pages.status();
  EXPECT_THAT(std::string(pages.status().message()), ::testing::HasSubstr("checks at once"));
  // The store's sends were queued: the communicator's order is lost, so it goes.
  EXPECT_FALSE(peers_->Ready(client_->address()));
  std::lock_guard<std::mutex> lock(nccl_.mu());
  EXPECT_EQ(nccl_.record().digest_checks, 0);
}

TEST_F(DecodeNcclTest, APageCorruptedInFlightIsAMissAndTheCommunicatorStays) {
  Start();
  std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
  ASSERT_NE(lane, nullptr);
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    nccl_.record().corrupt_next_send = true;  // before the store posts its sends
  }
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok());
  absl::StatusOr<std::vector<engine::DevicePage>> pages =
      peers_->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture());
  EXPECT_TRUE(absl::IsDataLoss(pages.status())) << pages.status();
  EXPECT_EQ(peers_->Counts().digest_failures, 1u);
  EXPECT_TRUE(peers_->Ready(client_->address()));
}

TEST_F(DecodeNcclTest, APlacementWhoseEndWrapsPastTheSlabIsRefusedBeforeAnyReceive) {
  Start();
  std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
  ASSERT_NE(lane, nullptr);
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
  // Page 1's offset plus its length is 2^64, 0 in 64 bits: it would pass a check of the sum,
  // and a receive of that length would run off the slab.
  v1::OpenTransferResponse bad = *answer;
  const uint64_t offset = bad.placements().offset_bytes(1);
  ASSERT_GT(offset, 0u);
  bad.mutable_placements()->set_byte_length(1, ~uint64_t{0} - offset + 1);
  absl::StatusOr<std::vector<engine::DevicePage>> pages =
      peers_->Receive(*lane, bad, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture());
  EXPECT_TRUE(absl::IsDataLoss(pages.status())) << pages.status();
  EXPECT_THAT(std::string(pages.status().message()), ::testing::HasSubstr("page 1 is misplaced"));
}

TEST_F(DecodeNcclTest, ATransferPastItsDeadlineIsAMissAndANewCommunicatorIsMade) {
  kvstore::NcclSenderOptions sender;
  sender.transfer_timeout = absl::Milliseconds(100);
  Start(/*store_has_nccl=*/true, sender);
  std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
  ASSERT_NE(lane, nullptr);
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok());
  // The worker is late: the store's send misses its deadline and aborts the communicator.
  ASSERT_TRUE(WaitUntil([&] { return sender_->Counts().transfer_failures == 1; }));
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<engine::DevicePage>> pages =
      peers_->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture());
  EXPECT_FALSE(pages.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // nothing hangs
  EXPECT_EQ(peers_->Counts().transfer_failures, 1u);
  EXPECT_EQ(peers_->Counts().aborts, 1u);
  EXPECT_FALSE(peers_->Ready(client_->address()));
  lane.reset();
  // The next fetch starts a new setup in the background, and it comes up.
  EXPECT_EQ(peers_->Acquire(client_.get()), nullptr);
  ASSERT_TRUE(WaitUntil([&] { return peers_->Ready(client_->address()); }));
  EXPECT_EQ(peers_->Counts().communicators_made, 2u);
  std::shared_ptr<NcclPeers::Lane> again = peers_->Acquire(client_.get());
  ASSERT_NE(again, nullptr);
  WaitForTheStoresSide(*again);
  absl::StatusOr<v1::OpenTransferResponse> next = Open(*again);
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->transport(), v1::TRANSPORT_NCCL);
  EXPECT_EQ(next->transfer_id(), 1u);  // a new communicator's order starts again
  EXPECT_TRUE(
      peers_->Receive(*again, *next, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture())
          .ok());
}

// A store's transfer_timeout_ms is the store's to keep: the worker's wait has its own cap.
TEST_F(DecodeNcclTest, AReceiveWaitsNoLongerThanTheWorkersOwnCap) {
  kvstore::NcclSenderOptions sender;
  sender.transfer_timeout = absl::Seconds(20);  // the store would have the worker wait 20 s
  NcclPeersOptions peers;
  peers.max_receive_wait = absl::Milliseconds(200);
  Start(/*store_has_nccl=*/true, sender, peers);
  std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
  ASSERT_NE(lane, nullptr);
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    nccl_.record().hold_sends = true;  // the bytes never arrive
  }
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
  ASSERT_GE(answer->transfer_timeout_ms(), 20000u);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<engine::DevicePage>> pages =
      peers_->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture());
  const absl::Duration waited = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(pages.status())) << pages.status();
  EXPECT_THAT(std::string(pages.status().message()),
              ::testing::HasSubstr("--nccl_receive_timeout_ms"));
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_LT(waited, absl::Seconds(5));
  // Aborted like any missed deadline: a miss, and a new communicator in the background.
  EXPECT_EQ(peers_->Counts().transfer_failures, 1u);
  EXPECT_EQ(peers_->Counts().aborts, 1u);
  EXPECT_FALSE(peers_->Ready(client_->address()));
}

TEST_F(DecodeNcclTest, AReceiveEndsAtTheRequestsDeadline) {
  kvstore::NcclSenderOptions sender;
  sender.transfer_timeout = absl::Seconds(20);
  NcclPeersOptions peers;
  peers.max_receive_wait = absl::Seconds(20);
  Start(/*store_has_nccl=*/true, sender, peers);
  std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
  ASSERT_NE(lane, nullptr);
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    nccl_.record().hold_sends = true;
  }
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<engine::DevicePage>> pages =
      peers_->Receive(*lane, *answer, keys_, chain_[0].meta.parent_key, 0,
                      /*request_deadline=*/start + absl::Milliseconds(200));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(pages.status())) << pages.status();
  EXPECT_THAT(std::string(pages.status().message()),
              ::testing::HasSubstr("the request's deadline"));
  EXPECT_GE(waited, absl::Milliseconds(150));
  EXPECT_LT(waited, absl::Seconds(5));
  EXPECT_EQ(peers_->Counts().transfer_failures, 1u);
  EXPECT_FALSE(peers_->Ready(client_->address()));
}

TEST_F(DecodeNcclTest, ShutdownDuringAWarmUpTheStoreNeverSendsEndsNow) {
  kvstore::NcclSenderOptions sender_options;
  sender_options.init_timeout = absl::Seconds(30);  // the worker's deadline for the warm-up
  Start(/*store_has_nccl=*/true, sender_options);
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    nccl_.record().hold_sends = true;  // the store's warm-up never arrives
  }
  EXPECT_EQ(peers_->Acquire(client_.get()), nullptr);  // starts the setup
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    return nccl_.record().joins == 2;  // both ends joined: the worker waits for the warm-up
  }));
  const absl::Time start = absl::Now();
  peers_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(DecodeNcclTest, AStoreThatGoesAwayMidTransferIsAMissWithinTheDeadline) {
  Start();
  std::shared_ptr<NcclPeers::Lane> lane = ReadyLane();
  ASSERT_NE(lane, nullptr);
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    nccl_.record().hold_sends = true;  // the store's sends never leave: it dies first
  }
  absl::StatusOr<v1::OpenTransferResponse> answer = Open(*lane);
  ASSERT_TRUE(answer.ok());
  ASSERT_EQ(answer->transport(), v1::TRANSPORT_NCCL);
  server_.reset();  // the kvstore process goes away with its communicator
  service_.reset();
  sender_.reset();
  v1::OpenTransferResponse shortened = *answer;
  shortened.set_transfer_timeout_ms(300);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<engine::DevicePage>> pages = peers_->Receive(
      *lane, shortened, keys_, chain_[0].meta.parent_key, 0, absl::InfiniteFuture());
  EXPECT_FALSE(pages.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(peers_->Counts().transfer_failures, 1u);
  EXPECT_FALSE(peers_->Ready(client_->address()));
}

TEST_F(DecodeNcclTest, AStoreWithoutNcclIsAFailedSetupRetriedOnlyAfterAPause) {
  NcclPeersOptions peers;
  peers.setup_retry = absl::ZeroDuration();  // a failure would be retried at once...
  peers.unsupported_retry = absl::Hours(1);  // ...but "not possible here" waits
  Start(/*store_has_nccl=*/false, {}, peers);
  EXPECT_EQ(peers_->Acquire(client_.get()), nullptr);
  ASSERT_TRUE(WaitUntil([&] { return peers_->Counts().setup_failures == 1; }));
  EXPECT_EQ(peers_->Acquire(client_.get()), nullptr);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(peers_->Counts().setup_failures, 1u);  // no second setup within the pause
  EXPECT_FALSE(peers_->Ready(client_->address()));
}

TEST_F(DecodeNcclTest, AJoinThatFailsIsCountedAndTheStoreAbortsItsSideAtItsDeadline) {
  kvstore::NcclSenderOptions sender;
  sender.init_timeout = absl::Milliseconds(150);
  Start(/*store_has_nccl=*/true, sender);
  {
    std::lock_guard<std::mutex> lock(nccl_.mu());
    nccl_.record().fail_joins = true;
  }
  EXPECT_EQ(peers_->Acquire(client_.get()), nullptr);
  ASSERT_TRUE(WaitUntil([&] { return peers_->Counts().setup_failures == 1; }));
  EXPECT_EQ(peers_->Counts().aborts, 1u);
  // The store's rank 0 also failed (its join was refused the same way) and counted it.
  ASSERT_TRUE(WaitUntil([&] { return sender_->Counts().init_failures == 1; }));
}

}  // namespace
}  // namespace kvstrata::decode

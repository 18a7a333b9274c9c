// OpenTransfer's handshake: which transport a store picks for which client, the lease it
// answers, and the pool offsets and digests of a same-GPU answer (against a fast tier in host
// memory here; tests/services/same_gpu_pool_gpu_test.cc maps a real HBM pool).

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <vector>

#include "core/metrics.h"
#include "core/page_digest.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/server.h"
#include "services/kvstore/kvstore_service.h"
#include "tests/services/host_tier_memory.h"
#include "tests/services/test_pages.h"

namespace kvstrata::kvstore {
namespace {

using ::kvstrata::kvstore::testing::HostTierMemory;
using ::kvstrata::kvstore::testing::Key;
using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::TestPage;
using ::testing::HasSubstr;

constexpr char kGpu[] = "GPU-5e1f0c2a-0000-4000-8000-000000000001";
constexpr char kBoot[] = "0b8d4c4e-1111-4222-8333-444455556666";

class OpenTransferTest : public ::testing::Test {
 protected:
  void Start(bool fast_tier) {
    PageStoreOptions options;
    options.capacity_bytes = 8 * 16448;
    options.max_lease_ttl = absl::Seconds(30);
    if (fast_tier) {
      tier_ = std::make_shared<HostTierMemory>(4 * 16640);
      options.fast_tier = tier_;
    }
    store_ = std::make_unique<PageStore>(options, &clock_);
    KvStoreServiceOptions service_options{.store_id = "test-store"};
    if (fast_tier) {
      service_options.same_gpu_pool = {.socket_path = "/tmp/test-pool.sock",
                                       .pool_id = 77,
                                       .gpu_uuid = kGpu,
                                       .host_boot_id = kBoot};
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

  v1::OpenTransferRequest Request(std::vector<v1::Transport> transports, const char* gpu = kGpu,
                                  const char* boot = kBoot) {
    v1::OpenTransferRequest request;
    request.set_client_id("worker-0");
    request.mutable_device()->set_gpu_uuid(gpu);
    request.mutable_device()->set_host_boot_id(boot);
    for (const TestPage& page : chain_) request.add_pages()->set_key(page.meta.key.ToBytes());
    for (v1::Transport t : transports) request.add_transports(t);
    return request;
  }

  // The same request naming the pages as a chain: `count` pages ending at `last`, after
  // `first_parent`.
  v1::OpenTransferRequest ChainRequest(std::vector<v1::Transport> transports, const PageKey& last,
                                       uint32_t count, const PageKey& first_parent,
                                       const char* gpu = kGpu) {
    v1::OpenTransferRequest request = Request(std::move(transports), gpu);
    request.clear_pages();
    request.set_compact(true);
    request.mutable_chain()->set_last_key(last.ToBytes());
    request.mutable_chain()->set_page_count(count);
    request.mutable_chain()->set_first_parent_key(first_parent.ToBytes());
    return request;
  }

  grpc::Status Open(const v1::OpenTransferRequest& request, v1::OpenTransferResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub_->OpenTransfer(&context, request, response);
  }

  SystemClock clock_;
  MetricsRegistry registry_;
  std::shared_ptr<HostTierMemory> tier_;
  std::unique_ptr<PageStore> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<v1::KvStore::Stub> stub_;
  std::vector<TestPage> chain_;
};

TEST_F(OpenTransferTest, AClientOnTheStoresGpuGetsPoolOffsetsAndDigests) {
  Start(/*fast_tier=*/true);
  v1::OpenTransferResponse response;
  ASSERT_TRUE(Open(Request({v1::TRANSPORT_SAME_GPU_POOL, v1::TRANSPORT_GRPC_STREAM}), &response)
                  .ok());
  EXPECT_EQ(response.transport(), v1::TRANSPORT_SAME_GPU_POOL);
  EXPECT_EQ(response.pool().socket_path(), "/tmp/test-pool.sock");
  EXPECT_EQ(response.pool().pool_id(), 77u);
  EXPECT_EQ(response.pool().pool_bytes(), 4u * 16640);
  EXPECT_NE(response.lease_id(), 0u);
  ASSERT_EQ(response.segments_size(), 3);
  for (int i = 0; i < 3; ++i) {
    const v1::TransferSegment& segment = response.segments(i);
    const TestPage& page = chain_[i];
    EXPECT_EQ(segment.header().key(), page.meta.key.ToBytes());
    EXPECT_EQ(segment.header().byte_length(), page.bytes.size());
    EXPECT_EQ(segment.digest64(), PageDigest64(page.bytes.data(), page.bytes.size()));
    EXPECT_EQ(std::memcmp(tier_->at(segment.offset_bytes()), page.bytes.data(), page.bytes.size()),
              0);
  }
  // The pages are leased: the store says so, and releasing the lease frees them.
  EXPECT_EQ(store_->Stats().pinned_pages, 3u);
  EXPECT_TRUE(store_->Release(response.lease_id()));
}

TEST_F(OpenTransferTest, APoolHolderHoldsTheLeaseOnlyOnTheSameGpuAndOnlyWhileOpen) {
  Start(/*fast_tier=*/true);
  store_->OpenHolder(4242);
  v1::OpenTransferRequest request =
      Request({v1::TRANSPORT_SAME_GPU_POOL, v1::TRANSPORT_GRPC_STREAM});
  request.set_pool_holder(4242);
  v1::OpenTransferResponse response;
  ASSERT_TRUE(Open(request, &response).ok());
  EXPECT_EQ(response.transport(), v1::TRANSPORT_SAME_GPU_POOL);
  EXPECT_TRUE(response.lease_held());
  EXPECT_EQ(store_->Stats().held_leases, 1u);
  // Another GPU gets the byte stream, and its lease is not held (it expires as usual).
  v1::OpenTransferRequest elsewhere =
      Request({v1::TRANSPORT_SAME_GPU_POOL, v1::TRANSPORT_GRPC_STREAM}, "GPU-other");
  elsewhere.set_pool_holder(4242);
  v1::OpenTransferResponse stream;
  ASSERT_TRUE(Open(elsewhere, &stream).ok());
  EXPECT_EQ(stream.transport(), v1::TRANSPORT_GRPC_STREAM);
  EXPECT_FALSE(stream.lease_held());
  // A holder the store does not know (its connection closed) leaves the lease timed.
  request.set_pool_holder(99);
  v1::OpenTransferResponse unknown;
  ASSERT_TRUE(Open(request, &unknown).ok());
  EXPECT_EQ(unknown.transport(), v1::TRANSPORT_SAME_GPU_POOL);
  EXPECT_FALSE(unknown.lease_held());
  EXPECT_EQ(store_->Stats().held_leases, 1u);
  // The holder's connection closes: its lease goes, the others stay.
  EXPECT_EQ(store_->CloseHolder(4242), 1);
  EXPECT_EQ(store_->Stats().active_leases, 2u);
  EXPECT_FALSE(store_->Release(response.lease_id()));
}

TEST_F(OpenTransferTest, ACompactAnswerGivesTheSamePlacementsAsArrays) {
  Start(/*fast_tier=*/true);
  v1::OpenTransferResponse full;
  ASSERT_TRUE(Open(Request({v1::TRANSPORT_SAME_GPU_POOL}), &full).ok());
  v1::OpenTransferRequest request = Request({v1::TRANSPORT_SAME_GPU_POOL});
  request.set_compact(true);
  v1::OpenTransferResponse compact;
  ASSERT_TRUE(Open(request, &compact).ok());
  EXPECT_EQ(compact.segments_size(), 0);
  const v1::PoolPlacements& p = compact.placements();
  ASSERT_EQ(p.offset_bytes_size(), 3);
  ASSERT_EQ(p.digest64_size(), 3);
  ASSERT_EQ(p.byte_length_size(), 3);
  ASSERT_EQ(p.encoding_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p.offset_bytes(i), full.segments(i).offset_bytes());
    EXPECT_EQ(p.digest64(i), full.segments(i).digest64());
    EXPECT_EQ(p.byte_length(i), chain_[i].bytes.size());
    EXPECT_EQ(p.encoding(i), v1::PAGE_ENCODING_BF16);
  }
  EXPECT_LT(compact.ByteSizeLong(), full.ByteSizeLong() / 2);
}

// The old form (every key) and the chain form name the same pages and get the same answer.
TEST_F(OpenTransferTest, AChainGetsTheSamePlacementsAsItsKeys) {
  Start(/*fast_tier=*/true);
  v1::OpenTransferRequest by_keys = Request({v1::TRANSPORT_SAME_GPU_POOL});
  by_keys.set_compact(true);
  v1::OpenTransferResponse keys_answer;
  ASSERT_TRUE(Open(by_keys, &keys_answer).ok());
  v1::OpenTransferResponse chain_answer;
  grpc::Status s =
      Open(ChainRequest({v1::TRANSPORT_SAME_GPU_POOL}, Key(3), 3, Key(0xEE)), &chain_answer);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(chain_answer.transport(), v1::TRANSPORT_SAME_GPU_POOL);
  EXPECT_EQ(chain_answer.pool().pool_id(), 77u);
  EXPECT_NE(chain_answer.lease_id(), keys_answer.lease_id());
  const v1::PoolPlacements& k = keys_answer.placements();
  const v1::PoolPlacements& c = chain_answer.placements();
  ASSERT_EQ(c.offset_bytes_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.offset_bytes(i), k.offset_bytes(i)) << i;
    EXPECT_EQ(c.digest64(i), k.digest64(i)) << i;
    EXPECT_EQ(c.byte_length(i), k.byte_length(i)) << i;
    EXPECT_EQ(c.encoding(i), k.encoding(i)) << i;
    EXPECT_EQ(c.digest64(i), PageDigest64(chain_[i].bytes.data(), chain_[i].bytes.size()));
    EXPECT_EQ(
        std::memcmp(tier_->at(c.offset_bytes(i)), chain_[i].bytes.data(), chain_[i].bytes.size()),
        0);
  }
  // The chain's lease holds its pages: releasing the key list's leaves them pinned.
  EXPECT_TRUE(store_->Release(keys_answer.lease_id()));
  EXPECT_EQ(store_->Stats().pinned_pages, 3u);
  EXPECT_TRUE(store_->Release(chain_answer.lease_id()));
  EXPECT_EQ(store_->Stats().pinned_pages, 0u);

  // A run in the middle of the chain (pages 1 and 2 after page 0), with page headers.
  v1::OpenTransferRequest middle = ChainRequest({v1::TRANSPORT_SAME_GPU_POOL}, Key(3), 2, Key(1));
  middle.set_compact(false);
  v1::OpenTransferResponse segments;
  ASSERT_TRUE(Open(middle, &segments).ok());
  ASSERT_EQ(segments.segments_size(), 2);
  EXPECT_EQ(segments.segments(0).header().key(), Key(2).ToBytes());
  EXPECT_EQ(segments.segments(0).header().page_index(), 1u);
  EXPECT_EQ(segments.segments(1).header().key(), Key(3).ToBytes());
  EXPECT_EQ(segments.segments(1).offset_bytes(), k.offset_bytes(2));
  EXPECT_EQ(store_->Stats().pinned_pages, 2u);
}

TEST_F(OpenTransferTest, AChainOnAnotherGpuIsPinnedForTheByteStreamAndExtendsTheClientsLease) {
  Start(/*fast_tier=*/true);
  absl::StatusOr<PinResult> lease = store_->Pin({Key(1)}, absl::Seconds(5), 0);
  ASSERT_TRUE(lease.ok());
  v1::OpenTransferRequest request = ChainRequest(
      {v1::TRANSPORT_SAME_GPU_POOL, v1::TRANSPORT_GRPC_STREAM}, Key(3), 3, Key(0xEE), "GPU-other");
  request.set_lease_id(lease->lease_id);
  v1::OpenTransferResponse response;
  ASSERT_TRUE(Open(request, &response).ok());
  EXPECT_EQ(response.transport(), v1::TRANSPORT_GRPC_STREAM);
  EXPECT_FALSE(response.has_placements());
  EXPECT_EQ(response.lease_id(), lease->lease_id);
  EXPECT_EQ(store_->Stats().active_leases, 1u);
  EXPECT_EQ(store_->Stats().pinned_pages, 3u);
}

// A chain the store's parent links do not confirm is a miss: NOT_FOUND naming `chain`, and no
// lease left behind (never other pages, never a crash).
TEST_F(OpenTransferTest, ABrokenChainIsAMissAndLeavesNoLease) {
  Start(/*fast_tier=*/true);
  struct Case {
    PageKey last;
    uint32_t count;
    PageKey first_parent;
    const char* says;
  };
  for (const Case& c : {
           // Starts one page later than the client thinks (its count is one short).
           Case{Key(3), 2, Key(0xEE), "starts after page"},
           // Another sequence's page as first parent.
           Case{Key(3), 3, Key(42), "starts after page"},
           // The last page is not (or no longer) stored.
           Case{Key(42), 1, Key(3), "is absent"},
       }) {
    v1::OpenTransferResponse response;
    grpc::Status status = Open(
        ChainRequest({v1::TRANSPORT_SAME_GPU_POOL}, c.last, c.count, c.first_parent), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << c.says;
    EXPECT_THAT(status.error_message(), HasSubstr("chain: "));
    EXPECT_THAT(status.error_message(), HasSubstr(c.says));
  }
  EXPECT_EQ(store_->Stats().active_leases, 0u);
  EXPECT_EQ(store_->Stats().pinned_pages, 0u);
}

TEST_F(OpenTransferTest, ABadChainIsInvalidNamingItsField) {
  Start(/*fast_tier=*/true);
  auto expect_invalid = [&](const v1::OpenTransferRequest& request, const char* field) {
    v1::OpenTransferResponse response;
    grpc::Status status = Open(request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_THAT(status.error_message(), HasSubstr(field));
  };
  const std::vector<v1::Transport> pool = {v1::TRANSPORT_SAME_GPU_POOL};
  expect_invalid(ChainRequest(pool, Key(3), 0, Key(0xEE)), "chain.page_count: 0");
  // Above the store's limit (4096 keys a request), whatever the chain.
  expect_invalid(ChainRequest(pool, Key(3), 4097, Key(0xEE)), "chain.page_count: 4097");
  // Longer than any chain ending at page_index 2 can be.
  expect_invalid(ChainRequest(pool, Key(3), 4, Key(0xEE)), "chain.page_count: page_count=4");
  v1::OpenTransferRequest short_key = ChainRequest(pool, Key(3), 3, Key(0xEE));
  short_key.mutable_chain()->set_last_key("short");
  expect_invalid(short_key, "chain.last_key");
  v1::OpenTransferRequest no_parent = ChainRequest(pool, Key(3), 3, Key(0xEE));
  no_parent.mutable_chain()->clear_first_parent_key();
  expect_invalid(no_parent, "chain.first_parent_key");
  v1::OpenTransferRequest both = ChainRequest(pool, Key(3), 3, Key(0xEE));
  both.add_pages()->set_key(Key(1).ToBytes());
  expect_invalid(both, "pages and chain");
  v1::OpenTransferRequest neither = Request(pool);
  neither.clear_pages();
  expect_invalid(neither, "pages: empty");
  EXPECT_EQ(store_->Stats().active_leases, 0u);
}

TEST_F(OpenTransferTest, AnotherGpuOrHostGetsTheByteStreamWithTheLease) {
  Start(/*fast_tier=*/true);
  for (auto [gpu, boot] : {std::pair{"GPU-other", kBoot}, std::pair{kGpu, "another-host"}}) {
    v1::OpenTransferResponse response;
    ASSERT_TRUE(
        Open(Request({v1::TRANSPORT_SAME_GPU_POOL, v1::TRANSPORT_GRPC_STREAM}, gpu, boot), &response)
            .ok());
    EXPECT_EQ(response.transport(), v1::TRANSPORT_GRPC_STREAM) << gpu << " " << boot;
    EXPECT_EQ(response.segments_size(), 0);
    EXPECT_NE(response.lease_id(), 0u);
    EXPECT_TRUE(store_->Release(response.lease_id()));
  }
  // Only the pool asked for, on another GPU: no transport in common.
  v1::OpenTransferResponse response;
  grpc::Status status = Open(Request({v1::TRANSPORT_SAME_GPU_POOL}, "GPU-other"), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("transports"));
  EXPECT_EQ(store_->Stats().active_leases, 0u);
}

TEST_F(OpenTransferTest, AHostStoreAnswersTheByteStreamAndAnEmptyListMeansIt) {
  Start(/*fast_tier=*/false);
  v1::OpenTransferResponse response;
  ASSERT_TRUE(Open(Request({}), &response).ok());
  EXPECT_EQ(response.transport(), v1::TRANSPORT_GRPC_STREAM);
  v1::OpenTransferResponse pool_only;
  EXPECT_EQ(Open(Request({v1::TRANSPORT_SAME_GPU_POOL}), &pool_only).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::OpenTransferResponse nccl_only;
  EXPECT_EQ(Open(Request({v1::TRANSPORT_NCCL}), &nccl_only).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(OpenTransferTest, AnAbsentPageIsNotFoundAndLeavesNoLease) {
  Start(/*fast_tier=*/true);
  v1::OpenTransferRequest request = Request({v1::TRANSPORT_SAME_GPU_POOL});
  request.add_pages()->set_key(Key(42).ToBytes());
  v1::OpenTransferResponse response;
  grpc::Status status = Open(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("pages[3]"));
  EXPECT_EQ(store_->Stats().active_leases, 0u);
  // A malformed key names its field.
  v1::OpenTransferRequest bad = Request({v1::TRANSPORT_SAME_GPU_POOL});
  bad.mutable_pages(1)->set_key("short");
  status = Open(bad, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("pages[1].key"));
}

TEST_F(OpenTransferTest, AClientsOwnLeaseIsExtendedNotReplaced) {
  Start(/*fast_tier=*/true);
  absl::StatusOr<PinResult> lease = store_->Pin({Key(1)}, absl::Seconds(5), 0);
  ASSERT_TRUE(lease.ok());
  v1::OpenTransferRequest request = Request({v1::TRANSPORT_SAME_GPU_POOL});
  request.set_lease_id(lease->lease_id);
  v1::OpenTransferResponse response;
  ASSERT_TRUE(Open(request, &response).ok());
  EXPECT_EQ(response.lease_id(), lease->lease_id);
  EXPECT_EQ(store_->Stats().active_leases, 1u);
  EXPECT_EQ(store_->Stats().pinned_pages, 3u);
}

}  // namespace
}  // namespace kvstrata::kvstore

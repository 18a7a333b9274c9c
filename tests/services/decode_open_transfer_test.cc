// The decode worker's same-GPU handshake (services/decode/same_gpu_pools.h OpenTransferOfChain)
// against a kvstore in process whose fast tier is in host memory: it names the prefix as a
// chain, and still gets its pages from a store older than the chain form (which sees no pages
// in such a request) by naming every key.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/metrics.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/server.h"
#include "services/decode/same_gpu_pools.h"
#include "services/kvstore/client.h"
#include "services/kvstore/kvstore_service.h"
#include "tests/services/host_tier_memory.h"
#include "tests/services/test_pages.h"

namespace kvstrata::decode {
namespace {

using ::kvstrata::kvstore::testing::Key;
using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::TestPage;
using ::testing::HasSubstr;

constexpr char kGpu[] = "GPU-5e1f0c2a-0000-4000-8000-000000000002";
constexpr char kBoot[] = "0b8d4c4e-1111-4222-8333-444455556667";

// A store from before the chain form: it does not know OpenTransferRequest.chain, so it parses
// such a request as one without pages. Otherwise the real service.
class OlderKvStore final : public v1::KvStore::Service {
 public:
  explicit OlderKvStore(kvstore::KvStoreService* current) : current_(current) {}
  grpc::Status OpenTransfer(grpc::ServerContext* context, const v1::OpenTransferRequest* request,
                            v1::OpenTransferResponse* response) override {
    ++calls;
    v1::OpenTransferRequest without_chain = *request;
    without_chain.clear_chain();
    return current_->OpenTransfer(context, &without_chain, response);
  }
  int calls = 0;

 private:
  kvstore::KvStoreService* current_;
};

class DecodeOpenTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kvstore::PageStoreOptions options;
    options.capacity_bytes = 8 * 16448;
    options.max_lease_ttl = absl::Seconds(30);
    tier_ = std::make_shared<kvstore::testing::HostTierMemory>(4 * 16640);
    options.fast_tier = tier_;
    store_ = std::make_unique<kvstore::PageStore>(options, &clock_);
    kvstore::KvStoreServiceOptions service_options{.store_id = "test-store"};
    service_options.same_gpu_pool = {.socket_path = "/tmp/test-pool.sock",
                                     .pool_id = 5,
                                     .gpu_uuid = kGpu,
                                     .host_boot_id = kBoot};
    service_ = std::make_unique<kvstore::KvStoreService>(store_.get(), service_options, &registry_);
    older_ = std::make_unique<OlderKvStore>(service_.get());
    for (auto [service, server] :
         {std::pair<grpc::Service*, std::unique_ptr<rpc::Server>*>{service_.get(), &server_},
          {older_.get(), &older_server_}}) {
      absl::StatusOr<std::unique_ptr<rpc::Server>> started =
          rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {service}});
      ASSERT_TRUE(started.ok()) << started.status();
      *server = *std::move(started);
    }
    client_ = std::make_unique<kvstore::KvStoreClient>(server_->address());
    older_client_ = std::make_unique<kvstore::KvStoreClient>(older_server_->address());
    chain_ = MakeChain({1, 2, 3});
    for (const TestPage& page : chain_) ASSERT_TRUE(store_->Put(page.meta, page.bytes).ok());
  }

  // What the worker fills before naming the pages.
  v1::OpenTransferRequest Request() const {
    v1::OpenTransferRequest request;
    request.set_client_id("worker-0");
    request.set_compact(true);
    request.mutable_device()->set_gpu_uuid(kGpu);
    request.mutable_device()->set_host_boot_id(kBoot);
    request.add_transports(v1::TRANSPORT_SAME_GPU_POOL);
    request.add_transports(v1::TRANSPORT_GRPC_STREAM);
    return request;
  }

  // Placements of `keys` asked for the old way, every key listed.
  v1::PoolPlacements ByKeys(const std::vector<PageKey>& keys) {
    v1::OpenTransferRequest request = Request();
    for (const PageKey& key : keys) request.add_pages()->set_key(key.ToBytes());
    absl::StatusOr<v1::OpenTransferResponse> answer = client_->OpenTransfer(request);
    EXPECT_TRUE(answer.ok()) << answer.status();
    if (!answer.ok()) return {};
    store_->Release(answer->lease_id());
    return answer->placements();
  }

  static void ExpectSame(const v1::PoolPlacements& got, const v1::PoolPlacements& want) {
    ASSERT_EQ(got.offset_bytes_size(), want.offset_bytes_size());
    ASSERT_GT(got.offset_bytes_size(), 0);
    for (int i = 0; i < got.offset_bytes_size(); ++i) {
      EXPECT_EQ(got.offset_bytes(i), want.offset_bytes(i)) << i;
      EXPECT_EQ(got.digest64(i), want.digest64(i)) << i;
      EXPECT_EQ(got.byte_length(i), want.byte_length(i)) << i;
      EXPECT_EQ(got.encoding(i), want.encoding(i)) << i;
    }
  }

  SystemClock clock_;
  MetricsRegistry registry_;
  std::shared_ptr<kvstore::testing::HostTierMemory> tier_;
  std::unique_ptr<kvstore::PageStore> store_;
  std::unique_ptr<kvstore::KvStoreService> service_;
  std::unique_ptr<OlderKvStore> older_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<rpc::Server> older_server_;
  std::unique_ptr<kvstore::KvStoreClient> client_;
  std::unique_ptr<kvstore::KvStoreClient> older_client_;
  std::vector<TestPage> chain_;
};

TEST_F(DecodeOpenTransferTest, TheWorkerNamesAChainAndGetsThePlacementsOfItsKeys) {
  const std::vector<PageKey> keys = {Key(1), Key(2), Key(3)};
  bool every_key = true;
  absl::StatusOr<v1::OpenTransferResponse> answer =
      OpenTransferOfChain(*client_, Request(), keys, Key(0xEE), &every_key);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(every_key);
  EXPECT_EQ(answer->transport(), v1::TRANSPORT_SAME_GPU_POOL);
  ExpectSame(answer->placements(), ByKeys(keys));
  store_->Release(answer->lease_id());
  // A run after a prefix the worker has already (page 0 from its own tier).
  const std::vector<PageKey> tail = {Key(2), Key(3)};
  answer = OpenTransferOfChain(*client_, Request(), tail, Key(1), &every_key);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_FALSE(every_key);
  ExpectSame(answer->placements(), ByKeys(tail));
}

TEST_F(DecodeOpenTransferTest, AStoreOlderThanTheChainFormIsSentEveryKey) {
  const std::vector<PageKey> keys = {Key(1), Key(2), Key(3)};
  bool every_key = false;
  absl::StatusOr<v1::OpenTransferResponse> answer =
      OpenTransferOfChain(*older_client_, Request(), keys, Key(0xEE), &every_key);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(every_key);
  EXPECT_EQ(older_->calls, 2);
  EXPECT_EQ(answer->transport(), v1::TRANSPORT_SAME_GPU_POOL);
  ExpectSame(answer->placements(), ByKeys(keys));
}

TEST_F(DecodeOpenTransferTest, AChainTheStoreDoesNotConfirmIsAMissWithoutAResend) {
  // The worker's keys say page 2 follows page 0 directly: not what the store holds.
  const std::vector<PageKey> keys = {Key(2), Key(3)};
  bool every_key = true;
  absl::StatusOr<v1::OpenTransferResponse> answer =
      OpenTransferOfChain(*client_, Request(), keys, Key(0xEE), &every_key);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(answer.status().message(), HasSubstr("chain"));
  EXPECT_FALSE(every_key);
  EXPECT_EQ(store_->Stats().active_leases, 0u);
}

}  // namespace
}  // namespace kvstrata::decode

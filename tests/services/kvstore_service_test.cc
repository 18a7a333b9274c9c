#include "services/kvstore/kvstore_service.h"

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/metrics.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/server.h"
#include "tests/services/test_pages.h"
#include "tests/testing/metrics_check.h"
#include "tests/testing/raw_call.h"

namespace kvstrata::kvstore {
namespace {

using ::kvstrata::kvstore::testing::Key;
using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::MakePage;
using ::kvstrata::kvstore::testing::TestPage;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

void SetDeadline(grpc::ClientContext& context, int seconds = 10) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
}

class KvStoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PageStoreOptions options;
    options.capacity_bytes = 8 * 16448;
    options.max_lease_ttl = absl::Seconds(30);
    store_ = std::make_unique<PageStore>(options, &clock_);
    service_ = std::make_unique<KvStoreService>(
        store_.get(), KvStoreServiceOptions{.store_id = "test-store", .max_keys_per_request = 16},
        &registry_);
    absl::StatusOr<std::unique_ptr<rpc::Server>> server =
        rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {service_.get()}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::KvStore::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  // Puts `pages` in one stream, each in chunks of `chunk` bytes.
  grpc::Status Put(const std::vector<TestPage>& pages, v1::PutResponse* response,
                   size_t chunk = 5000) {
    grpc::ClientContext context;
    SetDeadline(context);
    auto writer = stub_->Put(&context, response);
    for (const TestPage& page : pages) {
      v1::PutRequest request;
      v1::PageHeader* header = request.mutable_header();
      header->set_key(page.meta.key.ToBytes());
      header->set_parent_key(page.meta.parent_key.ToBytes());
      header->set_page_index(page.meta.page_index);
      header->set_encoding(ToProto(page.meta.form));
      header->set_byte_length(page.meta.byte_length);
      header->set_checksum_xxh3_64(page.meta.checksum_xxh3_64);
      if (!writer->Write(request)) break;
      for (size_t offset = 0; offset < page.bytes.size(); offset += chunk) {
        request.set_chunk(reinterpret_cast<const char*>(page.bytes.data()) + offset,
                          std::min(chunk, page.bytes.size() - offset));
        if (!writer->Write(request)) break;
      }
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // Fetches pages; returns the page bytes in order, checking chunk sizes on the way.
  grpc::Status Fetch(const std::vector<PageKey>& keys, uint64_t lease_id,
                     std::vector<std::string>* pages, uint32_t max_chunk = 4096) {
    v1::FetchRequest request;
    for (const PageKey& key : keys) request.add_pages()->set_key(key.ToBytes());
    request.set_lease_id(lease_id);
    request.set_max_chunk_bytes(max_chunk);
    grpc::ClientContext context;
    SetDeadline(context);
    auto reader = stub_->Fetch(&context, request);
    v1::FetchResponse response;
    while (reader->Read(&response)) {
      if (response.has_header()) {
        pages->emplace_back();
      } else {
        EXPECT_LE(response.chunk().size(), max_chunk);
        pages->back() += response.chunk();
      }
    }
    return reader->Finish();
  }

  SystemClock clock_;
  MetricsRegistry registry_;
  std::unique_ptr<PageStore> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<v1::KvStore::Stub> stub_;
};

TEST_F(KvStoreServiceTest, PutLookupFetchRoundTrip) {
  std::vector<TestPage> chain = MakeChain({1, 2, 3});
  v1::PutResponse put;
  grpc::Status status = Put(chain, &put);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(put.pages_stored(), 3u);
  // Idempotent: the same stream again stores nothing.
  ASSERT_TRUE(Put(chain, &put).ok());
  EXPECT_EQ(put.pages_stored(), 0u);
  EXPECT_EQ(put.pages_already_present(), 3u);

  v1::LookupRequest lookup;
  for (uint8_t id : {1, 2, 3, 4}) lookup.add_page_keys(Key(id).ToBytes());
  lookup.set_lease_ttl_ms(5000);
  v1::LookupResponse found;
  grpc::ClientContext context;
  SetDeadline(context);
  ASSERT_TRUE(stub_->Lookup(&context, lookup, &found).ok());
  EXPECT_EQ(found.matched_pages(), 3u);
  ASSERT_EQ(found.pages_size(), 3);
  EXPECT_EQ(found.pages(1).key(), Key(2).ToBytes());
  EXPECT_EQ(found.pages(1).primary_encoding(), v1::PAGE_ENCODING_BF16);
  EXPECT_EQ(found.pages(1).primary_bytes(), chain[1].bytes.size());
  EXPECT_EQ(found.page_size_tokens(), 64u);
  EXPECT_NE(found.lease_id(), 0u);

  // The count and a lease without the page infos, when asked so.
  lookup.set_matched_count_only(true);
  v1::LookupResponse counted;
  grpc::ClientContext count_context;
  SetDeadline(count_context);
  ASSERT_TRUE(stub_->Lookup(&count_context, lookup, &counted).ok());
  EXPECT_EQ(counted.matched_pages(), 3u);
  EXPECT_EQ(counted.pages_size(), 0);
  EXPECT_NE(counted.lease_id(), 0u);
  EXPECT_NE(counted.lease_id(), found.lease_id());

  std::vector<std::string> pages;
  ASSERT_TRUE(Fetch({Key(1), Key(2), Key(3)}, found.lease_id(), &pages).ok());
  ASSERT_EQ(pages.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(pages[i], std::string(chain[i].bytes.begin(), chain[i].bytes.end())) << i;
  }
  // An absent page ends the stream with NOT_FOUND naming it, after the earlier pages.
  pages.clear();
  grpc::Status missing = Fetch({Key(1), Key(9)}, 0, &pages);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr(Key(9).ToHex()));
  EXPECT_EQ(pages.size(), 1u);
}

// A stream message that does not parse fails the Put; gRPC's own reader would have ended the
// stream there and committed it as if complete.
TEST_F(KvStoreServiceTest, EveryDeclaredMetricIsServedAndDocumented) {
  v1::PutResponse put;
  ASSERT_TRUE(Put(MakeChain({1}), &put).ok());
  test_util::ExpectDeclaredMetricsServedAndDocumented(registry_, "docs/kvstore.md");
}

TEST_F(KvStoreServiceTest, AnUnparseableMessageFailsThePutAndItsPageIsNotStored) {
  std::vector<TestPage> chain = MakeChain({1, 2});
  auto header_of = [](const TestPage& page) {
    v1::PutRequest request;
    v1::PageHeader* header = request.mutable_header();
    header->set_key(page.meta.key.ToBytes());
    header->set_parent_key(page.meta.parent_key.ToBytes());
    header->set_page_index(page.meta.page_index);
    header->set_encoding(ToProto(page.meta.form));
    header->set_byte_length(page.meta.byte_length);
    header->set_checksum_xxh3_64(page.meta.checksum_xxh3_64);
    return request.SerializeAsString();
  };
  v1::PutRequest chunk;
  chunk.set_chunk(reinterpret_cast<const char*>(chain[0].bytes.data()), chain[0].bytes.size());
  v1::PutRequest chunk1;
  chunk1.set_chunk(reinterpret_cast<const char*>(chain[1].bytes.data()), chain[1].bytes.size());
  // Page 0 whole, a message of garbage, then page 1 whole: the garbage is not the end.
  const std::vector<std::string> messages = {header_of(chain[0]), chunk.SerializeAsString(),
                                             std::string("\xff\xff\xff", 3), header_of(chain[1]),
                                             chunk1.SerializeAsString()};
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  test_util::RawResult r =
      test_util::RawClientStreamingCall(channel, "/kvstrata.v1.KvStore/Put", messages);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("message 2"));
  EXPECT_THAT(r.status.error_message(), HasSubstr("kvstrata.v1.PutRequest"));
  // As the API says, the pages before the failure are committed; nothing after it is.
  EXPECT_EQ(store_->Stats().pages, 1u);
  std::vector<std::string> pages;
  EXPECT_EQ(Fetch({Key(2)}, 0, &pages).error_code(), grpc::StatusCode::NOT_FOUND);

  // The whole stream again, well formed, completes the chain.
  v1::PutResponse put;
  ASSERT_TRUE(Put(chain, &put).ok());
  EXPECT_EQ(put.pages_stored(), 1u);
  EXPECT_EQ(put.pages_already_present(), 1u);
}

TEST_F(KvStoreServiceTest, FullStoreEvictsDuringPut) {
  std::vector<TestPage> roots;
  for (uint8_t id = 1; id <= 10; ++id) roots.push_back(MakePage(Key(id), Key(0xEE), 0));
  v1::PutResponse put;
  ASSERT_TRUE(Put(roots, &put, /*chunk=*/1 << 20).ok());
  EXPECT_EQ(put.pages_stored(), 10u);
  EXPECT_EQ(put.pages_evicted(), 2u);
  const PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.pages, 8u);
  EXPECT_EQ(stats.evictions_total, 2u);
  EXPECT_THAT(registry_.Render(), HasSubstr("kvstrata_kvstore_evictions_total 2"));
}

TEST_F(KvStoreServiceTest, PinReleaseAndStats) {
  v1::PutResponse put;
  ASSERT_TRUE(Put(MakeChain({1, 2}), &put).ok());
  v1::PinRequest pin;
  pin.add_page_keys(Key(2).ToBytes());
  pin.add_page_keys(Key(7).ToBytes());
  pin.set_ttl_ms(10000);
  v1::PinResponse pinned;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->Pin(&context, pin, &pinned).ok());
  }
  EXPECT_EQ(pinned.pinned_pages(), 1u);
  EXPECT_THAT(pinned.missing_indices(), ElementsAre(1));
  EXPECT_EQ(pinned.expires_in_ms(), 10000u);

  v1::StatsResponse stats;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->Stats(&context, v1::StatsRequest(), &stats).ok());
  }
  EXPECT_EQ(stats.store_id(), "test-store");
  EXPECT_NE(stats.store_epoch(), 0u);
  EXPECT_EQ(stats.pages(), 2u);
  EXPECT_EQ(stats.bytes_used(), 2 * 16448u);
  EXPECT_EQ(stats.bytes_capacity(), 8 * 16448u);
  EXPECT_EQ(stats.pinned_pages(), 1u);
  EXPECT_EQ(stats.active_leases(), 1u);
  EXPECT_EQ(stats.limits().max_keys_per_request(), 16u);
  EXPECT_EQ(stats.limits().max_lease_ttl_ms(), 30000u);
  EXPECT_EQ(stats.last_event_sequence(), 2u);

  v1::ReleaseRequest release;
  release.set_lease_id(pinned.lease_id());
  for (bool expected : {true, false}) {
    v1::ReleaseResponse released;
    grpc::ClientContext context;
    SetDeadline(context);
    ASSERT_TRUE(stub_->Release(&context, release, &released).ok());
    EXPECT_EQ(released.released(), expected);
  }
  // The metrics follow the store.
  const std::string metrics = registry_.Render();
  EXPECT_THAT(metrics, HasSubstr("kvstrata_kvstore_pages 2"));
  EXPECT_THAT(metrics, HasSubstr("kvstrata_kvstore_pages_stored_total 2"));
  EXPECT_THAT(metrics,
              HasSubstr("kvstrata_kvstore_request_duration_seconds_count{method=\"Pin\"} 1"));
}

TEST_F(KvStoreServiceTest, WatchEventsSendsSnapshotThenLiveEvents) {
  v1::PutResponse put;
  ASSERT_TRUE(Put(MakeChain({1, 2}), &put).ok());
  v1::WatchEventsRequest request;
  request.set_include_snapshot(true);
  grpc::ClientContext context;
  SetDeadline(context);
  auto reader = stub_->WatchEvents(&context, request);
  std::vector<v1::PageEvent> events;
  v1::WatchEventsResponse response;
  while (events.size() < 2 && reader->Read(&response)) {
    EXPECT_EQ(response.store_epoch(), store_->epoch());
    for (const v1::PageEvent& e : response.events()) events.push_back(e);
  }
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].snapshot());
  EXPECT_EQ(events[0].stored().key(), Key(1).ToBytes());
  EXPECT_EQ(events[0].stored().parent_key(), "");
  EXPECT_EQ(events[1].stored().key(), Key(2).ToBytes());
  EXPECT_EQ(events[1].stored().parent_key(), Key(1).ToBytes());
  EXPECT_EQ(events[1].sequence(), 2u);

  ASSERT_TRUE(Put({MakePage(Key(3), Key(2), 2)}, &put).ok());
  ASSERT_TRUE(reader->Read(&response));
  ASSERT_EQ(response.events_size(), 1);
  EXPECT_FALSE(response.events(0).snapshot());
  EXPECT_EQ(response.events(0).sequence(), 3u);
  EXPECT_EQ(response.events(0).stored().key(), Key(3).ToBytes());
  EXPECT_EQ(response.events(0).stored().page_index(), 2u);
  context.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(KvStoreServiceTest, BadRequests) {
  {
    v1::LookupRequest lookup;
    lookup.add_page_keys(Key(1).ToBytes());
    lookup.add_page_keys("short");
    v1::LookupResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status status = stub_->Lookup(&context, lookup, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("page_keys[1]"));
  }
  {
    v1::LookupRequest lookup;
    for (int i = 0; i < 17; ++i) lookup.add_page_keys(Key(1).ToBytes());
    v1::LookupResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    EXPECT_EQ(stub_->Lookup(&context, lookup, &response).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  v1::PutResponse put;
  TestPage corrupt = MakeChain({1})[0];
  corrupt.bytes[100] ^= 0xff;
  grpc::Status status = Put({corrupt}, &put);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(status.error_message(), HasSubstr(Key(1).ToHex()));

  status = Put({MakePage(Key(2), Key(1), 1)}, &put);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("parent"));

  // The first page commits before the second one fails.
  std::vector<TestPage> chain = MakeChain({1, 2});
  TestPage bad_length = chain[1];
  bad_length.bytes.pop_back();
  status = Put({chain[0], bad_length}, &put);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("stream ended"));
  EXPECT_EQ(store_->Stats().pages, 1u);
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::PutResponse response;
    auto writer = stub_->Put(&context, &response);
    v1::PutRequest chunk;
    chunk.set_chunk("abc");
    writer->Write(chunk);
    writer->WritesDone();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    v1::PinRequest pin;
    pin.add_page_keys(Key(1).ToBytes());
    v1::PinResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status pin_status = stub_->Pin(&context, pin, &response);
    EXPECT_EQ(pin_status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(pin_status.error_message(), HasSubstr("ttl_ms"));
  }
  std::vector<std::string> pages;
  EXPECT_EQ(Fetch({Key(1)}, /*lease_id=*/424242, &pages).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  {
    v1::OpenTransferResponse response;
    grpc::ClientContext context;
    SetDeadline(context);
    grpc::Status transfer = stub_->OpenTransfer(&context, v1::OpenTransferRequest(), &response);
    EXPECT_EQ(transfer.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(transfer.error_message(), HasSubstr("pages"));
  }
}

}  // namespace
}  // namespace kvstrata::kvstore

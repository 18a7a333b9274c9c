#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "engine/cpu_backend.h"
#include "engine/scheduler.h"
#include "rpc/server.h"
#include "services/kvstore/client.h"
#include "services/kvstore/kvstore_service.h"
#include "tests/engine/random_model.h"

namespace kvstrata::kvstore {
namespace {

using engine::ExportedPage;
using engine::GenerationEvent;
using engine::GenerationRequest;
using engine::KvCache;
using engine::KvCacheFormat;
using engine::Scheduler;

// Engine side: the tiny random model on an INT2 cache, one fresh scheduler per run.
class Worker {
 public:
  struct Result {
    std::vector<int32_t> tokens;
    int cached_tokens = 0;
    std::vector<ExportedPage> pages;
  };

  Worker() : model_(engine::testing::RandomModel({})) {
    rot_ = engine::IdentityRotations(model_.config.num_layers, model_.config.num_kv_heads,
                                     model_.config.head_dim);
    namespace_key_ = *NamespaceKey(
        {.model_fingerprint = model_.fingerprint, .kv_format = "int2", .rotation_digest = "id"});
  }
  const PageKey& namespace_key() const { return namespace_key_; }

  Result Run(std::vector<int32_t> prompt, int max_tokens,
             std::vector<std::string> cached_pages = {}) {
    engine::KvCacheOptions o;
    o.format = KvCacheFormat::kInt2;
    o.capacity_bytes = 64 << 20;
    o.max_sequences = 2;
    o.max_chunk_tokens = 64;
    std::unique_ptr<KvCache> cache =
        *KvCache::Create({model_.config.num_layers, model_.config.num_kv_heads, 64, 64, 64}, o);
    std::unique_ptr<engine::Backend> backend = engine::CreateCpuBackend(model_, rot_, cache.get());
    Scheduler scheduler(
        backend.get(), cache.get(), [](int32_t t) { return std::to_string(t); },
        [](int32_t) { return false; }, {.prefill_chunk = 64});
    GenerationRequest r;
    r.request_id = "client-test";
    r.prompt = std::move(prompt);
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    r.namespace_key = namespace_key_;
    r.publish_pages = true;
    r.cached_pages = std::move(cached_pages);
    Result out;
    absl::StatusOr<uint64_t> id = scheduler.Submit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    for (int guard = 0; !scheduler.idle() && guard < 10000; ++guard) {
      std::vector<GenerationEvent> events;
      EXPECT_TRUE(scheduler.Step(&events).ok());
      for (GenerationEvent& e : events) {
        if (e.token >= 0) out.tokens.push_back(e.token);
        if (e.finish == engine::FinishReason::kNone) continue;
        out.cached_tokens = e.cached_tokens;
        out.pages = std::move(e.published_pages);
      }
    }
    return out;
  }
  std::vector<int32_t> RandomPrompt(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = 1 + static_cast<int32_t>(rng() % (model_.config.vocab_size - 1));
    return p;
  }

 private:
  model::LoadedModel model_;
  engine::RotationSet rot_;
  PageKey namespace_key_;
};

std::vector<PutPage> ToPut(const std::vector<ExportedPage>& pages, const PageKey& namespace_key) {
  std::vector<PutPage> out;
  for (const ExportedPage& e : pages) {
    out.push_back({.key = e.key,
                   .parent_key = e.page_index == 0 ? namespace_key : pages[e.page_index - 1].key,
                   .page_index = static_cast<uint32_t>(e.page_index),
                   .encoding = e.encoding == kernels::PageEncoding::kBf16 ? v1::PAGE_ENCODING_BF16
                                                                          : v1::PAGE_ENCODING_INT2,
                   .bytes = e.bytes});
  }
  return out;
}

class KvStoreClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = std::make_unique<PageStore>(PageStoreOptions{.capacity_bytes = 64 << 20}, &clock_);
    service_ = std::make_unique<KvStoreService>(store_.get(), KvStoreServiceOptions{}, &registry_);
    absl::StatusOr<std::unique_ptr<rpc::Server>> server =
        rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {service_.get()}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  SystemClock clock_;
  MetricsRegistry registry_;
  std::unique_ptr<PageStore> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<rpc::Server> server_;
};

TEST_F(KvStoreClientTest, EnginePagesRoundTripThroughTheStoreIntoAFreshSequence) {
  Worker worker;
  const std::vector<int32_t> prompt = worker.RandomPrompt(8 * 64 + 20, 5);
  const Worker::Result scratch = worker.Run(prompt, 10);
  ASSERT_EQ(scratch.tokens.size(), 10u);
  // The donor stops at 512 tokens: 8 pages, INT2 history and BF16 sink and recent window.
  const Worker::Result donor =
      worker.Run(std::vector<int32_t>(prompt.begin(), prompt.begin() + 512), 1);
  ASSERT_EQ(donor.pages.size(), 8u);

  KvStoreClient client(server_->address());
  absl::StatusOr<PutSummary> put = client.Put(ToPut(donor.pages, worker.namespace_key()));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->pages_stored, 8u);
  put = client.Put(ToPut(donor.pages, worker.namespace_key()));  // idempotent
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->pages_already_present, 8u);

  // The prompt's chain: 8 stored keys, then one the store has never seen (the scratch run has
  // only these 8 full pages too: 532 + 10 tokens).
  std::vector<PageKey> keys;
  for (const ExportedPage& e : donor.pages) keys.push_back(e.key);
  keys.push_back(ChainPageKey(keys.back(), std::vector<uint32_t>(64, 7)));
  absl::StatusOr<LookupReply> lookup = client.Lookup(keys, /*lease_ttl_ms=*/5000);
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  EXPECT_EQ(lookup->matched_pages, 8u);
  EXPECT_EQ(lookup->pages.size(), 8u);
  EXPECT_NE(lookup->lease_id, 0u);
  // What a worker asks: the same count and a lease, no page infos.
  absl::StatusOr<LookupReply> counted =
      client.Lookup(keys, /*lease_ttl_ms=*/5000, /*page_infos=*/false);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_EQ(counted->matched_pages, 8u);
  EXPECT_TRUE(counted->pages.empty());
  EXPECT_NE(counted->lease_id, 0u);
  ASSERT_TRUE(client.Release(counted->lease_id).ok());

  std::vector<std::pair<PageKey, v1::PageEncoding>> refs;
  for (uint32_t i = 0; i < lookup->matched_pages; ++i) {
    refs.push_back({keys[i], v1::PAGE_ENCODING_UNSPECIFIED});
  }
  absl::StatusOr<std::vector<FetchedPage>> fetched = client.Fetch(refs, lookup->lease_id);
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_EQ(fetched->size(), 8u);
  std::vector<std::string> cached;
  for (size_t i = 0; i < fetched->size(); ++i) {
    EXPECT_TRUE((*fetched)[i].bytes == donor.pages[i].bytes) << "page " << i;
    cached.push_back((*fetched)[i].bytes);
  }

  const Worker::Result imported = worker.Run(prompt, 10, std::move(cached));
  EXPECT_EQ(imported.cached_tokens, 512);
  EXPECT_EQ(imported.tokens, scratch.tokens);
}

TEST_F(KvStoreClientTest, AbsentPageIsAMiss) {
  KvStoreClient client(server_->address());
  PageKey absent;
  absent.bytes.fill(0x42);
  absl::StatusOr<LookupReply> lookup = client.Lookup(std::vector<PageKey>{absent});
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  EXPECT_EQ(lookup->matched_pages, 0u);
  const std::vector<std::pair<PageKey, v1::PageEncoding>> refs = {
      {absent, v1::PAGE_ENCODING_UNSPECIFIED}};
  absl::StatusOr<std::vector<FetchedPage>> fetched = client.Fetch(refs);
  ASSERT_FALSE(fetched.ok());
  EXPECT_EQ(fetched.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(IsStoreMiss(fetched.status()));
}

TEST_F(KvStoreClientTest, StoppedStoreIsAMissWithinTheDeadline) {
  const std::string address = server_->address();
  server_->Shutdown(absl::ZeroDuration());
  server_->Wait();
  server_.reset();
  KvStoreClient client(address, {.lookup_deadline = absl::Milliseconds(500)});
  PageKey key;
  const absl::Time start = absl::Now();
  absl::StatusOr<LookupReply> lookup = client.Lookup(std::vector<PageKey>{key});
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(lookup.ok());
  EXPECT_TRUE(IsStoreMiss(lookup.status())) << lookup.status();
  EXPECT_NE(lookup.status().message().find(address), std::string::npos);
  EXPECT_LT(took, absl::Seconds(3));
}

TEST(KvStoreClientDeadlineTest, SilentStoreIsAMissAtTheDeadline) {
  // A listening socket that never speaks: TCP connects, gRPC never gets an answer.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  KvStoreClient client(address, {.lookup_deadline = absl::Milliseconds(300)});
  const absl::Time start = absl::Now();
  absl::StatusOr<LookupReply> lookup = client.Lookup(std::vector<PageKey>{PageKey{}});
  const absl::Duration took = absl::Now() - start;
  close(fd);
  ASSERT_FALSE(lookup.ok());
  EXPECT_TRUE(IsStoreMiss(lookup.status())) << lookup.status();
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(HashRingTest, AddingOrRemovingANodeMovesOnlyItsShare) {
  std::mt19937_64 rng(3);
  std::vector<PageKey> keys(20000);
  for (PageKey& k : keys) {
    for (auto& b : k.bytes) b = static_cast<uint8_t>(rng());
  }
  HashRing ring;
  EXPECT_EQ(ring.NodeFor(keys[0]), "");
  for (const char* n : {"store-a:7000", "store-b:7000", "store-c:7000", "store-d:7000"}) {
    ring.Add(n);
  }
  ring.Add("store-a:7000");  // idempotent
  EXPECT_EQ(ring.size(), 4u);
  std::vector<std::string> before;
  std::map<std::string, int> load;
  for (const PageKey& k : keys) before.push_back(ring.NodeFor(k)), ++load[before.back()];
  for (const auto& [node, n] : load) {  // virtual nodes keep the shares near 1/4
    EXPECT_GT(n, 20000 / 4 * 0.6) << node;
    EXPECT_LT(n, 20000 / 4 * 1.4) << node;
  }

  ring.Add("store-e:7000");
  int moved = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string now = ring.NodeFor(keys[i]);
    if (now == before[i]) continue;
    ++moved;
    EXPECT_EQ(now, "store-e:7000");  // only to the new node
  }
  EXPECT_GT(moved, 20000 / 5 * 0.6);
  EXPECT_LT(moved, 20000 / 5 * 1.4);

  ring.Remove("store-e:7000");
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(ring.NodeFor(keys[i]), before[i]);

  ring.Remove("store-b:7000");
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string now = ring.NodeFor(keys[i]);
    if (before[i] == "store-b:7000") {
      EXPECT_NE(now, "store-b:7000");
    } else {
      EXPECT_EQ(now, before[i]);  // chains of the other nodes stay put
    }
  }
}

TEST(KvStoreRingTest, ChainsGoToOneClientChosenByTheirFirstKey) {
  KvStoreRing ring;
  PageKey key;
  key.bytes.fill(7);
  EXPECT_EQ(ring.ForChain(key), nullptr);
  ring.AddStore("127.0.0.1:1");
  ring.AddStore("127.0.0.1:2");
  KvStoreClient* client = ring.ForChain(key);
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(ring.ForChain(key), client);
  const std::string chosen = client->address();
  ring.RemoveStore(chosen);  // the chain moves to the remaining store
  KvStoreClient* other = ring.ForChain(key);
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->address(), chosen);
}

// A store that keeps failing is taken out of the ring: only its chains move, to the other
// store, and they move back once it is tried again after the ejection time.
TEST(KvStoreRingTest, AStoreThatKeepsFailingIsEjectedForAWhileAndOnlyItsChainsMove) {
  KvStoreRing ring({}, 128, {.failures_to_eject = 3, .ejection = absl::Milliseconds(300)});
  ring.AddStore("127.0.0.1:1");
  ring.AddStore("127.0.0.1:2");
  std::vector<PageKey> keys(200);
  std::map<int, std::string> home;  // chain -> store
  for (int i = 0; i < 200; ++i) {
    keys[i].bytes[0] = static_cast<uint8_t>(i);
    keys[i].bytes[1] = static_cast<uint8_t>(i * 37);
    keys[i].bytes[2] = static_cast<uint8_t>(i * 101);
    home[i] = ring.ForChain(keys[i])->address();
  }
  const std::string down = "127.0.0.1:1";
  const absl::Status unavailable = absl::UnavailableError("connection refused");
  EXPECT_FALSE(ring.ReportResult(down, unavailable));
  EXPECT_FALSE(ring.ReportResult(down, absl::NotFoundError("a miss is not a failure")));
  EXPECT_FALSE(ring.ReportResult(down, unavailable));  // the count started again
  EXPECT_FALSE(ring.ReportResult(down, unavailable));
  EXPECT_TRUE(ring.ReportResult(down, absl::DeadlineExceededError("slow")));
  EXPECT_EQ(ring.Ejected(), std::vector<std::string>{down});
  int moved = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string now = ring.ForChain(keys[i])->address();
    EXPECT_EQ(now, "127.0.0.1:2") << "chain " << i;
    moved += home[i] != now;
    if (home[i] != down) {
      EXPECT_EQ(now, home[i]) << "a chain of the healthy store moved";
    }
  }
  EXPECT_GT(moved, 0);
  absl::SleepFor(absl::Milliseconds(350));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(ring.ForChain(keys[i])->address(), home[i]);
  EXPECT_TRUE(ring.Ejected().empty());
  // On probation: one more failure takes it out again.
  EXPECT_TRUE(ring.ReportResult(down, unavailable));
}

}  // namespace
}  // namespace kvstrata::kvstore

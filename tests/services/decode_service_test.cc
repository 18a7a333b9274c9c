// The decode service end to end, in process: a KvStore and one or two Generation services on the
// default model (KVSTRATA_MODEL), over loopback gRPC.

#include "services/decode/decode_service.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/metrics.h"
#include "engine/engine.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "rpc/server.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/page_store.h"
#include "tests/services/decode_fake_registry.h"
#include "tests/testing/metrics_check.h"
#include "tests/testing/raw_call.h"
#include "tests/testing/wait_until.h"

namespace kvstrata::decode {
namespace {

struct KvStoreInstance {
  SystemClock clock;
  MetricsRegistry registry;
  std::unique_ptr<kvstore::PageStore> store;
  std::unique_ptr<kvstore::KvStoreService> service;
  std::unique_ptr<rpc::Server> server;
};

std::unique_ptr<KvStoreInstance> StartKvStore() {
  auto k = std::make_unique<KvStoreInstance>();
  k->store = std::make_unique<kvstore::PageStore>(
      kvstore::PageStoreOptions{.capacity_bytes = 256 << 20}, &k->clock);
  k->service = std::make_unique<kvstore::KvStoreService>(
      k->store.get(), kvstore::KvStoreServiceOptions{}, &k->registry);
  absl::StatusOr<std::unique_ptr<rpc::Server>> server =
      rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {k->service.get()}});
  if (!server.ok()) return nullptr;
  k->server = *std::move(server);
  return k;
}

struct DecodeInstance {
  MetricsRegistry registry;
  std::unique_ptr<DecodeService> service;
  std::unique_ptr<rpc::Server> server;
  std::unique_ptr<v1::Generation::Stub> stub;
  // The engine's own PageNamespace("") and PageNamespace("tenant-a").
  PageKey namespace_unsalted;
  PageKey namespace_salted;
  std::string engine_identity;  // the engine's tokenizer identity
};

std::unique_ptr<DecodeInstance> StartDecode(
    std::vector<std::string> kvstores, const std::string& worker_id,
    int64_t local_cache_bytes = 0, engine::KvCacheFormat format = engine::KvCacheFormat::kInt2) {
  const char* model = std::getenv("KVSTRATA_MODEL");
  if (model == nullptr || *model == '\0') return nullptr;
  engine::EngineOptions o;
  o.model_path = model;
  o.kv_cache.format = format;
  o.default_rotations_dir = "rotations";  // tests run in the source folder
  o.kv_cache.capacity_bytes = int64_t{256} << 20;
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Engine::Load(o);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status();
    return nullptr;
  }
  auto d = std::make_unique<DecodeInstance>();
  d->namespace_unsalted = *(*engine)->PageNamespace("");
  d->namespace_salted = *(*engine)->PageNamespace("tenant-a");
  d->engine_identity = (*engine)->prompt_encoder().identity();
  DecodeServiceOptions options;
  options.worker_id = worker_id;
  options.local_cache_bytes = local_cache_bytes;
  options.kvstore_addresses = std::move(kvstores);
  options.kvstore_client.lookup_deadline = absl::Milliseconds(500);
  d->service = std::make_unique<DecodeService>(*std::move(engine), options, &d->registry);
  absl::StatusOr<std::unique_ptr<rpc::Server>> server =
      rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {d->service.get()}});
  if (!server.ok()) {
    ADD_FAILURE() << server.status();
    return nullptr;
  }
  d->server = *std::move(server);
  d->stub = v1::Generation::NewStub(
      grpc::CreateChannel(d->server->address(), grpc::InsecureChannelCredentials()));
  return d;
}

struct Result {
  grpc::Status status;
  int messages = 0;
  std::string text;
  std::vector<uint32_t> tokens;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  bool has_usage = false;
  v1::Usage usage;
};

// A deadline for requests whose speed is not under test: a ~400-token prefill takes about a
// second here, and over 30 s under ASan and UBSan (scripts/sanitize.sh) on two busy cores.
Result Call(v1::Generation::Stub& stub, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(180));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub.Generate(&context, request);
  Result r;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    ++r.messages;
    r.text += m.text();
    r.tokens.insert(r.tokens.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) r.finish = m.finish_reason();
    if (m.has_usage()) {
      r.has_usage = true;
      r.usage = m.usage();
    }
  }
  r.status = reader->Finish();
  return r;
}

v1::GenerateRequest Chat(const std::string& system, const std::string& user, int max_tokens) {
  v1::GenerateRequest r;
  v1::ChatInput* chat = r.mutable_chat();
  chat->set_apply_chat_template(true);
  chat->set_add_generation_prompt(true);
  if (!system.empty()) {
    v1::ChatMessage* m = chat->add_messages();
    m->set_role("system");
    m->set_content(system);
  }
  v1::ChatMessage* m = chat->add_messages();
  m->set_role("user");
  m->set_content(user);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_stop()->set_max_tokens(max_tokens);
  return r;
}

// Polls `done` for up to 5 s.
template <typename Done>
bool WaitFor(Done done) {
  const absl::Time give_up = absl::Now() + absl::Seconds(5);
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// About 300 words of the GPL (well over two 64-token pages).
std::string LongSystemPrompt() {
  std::ifstream in("/usr/share/common-licenses/GPL-3");
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  if (text.size() < 1800) return std::string(1800, 'a');
  return text.substr(0, 1800);
}

#define REQUIRE_INSTANCE(p) \
  if ((p) == nullptr) GTEST_FAIL() << "could not start (is KVSTRATA_MODEL set to the model?)"

TEST(DecodeServiceTest, GreedyChatAnswersParisWithFinishAndUsage) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w0");
  REQUIRE_INSTANCE(d);
  const Result r = Call(*d->stub, Chat("", "What is the capital of France?", 16));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_NE(r.text.find("Paris"), std::string::npos) << r.text;
  EXPECT_GE(r.messages, 3);
  EXPECT_NE(r.finish, v1::FINISH_REASON_UNSPECIFIED);
  ASSERT_TRUE(r.has_usage);
  EXPECT_GT(r.usage.prompt_tokens(), 5u);
  EXPECT_EQ(r.usage.completion_tokens(), r.tokens.size());
  EXPECT_EQ(r.usage.cached_kvstore_tokens(), 0u);
  EXPECT_EQ(r.usage.uncached_tokens(), r.usage.prompt_tokens());

  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(d->stub->GetServerInfo(&context, {}, &info).ok());
  EXPECT_FALSE(info.kv_format().name().empty());
  EXPECT_EQ(info.kv_format().page_size_tokens(), 64u);
  EXPECT_EQ(info.tokenizer(), d->engine_identity);
  EXPECT_EQ(info.model_fingerprint().size(), 64u);  // hex SHA-256 of the GGUF file
  // SmolLM2: <|im_end|> (2) ends generation, and so does <|endoftext|> (0).
  EXPECT_NE(std::find(info.eos_token_ids().begin(), info.eos_token_ids().end(), 2u),
            info.eos_token_ids().end());
  EXPECT_NE(d->registry.Render().find("kvstrata_decode_requests_total{finish_reason="),
            std::string::npos);
}

TEST(DecodeServiceTest, SecondWorkerReusesPrefixFromTheKvStoreWithTheSameGreedyText) {
  std::unique_ptr<KvStoreInstance> store = StartKvStore();
  ASSERT_NE(store, nullptr);
  std::unique_ptr<DecodeInstance> first = StartDecode({store->server->address()}, "w1");
  REQUIRE_INSTANCE(first);
  std::unique_ptr<DecodeInstance> second = StartDecode({store->server->address()}, "w2");
  REQUIRE_INSTANCE(second);
  const v1::GenerateRequest request =
      Chat(LongSystemPrompt(), "In one sentence, what is this license about?", 12);

  const Result a = Call(*first->stub, request);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(a.has_usage);
  EXPECT_GT(a.usage.prompt_tokens(), 3u * 64);
  EXPECT_EQ(a.usage.cached_kvstore_tokens(), 0u);
  first->service->WaitForPublishes();

  const Result b = Call(*second->stub, request);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  ASSERT_TRUE(b.has_usage);
  EXPECT_GT(b.usage.cached_kvstore_tokens(), 2u * 64);
  EXPECT_EQ(b.usage.cached_kvstore_tokens() % 64, 0u);
  EXPECT_EQ(
      b.usage.cached_kvstore_tokens() + b.usage.uncached_tokens() + b.usage.recomputed_tokens(),
      b.usage.prompt_tokens());
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.tokens, a.tokens);
  // The lookup's lease ended with the fetch: the pages can be evicted again.
  EXPECT_EQ(store->store->Stats().active_leases, 0u);
}

// The codec format's history pages go through the kvstore like INT2's (the store once refused
// them), and its workers describe the format so a router can rebuild their namespace.
TEST(DecodeServiceTest, CodecPagesAreSharedThroughTheKvStore) {
  std::unique_ptr<KvStoreInstance> store = StartKvStore();
  ASSERT_NE(store, nullptr);
  std::unique_ptr<DecodeInstance> first =
      StartDecode({store->server->address()}, "w1c", 0, engine::KvCacheFormat::kCodec);
  REQUIRE_INSTANCE(first);
  std::unique_ptr<DecodeInstance> second =
      StartDecode({store->server->address()}, "w2c", 0, engine::KvCacheFormat::kCodec);
  REQUIRE_INSTANCE(second);
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(first->stub->GetServerInfo(&context, {}, &info).ok());
  EXPECT_EQ(info.kv_format().quantization(), v1::KV_QUANTIZATION_CODEC);
  EXPECT_EQ(info.kv_format().name(), "codec-sink64-recent256-p64");
  EXPECT_NEAR(info.kv_format().history_bits_per_element(), 2.496, 0.001);  // P2v4
  EXPECT_EQ(info.kv_format().int2_page_bytes(), 232576u);  // docs/kv-format.md

  const v1::GenerateRequest request =
      Chat(LongSystemPrompt(), "In one sentence, what is this license about?", 12);
  const Result a = Call(*first->stub, request);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  first->service->WaitForPublishes();
  const Result b = Call(*second->stub, request);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  ASSERT_TRUE(b.has_usage);
  EXPECT_GT(b.usage.cached_kvstore_tokens(), 2u * 64);
  EXPECT_EQ(b.tokens, a.tokens);
}

TEST(DecodeServiceTest, StoppedKvStoreIsAMissAndTheRequestCompletes) {
  std::unique_ptr<KvStoreInstance> store = StartKvStore();
  ASSERT_NE(store, nullptr);
  const std::string address = store->server->address();
  std::unique_ptr<DecodeInstance> d = StartDecode({address}, "w3");
  REQUIRE_INSTANCE(d);
  store->server->Shutdown(absl::ZeroDuration());
  store->server->Wait();
  store.reset();
  const Result r = Call(*d->stub, Chat(LongSystemPrompt(), "Summarise.", 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_NE(r.finish, v1::FINISH_REASON_UNSPECIFIED);
  ASSERT_TRUE(r.has_usage);
  EXPECT_EQ(r.usage.cached_kvstore_tokens(), 0u);
  EXPECT_EQ(r.usage.completion_tokens(), 4u);
  d->service->WaitForPublishes();  // the publish fails too, quietly
  EXPECT_NE(d->registry.Render().find("kvstrata_decode_kvstore_errors_total{op=\"lookup\"} 1"),
            std::string::npos)
      << d->registry.Render();
}

TEST(DecodeServiceTest, CancelledRequestFreesItsPages) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w4");
  REQUIRE_INSTANCE(d);
  v1::GenerateRequest request = Chat("", "Write a long story.", 200);
  request.mutable_stop()->set_ignore_eos(true);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      d->stub->Generate(&context, request);
  v1::GenerateResponse m;
  if (!reader->Read(&m)) {
    const grpc::Status status = reader->Finish();
    GTEST_FAIL() << status.error_code() << " " << status.error_message();
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (d->service->KvBytesInUse() == 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_GT(d->service->KvBytesInUse(), 0);
  context.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  while ((d->service->KvBytesInUse() != 0 || d->service->ActiveSequences() != 0) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(d->service->KvBytesInUse(), 0);
  EXPECT_EQ(d->service->ActiveSequences(), 0);
}

TEST(DecodeServiceTest, AbortEndsTheStreamWithAbortAndUsage) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w6");
  REQUIRE_INSTANCE(d);
  v1::GenerateRequest request = Chat("", "Write a long story.", 200);
  request.mutable_stop()->set_ignore_eos(true);
  request.set_request_id("abort-me");
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      d->stub->Generate(&context, request);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_EQ(m.request_id(), "abort-me");
  grpc::ClientContext abort_context;
  v1::AbortRequest abort;
  abort.set_request_id("abort-me");
  v1::AbortResponse abort_response;
  ASSERT_TRUE(d->stub->Abort(&abort_context, abort, &abort_response).ok());
  EXPECT_TRUE(abort_response.found());
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  uint32_t completion = 0;
  while (reader->Read(&m)) {
    if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) finish = m.finish_reason();
    if (m.has_usage()) completion = m.usage().completion_tokens();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(finish, v1::FINISH_REASON_ABORT);
  EXPECT_GT(completion, 0u);
  EXPECT_LT(completion, 200u);

  grpc::ClientContext again;
  ASSERT_TRUE(d->stub->Abort(&again, abort, &abort_response).ok());
  EXPECT_FALSE(abort_response.found());  // finished: idempotent, not found
}

TEST(DecodeServiceTest, BadRequestsAreInvalidArgumentNamingTheField) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w5");
  REQUIRE_INSTANCE(d);
  auto expect_invalid = [&](const v1::GenerateRequest& request, const std::string& field) {
    const Result r = Call(*d->stub, request);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_NE(r.status.error_message().find(field), std::string::npos) << r.status.error_message();
    EXPECT_EQ(r.messages, 0);
  };
  v1::GenerateRequest empty;
  empty.set_text("");
  expect_invalid(empty, "input");
  expect_invalid(v1::GenerateRequest{}, "input");
  v1::GenerateRequest r = Chat("", "Hi", 4);
  r.mutable_sampling()->set_temperature(-1);
  expect_invalid(r, "sampling.temperature");
  r = Chat("", "Hi", 4);
  r.mutable_sampling()->set_top_p(1.5f);
  expect_invalid(r, "sampling.top_p");
  r = Chat("", "Hi", 4);
  r.mutable_sampling()->set_frequency_penalty(3);
  expect_invalid(r, "sampling.frequency_penalty");
  r = Chat("", "Hi", 4);
  r.mutable_token_ids()->add_ids(1u << 30);
  expect_invalid(r, "token_ids.ids[0]");
}

// The parts of the Generation contract a worker keeps on its own (issue: the router relied on
// them): gauges before the first request (and every declared metric on /metrics and in
// docs/decode.md), limits in ServerInfo, matched_stop, a deadline during decoding, requests that
// do not parse, and a malformed routing hint.
TEST(DecodeServiceTest, WorkerKeepsTheGenerationContract) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w6");
  REQUIRE_INSTANCE(d);
  const std::string before = d->registry.Render();
  EXPECT_NE(before.find("\nkvstrata_decode_running_sequences 0\n"), std::string::npos) << before;
  EXPECT_NE(before.find("\nkvstrata_decode_waiting_requests 0\n"), std::string::npos) << before;
  test_util::ExpectDeclaredMetricsServedAndDocumented(d->registry, "docs/decode.md");

  grpc::ClientContext info_context;
  v1::ServerInfo info;
  ASSERT_TRUE(d->stub->GetServerInfo(&info_context, {}, &info).ok());
  EXPECT_GT(info.max_context_tokens(), 1000u);
  EXPECT_EQ(info.max_n(), 1u);
  EXPECT_GT(info.max_stop_strings(), 0u);
  EXPECT_GE(info.max_request_bytes(), 64u << 20);
  const v1::RegisterWorkerRequest description = d->service->WorkerDescription("127.0.0.1:1");
  EXPECT_EQ(description.limits().max_context_tokens(), info.max_context_tokens());

  // A stop string: the reply to this certainly has a space in it.
  v1::GenerateRequest stop = Chat("", "What is the capital of France?", 32);
  stop.mutable_stop()->add_stop_strings(" ");
  Result r = Call(*d->stub, stop);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.finish, v1::FINISH_REASON_STOP_STRING);
  {
    grpc::ClientContext c;
    auto reader = d->stub->Generate(&c, stop);
    v1::GenerateResponse m, last;
    while (reader->Read(&m)) last = m;
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_STOP_STRING);
    EXPECT_EQ(last.matched_stop(), " ");
  }

  // A deadline reached while decoding: DEADLINE, usage and OK, before the deadline (5 s: the
  // short prefill takes well under one here, and a few under the sanitizers on busy cores).
  {
    v1::GenerateRequest g = Chat("", "Tell me a long story about a dragon.", 4000);
    g.mutable_stop()->set_ignore_eos(true);
    grpc::ClientContext c;
    const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(5000);
    c.set_deadline(deadline);
    auto reader = d->stub->Generate(&c, g);
    v1::GenerateResponse m, last;
    uint32_t tokens = 0;
    while (reader->Read(&m)) {
      tokens += static_cast<uint32_t>(m.token_ids_size());
      last = m;
    }
    const grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
    EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_DEADLINE);
    ASSERT_TRUE(last.has_usage());
    EXPECT_EQ(last.usage().completion_tokens(), tokens);
    EXPECT_GT(tokens, 0u);
  }
  // One that passes before the first token is DEADLINE_EXCEEDED.
  {
    v1::GenerateRequest g = Chat(LongSystemPrompt(), "Summarise.", 16);
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(40));
    auto reader = d->stub->Generate(&c, g);
    v1::GenerateResponse m;
    int messages = 0;
    while (reader->Read(&m)) ++messages;
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_EQ(messages, 0);
  }

  // Bytes that are not a GenerateRequest.
  auto channel = grpc::CreateChannel(d->server->address(), grpc::InsecureChannelCredentials());
  test_util::RawResult raw = test_util::RawServerStreamingCall(
      channel, "/kvstrata.v1.Generation/Generate", std::string("\x1a\x02\xc3\x28", 4));
  EXPECT_EQ(raw.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(raw.status.error_message().find("text"), std::string::npos)
      << raw.status.error_message();
  raw = test_util::RawServerStreamingCall(channel, "/kvstrata.v1.Generation/Generate",
                                          std::string("\x0b\x0c\x0d", 3));
  EXPECT_EQ(raw.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(raw.status.error_message().find("GenerateRequest"), std::string::npos)
      << raw.status.error_message();

  // From a router, a page key must be 16 bytes.
  v1::GenerateRequest hinted = Chat("", "Hi", 4);
  hinted.mutable_routing()->add_prefix_page_keys("short");
  r = Call(*d->stub, hinted);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("routing.prefix_page_keys[0]"), std::string::npos);

  // Context limit, in the router's words.
  v1::GenerateRequest too_long;
  for (uint32_t i = 0; i < info.max_context_tokens(); ++i) too_long.mutable_token_ids()->add_ids(42);
  r = Call(*d->stub, too_long);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(r.status.error_message().find("max_context_tokens="), std::string::npos);
  // The requests that ended early (the deadlines above) leave the engine once it notices, with
  // no request after them: on busy cores the long prompt's prefill may still be running here.
  EXPECT_TRUE(test_util::WaitUntil(
      [&] {
        return d->registry.Render().find("\nkvstrata_decode_running_sequences 0\n") !=
               std::string::npos;
      },
      absl::Seconds(60)))
      << d->registry.Render();
}

constexpr int64_t kLocalTier = int64_t{64} << 20;

TEST(DecodeServiceTest, SecondIdenticalRequestReusesTheLocalTierWithTheSameGreedyText) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w7", kLocalTier);
  REQUIRE_INSTANCE(d);
  const v1::GenerateRequest request =
      Chat(LongSystemPrompt(), "In one sentence, what is this license about?", 8);
  const Result a = Call(*d->stub, request);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(a.has_usage);
  EXPECT_EQ(a.usage.cached_local_tokens(), 0u);
  ASSERT_GT(d->service->local_pages()->pages(), 2);

  const Result b = Call(*d->stub, request);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  ASSERT_TRUE(b.has_usage);
  EXPECT_GT(b.usage.cached_local_tokens(), 2u * 64);
  EXPECT_EQ(b.usage.cached_local_tokens() % 64, 0u);
  EXPECT_EQ(b.usage.cached_kvstore_tokens(), 0u);
  EXPECT_EQ(b.usage.recomputed_tokens(), 0u);
  EXPECT_EQ(b.usage.inexact_recent_window_tokens(), 0u);  // the window pages stayed BF16
  EXPECT_EQ(b.usage.cached_local_tokens() + b.usage.uncached_tokens(), b.usage.prompt_tokens());
  EXPECT_EQ(b.text, a.text);
  EXPECT_EQ(b.tokens, a.tokens);
  const std::string metrics = d->registry.Render();
  EXPECT_NE(metrics.find("kvstrata_decode_prompt_tokens_total{tier=\"local\"} " +
                         std::to_string(b.usage.cached_local_tokens())),
            std::string::npos)
      << metrics;
  EXPECT_NE(
      metrics.find("kvstrata_decode_local_cache_capacity_bytes " + std::to_string(kLocalTier)),
      std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("kvstrata_decode_local_cache_pages 0\n"), std::string::npos) << metrics;
}

// Two identical requests at once on one worker: the second waits for the first's prefill and
// takes its prompt pages from the local tier, instead of computing them a second time.
TEST(DecodeServiceTest, ConcurrentRequestWaitsForTheSamePrefixInsteadOfComputingItTwice) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w8", kLocalTier);
  REQUIRE_INSTANCE(d);
  const v1::GenerateRequest request =
      Chat(LongSystemPrompt(), "In one sentence, what is this license about?", 8);
  Result a;
  std::thread first([&] { a = Call(*d->stub, request); });
  // Let the first request register its prefill before the others arrive.
  absl::SleepFor(absl::Milliseconds(200));
  // A third waits too, and its client gives up while it waits: it must stop waiting and compute
  // nothing (a client that left earlier used to keep its place in line and run later).
  grpc::Status gave_up;
  std::thread third([&] {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(150));
    auto reader = d->stub->Generate(&c, request);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    gave_up = reader->Finish();
  });
  const Result b = Call(*d->stub, request);
  first.join();
  third.join();
  EXPECT_EQ(gave_up.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // Two requests ran; the third ended while it waited, before reaching the engine: ended by
  // the worker as its deadline came near (DEADLINE_EXCEEDED) or seen cancelled once the
  // client's deadline passed (CANCELLED), whichever came first.
  EXPECT_TRUE(WaitFor([&] {
    const std::string m = d->registry.Render();
    return m.find("kvstrata_decode_rejected_requests_total{code=\"CANCELLED\"} 1") !=
               std::string::npos ||
           m.find("kvstrata_decode_rejected_requests_total{code=\"DEADLINE_EXCEEDED\"} 1") !=
               std::string::npos;
  })) << d->registry.Render();
  // A stream's last message reaches its client just before the worker lets go of its sequence.
  EXPECT_TRUE(WaitFor([&] { return d->service->ActiveSequences() == 0; }))
      << d->service->ActiveSequences() << " sequences still active";
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(a.usage.cached_local_tokens(), 0u);
  EXPECT_GT(b.usage.cached_local_tokens(), 2u * 64);
  EXPECT_EQ(b.tokens, a.tokens);
  // The second waited; the third too, unless its deadline passed before it got that far (slow
  // sanitizer builds): either way it computed nothing.
  const std::string metrics = d->registry.Render();
  EXPECT_TRUE(metrics.find("kvstrata_decode_prefix_waits_total 1\n") != std::string::npos ||
              metrics.find("kvstrata_decode_prefix_waits_total 2\n") != std::string::npos)
      << metrics;
}

// Token ids that are not a text: the test controls every page boundary.
std::vector<uint32_t> Tokens(int n, uint32_t seed) {
  std::vector<uint32_t> ids;
  for (int i = 0; i < n; ++i)
    ids.push_back(100 + (seed + static_cast<uint32_t>(i) * 7919u) % 20000);
  return ids;
}

v1::GenerateRequest TokenRequest(const std::vector<uint32_t>& ids, int max_tokens) {
  v1::GenerateRequest r;
  for (uint32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_stop()->set_max_tokens(max_tokens);
  r.mutable_stop()->set_ignore_eos(true);
  return r;
}

TEST(DecodeServiceTest, LocalRunFirstThenTheKvStoreForThePagesAfterIt) {
  std::unique_ptr<KvStoreInstance> store = StartKvStore();
  ASSERT_NE(store, nullptr);
  std::unique_ptr<DecodeInstance> first = StartDecode({store->server->address()}, "w8", 0);
  REQUIRE_INSTANCE(first);
  std::unique_ptr<DecodeInstance> second =
      StartDecode({store->server->address()}, "w9", kLocalTier);
  REQUIRE_INSTANCE(second);
  // P: 6 cacheable pages. Q shares P's first 2 pages, then goes elsewhere for 300 tokens (long
  // enough that page 1 is INT2 history when Q ends, as an import of P's 6 pages needs). Short
  // prompts keep this test fast on two cores.
  const std::vector<uint32_t> p = Tokens(6 * 64 + 20, 1);
  std::vector<uint32_t> q(p.begin(), p.begin() + 2 * 64);
  for (uint32_t id : Tokens(300, 5)) q.push_back(id + 20000);

  const Result a = Call(*first->stub, TokenRequest(p, 4));  // computes P, publishes it
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  first->service->WaitForPublishes();
  const Result qr = Call(*second->stub, TokenRequest(q, 4));  // leaves Q's pages local
  ASSERT_TRUE(qr.status.ok()) << qr.status.error_message();
  second->service->WaitForPublishes();
  ASSERT_EQ(second->service->local_pages()->pages(), 6);

  const Result b = Call(*second->stub, TokenRequest(p, 4));
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  ASSERT_TRUE(b.has_usage);
  EXPECT_EQ(b.usage.cached_local_tokens(), 2u * 64);
  EXPECT_EQ(b.usage.cached_kvstore_tokens(), 4u * 64);
  EXPECT_EQ(b.usage.recomputed_tokens(), 0u);
  EXPECT_EQ(b.usage.uncached_tokens(), 20u);
  EXPECT_EQ(b.tokens, a.tokens);
}

TEST(DecodeServiceTest, ServerInfoLetsARouterReproduceThePageNamespace) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w10");
  REQUIRE_INSTANCE(d);
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(d->stub->GetServerInfo(&context, {}, &info).ok());
  const v1::KvFormat& f = info.kv_format();
  EXPECT_EQ(f.quantization(), v1::KV_QUANTIZATION_INT2_UNIFORM);
  EXPECT_EQ(f.rotation_digest().size(), 32u);  // the repository's rotation file for this model
  EXPECT_GT(f.num_layers(), 0u);
  EXPECT_GT(f.num_kv_heads(), 0u);
  EXPECT_EQ(f.sink_tokens(), 64u);
  EXPECT_GE(f.recent_window_tokens(), 256u);
  EXPECT_GT(f.int2_page_bytes(), 0u);
  EXPECT_GT(f.bf16_page_bytes(), f.int2_page_bytes());
  // What the router does (core/radix_hash.h, docs/hashing.md), from the response alone.
  auto router_namespace = [&](const std::string& salt) {
    HashNamespace ns;
    ns.model_fingerprint = info.model_fingerprint();
    ns.kv_format = f.name();
    ns.rotation_digest =
        f.rotation_digest().empty() ? "identity" : absl::BytesToHexString(f.rotation_digest());
    ns.page_tokens = f.page_size_tokens();
    ns.cache_salt = salt;
    return NamespaceKey(ns);
  };
  absl::StatusOr<PageKey> unsalted = router_namespace("");
  ASSERT_TRUE(unsalted.ok()) << unsalted.status();
  EXPECT_EQ(*unsalted, d->namespace_unsalted);
  absl::StatusOr<PageKey> salted = router_namespace("tenant-a");
  ASSERT_TRUE(salted.ok()) << salted.status();
  EXPECT_EQ(*salted, d->namespace_salted);
}

TEST(DecodeServiceTest, RegistersWithTheRouterAndHeartbeatsTheLocalPagesOfARequest) {
  std::unique_ptr<DecodeInstance> d = StartDecode({}, "w11", kLocalTier);
  REQUIRE_INSTANCE(d);
  FakeWorkerRegistry router;
  absl::StatusOr<std::unique_ptr<rpc::Server>> router_server =
      rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {&router}});
  ASSERT_TRUE(router_server.ok()) << router_server.status();
  RouterRegistrationOptions options;
  options.router_address = (*router_server)->address();
  options.initial_interval = absl::Milliseconds(100);
  options.worker = d->service->WorkerDescription(d->server->address());
  DecodeService* service = d->service.get();
  RouterRegistration registration(options, service->local_pages(),
                                  [service] { return service->LoadSample(); });
  ASSERT_TRUE(router.WaitFor([](auto& r, auto& h) { return !r.empty() && !h.empty(); }));

  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(d->stub->GetServerInfo(&context, {}, &info).ok());
  const v1::RegisterWorkerRequest reg = router.registers()[0];
  EXPECT_EQ(reg.worker_id(), "w11");
  EXPECT_EQ(reg.address(), d->server->address());
  EXPECT_EQ(reg.model(), info.model());
  EXPECT_EQ(reg.model_fingerprint(), info.model_fingerprint());
  EXPECT_EQ(reg.kv_format().SerializeAsString(), info.kv_format().SerializeAsString());
  EXPECT_EQ(reg.server_version(), "0.1.0");
  EXPECT_GT(reg.capacity_pages(), 0u);
  EXPECT_GT(reg.max_running_requests(), 0u);
  EXPECT_NE(reg.incarnation(), 0u);
  EXPECT_EQ(reg.local_page_keys_size(), 0);
  const v1::HeartbeatRequest beat = router.heartbeats()[0];
  EXPECT_EQ(beat.load().total_pages(), reg.capacity_pages());
  EXPECT_EQ(beat.load().free_pages(), beat.load().total_pages());

  const Result r = Call(*d->stub, Chat(LongSystemPrompt(), "Summarise.", 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const int64_t held = service->local_pages()->pages();
  ASSERT_GT(held, 2);
  ASSERT_TRUE(router.WaitFor([&](auto&, auto& h) {
    int64_t stored = 0;
    for (const v1::HeartbeatRequest& b : h) {
      stored += b.stored_page_keys_size();
      EXPECT_EQ(b.removed_page_keys_size(), 0);
    }
    return stored == held;
  })) << "stored keys never reached the router";
  registration.Drain();
  EXPECT_TRUE(router.heartbeats().back().load().draining());
}

}  // namespace
}  // namespace kvstrata::decode

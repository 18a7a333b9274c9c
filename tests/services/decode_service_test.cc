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

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/metrics.h"
#include "engine/engine.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "rpc/server.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/page_store.h"

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
};

std::unique_ptr<DecodeInstance> StartDecode(std::vector<std::string> kvstores,
                                            const std::string& worker_id) {
  const char* model = std::getenv("KVSTRATA_MODEL");
  if (model == nullptr || *model == '\0') return nullptr;
  engine::EngineOptions o;
  o.model_path = model;
  o.default_rotations_dir = "rotations";  // tests run in the source folder
  o.kv_cache.capacity_bytes = int64_t{256} << 20;
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Engine::Load(o);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status();
    return nullptr;
  }
  auto d = std::make_unique<DecodeInstance>();
  DecodeServiceOptions options;
  options.worker_id = worker_id;
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

Result Call(v1::Generation::Stub& stub, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
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

}  // namespace
}  // namespace kvstrata::decode

// The OpenAI front over real HTTP against a scripted kvstrata.v1.Generation service, reached in
// process as the router reaches its own: routes, status mapping end to end, streams that fail,
// body limits, deadlines, and a client that hangs up cancelling its call. No model.

#include "services/openai/openai_front.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/http_server.h"
#include "core/metrics.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "rpc/server.h"
#include "tests/testing/loopback.h"
#include "tests/testing/metrics_check.h"
#include "tests/tokenizer/test_vocab.h"
#include "tokenizer/tokenizer.h"

namespace kvstrata::openai {
namespace {

using json = nlohmann::json;

// Does what the prompt says: "status:CODE" fails with that gRPC code before output,
// "fail_after_output" fails after one message, "wait" waits to be cancelled,
// "stream_then_wait" sends a message and then waits; anything else streams "Hel", "lo", done.
class ScriptedGeneration final : public v1::Generation::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = *request;
    }
    const std::string script =
        request->has_chat() ? request->chat().messages(0).content() : request->text();
    v1::GenerateResponse m;
    m.set_request_id(request->request_id());
    if (absl::StartsWith(script, "status:")) {
      return grpc::Status(static_cast<grpc::StatusCode>(std::stoi(script.substr(7))),
                          "sampling.top_p=2 must be in [0, 1]");
    }
    if (script == "wait" || script == "stream_then_wait" || script == "fail_after_output") {
      if (script != "wait") {
        m.set_text("Hel");
        writer->Write(m);
      }
      if (script == "fail_after_output") {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker w lost");
      }
      Started();
      for (int i = 0; i < 1000 && !context->IsCancelled(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      cancelled_ = context->IsCancelled();
      return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
    }
    if (script == "slow") std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    m.set_worker_id("w");
    m.set_text("Hel");
    writer->Write(m);
    if (script == "slow_gap") std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    m.set_text("lo");
    writer->Write(m);
    m.clear_text();
    m.set_finish_reason(v1::FINISH_REASON_LENGTH);
    m.mutable_usage()->set_prompt_tokens(130);
    m.mutable_usage()->set_completion_tokens(2);
    m.mutable_usage()->set_cached_kvstore_tokens(128);
    writer->Write(m);
    return grpc::Status::OK;
  }

  grpc::Status GetServerInfo(grpc::ServerContext*, const v1::GetServerInfoRequest*,
                             v1::ServerInfo* info) override {
    info->set_model("m1");
    info->set_model_fingerprint("0123456789abcdef0123");
    info->set_available_workers(1);
    return grpc::Status::OK;
  }

  v1::GenerateRequest last() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  void WaitStarted() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return started_; });
  }
  bool cancelled() const { return cancelled_; }
  void Reset() {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = false;
    cancelled_ = false;
  }

 private:
  void Started() {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  v1::GenerateRequest last_;
  bool started_ = false;
  std::atomic<bool> cancelled_{false};
};

struct Reply {
  int status = 0;
  std::string headers;
  std::string body;
};

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

void Send(int fd, const std::string& method, const std::string& path, const std::string& body,
          const std::string& headers = "") {
  // HTTP/1.0: the response ends when the connection closes, streamed or not.
  const std::string request = absl::StrCat(method, " ", path, " HTTP/1.0\r\nHost: x\r\n", headers,
                                           "Content-Length: ", body.size(), "\r\n\r\n", body);
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
}

Reply Call(int port, const std::string& method, const std::string& path,
           const std::string& body = "", const std::string& headers = "") {
  const int fd = Connect(port);
  Send(fd, method, path, body, headers);
  std::string raw;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) raw.append(buffer, n);
  close(fd);
  Reply r;
  const size_t split = raw.find("\r\n\r\n");
  if (split == std::string::npos || raw.size() < 12) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, split);
  r.body = raw.substr(split + 4);
  return r;
}

std::string Chat(const std::string& content, const std::string& extra = "") {
  return absl::StrCat(R"({"model": "m1", "messages": [{"role": "user", "content": ")", content,
                      R"("}])", extra, "}");
}

class OpenAiFrontTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<rpc::Server>> grpc_server =
        rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {&service_}});
    ASSERT_TRUE(grpc_server.ok()) << grpc_server.status();
    grpc_ = *std::move(grpc_server);
    absl::StatusOr<tokenizer::Tokenizer> tok =
        tokenizer::Tokenizer::Create(tokenizer::testing::MakeSpec({}));
    ASSERT_TRUE(tok.ok()) << tok.status();
    front_ = std::make_unique<OpenAiFront>(
        grpc_->grpc_server().InProcessChannel(grpc::ChannelArguments()), *tok,
        FrontOptions{.timeout = absl::Seconds(30)}, &registry_);
    absl::StatusOr<std::unique_ptr<http::HttpServer>> http =
        http::HttpServer::Start({.port = 0, .max_body_bytes = 4096},
                                [this](http::HttpRequest& r) { return front_->Handle(r); });
    ASSERT_TRUE(http.ok()) << http.status();
    http_ = *std::move(http);
    port_ = http_->port();
  }
  void TearDown() override {
    if (http_) http_->Stop();
  }

  ScriptedGeneration service_;
  MetricsRegistry registry_;
  std::unique_ptr<rpc::Server> grpc_;
  std::unique_ptr<OpenAiFront> front_;
  std::unique_ptr<http::HttpServer> http_;
  int port_ = 0;
};

TEST_F(OpenAiFrontTest, ModelsHealthAndUnknownPaths) {
  Reply r = Call(port_, "GET", "/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["data"][0]["id"], "m1");
  EXPECT_EQ(Call(port_, "GET", "/v1/models/m1").status, 200);
  r = Call(port_, "GET", "/v1/models/other");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "model_not_found");
  r = Call(port_, "GET", "/health");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["available_workers"], 1);
  r = Call(port_, "GET", "/v1/chat/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_TRUE(absl::StrContains(r.headers, "Allow: POST")) << r.headers;
  r = Call(port_, "POST", "/v1/embeddings", "{}");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(json::parse(r.body)["error"]["type"], "invalid_request_error");
  front_->SetServing(false);
  EXPECT_EQ(Call(port_, "GET", "/health").status, 503);
  EXPECT_EQ(Call(port_, "POST", "/v1/chat/completions", Chat("hi")).status, 503);
}

TEST_F(OpenAiFrontTest, EveryDeclaredMetricIsServedAndDocumented) {
  ASSERT_EQ(Call(port_, "GET", "/v1/models").status, 200);
  test_util::ExpectDeclaredMetricsServedAndDocumented(registry_, "docs/routing.md",
                                                      "kvstrata_router_");
}

TEST_F(OpenAiFrontTest, WholeAndStreamedChat) {
  Reply r = Call(port_, "POST", "/v1/chat/completions", Chat("hi", R"(, "top_p": 0.5)"),
                 "X-Request-Id: req-1\r\n");
  ASSERT_EQ(r.status, 200) << r.body;
  const json whole = json::parse(r.body);
  EXPECT_EQ(whole["id"], "chatcmpl-req-1");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 128);
  EXPECT_EQ(whole["system_fingerprint"], "fp_0123456789ab");
  EXPECT_TRUE(absl::StrContains(r.headers, "X-Request-Id: req-1")) << r.headers;
  EXPECT_TRUE(absl::StrContains(r.headers, "X-Kvstrata-Worker: w")) << r.headers;
  const v1::GenerateRequest sent = service_.last();
  EXPECT_EQ(sent.request_id(), "req-1");
  EXPECT_EQ(sent.sampling().top_p(), 0.5f);
  EXPECT_TRUE(sent.chat().apply_chat_template());

  r = Call(port_, "POST", "/v1/chat/completions",
           Chat("hi", R"(, "stream": true, "stream_options": {"include_usage": true})"));
  ASSERT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StrContains(r.headers, "Content-Type: text/event-stream")) << r.headers;
  EXPECT_TRUE(absl::StrContains(r.body, R"("delta":{"content":"Hel"})")) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, R"("cached_tokens":128)")) << r.body;
  EXPECT_TRUE(absl::EndsWith(r.body, "data: [DONE]\n\n")) << r.body;
}

TEST_F(OpenAiFrontTest, ServerStatusesKeepTheirMeaning) {
  struct Case {
    grpc::StatusCode code;
    int http;
  };
  for (const Case& c :
       {Case{grpc::StatusCode::INVALID_ARGUMENT, 400}, Case{grpc::StatusCode::NOT_FOUND, 404},
        Case{grpc::StatusCode::RESOURCE_EXHAUSTED, 429}, Case{grpc::StatusCode::UNAVAILABLE, 503},
        Case{grpc::StatusCode::DEADLINE_EXCEEDED, 504}, Case{grpc::StatusCode::INTERNAL, 500}}) {
    for (const char* stream : {"", R"(, "stream": true)"}) {
      const Reply r = Call(port_, "POST", "/v1/chat/completions",
                           Chat(absl::StrCat("status:", static_cast<int>(c.code)), stream));
      EXPECT_EQ(r.status, c.http) << c.code << stream << " " << r.body;
      const json e = json::parse(r.body)["error"];
      if (c.http == 400) {
        EXPECT_EQ(e["param"], "top_p") << e;
      }
      EXPECT_FALSE(e["message"].get<std::string>().empty());
    }
  }
}

TEST_F(OpenAiFrontTest, AFailureAfterOutputBegan) {
  Reply r = Call(port_, "POST", "/v1/chat/completions", Chat("fail_after_output"));
  EXPECT_EQ(r.status, 503) << r.body;  // a partial answer is no answer
  r = Call(port_, "POST", "/v1/chat/completions", Chat("fail_after_output", R"(, "stream": true)"));
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StrContains(r.body, R"("content":"Hel")")) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, R"(data: {"error":)")) << r.body;
  EXPECT_FALSE(absl::StrContains(r.body, "[DONE]")) << r.body;
}

TEST_F(OpenAiFrontTest, BodyLimitAndBadInput) {
  Reply r = Call(port_, "POST", "/v1/completions", std::string(5000, ' '));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "request_too_large");
  r = Call(port_, "POST", "/v1/completions", "{not json");
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(json::parse(r.body)["error"]["param"].is_null());
  r = Call(port_, "POST", "/v1/completions", R"({"prompt": "x"})", "X-Kvstrata-Timeout-Ms: no\r\n");
  EXPECT_EQ(r.status, 400);
}

// The HTTP server's idle timeout is for connections between requests, not for a request that
// waits long for its first token or a stream that pauses.
TEST_F(OpenAiFrontTest, ASlowFirstTokenOutlivesTheIdleTimeout) {
  for (const char* stream : {"", R"(, "stream": true)"}) {
    const Reply r = Call(port_, "POST", "/v1/chat/completions", Chat("slow", stream));
    EXPECT_EQ(r.status, 200) << stream;
    EXPECT_TRUE(absl::StrContains(r.body, "Hel")) << stream << r.body;
  }
  // Nor for a stream that pauses between two events.
  const Reply r =
      Call(port_, "POST", "/v1/chat/completions", Chat("slow_gap", R"(, "stream": true)"));
  EXPECT_TRUE(absl::EndsWith(r.body, "data: [DONE]\n\n")) << r.body;
}

TEST_F(OpenAiFrontTest, TheTimeoutHeaderBecomesTheDeadline) {
  const Reply r =
      Call(port_, "POST", "/v1/chat/completions", Chat("wait"), "X-Kvstrata-Timeout-Ms: 200\r\n");
  EXPECT_EQ(r.status, 504) << r.body;
}

TEST_F(OpenAiFrontTest, AClientThatHangsUpCancelsItsCall) {
  for (const char* script : {"wait", "stream_then_wait"}) {
    service_.Reset();
    const int fd = Connect(port_);
    Send(fd, "POST", "/v1/chat/completions",
         Chat(script, std::string(script) == "wait" ? "" : R"(, "stream": true)"));
    service_.WaitStarted();
    const absl::Time left = absl::Now();
    close(fd);
    while (!service_.cancelled() && absl::Now() - left < absl::Seconds(5)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(service_.cancelled()) << script;
    EXPECT_LT(absl::Now() - left, absl::Seconds(1)) << script;
  }
  EXPECT_NE(registry_.Render().find("kvstrata_router_http_client_disconnects_total 2"),
            std::string::npos)
      << registry_.Render();
}

}  // namespace
}  // namespace kvstrata::openai

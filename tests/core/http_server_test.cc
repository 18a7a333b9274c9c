#include "core/http_server.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <cstddef>
#include <string>

#include "absl/strings/numbers.h"
#include "tests/testing/loopback.h"

namespace kvstrata::http {
namespace {

using ::kvstrata::test_util::HttpGet;

// The stack size of the thread that runs the handler, as glibc reports it.
size_t HandlerStackBytes(const HttpServerOptions& options) {
  auto server = HttpServer::Start(options, [](HttpRequest&) {
    pthread_attr_t attr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstacksize(&attr, &size);
      pthread_attr_destroy(&attr);
    }
    return HttpResponse{.content_type = "text/plain", .body = std::to_string(size)};
  });
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return 0;
  size_t size = 0;
  EXPECT_TRUE(absl::SimpleAtoi(HttpGet((*server)->port(), "/"), &size));
  return size;
}

// Connection threads get the stack the options ask for, whatever RLIMIT_STACK says: in a CUDA
// build glibc takes the process's static thread-local storage out of it, and a stack fixed too
// small (civetweb's 100 KiB) kept /metrics from starting.
TEST(HttpServer, ConnectionThreadsGetTheStackAskedFor) {
  for (size_t asked : {size_t{1} << 20, size_t{3} << 20}) {
    HttpServerOptions options;
    options.thread_stack_bytes = asked;
    const size_t got = HandlerStackBytes(options);
    EXPECT_GE(got, asked - (size_t{256} << 10)) << "asked for " << asked;
    EXPECT_LE(got, asked + (size_t{64} << 10)) << "asked for " << asked;
  }
  EXPECT_EQ(HttpServerOptions{}.thread_stack_bytes, size_t{1} << 20);
}

TEST(HttpServer, ATooSmallStackIsRefused) {
  HttpServerOptions options;
  options.thread_stack_bytes = 64 << 10;
  auto server = HttpServer::Start(options, [](HttpRequest&) { return HttpResponse{}; });
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("thread_stack_bytes"), std::string::npos);
}

}  // namespace
}  // namespace kvstrata::http

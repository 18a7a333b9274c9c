// Starts the real kvstrata-kvstore binary as a child process on free loopback ports, waits for
// its health check, uses it, scrapes /metrics through `promtool check metrics`, and stops it with
// SIGTERM.

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "tests/testing/loopback.h"

#ifndef KVSTRATA_KVSTORE_BINARY
#error "KVSTRATA_KVSTORE_BINARY must name the kvstrata-kvstore binary"
#endif

namespace kvstrata::kvstore {
namespace {

using ::kvstrata::test_util::FreePort;
using ::kvstrata::test_util::HttpGet;

using ::testing::HasSubstr;

TEST(KvStoreBinaryTest, ServesHealthAndMetricsAndStopsOnSigterm) {
  const int grpc_port = FreePort();
  const int metrics_port = FreePort();
  ASSERT_GT(grpc_port, 0);
  ASSERT_GT(metrics_port, 0);
  const std::string listen = absl::StrCat("--listen=127.0.0.1:", grpc_port);
  const std::string metrics_listen = absl::StrCat("--metrics_listen=127.0.0.1:", metrics_port);

  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(KVSTRATA_KVSTORE_BINARY, "kvstrata-kvstore", "--insecure", listen.c_str(),
          metrics_listen.c_str(), "--capacity_mb=4", "--shutdown_grace_ms=500",
          static_cast<char*>(nullptr));
    _exit(127);
  }

  // Reconnect quickly while the child starts (gRPC's default first backoff is 1 s).
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                           grpc::InsecureChannelCredentials(), args);
  auto health = grpc::health::v1::Health::NewStub(channel);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool serving = false;
  while (!serving && absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    context.set_wait_for_ready(true);  // waits for the port to open within the deadline
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("kvstrata.v1.KvStore");
    grpc::health::v1::HealthCheckResponse response;
    serving = health->Check(&context, request, &response).ok() &&
              response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, WNOHANG), 0) << "kvstrata-kvstore exited early";
  }
  ASSERT_TRUE(serving) << "kvstrata-kvstore not SERVING within 10 s";

  // One call so that the latency histogram has a child.
  auto store = v1::KvStore::NewStub(channel);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsResponse stats;
    ASSERT_TRUE(store->Stats(&context, v1::StatsRequest(), &stats).ok());
    EXPECT_EQ(stats.bytes_capacity(), 4u << 20);
  }

  const std::string metrics = HttpGet(metrics_port, "/metrics");
  EXPECT_THAT(metrics, HasSubstr("kvstrata_kvstore_capacity_bytes 4194304"));
  // prometheus-cpp writes labels in name order, whatever order they were declared in.
  EXPECT_THAT(metrics,
              HasSubstr("kvstrata_kvstore_requests_total{code=\"OK\",method=\"Stats\"} 1"));
  const std::string path = absl::StrCat(::testing::TempDir(), "kvstore_metrics_", getpid());
  FILE* file = fopen(path.c_str(), "w");
  ASSERT_NE(file, nullptr);
  fwrite(metrics.data(), 1, metrics.size(), file);
  fclose(file);
  const std::string check = absl::StrCat("promtool check metrics < ", path, " 2>&1");
  FILE* promtool = popen(check.c_str(), "r");
  ASSERT_NE(promtool, nullptr);
  std::string promtool_output;
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), promtool) != nullptr) promtool_output += buffer;
  EXPECT_EQ(pclose(promtool), 0) << promtool_output;
  unlink(path.c_str());

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace kvstrata::kvstore

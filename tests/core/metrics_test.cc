#include "core/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/loopback.h"

namespace kvstrata {
namespace {

using ::kvstrata::test_util::HttpGetResponse;

MetricsRegistry& Populated(MetricsRegistry& r) {
  auto& requests =
      r.AddCounter("kvstrata_test_requests_total", "Requests by finish reason.", {"reason"});
  requests.With({"eos"}).Increment();
  requests.With({"length"}).Increment(2);
  r.AddGauge("kvstrata_test_running_requests", "Requests running now.").Get().Set(3);
  auto& ttft = r.AddHistogram("kvstrata_test_time_to_first_token_seconds", "Time to first token.",
                              LatencyBucketsSeconds());
  ttft.Get().Observe(0.003);
  ttft.Get().Observe(0.2);
  ttft.Get().Observe(100.0);
  r.AddCounter("kvstrata_test_escaped_total", "Label \"quoting\" and \\ backslashes.", {"tier"})
      .With({"a\"b\\c"})
      .Increment();
  return r;
}

TEST(Metrics, RendersTheTextFormat) {
  MetricsRegistry r;
  const std::string text = Populated(r).Render();
  EXPECT_NE(text.find("# TYPE kvstrata_test_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_requests_total{reason=\"eos\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_requests_total{reason=\"length\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_running_requests 3\n"), std::string::npos);
  // cumulative buckets: 0.003 <= 0.005, 0.2 <= 0.25, 100 only in +Inf
  EXPECT_NE(text.find("kvstrata_test_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_time_to_first_token_seconds_bucket{le=\"60\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_time_to_first_token_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(text.find("kvstrata_test_time_to_first_token_seconds_sum 100.203\n"),
            std::string::npos);
  EXPECT_NE(text.find("{tier=\"a\\\"b\\\\c\"}"), std::string::npos);
}

TEST(Metrics, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry r;
  auto& c = r.AddCounter("kvstrata_test_hits_total", "Hits.", {"worker"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c, t] {
      for (int i = 0; i < 10000; ++i) c.With({t % 2 ? "a" : "b"}).Increment();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.With({"a"}).value() + c.With({"b"}).value(), 40000);
}

TEST(MetricsServer, ServesMetricsThatPromtoolAccepts) {
  MetricsRegistry r;
  Populated(r);
  std::string error;
  auto server = MetricsServer::Start(&r, "127.0.0.1:0", &error);
  ASSERT_NE(server, nullptr) << error;
  ASSERT_GT(server->port(), 0);
  const std::string response = HttpGetResponse(server->port(), "/metrics");
  ASSERT_NE(response.find("200 OK"), std::string::npos) << response;
  ASSERT_NE(response.find("text/plain; version=0.0.4"), std::string::npos);
  const std::string body = response.substr(response.find("\r\n\r\n") + 4);
  EXPECT_EQ(body, r.Render());
  EXPECT_NE(HttpGetResponse(server->port(), "/nope").find("404"), std::string::npos);
  // promtool (Debian's prometheus package) lints the exposition.
  const std::string path = ::testing::TempDir() + "/metrics.txt";
  std::ofstream(path) << body;
  const int rc =
      std::system(("promtool check metrics < " + path + " > " + path + ".out 2>&1").c_str());
  std::ifstream out(path + ".out");
  const std::string lint((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << lint;
}

TEST(MetricsServer, ABusyPortIsAnError) {
  MetricsRegistry r;
  std::string error;
  auto first = MetricsServer::Start(&r, "127.0.0.1:0", &error);
  ASSERT_NE(first, nullptr);
  auto second = MetricsServer::Start(&r, "127.0.0.1:" + std::to_string(first->port()), &error);
  EXPECT_EQ(second, nullptr);
  EXPECT_NE(error.find(std::to_string(first->port())), std::string::npos);
}

}  // namespace
}  // namespace kvstrata

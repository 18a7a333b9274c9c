// kvstrata's part of the metrics: fixed label names given positionally, every declared family on
// the endpoint from the start, the bucket bounds, and the /metrics server. The text format
// itself is prometheus-cpp's (promtool still checks what comes out).
#include "core/metrics.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/loopback.h"

namespace kvstrata {
namespace {

using ::kvstrata::test_util::HttpGetResponse;

std::string Promtool(const std::string& text, int* rc) {
  const std::string path = ::testing::TempDir() + "/metrics.txt";
  std::ofstream(path) << text;
  *rc = std::system(("promtool check metrics < " + path + " > " + path + ".out 2>&1").c_str());
  std::ifstream out(path + ".out");
  return std::string((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
}

TEST(Metrics, LabelValuesFollowTheDeclaredLabelNames) {
  MetricsRegistry r;
  auto& requests =
      r.AddCounter("kvstrata_test_http_requests_total", "Requests.", {"status", "endpoint"});
  requests.With({"200", "/v1/models"}).Increment();
  requests.With({"404", "/nope"}).Increment(2);
  requests.With({"200", "/v1/models"}).Increment();
  const std::string text = r.Render();
  EXPECT_NE(text.find("kvstrata_test_http_requests_total{endpoint=\"/v1/models\",status=\"200\"} "
                      "2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvstrata_test_http_requests_total{endpoint=\"/nope\",status=\"404\"} 2\n"),
            std::string::npos)
      << text;
}

TEST(MetricsDeathTest, AWrongNumberOfLabelValuesIsAProgrammingError) {
  MetricsRegistry r;
  auto& tiers = r.AddCounter("kvstrata_test_tokens_total", "Tokens.", {"tier"});
  EXPECT_DEATH(tiers.With({"local", "extra"}), "wrong label count");
  EXPECT_DEATH(tiers.Get(), "has labels");
  EXPECT_DEATH(r.AddGauge("kvstrata_test_tokens_total", "Again."), "twice");
  EXPECT_DEATH(r.AddGauge("kvstrata_test_bad_help", "Two\nlines."), "escaping");
  EXPECT_DEATH(r.AddGauge("kvstrata-test", "Bad name."), "bad metric name");
}

TEST(Metrics, EveryDeclaredFamilyIsRenderedFromTheStartInDeclarationOrder) {
  MetricsRegistry r;
  r.AddCounter("kvstrata_test_requests_total", "Requests by finish reason.", {"finish_reason"});
  r.AddGauge("kvstrata_test_running_requests", "Requests running now.");
  r.AddHistogram("kvstrata_test_ttft_seconds", "Time to first token.", LatencyBucketsSeconds(),
                 {"tier"});
  r.AddCounter("kvstrata_test_generated_tokens_total", "Tokens generated.");
  const std::string text = r.Render();
  size_t at = 0;
  for (const std::string& name : r.names()) {
    const size_t found = text.find("# TYPE " + name + " ", at);
    ASSERT_NE(found, std::string::npos) << name << " missing or out of order:\n" << text;
    at = found;
  }
  EXPECT_EQ(r.names().size(), 4u);
  // A family without labels has its series from the start; a labelled one only its header.
  EXPECT_NE(text.find("\nkvstrata_test_running_requests 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nkvstrata_test_generated_tokens_total 0\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("kvstrata_test_requests_total{"), std::string::npos) << text;
  int rc = 0;
  const std::string lint = Promtool(text, &rc);
  EXPECT_EQ(rc, 0) << lint << text;
}

TEST(Metrics, HistogramsUseTheDeclaredBoundsSortedWithInf) {
  MetricsRegistry r;
  auto& fetch = r.AddHistogram("kvstrata_test_fetch_seconds", "Fetch time.", {0.5, 0.001, 0.01});
  fetch.Get().Observe(0.003);
  fetch.Get().Observe(0.2);
  fetch.Get().Observe(100.0);
  const std::string text = r.Render();
  const std::string b = "kvstrata_test_fetch_seconds_bucket";
  EXPECT_NE(text.find(b + "{le=\"0.001\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find(b + "{le=\"0.01\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find(b + "{le=\"0.5\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find(b + "{le=\"+Inf\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvstrata_test_fetch_seconds_count 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kvstrata_test_fetch_seconds_sum 100.203\n"), std::string::npos) << text;
}

// The bounds docs/operations.md lists: strictly increasing, and covering what the CUDA path
// (sub-millisecond tokens, millisecond fetches) and the CPU path (minutes-long requests) see.
TEST(Metrics, BucketBoundsCoverTheGpuAndTheCpuPath) {
  struct Case {
    const char* what;
    const std::vector<double>& bounds;
    double at_most_first, at_least_last;
  };
  for (const Case& c : {Case{"latency", LatencyBucketsSeconds(), 0.001, 300},
                        Case{"token latency", TokenLatencyBucketsSeconds(), 0.0005, 5},
                        Case{"rpc latency", RpcLatencyBucketsSeconds(), 0.0001, 10},
                        Case{"transfer", TransferBucketsBytes(), 4096, 1 << 30}}) {
    SCOPED_TRACE(c.what);
    ASSERT_FALSE(c.bounds.empty());
    EXPECT_LE(c.bounds.front(), c.at_most_first);
    EXPECT_GE(c.bounds.back(), c.at_least_last);
    for (size_t i = 1; i < c.bounds.size(); ++i) EXPECT_LT(c.bounds[i - 1], c.bounds[i]);
  }
  // Enough resolution where a GPU decodes (2.5 .. 25 ms a token): at least four bounds.
  int gpu = 0;
  for (double b : TokenLatencyBucketsSeconds()) gpu += b >= 0.0025 && b <= 0.025;
  EXPECT_GE(gpu, 4);
}

TEST(MetricsServer, ServesTheRegistryThatPromtoolAccepts) {
  MetricsRegistry r;
  r.AddCounter("kvstrata_test_requests_total", "Requests by finish reason.", {"reason"})
      .With({"eos"})
      .Increment();
  r.AddHistogram("kvstrata_test_ttft_seconds", "Time to first token.", LatencyBucketsSeconds())
      .Get()
      .Observe(0.2);
  r.AddCounter("kvstrata_test_escaped_total", "Label quoting.", {"tier"})
      .With({"a\"b\\c"})
      .Increment();
  std::string error;
  auto server = MetricsServer::Start(&r, "127.0.0.1:0", &error);
  ASSERT_NE(server, nullptr) << error;
  ASSERT_GT(server->port(), 0);
  const std::string response = HttpGetResponse(server->port(), "/metrics");
  ASSERT_NE(response.find("200 OK"), std::string::npos) << response;
  ASSERT_NE(response.find("text/plain; version=0.0.4"), std::string::npos);
  const std::string body = response.substr(response.find("\r\n\r\n") + 4);
  EXPECT_EQ(body, r.Render());
  EXPECT_NE(body.find("{tier=\"a\\\"b\\\\c\"}"), std::string::npos) << body;
  EXPECT_NE(HttpGetResponse(server->port(), "/nope").find("404"), std::string::npos);
  int rc = 0;
  const std::string lint = Promtool(body, &rc);
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

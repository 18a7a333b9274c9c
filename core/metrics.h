#pragma once

// Prometheus metrics on prometheus-cpp's core library (Debian's prometheus-cpp-dev): its
// counters, gauges and histograms, one prometheus::Registry per process, its TextSerializer for
// the text exposition format (0.0.4). What is kvstrata's own is small: a component declares its
// metrics in one place (a struct of Family members built from one MetricsRegistry: name, help,
// label names, bucket bounds), families keep fixed label names given positionally, and
// /metrics is served on kvstrata's HTTP server (core/http_server.h), not on prometheus-cpp's
// Exposer (prometheus-cpp::pull is not linked): the Exposer runs civetweb, whose 100 KiB thread
// stacks cannot hold the static TLS of the CUDA runtime and OpenBLAS (/metrics of the CUDA build
// failed to start that way before), and one HTTP stack per process is simpler.
//
// Names follow Prometheus conventions: kvstrata_ prefix, unit suffixes (_seconds, _bytes,
// _tokens), counters end in _total.
//
// Thread-safe: updates are atomics on an existing child; looking up a child by label values
// takes the family's mutex (keep label values low-cardinality and cache the child); a family
// without labels keeps its one child, so Get() takes no lock.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_type.h"
#include "prometheus/registry.h"

namespace kvstrata {

using Counter = prometheus::Counter;
using Gauge = prometheus::Gauge;  // Set, Increment(by), Decrement(by)
using Histogram = prometheus::Histogram;

// A metric name with fixed label names, and its children, one per combination of label values.
// Owned by the MetricsRegistry that made it.
template <typename T>
class Family {
 public:
  Family(prometheus::Family<T>* family, std::string name, std::vector<std::string> label_names,
         std::vector<double> bounds);
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;

  // The child for these label values, in the order of the label names (created on first use).
  // values.size() must equal the number of label names: a programming error otherwise (CHECK).
  T& With(const std::vector<std::string>& values);
  // The one child of a family without labels; it exists from the start (reads 0).
  T& Get();

  const std::string& name() const { return name_; }

 private:
  prometheus::Family<T>* family_;
  std::string name_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;  // histograms only
  T* single_ = nullptr;         // the child of a family without labels
};

class MetricsRegistry {
 public:
  // name, help and label names must be valid Prometheus names, the name new to this registry,
  // and help a single line without backslashes (prometheus-cpp writes it unescaped): CHECKed.
  Family<Counter>& AddCounter(std::string name, std::string help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(std::string name, std::string help,
                          std::vector<std::string> label_names = {});
  // bounds: the upper bounds of the buckets (any order; +Inf is added).
  Family<Histogram>& AddHistogram(std::string name, std::string help, std::vector<double> bounds,
                                  std::vector<std::string> label_names = {});

  // The text exposition of every declared family, in declaration order. A family without a
  // child yet is shown by its HELP and TYPE lines (prometheus-cpp would leave it out), so every
  // declared metric is on the endpoint from the start.
  std::string Render() const;
  // The names declared so far, in declaration order.
  std::vector<std::string> names() const;

 private:
  struct Declared {
    std::string name;
    std::string help;
    prometheus::MetricType type;
  };
  void Declare(const std::string& name, const std::string& help,
               const std::vector<std::string>& label_names, prometheus::MetricType type);

  prometheus::Registry registry_;
  mutable std::mutex mu_;
  std::vector<Declared> declared_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_;
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_;
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_;
};

// Bucket bounds, chosen to resolve both the CUDA path (milliseconds) and the CPU path (up to
// minutes for a long prompt on a small host); docs/operations.md lists them.
//
// Request latencies in seconds (time to first token, end-to-end, queue time): 1 ms .. 300 s.
const std::vector<double>& LatencyBucketsSeconds();
// Per-token latencies in seconds (inter-token): 0.5 ms .. 5 s, finest where a GPU decodes
// (2.5 .. 25 ms) and where a CPU does (25 .. 250 ms).
const std::vector<double>& TokenLatencyBucketsSeconds();
// kvstore calls in seconds (a served RPC; a decode worker's lookup + fetch): 100 us .. 10 s.
const std::vector<double>& RpcLatencyBucketsSeconds();
// Page data moved per call in bytes: 4 KiB (part of one page) .. 1 GiB, x4 apart.
const std::vector<double>& TransferBucketsBytes();

namespace http {
class HttpServer;
}  // namespace http

// Serves GET /metrics (and GET / with a short index) over HTTP for one registry, on the
// HTTP server of core/http_server.h.
class MetricsServer {
 public:
  ~MetricsServer();
  // address "host:port" (IPv6 as "[::1]:port"); port 0 picks a free port (see port()). Error
  // text on failure.
  static std::unique_ptr<MetricsServer> Start(const MetricsRegistry* registry,
                                              const std::string& address, std::string* error);
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<http::HttpServer> server_;
  int port_ = 0;
};

}  // namespace kvstrata

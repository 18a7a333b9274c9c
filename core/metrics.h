#pragma once

// Prometheus metrics in the text exposition format (version 0.0.4), kept small on purpose:
// counters, gauges and histograms, each a family with fixed label names. A component declares
// its metrics in one place (a struct of family references built from one registry) and
// /metrics renders the registry. Names follow Prometheus conventions: kvstrata_ prefix, unit
// suffixes (_seconds, _bytes, _tokens), counters end in _total.
//
// Thread-safe: updates are lock-free atomics on an existing child; looking up a child by label
// values takes the family's mutex (keep label values low-cardinality and cache the child).

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvstrata {

class Counter {
 public:
  void Increment(double by = 1.0) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double by) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double v);
  // Cumulative counts per bound (then +Inf), sum and count, read without a lock (each value is
  // consistent on its own; a scrape may see an observation in count before it shows in sum).
  std::vector<uint64_t> cumulative_counts() const;
  double sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // [bounds.size() + 1], not cumulative
  std::atomic<double> sum_{0.0};
  std::atomic<uint64_t> count_{0};
};

enum class MetricType { kCounter, kGauge, kHistogram };

// A metric name and its children, one per combination of label values.
template <typename T>
class Family {
 public:
  Family(std::string name, std::string help, std::vector<std::string> label_names,
         std::vector<double> bounds = {})
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        bounds_(std::move(bounds)) {}

  // The child for these label values (created on first use). values.size() must equal the
  // number of label names; extra or missing values are a programming error (CHECK).
  T& With(const std::vector<std::string>& values);
  T& Get() { return With({}); }

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  const std::vector<double>& bounds() const { return bounds_; }
  // Snapshot of (label values, child) pairs in label order.
  std::vector<std::pair<std::vector<std::string>, const T*>> Children() const;

 private:
  std::string name_, help_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> children_;
};

class MetricsRegistry {
 public:
  Family<Counter>& AddCounter(std::string name, std::string help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(std::string name, std::string help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(std::string name, std::string help, std::vector<double> bounds,
                                  std::vector<std::string> label_names = {});

  // The text exposition of every family, in registration order.
  std::string Render() const;

 private:
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Family<Counter>>> counters_;
  std::vector<std::unique_ptr<Family<Gauge>>> gauges_;
  std::vector<std::unique_ptr<Family<Histogram>>> histograms_;
  std::vector<std::pair<MetricType, size_t>> order_;
};

// Buckets for latencies in seconds: 1 ms .. 60 s, roughly x2.5 apart (TTFT, end-to-end).
const std::vector<double>& LatencyBucketsSeconds();
// Buckets for per-token latencies in seconds: 1 ms .. 5 s.
const std::vector<double>& TokenLatencyBucketsSeconds();

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

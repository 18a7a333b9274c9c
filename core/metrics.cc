#include "core/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check.h"
#include "core/http_server.h"

namespace kvstrata {

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_->begin(), bounds_->end(), v) - bounds_->begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> out(bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) out[i] = running += buckets_[i].load();
  return out;
}

template <typename T>
T& Family<T>::With(const std::vector<std::string>& values) {
  KV_CHECK(values.size() == label_names_.size()) << "metric " << name_ << ": wrong label count";
  std::lock_guard<std::mutex> lock(mu_);
  std::unique_ptr<T>& child = children_[values];
  if (!child) {
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<T>(&bounds_);
    } else {
      child = std::make_unique<T>();
    }
  }
  return *child;
}

template <typename T>
std::vector<std::pair<std::vector<std::string>, const T*>> Family<T>::Children() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::vector<std::string>, const T*>> out;
  for (const auto& [labels, child] : children_) out.emplace_back(labels, child.get());
  return out;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

Family<Counter>& MetricsRegistry::AddCounter(std::string name, std::string help,
                                             std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  counters_.push_back(
      std::make_unique<Family<Counter>>(std::move(name), std::move(help), std::move(label_names)));
  order_.emplace_back(MetricType::kCounter, counters_.size() - 1);
  return *counters_.back();
}

Family<Gauge>& MetricsRegistry::AddGauge(std::string name, std::string help,
                                         std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_.push_back(
      std::make_unique<Family<Gauge>>(std::move(name), std::move(help), std::move(label_names)));
  order_.emplace_back(MetricType::kGauge, gauges_.size() - 1);
  return *gauges_.back();
}

Family<Histogram>& MetricsRegistry::AddHistogram(std::string name, std::string help,
                                                 std::vector<double> bounds,
                                                 std::vector<std::string> label_names) {
  std::sort(bounds.begin(), bounds.end());
  std::lock_guard<std::mutex> lock(mu_);
  histograms_.push_back(std::make_unique<Family<Histogram>>(
      std::move(name), std::move(help), std::move(label_names), std::move(bounds)));
  order_.emplace_back(MetricType::kHistogram, histograms_.size() - 1);
  return *histograms_.back();
}

namespace {

std::string EscapeLabel(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string Labels(const std::vector<std::string>& names, const std::vector<std::string>& values,
                   const std::string& extra = "") {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "" : ",", names[i], "=\"", EscapeLabel(values[i]), "\"");
  }
  if (!extra.empty()) absl::StrAppend(&out, out.empty() ? "" : ",", extra);
  return out.empty() ? "" : absl::StrCat("{", out, "}");
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  char buf[32];
  const auto result = std::to_chars(buf, buf + sizeof(buf), v);  // shortest that round-trips
  return std::string(buf, result.ptr);
}

template <typename T>
void Header(std::string* out, const Family<T>& f, const char* type) {
  absl::StrAppend(out, "# HELP ", f.name(), " ", EscapeHelp(f.help()), "\n# TYPE ", f.name(), " ",
                  type, "\n");
}

}  // namespace

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [type, index] : order_) {
    switch (type) {
      case MetricType::kCounter: {
        const Family<Counter>& f = *counters_[index];
        Header(&out, f, "counter");
        for (const auto& [labels, c] : f.Children()) {
          absl::StrAppend(&out, f.name(), Labels(f.label_names(), labels), " ", Number(c->value()),
                          "\n");
        }
        break;
      }
      case MetricType::kGauge: {
        const Family<Gauge>& f = *gauges_[index];
        Header(&out, f, "gauge");
        for (const auto& [labels, g] : f.Children()) {
          absl::StrAppend(&out, f.name(), Labels(f.label_names(), labels), " ", Number(g->value()),
                          "\n");
        }
        break;
      }
      case MetricType::kHistogram: {
        const Family<Histogram>& f = *histograms_[index];
        Header(&out, f, "histogram");
        for (const auto& [labels, h] : f.Children()) {
          const std::vector<uint64_t> counts = h->cumulative_counts();
          for (size_t i = 0; i <= f.bounds().size(); ++i) {
            const std::string le = i < f.bounds().size() ? Number(f.bounds()[i]) : "+Inf";
            absl::StrAppend(&out, f.name(), "_bucket",
                            Labels(f.label_names(), labels, absl::StrCat("le=\"", le, "\"")), " ",
                            counts[i], "\n");
          }
          absl::StrAppend(&out, f.name(), "_sum", Labels(f.label_names(), labels), " ",
                          Number(h->sum()), "\n");
          absl::StrAppend(&out, f.name(), "_count", Labels(f.label_names(), labels), " ",
                          counts.back(), "\n");
        }
        break;
      }
    }
  }
  return out;
}

const std::vector<double>& LatencyBucketsSeconds() {
  static const auto* b = new std::vector<double>{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                 0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
  return *b;
}

const std::vector<double>& TokenLatencyBucketsSeconds() {
  static const auto* b = new std::vector<double>{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                                 0.1,   0.15,   0.25,  0.5,  1.0,   2.5,  5.0};
  return *b;
}

namespace {

http::HttpResponse ServeMetrics(const MetricsRegistry& registry, http::HttpRequest& request) {
  http::HttpResponse r{.content_type = "text/plain; version=0.0.4; charset=utf-8"};
  if (request.method() != "GET") {
    r.status = 405;
    r.body = "only GET\n";
    r.headers.emplace_back("Allow", "GET");
  } else if (request.path() == "/metrics") {
    r.body = registry.Render();
  } else if (request.path() == "/") {
    r.body = "kvstrata: metrics at /metrics\n";
  } else {
    r.status = 404;
    r.body = "not found; metrics are at /metrics\n";
  }
  return r;
}

}  // namespace

std::unique_ptr<MetricsServer> MetricsServer::Start(const MetricsRegistry* registry,
                                                    const std::string& address,
                                                    std::string* error) {
  const size_t colon = address.rfind(':');
  http::HttpServerOptions options;
  // A scraper or two: few connections.
  options.max_connections = 64;
  options.max_body_bytes = 1 << 16;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &options.port)) {
    *error = absl::StrCat("cannot serve metrics on ", address, ": not HOST:PORT");
    return nullptr;
  }
  options.host = address.substr(0, colon);
  if (options.host.size() >= 2 && options.host.front() == '[' && options.host.back() == ']') {
    options.host = options.host.substr(1, options.host.size() - 2);
  }
  absl::StatusOr<std::unique_ptr<http::HttpServer>> server = http::HttpServer::Start(
      options, [registry](http::HttpRequest& r) { return ServeMetrics(*registry, r); });
  if (!server.ok()) {
    *error = absl::StrCat("cannot serve metrics on ", address, ": ", server.status().message());
    return nullptr;
  }
  std::unique_ptr<MetricsServer> metrics(new MetricsServer());
  metrics->port_ = (*server)->port();
  metrics->server_ = *std::move(server);
  return metrics;
}

MetricsServer::~MetricsServer() = default;

}  // namespace kvstrata

#include "core/metrics.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/http_server.h"
#include "prometheus/check_names.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace kvstrata {

template <typename T>
Family<T>::Family(prometheus::Family<T>* family, std::string name,
                  std::vector<std::string> label_names, std::vector<double> bounds)
    : family_(family),
      name_(std::move(name)),
      label_names_(std::move(label_names)),
      bounds_(std::move(bounds)) {
  if (label_names_.empty()) single_ = &With({});
}

template <typename T>
T& Family<T>::With(const std::vector<std::string>& values) {
  KV_CHECK(values.size() == label_names_.size()) << "metric " << name_ << ": wrong label count";
  prometheus::Labels labels;
  for (size_t i = 0; i < values.size(); ++i) labels.emplace(label_names_[i], values[i]);
  if constexpr (std::is_same_v<T, Histogram>) {
    return family_->Add(labels, bounds_);
  } else {
    return family_->Add(labels);
  }
}

template <typename T>
T& Family<T>::Get() {
  KV_CHECK(single_ != nullptr) << "metric " << name_ << " has labels: use With()";
  return *single_;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

void MetricsRegistry::Declare(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names,
                              prometheus::MetricType type) {
  KV_CHECK(prometheus::CheckMetricName(name)) << "bad metric name " << name;
  KV_CHECK(help.find_first_of("\\\n") == std::string::npos)
      << "metric " << name << ": help needs escaping";
  for (const std::string& label : label_names) {
    KV_CHECK(prometheus::CheckLabelName(label)) << "metric " << name << ": bad label " << label;
  }
  for (const Declared& d : declared_) KV_CHECK(d.name != name) << "metric " << name << " twice";
  declared_.push_back({name, help, type});
}

Family<Counter>& MetricsRegistry::AddCounter(std::string name, std::string help,
                                             std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  Declare(name, help, label_names, prometheus::MetricType::Counter);
  auto* family = &prometheus::BuildCounter().Name(name).Help(help).Register(registry_);
  counters_.push_back(std::make_unique<Family<Counter>>(
      family, std::move(name), std::move(label_names), std::vector<double>{}));
  return *counters_.back();
}

Family<Gauge>& MetricsRegistry::AddGauge(std::string name, std::string help,
                                         std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  Declare(name, help, label_names, prometheus::MetricType::Gauge);
  auto* family = &prometheus::BuildGauge().Name(name).Help(help).Register(registry_);
  gauges_.push_back(std::make_unique<Family<Gauge>>(family, std::move(name), std::move(label_names),
                                                    std::vector<double>{}));
  return *gauges_.back();
}

Family<Histogram>& MetricsRegistry::AddHistogram(std::string name, std::string help,
                                                 std::vector<double> bounds,
                                                 std::vector<std::string> label_names) {
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  std::lock_guard<std::mutex> lock(mu_);
  Declare(name, help, label_names, prometheus::MetricType::Histogram);
  auto* family = &prometheus::BuildHistogram().Name(name).Help(help).Register(registry_);
  histograms_.push_back(std::make_unique<Family<Histogram>>(
      family, std::move(name), std::move(label_names), std::move(bounds)));
  return *histograms_.back();
}

std::string MetricsRegistry::Render() const {
  std::map<std::string, prometheus::MetricFamily> collected;
  for (prometheus::MetricFamily& f : registry_.Collect()) {
    std::string name = f.name;
    collected.emplace(std::move(name), std::move(f));
  }
  std::vector<prometheus::MetricFamily> families;
  {
    std::lock_guard<std::mutex> lock(mu_);
    families.reserve(declared_.size());
    for (const Declared& d : declared_) {
      auto it = collected.find(d.name);
      families.push_back(it != collected.end()
                             ? std::move(it->second)
                             : prometheus::MetricFamily{d.name, d.help, d.type, {}});
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

std::vector<std::string> MetricsRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const Declared& d : declared_) out.push_back(d.name);
  return out;
}

const std::vector<double>& LatencyBucketsSeconds() {
  static const auto* b =
      new std::vector<double>{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,   0.25, 0.5,
                              1.0,   2.5,    5.0,   10.0, 30.0,  60.0, 120.0, 300.0};
  return *b;
}

const std::vector<double>& TokenLatencyBucketsSeconds() {
  static const auto* b =
      new std::vector<double>{0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05,
                              0.075,  0.1,   0.15,   0.25,  0.5,    1.0,  2.5,   5.0};
  return *b;
}

const std::vector<double>& RpcLatencyBucketsSeconds() {
  static const auto* b =
      new std::vector<double>{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                              0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   10.0};
  return *b;
}

const std::vector<double>& TransferBucketsBytes() {
  static const auto* b = [] {
    auto* v = new std::vector<double>;
    for (double bytes = 4096; bytes <= 1024.0 * 1024 * 1024; bytes *= 4) v->push_back(bytes);
    return v;
  }();
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

// kvstrata-router: the public kvstrata.v1.Generation endpoint. Tokenises each prompt once, picks
// a decode worker with the routing policy and forwards the request; serves
// kvstrata.v1.WorkerRegistry for the workers. `kvstrata-router --help` lists the flags;
// docs/routing.md explains the policies and docs/operations.md how to run it.

#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/http_server.h"
#include "core/metrics.h"
#include "core/shutdown.h"
#include "engine/defaults.h"
#include "model/loader.h"
#include "rpc/security_flags.h"
#include "rpc/server.h"
#include "services/openai/openai_front.h"
#include "services/router/router_service.h"
#include "tokenizer/prompt_encoder.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50070",
          "gRPC address to serve Generation and WorkerRegistry on (port 0: any).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9470",
          "HTTP address for Prometheus /metrics (port 0: any; empty: no metrics endpoint).");
ABSL_FLAG(std::string, model, "",
          "Where the tokenizer comes from: the workers' .gguf file or Hugging Face folder (only "
          "the tokenizer is read). Default: SmolLM2-135M-Instruct in $KVSTRATA_CACHE or "
          "~/.cache/kvstrata, from scripts/fetch-model.sh.");
ABSL_FLAG(std::string, policy, "prefix-affinity",
          "Routing policy: prefix-affinity (page-aware, kvstore-aware, bounded load), "
          "cache-aware (SGLang's), least-load or round-robin.");
ABSL_FLAG(std::string, workers, "",
          "Static workers, comma-separated ID=HOST:PORT; they never expire. Workers usually "
          "register themselves instead (kvstrata-decode --router).");
ABSL_FLAG(std::string, kvstore, "",
          "Comma-separated kvstore addresses whose page events feed the prefix index (the ones "
          "the workers use); empty: the router predicts no kvstore hits.");
ABSL_FLAG(std::string, router_id, "router-0", "Identity sent to workers and used in request ids.");
ABSL_FLAG(uint32_t, heartbeat_interval_ms, 1000, "Heartbeat interval asked of workers.");
ABSL_FLAG(uint32_t, max_missed_heartbeats, 3,
          "Heartbeats a registered worker may miss before it is dropped from the pool.");
ABSL_FLAG(int, max_attempts, 3,
          "Workers tried per request: one that fails before any output is retried on another.");
ABSL_FLAG(int, max_in_flight_requests, 1024,
          "Requests in flight at the router before Generate answers RESOURCE_EXHAUSTED.");
ABSL_FLAG(double, load_bound, 1.25,
          "prefix-affinity: no worker takes more than this times the average load (>= 1).");
ABSL_FLAG(double, fetch_cost_ratio, 0.1,
          "prefix-affinity: cost of fetching a page from the kvstore / computing it, in [0, 1].");
ABSL_FLAG(double, colocated_fetch_cost_ratio, -1,
          "prefix-affinity: the same cost for a page on the kvstore node on the worker's own GPU "
          "(the same-GPU transport), in [0, --fetch_cost_ratio]; negative: --fetch_cost_ratio / "
          "10 (docs/routing.md#co-located-kvstore).");
ABSL_FLAG(uint32_t, kvstore_forget_after_ms, 10000,
          "A kvstore node whose event stream has been down this long has its pages dropped from "
          "the prefix index, so requests stop being routed for pages it no longer serves; 0: "
          "keep them until the stream is back (a stream that comes back always replaces them "
          "with the node's snapshot).");
ABSL_FLAG(uint32_t, deadline_margin_ms, 50,
          "How long before a client's deadline the router ends its stream (finish_reason "
          "DEADLINE when output began): workers get the deadline less this.");
ABSL_FLAG(uint32_t, max_request_bytes, 64 << 20,
          "Largest request message accepted, in bytes (gRPC refuses larger ones with "
          "RESOURCE_EXHAUSTED). Keep it above what max_context_tokens of text can take, so that "
          "too long a prompt is refused as OUT_OF_RANGE by the router itself.");
ABSL_FLAG(bool, log_requests, true,
          "Log one line per request: worker, routing reason, predicted and actual cached tokens.");
ABSL_FLAG(uint32_t, http_port, 0,
          "Port of the OpenAI-compatible HTTP front (/v1/completions, /v1/chat/completions, "
          "/v1/models, /health) on the host of --listen; 0: no HTTP front.");
ABSL_FLAG(std::string, http_host, "", "Address the HTTP front binds; empty: the host of --listen.");
ABSL_FLAG(uint32_t, http_max_connections, 2048,
          "Open HTTP connections before new ones are refused. Each holds one thread while open "
          "(a streamed response holds it to the end), so this bounds the concurrent HTTP "
          "requests; keep it above --max_in_flight_requests so that overload is answered 429.");
ABSL_FLAG(uint32_t, http_max_body_bytes, 8 << 20,
          "Largest HTTP request body, in bytes; larger ones are answered 413.");
ABSL_FLAG(uint32_t, http_timeout_ms, 600000,
          "Deadline of each HTTP generation request (the X-Kvstrata-Timeout-Ms header may ask "
          "for less); past it the request ends: 504 before output, finish_reason length after.");
ABSL_FLAG(uint32_t, http_idle_timeout_s, 60,
          "Seconds an idle keep-alive HTTP connection stays open (0: no limit).");
ABSL_FLAG(uint32_t, shutdown_grace_ms, 5000,
          "On SIGINT/SIGTERM, how long in-flight requests may finish before being cancelled.");

ABSL_FLAG(std::string, api_keys_file, "",
          "File of API keys to tenants (\"<tenant> <sha256 hex of the key>\" a line; "
          "`kvstrata hash-api-key` prints a hash): every request then needs \"authorization: "
          "Bearer <key>\" and its tenant is bound into the cache namespace. Re-read when it "
          "changes. Empty: no tenants, cache_salt as sent.");
ABSL_FLAG(uint32_t, api_keys_reload_s, 10,
          "How often --api_keys_file is checked for changes, in seconds.");

namespace kvstrata::router {
namespace {

struct RouterConfig {
  std::string listen;
  std::string metrics_listen;
  std::string model_path;
  RouterOptions router;
  std::optional<http::HttpServerOptions> http;  // nullopt: no HTTP front
  openai::FrontOptions front;
  absl::Duration shutdown_grace;
  rpc::SecurityConfig security;
  std::string api_keys_file;
  absl::Duration api_keys_reload;
};

// The HTTP front's flags; c.listen must be set.
absl::Status HttpConfigFromFlags(RouterConfig& c) {
  const uint32_t port = absl::GetFlag(FLAGS_http_port);
  if (port == 0) return absl::OkStatus();
  if (port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http_port=", port, ": must be <= 65535"));
  }
  http::HttpServerOptions h;
  h.port = static_cast<int>(port);
  h.host = absl::GetFlag(FLAGS_http_host);
  if (h.host.empty()) {
    if (absl::StartsWith(c.listen, "unix:") || !absl::StrContains(c.listen, ':')) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http_host: needed, since --listen=", c.listen, " has no host"));
    }
    h.host = c.listen.substr(0, c.listen.rfind(':'));
    if (h.host.size() >= 2 && h.host.front() == '[') h.host = h.host.substr(1, h.host.size() - 2);
  }
  h.max_connections = static_cast<int>(absl::GetFlag(FLAGS_http_max_connections));
  if (h.max_connections < 1 || h.max_connections > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_max_connections=", h.max_connections, ": must be in [1, 100000]"));
  }
  h.max_body_bytes = absl::GetFlag(FLAGS_http_max_body_bytes);
  if (h.max_body_bytes < 1024) {
    return absl::InvalidArgumentError("--http_max_body_bytes: must be >= 1024");
  }
  h.idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_idle_timeout_s));
  const uint32_t timeout_ms = absl::GetFlag(FLAGS_http_timeout_ms);
  if (timeout_ms < 1) return absl::InvalidArgumentError("--http_timeout_ms: must be >= 1");
  c.front.timeout = absl::Milliseconds(timeout_ms);
  c.http = h;
  return absl::OkStatus();
}

absl::StatusOr<RouterConfig> ConfigFromFlags() {
  RouterConfig c;
  c.listen = absl::GetFlag(FLAGS_listen);
  if (c.listen.empty()) return absl::InvalidArgumentError("--listen: must not be empty");
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  RouterOptions& o = c.router;
  o.router_id = absl::GetFlag(FLAGS_router_id);
  if (o.router_id.empty()) return absl::InvalidArgumentError("--router_id: must not be empty");
  o.policy = absl::GetFlag(FLAGS_policy);
  o.policy_options.prefix_affinity.load_bound = absl::GetFlag(FLAGS_load_bound);
  o.policy_options.prefix_affinity.fetch_cost_ratio = absl::GetFlag(FLAGS_fetch_cost_ratio);
  const double colocated = absl::GetFlag(FLAGS_colocated_fetch_cost_ratio);
  o.policy_options.prefix_affinity.colocated_fetch_cost_ratio =
      colocated < 0 ? absl::GetFlag(FLAGS_fetch_cost_ratio) / 10 : colocated;
  if (absl::StatusOr<std::unique_ptr<RoutingPolicy>> p =
          MakeRoutingPolicy(o.policy, o.policy_options);
      !p.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--policy=", o.policy,
                                                   " (with --load_bound, "
                                                   "--fetch_cost_ratio, "
                                                   "--colocated_fetch_cost_ratio): ",
                                                   p.status().message()));
  }
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(w, absl::MaxSplits('=', 1));
    if (parts.size() != 2 || parts[0].empty() || !absl::StrContains(parts[1], ':')) {
      return absl::InvalidArgumentError(absl::StrCat("--workers: '", w, "' is not ID=HOST:PORT"));
    }
    o.static_workers.push_back({parts[0], parts[1]});
  }
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_kvstore), ',', absl::SkipEmpty())) {
    if (!absl::StrContains(a, ':')) {
      return absl::InvalidArgumentError(absl::StrCat("--kvstore: '", a, "' is not HOST:PORT"));
    }
    o.kvstore_addresses.emplace_back(a);
  }
  const uint32_t interval = absl::GetFlag(FLAGS_heartbeat_interval_ms);
  if (interval < 10 || interval > 600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--heartbeat_interval_ms=", interval, ": must be in [10, 600000]"));
  }
  o.worker_table.heartbeat_interval = absl::Milliseconds(interval);
  const uint32_t missed = absl::GetFlag(FLAGS_max_missed_heartbeats);
  if (missed < 1 || missed > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_missed_heartbeats=", missed, ": must be in [1, 1000]"));
  }
  o.worker_table.max_missed_heartbeats = static_cast<int>(missed);
  o.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  if (o.max_attempts < 1 || o.max_attempts > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_attempts=", o.max_attempts, ": must be in [1, 16]"));
  }
  o.max_in_flight_requests = absl::GetFlag(FLAGS_max_in_flight_requests);
  if (o.max_in_flight_requests < 1) {
    return absl::InvalidArgumentError("--max_in_flight_requests: must be >= 1");
  }
  o.log_requests = absl::GetFlag(FLAGS_log_requests);
  const uint32_t margin = absl::GetFlag(FLAGS_deadline_margin_ms);
  if (margin > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--deadline_margin_ms=", margin, ": must be in [0, 10000]"));
  }
  o.deadline_margin = absl::Milliseconds(margin);
  o.kvstore_forget_after = absl::Milliseconds(absl::GetFlag(FLAGS_kvstore_forget_after_ms));
  o.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  if (o.max_request_bytes < (1 << 20) || o.max_request_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_request_bytes=", o.max_request_bytes, ": must be in [1 MiB, 1 GiB]"));
  }
  c.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  if (absl::Status s = HttpConfigFromFlags(c); !s.ok()) return s;
  absl::StatusOr<rpc::SecurityConfig> security = rpc::SecurityFromFlags();
  if (!security.ok()) return security.status();
  c.security = *std::move(security);
  c.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  c.api_keys_reload = absl::Seconds(absl::GetFlag(FLAGS_api_keys_reload_s));

  std::error_code ec;
  c.model_path = absl::GetFlag(FLAGS_model);
  if (c.model_path.empty()) {
    c.model_path = engine::DefaultModelPath();
    if (!std::filesystem::exists(c.model_path, ec)) {
      return absl::NotFoundError(absl::StrCat("--model: not given and the default model is not at ",
                                              c.model_path,
                                              "; run scripts/fetch-model.sh to fetch it"));
    }
  } else if (!std::filesystem::exists(c.model_path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model=", c.model_path, ": no such file or folder"));
  }
  return c;
}

int Run(const RouterConfig& config) {
  if (absl::Status s = InstallShutdownHandler(); !s.ok()) {
    fprintf(stderr, "kvstrata-router: %s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<tokenizer::TokenizerSpec> spec = model::LoadTokenizerSpec(config.model_path);
  if (!spec.ok()) {
    fprintf(stderr, "kvstrata-router: --model=%s: %s\n", config.model_path.c_str(),
            spec.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<tokenizer::PromptEncoder> encoder = tokenizer::PromptEncoder::Create(*spec);
  if (!encoder.ok()) {
    fprintf(stderr, "kvstrata-router: --model=%s: tokenizer: %s\n", config.model_path.c_str(),
            encoder.status().ToString().c_str());
    return 1;
  }
  const tokenizer::Tokenizer tokenizer = encoder->tokenizer();  // for the HTTP front's logprobs
  MetricsRegistry registry;
  std::unique_ptr<TenantKeys> tenant_keys;
  if (!config.api_keys_file.empty()) {
    absl::StatusOr<std::unique_ptr<TenantKeys>> keys =
        TenantKeys::Load(config.api_keys_file, config.api_keys_reload);
    if (!keys.ok()) {
      fprintf(stderr, "kvstrata-router: --api_keys_file: %s\n", keys.status().ToString().c_str());
      return 1;
    }
    tenant_keys = *std::move(keys);
  }
  const rpc::PeerAuthorizer authorizer(config.security.peers, &registry, "router");
  RouterOptions router_options = config.router;
  router_options.tenant_keys = tenant_keys.get();
  router_options.authorizer = &authorizer;
  if (!config.security.transport.insecure()) {
    const rpc::TransportSecurity transport = config.security.transport;
    router_options.dial = [transport](const std::string& address) {
      return transport.Dial(address);
    };
  }
  absl::StatusOr<std::unique_ptr<Router>> router =
      Router::Create(*std::move(encoder), router_options, &registry);
  if (!router.ok()) {
    fprintf(stderr, "kvstrata-router: %s\n", router.status().ToString().c_str());
    return 1;
  }
  RouterService generation(router->get());
  RegistryService registry_service(router->get());

  std::unique_ptr<MetricsServer> metrics;
  if (!config.metrics_listen.empty()) {
    std::string error;
    metrics = MetricsServer::Start(&registry, config.metrics_listen, &error);
    if (metrics == nullptr) {
      fprintf(stderr, "kvstrata-router: --metrics_listen=%s: %s\n", config.metrics_listen.c_str(),
              error.c_str());
      return 1;
    }
  }
  absl::StatusOr<std::unique_ptr<rpc::Server>> server = rpc::Server::Start(
      {.listen_address = config.listen,
       .services = {&generation, &registry_service},
       // Clients of the public API authenticate by API key; workers registering show their
       // certificate (checked per call by the authorizer).
       .credentials = config.security.transport.ServerCredentials(rpc::ClientCerts::kVerifyIfGiven),
       .health_listen_address = config.security.health_listen,
       .max_receive_message_bytes = static_cast<int>(config.router.max_request_bytes)});
  if (!server.ok()) {
    fprintf(stderr, "kvstrata-router: --listen: %s\n", server.status().ToString().c_str());
    return 1;
  }
  (*server)->SetServingStatus("kvstrata.v1.Generation", true);
  (*server)->SetServingStatus("kvstrata.v1.WorkerRegistry", true);

  // The HTTP front calls this very server in process: its requests are Generate calls like any.
  std::unique_ptr<openai::OpenAiFront> front;
  std::unique_ptr<http::HttpServer> http_server;
  if (config.http) {
    front = std::make_unique<openai::OpenAiFront>(
        (*server)->grpc_server().InProcessChannel(grpc::ChannelArguments()), tokenizer,
        config.front, &registry);
    absl::StatusOr<std::unique_ptr<http::HttpServer>> started = http::HttpServer::Start(
        *config.http, [&front](http::HttpRequest& r) { return front->Handle(r); });
    if (!started.ok()) {
      fprintf(stderr, "kvstrata-router: --http_port: %s\n", started.status().ToString().c_str());
      return 1;
    }
    http_server = *std::move(started);
  }
  fprintf(stderr,
          "kvstrata-router: serving kvstrata.v1.Generation and WorkerRegistry on %s (policy %s, "
          "%zu static worker(s), %zu kvstore(s)); metrics on %s; OpenAI HTTP %s\n",
          (*server)->address().c_str(), config.router.policy.c_str(),
          config.router.static_workers.size(), config.router.kvstore_addresses.size(),
          metrics ? absl::StrCat("port ", metrics->port(), " /metrics").c_str() : "(off)",
          http_server
              ? absl::StrCat("on ", config.http->host, " port ", http_server->port()).c_str()
              : "(off)");
  fprintf(
      stderr, "kvstrata-router: gRPC transport: %s; tenants %s\n",
      config.security.transport.Describe(rpc::ClientCerts::kVerifyIfGiven).c_str(),
      tenant_keys
          ? absl::StrCat("from ", config.api_keys_file, " (", tenant_keys->size(), " keys)").c_str()
          : "off (cache_salt as sent)");

  std::thread waiter([&] {
    const int signal = WaitForShutdownSignal();
    fprintf(stderr, "kvstrata-router: signal %d, shutting down (grace %s)\n", signal,
            absl::FormatDuration(config.shutdown_grace).c_str());
    // New HTTP connections are refused; requests in flight get the same grace as gRPC ones.
    // They are in-process calls, which stopping the gRPC server would end at once: it stops
    // once they are done (gRPC clients' requests go on meanwhile), within the one grace.
    const absl::Time give_up = absl::Now() + config.shutdown_grace;
    if (front) {
      front->SetServing(false);
      http_server->StopAccepting();
      (*server)->SetServingStatus("", false);
      if (!front->WaitIdle(config.shutdown_grace)) {
        fprintf(stderr,
                "kvstrata-router: HTTP requests still running after the grace; "
                "cancelling them\n");
      }
    }
    (*server)->Shutdown(std::max(absl::ZeroDuration(), give_up - absl::Now()));
  });
  (*server)->Wait();
  waiter.join();
  if (http_server) http_server->Stop();
  router->reset();
  fprintf(stderr, "kvstrata-router: stopped\n");
  return 0;
}

}  // namespace
}  // namespace kvstrata::router

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvstrata-router: the public kvstrata.v1.Generation endpoint in front of the decode\n"
      "workers. Tokenises each prompt once, hashes its pages, picks a worker with --policy and\n"
      "forwards the request; workers join through kvstrata.v1.WorkerRegistry (kvstrata-decode\n"
      "--router) or --workers. Exports kvstrata_router_* metrics on --metrics_listen.\n"
      "SIGINT/SIGTERM stop it cleanly.\n\n"
      "usage: kvstrata-router [--listen=HOST:PORT] [--policy=NAME] [--kvstore=HOST:PORT,...] ...");
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "services/router/main.cc") ||
           kvstrata::rpc::IsSecurityFlagsFile(file);
  };
  absl::SetFlagsUsageConfig(usage_config);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    fprintf(stderr, "kvstrata-router: unexpected argument '%s' (see --help)\n", positional[1]);
    return 2;
  }
  absl::StatusOr<kvstrata::router::RouterConfig> config = kvstrata::router::ConfigFromFlags();
  if (!config.ok()) {
    fprintf(stderr, "kvstrata-router: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  return kvstrata::router::Run(*config);
}

// kvstrata-decode: serves kvstrata.v1.Generation on one engine, with a local page tier, a kvstore
// prefix cache, registration with the router and Prometheus metrics on /metrics. `kvstrata-decode
// --help` lists the flags; docs/decode.md explains them.

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
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
#include "absl/time/time.h"
#include "core/metrics.h"
#include "core/page_mac.h"
#include "core/shutdown.h"
#include "core/status_macros.h"
#include "engine/defaults.h"
#include "engine/engine.h"
#include "rpc/security_flags.h"
#include "rpc/server.h"
#include "services/decode/decode_service.h"
#include "transport/nccl.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50071",
          "gRPC address to serve Generation on (port 0: any).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9471",
          "HTTP address for Prometheus /metrics (port 0: any; empty: no metrics endpoint).");
ABSL_FLAG(std::string, model, "",
          "The model: a .gguf file or a Hugging Face folder (default: SmolLM2-135M-Instruct in "
          "$KVSTRATA_CACHE or ~/.cache/kvstrata, from scripts/fetch-model.sh).");
ABSL_FLAG(std::string, kv_format, "int2",
          "KV cache format: bf16, int2, int2-lloyd-max or codec (the history codec a rotation "
          "file carries: per-layer 4/3/2/1-bit regions, about 2.5 bits; CPU only).");
ABSL_FLAG(std::string, rotations, "",
          "Rotation file fitted by kvstrata calibrate; default for INT2 formats (codec: the one "
          "carrying a history codec): the file in $KVSTRATA_ROTATIONS (else the repository's "
          "rotations/) fitted on this model; "
          "'identity' for none.");
ABSL_FLAG(int, kv_cache_mb, 256, "KV cache capacity in MiB (both page pools).");
ABSL_FLAG(bool, same_gpu_transport, true,
          "With --device cuda: ask kvstores for the same-GPU transport (a GPU kvstore on this "
          "GPU hands over its HBM pool; pages are copied GPU to GPU instead of by gRPC).");
ABSL_FLAG(std::string, same_gpu_pages, "in_place",
          "With --same_gpu_transport: what the worker does with a prefix in the HBM pool of a "
          "kvstore on this GPU. in_place: its INT2 history pages are read where they lie, for "
          "the whole request (no copy, no cache room taken; the store holds their lease for as "
          "long as this worker's pool connection is open); copy: every page is copied into the "
          "worker's own cache by one gather kernel, as are pages in_place cannot reach.");
ABSL_FLAG(bool, nccl_transport, true,
          "With --device cuda: take cached prefixes from GPU kvstores on other GPUs over NCCL "
          "(a communicator per kvstore, made in the background). Needs libnccl.so.2 on the "
          "loader's path or $KVSTRATA_NCCL_LIBRARY; without it the worker says so and uses gRPC.");
ABSL_FLAG(uint32_t, nccl_receive_mb, 1024,
          "With --nccl_transport: the receive memory per kvstore on this GPU, in MiB: the "
          "largest prefix taken over NCCL (100K tokens of an 8B model are ~2.1 GB).");
ABSL_FLAG(uint32_t, nccl_receive_timeout_ms, 5000,
          "With --nccl_transport: the longest a request waits for a prefix's bytes over NCCL, in "
          "ms, whatever the kvstore's deadline says; the request's own deadline may end the wait "
          "sooner. Past it the communicator is aborted (made again in the background) and the "
          "request computes the prefix. Leave room for the largest prefix: --nccl_receive_mb at "
          "the link's speed.");
ABSL_FLAG(bool, same_gpu_with_page_macs, false,
          "With --page_mac_key_file: keep the same-GPU transport on. Its pages are checked by "
          "their digest, not their MAC, so this trusts the kvstore on this GPU (in Kubernetes, "
          "the one in this worker's pod) not to alter them; pages by gRPC are MAC-checked "
          "still. Default: with page MACs, every cached page comes by gRPC.");
ABSL_FLAG(std::string, device, "cpu",
          "Where the model runs: cpu, or cuda / cuda:N (weights and KV cache on that GPU).");
ABSL_FLAG(std::string, gpu_weights, "auto",
          "With --device cuda, the weights' type: auto (fp32 up to 2 GiB of fp32 weights, else "
          "bf16), bf16, fp16 or fp32.");
ABSL_FLAG(bool, cuda_graphs, true,
          "With --device cuda, replay decode steps as CUDA graphs (false: launch every kernel).");
ABSL_FLAG(bool, gpu_sampling, true,
          "With --device cuda, draw tokens on the GPU for requests without top_k, top_p, min_p "
          "and top_logprobs (false: copy every row of logits to the host and sample there).");
ABSL_FLAG(bool, gpu_gemv, true,
          "With --device cuda and bf16 or fp16 weights, passes of 1-4 tokens (decode of a small "
          "batch) multiply the weights with kvstrata's matrix-vector kernel (false: cuBLAS).");
ABSL_FLAG(bool, gpu_fused_layer_ops, true,
          "With --device cuda, one GEMM for q/k/v and one for gate/up per layer, and the biases, "
          "q/k norms and RoPE in one launch (false: a launch per step, for comparison).");
ABSL_FLAG(std::string, kvstore, "",
          "Comma-separated kvstore addresses (HOST:PORT); empty: no kvstore.");
ABSL_FLAG(int, local_cache_mb, 256,
          "Local page tier: MiB of host memory keeping finished requests' pages for reuse by "
          "later requests on this worker (LRU, leaves before their ancestors); 0: off.");
ABSL_FLAG(std::string, router, "",
          "Comma-separated HOST:PORT of the router(s) whose WorkerRegistry to register with and "
          "heartbeat to; empty: no registration. A name resolving to several addresses (a "
          "Kubernetes headless Service in front of the router pods) means one router per "
          "address; names are resolved again every 5 s, so routers that scale in or out are "
          "followed. An unreachable router is retried every interval; serving goes on.");
ABSL_FLAG(std::string, advertise_address, "",
          "HOST:PORT the router should dial for Generation (default: the address actually bound "
          "for --listen, e.g. 127.0.0.1:50071).");
ABSL_FLAG(uint32_t, router_rpc_deadline_ms, 500,
          "Deadline of each RegisterWorker / Heartbeat call (capped at half the heartbeat "
          "interval the router asks for).");
ABSL_FLAG(std::string, worker_id, "decode-0",
          "Identity reported as worker_id (and to the router).");
ABSL_FLAG(int, max_queued_requests, 64, "Queued requests before RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint32_t, deadline_margin_ms, 30,
          "How long before a client's deadline the worker sends a stream's final message "
          "(finish_reason DEADLINE once output began).");
ABSL_FLAG(uint32_t, max_request_bytes, 64 << 20,
          "Largest request message accepted, in bytes (gRPC refuses larger ones with "
          "RESOURCE_EXHAUSTED); keep it above what a max-context prompt takes.");
ABSL_FLAG(std::string, page_mac_key_file, "",
          "File of the pool's page MAC keys (hex, one a line; the first signs): pages are MACed "
          "on Put and refused on Fetch unless their MAC matches (docs/operations.md). Empty: "
          "no MACs (plaintext clusters only).");
ABSL_FLAG(uint32_t, shutdown_grace_ms, 5000,
          "On SIGINT/SIGTERM, how long in-flight RPCs may finish before being cancelled.");

namespace kvstrata::decode {
namespace {

struct DecodeConfig {
  std::string listen;
  std::string metrics_listen;
  engine::EngineOptions engine;
  DecodeServiceOptions service;
  std::vector<std::string> routers;
  std::string advertise_address;
  absl::Duration router_rpc_deadline;
  absl::Duration shutdown_grace;
  rpc::SecurityConfig security;
};

// Folds the flags into a config; errors name the flag. Flag values first, the file system last.
absl::StatusOr<DecodeConfig> ConfigFromFlags() {
  DecodeConfig config;
  config.listen = absl::GetFlag(FLAGS_listen);
  if (config.listen.empty()) return absl::InvalidArgumentError("--listen: must not be empty");
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  absl::StatusOr<engine::KvCacheFormat> format =
      engine::ParseKvCacheFormat(absl::GetFlag(FLAGS_kv_format));
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_format: ", format.status().message()));
  }
  config.engine.kv_cache.format = *format;
  const int mb = absl::GetFlag(FLAGS_kv_cache_mb);
  if (mb < 1 || mb > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_cache_mb=", mb, ": must be in [1, 1048576]"));
  }
  config.engine.kv_cache.capacity_bytes = int64_t{mb} << 20;
  absl::StatusOr<engine::Device> device = engine::ParseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device: ", device.status().message()));
  }
  config.engine.device = *device;
  if (device->cuda && absl::GetFlag(FLAGS_same_gpu_transport)) {
    config.service.same_gpu_device = device->index;
  }
  config.service.same_gpu_with_page_macs = absl::GetFlag(FLAGS_same_gpu_with_page_macs);
  const std::string same_gpu_pages = absl::GetFlag(FLAGS_same_gpu_pages);
  if (same_gpu_pages != "in_place" && same_gpu_pages != "copy") {
    return absl::InvalidArgumentError(
        absl::StrCat("--same_gpu_pages=", same_gpu_pages, ": must be in_place or copy"));
  }
  config.service.same_gpu_in_place = same_gpu_pages == "in_place";
  const uint32_t nccl_mb = absl::GetFlag(FLAGS_nccl_receive_mb);
  if (nccl_mb == 0 || nccl_mb > (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nccl_receive_mb=", nccl_mb, ": must be in [1, 1048576]"));
  }
  config.service.nccl_receive_bytes = uint64_t{nccl_mb} << 20;
  const uint32_t nccl_wait_ms = absl::GetFlag(FLAGS_nccl_receive_timeout_ms);
  if (nccl_wait_ms == 0 || nccl_wait_ms > 600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nccl_receive_timeout_ms=", nccl_wait_ms, ": must be in [1, 600000]"));
  }
  config.service.nccl_receive_timeout = absl::Milliseconds(nccl_wait_ms);
  if (device->cuda && absl::GetFlag(FLAGS_nccl_transport)) {
    absl::StatusOr<transport::NcclRuntime*> nccl = transport::SystemNccl();
    if (nccl.ok()) {
      config.service.nccl_runtime = *nccl;
      config.service.nccl_device = device->index;
    } else {
      // Degraded, not fatal: prefixes from stores on other GPUs come by gRPC.
      fprintf(stderr, "kvstrata-decode: WARNING: --nccl_transport: %s; NCCL is not used\n",
              std::string(nccl.status().message()).c_str());
    }
  }
  absl::StatusOr<engine::GpuWeights> weights =
      engine::ParseGpuWeights(absl::GetFlag(FLAGS_gpu_weights));
  if (!weights.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu_weights: ", weights.status().message()));
  }
  config.engine.gpu_weights = *weights;
  config.engine.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  config.engine.gpu_sampling = absl::GetFlag(FLAGS_gpu_sampling);
  config.engine.gpu_gemv = absl::GetFlag(FLAGS_gpu_gemv);
  config.engine.gpu_fused_layer_ops = absl::GetFlag(FLAGS_gpu_fused_layer_ops);
  for (absl::string_view a : absl::StrSplit(absl::GetFlag(FLAGS_kvstore), ',', absl::SkipEmpty())) {
    if (!absl::StrContains(a, ':')) {
      return absl::InvalidArgumentError(absl::StrCat("--kvstore: '", a, "' is not HOST:PORT"));
    }
    config.service.kvstore_addresses.emplace_back(a);
  }
  const int local_mb = absl::GetFlag(FLAGS_local_cache_mb);
  if (local_mb < 0 || local_mb > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--local_cache_mb=", local_mb, ": must be in [0, 1048576]"));
  }
  config.service.local_cache_bytes = int64_t{local_mb} << 20;
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_router), ',', absl::SkipEmpty())) {
    if (!absl::StrContains(r, ':')) {
      return absl::InvalidArgumentError(absl::StrCat("--router: '", r, "' is not HOST:PORT"));
    }
    config.routers.emplace_back(r);
  }
  const uint32_t deadline_ms = absl::GetFlag(FLAGS_router_rpc_deadline_ms);
  if (deadline_ms < 1) return absl::InvalidArgumentError("--router_rpc_deadline_ms: must be >= 1");
  config.router_rpc_deadline = absl::Milliseconds(deadline_ms);
  config.service.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (config.service.worker_id.empty()) {
    return absl::InvalidArgumentError("--worker_id: must not be empty");
  }
  config.service.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  if (config.service.max_queued_requests < 1) {
    return absl::InvalidArgumentError("--max_queued_requests: must be >= 1");
  }
  config.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  const uint32_t margin = absl::GetFlag(FLAGS_deadline_margin_ms);
  if (margin > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--deadline_margin_ms=", margin, ": must be in [0, 10000]"));
  }
  config.service.deadline_margin = absl::Milliseconds(margin);
  config.service.max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes);
  if (config.service.max_request_bytes < (1 << 20) ||
      config.service.max_request_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("--max_request_bytes=",
                                                   config.service.max_request_bytes,
                                                   ": must be in [1 MiB, 1 GiB]"));
  }

  std::error_code ec;
  config.engine.rotations_path = absl::GetFlag(FLAGS_rotations);
  if (config.engine.rotations_path == "identity") {
    config.engine.rotations_path.clear();
  } else if (config.engine.rotations_path.empty()) {
    config.engine.default_rotations_dir = engine::DefaultRotationsDir();
  } else if (!std::filesystem::exists(config.engine.rotations_path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rotations=", config.engine.rotations_path, ": no such file"));
  }
  KV_ASSIGN_OR_RETURN(config.security, rpc::SecurityFromFlags());
  if (const std::string mac_file = absl::GetFlag(FLAGS_page_mac_key_file); !mac_file.empty()) {
    absl::StatusOr<std::shared_ptr<const PageMacKeys>> keys = PageMacKeys::FromFile(mac_file);
    if (!keys.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--page_mac_key_file: ", keys.status().message()));
    }
    config.service.kvstore_client.page_mac_keys = *std::move(keys);
  } else if (!config.security.transport.insecure()) {
    return absl::InvalidArgumentError(
        "--page_mac_key_file: required under TLS, so that no worker uses a page it cannot "
        "authenticate (see docs/operations.md)");
  }
  if (!config.security.transport.insecure()) {
    const rpc::TransportSecurity transport = config.security.transport;
    config.service.kvstore_client.dial = [transport](const std::string& address) {
      return transport.Dial(address);
    };
  }
  config.engine.model_path = absl::GetFlag(FLAGS_model);
  if (config.engine.model_path.empty()) {
    config.engine.model_path = engine::DefaultModelPath();
    if (!std::filesystem::exists(config.engine.model_path, ec)) {
      return absl::NotFoundError(absl::StrCat("--model: not given and the default model is not at ",
                                              config.engine.model_path,
                                              "; run scripts/fetch-model.sh to fetch it"));
    }
  } else if (!std::filesystem::exists(config.engine.model_path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model=", config.engine.model_path, ": no such file or folder"));
  }
  return config;
}

int Run(DecodeConfig config) {
  if (absl::Status s = InstallShutdownHandler(); !s.ok()) {
    fprintf(stderr, "kvstrata-decode: %s\n", s.ToString().c_str());
    return 1;
  }

  // The metrics endpoint first: a port that cannot be served is reported before the model loads.
  MetricsRegistry registry;
  std::unique_ptr<MetricsServer> metrics;
  if (!config.metrics_listen.empty()) {
    std::string error;
    metrics = MetricsServer::Start(&registry, config.metrics_listen, &error);
    if (metrics == nullptr) {
      fprintf(stderr, "kvstrata-decode: --metrics_listen=%s: %s\n", config.metrics_listen.c_str(),
              error.c_str());
      return 1;
    }
  }
  absl::StatusOr<std::unique_ptr<engine::Engine>> engine = engine::Engine::Load(config.engine);
  if (!engine.ok()) {
    fprintf(stderr, "kvstrata-decode: loading --model=%s on --device=%s: %s\n",
            config.engine.model_path.c_str(), config.engine.device.ToString().c_str(),
            engine.status().ToString().c_str());
    return 1;
  }
  config.service.model_name =
      (*engine)->config().name.empty() ? "default" : (*engine)->config().name;
  const std::string kv_format = (*engine)->KvFormatString();
  const std::string backend = (*engine)->backend().Describe();
  const rpc::PeerAuthorizer authorizer(config.security.peers, &registry, "decode");
  config.service.authorizer = &authorizer;
  DecodeService service(*std::move(engine), config.service, &registry);

  absl::StatusOr<std::unique_ptr<rpc::Server>> server = rpc::Server::Start(
      {.listen_address = config.listen,
       .services = {&service},
       .credentials = config.security.transport.ServerCredentials(rpc::ClientCerts::kRequire),
       .health_listen_address = config.security.health_listen,
       .max_receive_message_bytes = static_cast<int>(config.service.max_request_bytes)});
  if (!server.ok()) {
    fprintf(stderr, "kvstrata-decode: --listen: %s\n", server.status().ToString().c_str());
    return 1;
  }
  (*server)->SetServingStatus("kvstrata.v1.Generation", true);
  fprintf(stderr,
          "kvstrata-decode: serving kvstrata.v1.Generation on %s (model %s on %s, kv format %s, "
          "local page tier %lld MiB, %zu kvstore(s), router %s); metrics on %s\n",
          (*server)->address().c_str(), config.service.model_name.c_str(),
          backend.c_str(), kv_format.c_str(),
          static_cast<long long>(config.service.local_cache_bytes >> 20),
          config.service.kvstore_addresses.size(),
          config.routers.empty() ? "(none)" : absl::StrJoin(config.routers, ",").c_str(),
          metrics ? absl::StrCat("port ", metrics->port(), " /metrics").c_str() : "(off)");
  fprintf(stderr, "kvstrata-decode: gRPC transport: %s; page MACs %s\n",
          config.security.transport.Describe(rpc::ClientCerts::kRequire).c_str(),
          config.service.kvstore_client.page_mac_keys != nullptr ? "on" : "off");

  std::unique_ptr<RouterRegistrations> registration;
  if (!config.routers.empty()) {
    RouterRegistrationsOptions r;
    r.routers = config.routers;
    r.registration.rpc_deadline = config.router_rpc_deadline;
    r.registration.dial = config.service.kvstore_client.dial;
    r.registration.worker = service.WorkerDescription(
        config.advertise_address.empty() ? (*server)->address() : config.advertise_address);
    registration = std::make_unique<RouterRegistrations>(
        r, service.local_pages(), [&service] { return service.LoadSample(); });
  }

  std::thread waiter([&] {
    const int signal = WaitForShutdownSignal();
    fprintf(stderr, "kvstrata-decode: signal %d, shutting down (grace %s)\n", signal,
            absl::FormatDuration(config.shutdown_grace).c_str());
    // Tell the router first, so it sends nothing new while in-flight requests finish.
    if (registration != nullptr) registration->Drain();
    (*server)->Shutdown(config.shutdown_grace);
  });
  (*server)->Wait();
  waiter.join();
  fprintf(stderr, "kvstrata-decode: stopped\n");
  return 0;
}

}  // namespace
}  // namespace kvstrata::decode

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvstrata-decode: a decode worker (kvstrata.v1.Generation) on one model.\n"
      "Reuses cached prompt prefixes from two tiers: its own local page tier (host memory,\n"
      "--local_cache_mb) and then the kvstore(s) in --kvstore; keeps finished sequences'\n"
      "pages locally and publishes them to the kvstore. With --router it registers with the\n"
      "router and heartbeats its load and local page keys. Exports kvstrata_decode_* metrics\n"
      "on --metrics_listen. SIGINT/SIGTERM stop it cleanly (draining: the router is told\n"
      "first, in-flight requests get --shutdown_grace_ms). docs/decode.md has the details.\n\n"
      "usage: kvstrata-decode [--listen=HOST:PORT] [--model=PATH] [--kvstore=HOST:PORT,...]\n"
      "                       [--router=HOST:PORT] [--local_cache_mb=N] ...");
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "services/decode/main.cc") ||
           kvstrata::rpc::IsSecurityFlagsFile(file);
  };
  absl::SetFlagsUsageConfig(usage_config);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    fprintf(stderr, "kvstrata-decode: unexpected argument '%s' (see --help)\n", positional[1]);
    return 2;
  }
  absl::StatusOr<kvstrata::decode::DecodeConfig> config = kvstrata::decode::ConfigFromFlags();
  if (!config.ok()) {
    fprintf(stderr, "kvstrata-decode: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  return kvstrata::decode::Run(*std::move(config));
}

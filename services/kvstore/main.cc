// kvstrata-kvstore: serves kvstrata.v1.KvStore from an in-memory page store, with Prometheus
// metrics on /metrics. `kvstrata-kvstore --help` lists the flags; docs/kvstore.md explains them.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/metrics.h"
#include "core/shutdown.h"
#include "core/status_macros.h"
#include "rpc/security_flags.h"
#include "rpc/server.h"
#include "services/kvstore/gpu_tier.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/page_store.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50061",
          "gRPC address to serve KvStore on (port 0: any).");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9461",
          "HTTP address for Prometheus /metrics (port 0: any; empty: no metrics endpoint).");
ABSL_FLAG(uint64_t, capacity_mb, 1024,
          "Host-memory tier capacity in MiB (page bytes, both forms); the whole store without "
          "--device.");
ABSL_FLAG(std::string, device, "",
          "cuda or cuda:N: keep pages in an HBM pool on that GPU first (--gpu_capacity_mb), "
          "moving the least recently used to host memory when it is full, and offer workers on "
          "the same GPU the same-GPU transport. Empty: host memory only.");
ABSL_FLAG(uint64_t, gpu_capacity_mb, 16384, "HBM pool size in MiB with --device.");
ABSL_FLAG(std::string, pool_socket, "",
          "With --device: the Unix socket that hands the pool to workers on the same GPU "
          "(default: $TMPDIR/kvstrata-kvstore-<pid>.pool). Workers must be able to reach it: in "
          "Kubernetes a volume both containers mount.");
ABSL_FLAG(bool, nccl, true,
          "With --device: offer TRANSPORT_NCCL to workers on other GPUs (needs libnccl.so.2 on "
          "the loader's path or $KVSTRATA_NCCL_LIBRARY; without it the store says so and goes on "
          "without NCCL).");
ABSL_FLAG(uint32_t, nccl_init_timeout_ms, 30000,
          "How long a worker has to join a new NCCL communicator before it is aborted.");
ABSL_FLAG(uint32_t, nccl_transfer_timeout_ms, 2000,
          "Base deadline of an NCCL transfer (plus its bytes at 10 GB/s); past it the "
          "communicator is aborted.");
ABSL_FLAG(uint32_t, nccl_max_communicators, 64,
          "Most NCCL communicators with workers at once (each costs ~50-100 MB of HBM).");
ABSL_FLAG(uint32_t, max_lease_ttl_ms, 60000, "Longest lease a Lookup or Pin may ask for, in ms.");
ABSL_FLAG(uint32_t, max_leases, 4096, "Most live leases.");
ABSL_FLAG(uint32_t, max_keys_per_request, 4096, "Most page keys in one Lookup, Pin or Fetch.");
ABSL_FLAG(uint32_t, max_chunk_bytes, 1 << 20, "Largest Fetch chunk sent, in bytes (<= 4 MiB).");
ABSL_FLAG(uint32_t, page_size_tokens, 64, "Tokens per page, reported to clients.");
ABSL_FLAG(uint64_t, event_backlog, 65536, "Page events kept for WatchEvents resumption.");
ABSL_FLAG(std::string, store_id, "", "Identity reported by Stats (default: random).");
ABSL_FLAG(uint32_t, shutdown_grace_ms, 2000,
          "On SIGINT/SIGTERM, how long in-flight RPCs may finish before being cancelled.");

namespace kvstrata::kvstore {
namespace {

constexpr uint32_t kMaxChunkBytes = 4 << 20;

struct KvStoreConfig {
  std::string listen;
  int device = -1;  // cuda ordinal, -1: host memory only
  uint64_t gpu_capacity_bytes = 0;
  std::string pool_socket;
  bool nccl = false;
  NcclSenderOptions nccl_options;
  std::string metrics_listen;
  PageStoreOptions store;
  KvStoreServiceOptions service;
  absl::Duration shutdown_grace;
  rpc::SecurityConfig security;
};

// Folds the flags into a config; errors name the flag.
absl::StatusOr<KvStoreConfig> ConfigFromFlags() {
  KvStoreConfig config;
  config.listen = absl::GetFlag(FLAGS_listen);
  if (config.listen.empty()) return absl::InvalidArgumentError("--listen: must not be empty");
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  const uint64_t capacity_mb = absl::GetFlag(FLAGS_capacity_mb);
  if (capacity_mb == 0 || capacity_mb > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--capacity_mb: must be in 1..", uint64_t{1} << 30, ", got ", capacity_mb));
  }
  config.store.capacity_bytes = capacity_mb << 20;
  const std::string device = absl::GetFlag(FLAGS_device);
  if (!device.empty()) {
    if (device == "cuda") {
      config.device = 0;
    } else if (!absl::StartsWith(device, "cuda:") ||
               !absl::SimpleAtoi(device.substr(5), &config.device) || config.device < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: expected cuda or cuda:N, got '", device, "'"));
    }
    const uint64_t gpu_mb = absl::GetFlag(FLAGS_gpu_capacity_mb);
    if (gpu_mb == 0 || gpu_mb > (uint64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpu_capacity_mb: must be in 1..", uint64_t{1} << 30, ", got ", gpu_mb));
    }
    config.gpu_capacity_bytes = gpu_mb << 20;
    config.nccl = absl::GetFlag(FLAGS_nccl);
    config.nccl_options.device = config.device;
    const uint32_t init_ms = absl::GetFlag(FLAGS_nccl_init_timeout_ms);
    const uint32_t transfer_ms = absl::GetFlag(FLAGS_nccl_transfer_timeout_ms);
    const uint32_t max_comms = absl::GetFlag(FLAGS_nccl_max_communicators);
    if (init_ms == 0) return absl::InvalidArgumentError("--nccl_init_timeout_ms: must be > 0");
    if (transfer_ms == 0) {
      return absl::InvalidArgumentError("--nccl_transfer_timeout_ms: must be > 0");
    }
    if (max_comms == 0) return absl::InvalidArgumentError("--nccl_max_communicators: must be > 0");
    config.nccl_options.init_timeout = absl::Milliseconds(init_ms);
    config.nccl_options.transfer_timeout = absl::Milliseconds(transfer_ms);
    config.nccl_options.max_communicators = static_cast<int>(max_comms);
    config.pool_socket = absl::GetFlag(FLAGS_pool_socket);
    if (config.pool_socket.empty()) {
      const char* tmp = getenv("TMPDIR");
      config.pool_socket = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                        "/kvstrata-kvstore-", getpid(), ".pool");
    }
  }
  const uint32_t ttl_ms = absl::GetFlag(FLAGS_max_lease_ttl_ms);
  if (ttl_ms == 0) return absl::InvalidArgumentError("--max_lease_ttl_ms: must be > 0");
  config.store.max_lease_ttl = absl::Milliseconds(ttl_ms);
  config.store.max_leases = absl::GetFlag(FLAGS_max_leases);
  if (config.store.max_leases == 0) {
    return absl::InvalidArgumentError("--max_leases: must be > 0");
  }
  config.store.page_size_tokens = absl::GetFlag(FLAGS_page_size_tokens);
  if (config.store.page_size_tokens == 0 || config.store.page_size_tokens > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--page_size_tokens: must be in 1..4096, got ",
                                                   config.store.page_size_tokens));
  }
  config.store.event_backlog = absl::GetFlag(FLAGS_event_backlog);
  if (config.store.event_backlog == 0) {
    return absl::InvalidArgumentError("--event_backlog: must be > 0");
  }
  config.service.store_id = absl::GetFlag(FLAGS_store_id);
  config.service.max_keys_per_request = absl::GetFlag(FLAGS_max_keys_per_request);
  if (config.service.max_keys_per_request == 0) {
    return absl::InvalidArgumentError("--max_keys_per_request: must be > 0");
  }
  config.service.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  if (config.service.max_chunk_bytes == 0 || config.service.max_chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("--max_chunk_bytes: must be in 1..",
                                                   kMaxChunkBytes, ", got ",
                                                   config.service.max_chunk_bytes));
  }
  config.shutdown_grace = absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms));
  KV_ASSIGN_OR_RETURN(config.security, rpc::SecurityFromFlags());
  return config;
}

int Run(const KvStoreConfig& config) {
  if (absl::Status s = InstallShutdownHandler(); !s.ok()) {
    fprintf(stderr, "kvstrata-kvstore: %s\n", s.ToString().c_str());
    return 1;
  }

  SystemClock clock;
  PageStoreOptions store_options = config.store;
  KvStoreServiceOptions service_options = config.service;
  std::string tiers = absl::StrCat("host memory ", config.store.capacity_bytes >> 20, " MiB");
  GpuTier gpu;
  if (config.device >= 0) {
    absl::StatusOr<GpuTier> made =
        MakeGpuTier(config.device, config.gpu_capacity_bytes, config.pool_socket);
    if (!made.ok()) {
      fprintf(stderr, "kvstrata-kvstore: --device=cuda:%d (--gpu_capacity_mb, --pool_socket): %s\n",
              config.device, std::string(made.status().message()).c_str());
      return 1;
    }
    gpu = *std::move(made);
    store_options.fast_tier = gpu.memory;
    service_options.same_gpu_pool = {.socket_path = gpu.socket->path(),
                                      .pool_id = gpu.pool_id,
                                      .gpu_uuid = gpu.gpu_uuid,
                                      .host_boot_id = transport::HostBootId()};
    tiers = absl::StrCat(gpu.memory->Describe(), " ", config.gpu_capacity_bytes >> 20,
                         " MiB (pool socket ", gpu.socket->path(), ", ", gpu.gpu_uuid, ") + ",
                         tiers);
  }
  std::unique_ptr<NcclSender> nccl;
  if (config.device >= 0 && config.nccl) {
    absl::StatusOr<transport::NcclRuntime*> runtime = transport::SystemNccl();
    if (runtime.ok()) {
      nccl = std::make_unique<NcclSender>(*runtime, gpu.memory->base(), gpu.memory->size(),
                                          config.nccl_options);
      service_options.nccl = nccl.get();
      absl::StrAppend(&tiers, "; NCCL ", (*runtime)->version(), " to workers on other GPUs");
    } else {
      // A degraded start, not a failed one: workers on other GPUs use the gRPC stream.
      fprintf(stderr, "kvstrata-kvstore: WARNING: --nccl: %s; TRANSPORT_NCCL is not offered\n",
              std::string(runtime.status().message()).c_str());
    }
  }
  PageStore store(store_options, &clock);
  // Workers that read pages in place hold their leases through their pool-socket connections.
  // The listener goes before the store does (this guard is destroyed first).
  struct HolderListenerGuard {
    transport::PoolSocketServer* socket;
    ~HolderListenerGuard() {
      if (socket != nullptr) socket->SetHolderListener(nullptr);
    }
  } holder_guard{gpu.socket.get()};
  if (gpu.socket != nullptr) {
    gpu.socket->SetHolderListener([&store](uint64_t holder, bool open) {
      if (open) {
        store.OpenHolder(holder);
        return;
      }
      const int dropped = store.CloseHolder(holder);
      if (dropped > 0) {
        fprintf(stderr,
                "kvstrata-kvstore: a pool holder closed its connection; %d of its leases "
                "released\n",
                dropped);
      }
    });
  }
  MetricsRegistry registry;
  const rpc::PeerAuthorizer authorizer(config.security.peers, &registry, "kvstore");
  service_options.authorizer = &authorizer;
  KvStoreService service(&store, service_options, &registry);

  std::unique_ptr<MetricsServer> metrics;
  if (!config.metrics_listen.empty()) {
    std::string error;
    metrics = MetricsServer::Start(&registry, config.metrics_listen, &error);
    if (metrics == nullptr) {
      fprintf(stderr, "kvstrata-kvstore: --metrics_listen=%s: %s\n", config.metrics_listen.c_str(),
              error.c_str());
      return 1;
    }
  }
  absl::StatusOr<std::unique_ptr<rpc::Server>> server = rpc::Server::Start(
      {.listen_address = config.listen,
       .services = {&service},
       .credentials = config.security.transport.ServerCredentials(rpc::ClientCerts::kRequire),
       .health_listen_address = config.security.health_listen});
  if (!server.ok()) {
    fprintf(stderr, "kvstrata-kvstore: --listen: %s\n", server.status().ToString().c_str());
    return 1;
  }
  (*server)->SetServingStatus("kvstrata.v1.KvStore", true);
  fprintf(stderr,
          "kvstrata-kvstore: serving kvstrata.v1.KvStore on %s (pages in %s, epoch "
          "%016llx); metrics on %s\n",
          (*server)->address().c_str(), tiers.c_str(),
          static_cast<unsigned long long>(store.epoch()),
          metrics ? absl::StrCat("port ", metrics->port(), " /metrics").c_str() : "(off)");
  fprintf(stderr, "kvstrata-kvstore: gRPC transport: %s\n",
          config.security.transport.Describe(rpc::ClientCerts::kRequire).c_str());

  std::thread waiter([&] {
    const int signal = WaitForShutdownSignal();
    fprintf(stderr, "kvstrata-kvstore: signal %d, shutting down (grace %s)\n", signal,
            absl::FormatDuration(config.shutdown_grace).c_str());
    (*server)->Shutdown(config.shutdown_grace);
  });
  (*server)->Wait();
  waiter.join();
  fprintf(stderr, "kvstrata-kvstore: stopped\n");
  return 0;
}

}  // namespace
}  // namespace kvstrata::kvstore

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvstrata-kvstore: the KV page store (kvstrata.v1.KvStore), in host memory, or with\n"
      "--device=cuda:N in an HBM pool on that GPU with host memory behind it.\n"
      "Stores immutable KV pages by radix-hash key with parent links, evicts least recently\n"
      "used leaves when full, keeps leased pages, streams stored/removed events, and exports\n"
      "kvstrata_kvstore_* metrics on --metrics_listen. SIGINT/SIGTERM stop it cleanly.\n\n"
      "usage: kvstrata-kvstore [--listen=HOST:PORT] [--metrics_listen=HOST:PORT] "
      "[--capacity_mb=N] ...");
  // --help lists this file's flags (absl matches on the binary's name by default).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "services/kvstore/main.cc") ||
           kvstrata::rpc::IsSecurityFlagsFile(file);
  };
  absl::SetFlagsUsageConfig(usage_config);
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (positional.size() > 1) {
    fprintf(stderr, "kvstrata-kvstore: unexpected argument '%s' (see --help)\n", positional[1]);
    return 2;
  }
  absl::StatusOr<kvstrata::kvstore::KvStoreConfig> config = kvstrata::kvstore::ConfigFromFlags();
  if (!config.ok()) {
    fprintf(stderr, "kvstrata-kvstore: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  return kvstrata::kvstore::Run(*config);
}

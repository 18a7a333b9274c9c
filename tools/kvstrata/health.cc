// kvstrata health: asks a kvstrata server (router, decode worker or kvstore) for its
// grpc.health.v1 status. Exit status 0 when SERVING, 1 otherwise (unreachable within --timeout_ms,
// or NOT_SERVING), with the reason on stderr. scripts/cluster.sh waits on it.
//
//   kvstrata health --target=127.0.0.1:50071
//   kvstrata health --target=127.0.0.1:50061 --service=kvstrata.v1.KvStore

#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/generation_client.h"

ABSL_FLAG(std::string, service, "",
          "service name to check (e.g. kvstrata.v1.Generation); empty: the server as a whole");
ABSL_FLAG(int64_t, timeout_ms, 2000, "how long to wait for the server to answer, in ms");
ABSL_DECLARE_FLAG(std::string, target);

namespace kvstrata::cli {
namespace {

int RunHealth() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const int64_t timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  if (timeout_ms < 1) {
    std::fprintf(stderr, "kvstrata health: --timeout-ms must be >= 1\n");
    return 2;
  }
  const absl::Status status = CheckHealth(target, absl::GetFlag(FLAGS_service), timeout_ms);
  if (!status.ok()) {
    std::fprintf(stderr, "kvstrata health: %s: %s\n", target.c_str(),
                 DescribeRpcError(status).c_str());
    return 1;
  }
  std::printf("%s: SERVING\n", target.c_str());
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(health, "health",
                 "check a server's grpc.health.v1 status (exit 0 when SERVING)", RunHealth);

}  // namespace kvstrata::cli

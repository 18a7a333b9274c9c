// transport/nccl.h in a build without CUDA or without nccl.h: there is no NCCL, and the kvstore
// and the workers use their other transports.

#include "transport/nccl.h"

namespace kvstrata::transport {

absl::StatusOr<NcclRuntime*> SystemNccl() {
  return absl::UnavailableError(
      "this kvstrata was built without NCCL (KVSTRATA_CUDA=OFF or no nccl.h)");
}

}  // namespace kvstrata::transport

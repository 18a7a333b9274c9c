#pragma once

// NCCL between GPUs behind a small seam (docs/kvstore.md#nccl-between-gpus): a runtime that makes
// communicator ids, joins communicators with a deadline, gives device memory to move pages
// through and digest checkers that check pages where the bytes lie; and a communicator that runs
// one grouped transfer with a deadline. SystemNccl() is NCCL itself, opened at run time
// (libnccl.so.2); tests put a fake behind the same interfaces, so the kvstore's and the worker's
// NCCL code builds and is tested without a GPU.

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvstrata::transport {

// Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES), as they travel in OpenTransferResponse.
inline constexpr size_t kNcclUniqueIdBytes = 128;

// The first transfer on every new communicator, from the store to the worker: NCCL connects
// peers lazily at their first send (~700 ms), which a setup pays so that no request does.
inline constexpr uint64_t kNcclWarmupBytes = 4096;

// A range of device memory (host memory in the tests' fake).
struct DeviceRange {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

// One page where it landed and the digest it must have (core/page_digest.h).
struct DigestCheck {
  const uint8_t* data = nullptr;  // device, 16-byte aligned
  uint64_t bytes = 0;             // a multiple of 16
  uint64_t expected_digest = 0;
};

// Checks page digests where the bytes lie (on the GPU: kernels/cuda/page_gather.h in its
// digest-only mode, no copy to the host), up to max_pages() pages a call. Made once per receive
// slab: its scratch (device memory for the descriptors, sums and flags, pinned host memory to
// stage them) is allocated when it is made, and it runs on a stream of its own, synchronising
// only that stream, so a check allocates nothing and waits for no other work on the GPU. One
// check at a time (not thread-safe; the worker holds a store's lane while checking).
class DigestChecker {
 public:
  virtual ~DigestChecker() = default;
  virtual size_t max_pages() const = 0;
  // DataLoss naming the first page that differs; InvalidArgument for more than max_pages().
  virtual absl::Status Check(std::span<const DigestCheck> pages) = 0;
};

// One member of an NCCL communicator. Thread-safe: transfers run one at a time, in call order
// (NCCL matches a peer's sends to its receives by order, so both ends must agree on it).
class NcclCommunicator {
 public:
  virtual ~NcclCommunicator() = default;
  virtual int rank() const = 0;
  virtual int num_ranks() const = 0;
  // Registers memory that transfers will use (ncclCommRegister: zero-copy over NVLink when both
  // ends register). Unimplemented where the library has no registration; callers go on without.
  virtual absl::Status Register(DeviceRange range) = 0;
  // One grouped transfer with `peer`: every send and every receive posted in one
  // ncclGroupStart/End, in order, then waited for until `deadline`. On DeadlineExceeded, or an
  // NCCL error (Unavailable, naming NCCL's message), the communicator is aborted
  // (ncclCommAbort) and broken() from then on; a broken communicator answers
  // FailedPrecondition at once.
  virtual absl::Status Transfer(int peer, std::span<const DeviceRange> sends,
                                std::span<const DeviceRange> recvs, absl::Time deadline) = 0;
  virtual bool broken() const = 0;
  // Ends the communicator now (ncclCommAbort); a transfer in progress returns an error.
  virtual void Abort() = 0;
};

class NcclRuntime {
 public:
  virtual ~NcclRuntime() = default;
  // A new communicator's id (ncclGetUniqueId), kNcclUniqueIdBytes bytes.
  virtual absl::StatusOr<std::string> NewUniqueId() = 0;
  // Joins communicator `unique_id` of `num_ranks` as `rank` on cuda:`device`. Initialisation is
  // non-blocking and polled until `deadline`: when the other ranks have not joined by then the
  // half-made communicator is aborted and the answer is DeadlineExceeded; nothing waits longer.
  // `cancel` (may be null), once true, aborts the same way at the next poll (Cancelled).
  virtual absl::StatusOr<std::unique_ptr<NcclCommunicator>> Join(
      const std::string& unique_id, int num_ranks, int rank, int device, absl::Time deadline,
      const std::atomic<bool>* cancel = nullptr) = 0;
  // `bytes` of device memory on cuda:`device`, freed when the last reference goes.
  virtual absl::StatusOr<std::shared_ptr<DeviceRange>> Allocate(int device, uint64_t bytes) = 0;
  // A digest checker on cuda:`device` for up to `max_pages` pages a check (>= 1), its scratch
  // allocated now: ResourceExhausted when it does not fit.
  virtual absl::StatusOr<std::unique_ptr<DigestChecker>> NewDigestChecker(int device,
                                                                          size_t max_pages) = 0;
  // NCCL_VERSION_CODE of the library (DeviceInfo.nccl_version).
  virtual uint32_t version() const = 0;
};

// NCCL itself, opened once per process: $KVSTRATA_NCCL_LIBRARY alone if set, else libnccl.so.2
// on the loader's path (LD_LIBRARY_PATH: e.g. the nvidia-nccl-cu13 wheel's nvidia/nccl/lib),
// else the library found when kvstrata was built. FailedPrecondition naming the files tried when
// none opens; Unavailable in a build without CUDA or without nccl.h.
absl::StatusOr<NcclRuntime*> SystemNccl();

}  // namespace kvstrata::transport

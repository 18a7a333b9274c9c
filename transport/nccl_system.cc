// transport/nccl.h on NCCL itself. libnccl is opened at run time (dlopen) rather than linked:
// the library is 200+ MB and absent from the CPU images, and on the GPU machines it comes from
// Python's nvidia-nccl-cu13 wheel, not from the CUDA toolkit, so every binary still loads
// without it, and a worker or store that cannot open it says so and uses the other transports.

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "kernels/cuda/page_gather.h"
#include "transport/nccl.h"

namespace kvstrata::transport {
namespace {

// How often a non-blocking NCCL call or a transfer's completion is polled.
constexpr absl::Duration kPoll = absl::Microseconds(50);

struct NcclLibrary {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) get_async_error = nullptr;
  decltype(&ncclCommAbort) abort = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
  decltype(&ncclGetLastError) last_error = nullptr;
  // Absent before NCCL 2.19: transfers then go without registration.
  decltype(&ncclCommRegister) comm_register = nullptr;
  decltype(&ncclCommDeregister) comm_deregister = nullptr;
  int version = 0;
};

absl::StatusOr<NcclLibrary> OpenLibrary() {
  std::vector<std::string> files;
  // An operator's explicit choice is the only one tried, so a wrong path fails loudly rather
  // than quietly loading another NCCL.
  if (const char* env = std::getenv("KVSTRATA_NCCL_LIBRARY"); env != nullptr && *env != '\0') {
    files.push_back(env);
  } else {
    files.push_back("libnccl.so.2");
#ifdef KVSTRATA_NCCL_BUILD_LIBRARY
    files.push_back(KVSTRATA_NCCL_BUILD_LIBRARY);
#endif
  }
  void* handle = nullptr;
  std::string tried;
  std::string file;
  for (const std::string& f : files) {
    handle = dlopen(f.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      file = f;
      break;
    }
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
  }
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open NCCL (set KVSTRATA_NCCL_LIBRARY or LD_LIBRARY_PATH): ", tried));
  }
  NcclLibrary lib;
  std::string missing;
  auto bind = [&](auto& fn, const char* name, bool required) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr && required) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  bind(lib.get_version, "ncclGetVersion", true);
  bind(lib.get_unique_id, "ncclGetUniqueId", true);
  bind(lib.init_rank_config, "ncclCommInitRankConfig", true);
  bind(lib.get_async_error, "ncclCommGetAsyncError", true);
  bind(lib.abort, "ncclCommAbort", true);
  bind(lib.group_start, "ncclGroupStart", true);
  bind(lib.group_end, "ncclGroupEnd", true);
  bind(lib.send, "ncclSend", true);
  bind(lib.recv, "ncclRecv", true);
  bind(lib.error_string, "ncclGetErrorString", true);
  bind(lib.last_error, "ncclGetLastError", true);
  bind(lib.comm_register, "ncclCommRegister", false);
  bind(lib.comm_deregister, "ncclCommDeregister", false);
  if (!missing.empty())
    return absl::FailedPreconditionError(absl::StrCat(file, " lacks ", missing));
  if (lib.get_version(&lib.version) != ncclSuccess) lib.version = 0;
  return lib;  // the handle stays open for the life of the process
}

absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

class SystemCommunicator final : public NcclCommunicator {
 public:
  SystemCommunicator(const NcclLibrary& lib, ncclComm_t comm, cudaStream_t stream, cudaEvent_t done,
                     int device, int rank, int num_ranks)
      : lib_(lib),
        comm_(comm),
        stream_(stream),
        done_(done),
        device_(device),
        rank_(rank),
        num_ranks_(num_ranks) {}

  ~SystemCommunicator() override {
    // Pooled communicators live until the process (or an error) ends them; abort frees all of
    // it without waiting for a peer that may be gone, which a destroy would.
    Abort();
    cudaSetDevice(device_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int num_ranks() const override { return num_ranks_; }

  absl::Status Register(DeviceRange range) override {
    if (lib_.comm_register == nullptr) {
      return absl::UnimplementedError("this NCCL has no ncclCommRegister");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return absl::FailedPreconditionError("the NCCL communicator was aborted");
    cudaSetDevice(device_);
    void* handle = nullptr;
    const ncclResult_t r = lib_.comm_register(comm_, range.data, range.bytes, &handle);
    if (r == ncclInProgress) {
      // A non-blocking communicator may finish the registration in the background.
      KV_RETURN_IF_ERROR(WaitForState("ncclCommRegister", absl::Now() + absl::Seconds(30)));
    } else if (r != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclCommRegister: ", Message(r)));
    }
    registered_.push_back(handle);
    return absl::OkStatus();
  }

  absl::Status Transfer(int peer, std::span<const DeviceRange> sends,
                        std::span<const DeviceRange> recvs, absl::Time deadline) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return absl::FailedPreconditionError("the NCCL communicator was aborted");
    if (peer < 0 || peer >= num_ranks_) {
      return absl::InvalidArgumentError(absl::StrCat("peer ", peer, " of ", num_ranks_, " ranks"));
    }
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaError("cudaSetDevice", e);
    }
    ncclResult_t r = lib_.group_start();
    for (size_t i = 0; r == ncclSuccess && i < sends.size(); ++i) {
      r = lib_.send(sends[i].data, sends[i].bytes, ncclUint8, peer, comm_, stream_);
    }
    for (size_t i = 0; (r == ncclSuccess || r == ncclInProgress) && i < recvs.size(); ++i) {
      r = lib_.recv(recvs[i].data, recvs[i].bytes, ncclUint8, peer, comm_, stream_);
    }
    // The group is always closed, so a failed post leaves no open group on this thread.
    const ncclResult_t end = lib_.group_end();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    if (r != ncclSuccess && r != ncclInProgress) return Fail("posting the transfer", r);
    // Non-blocking: the group may still be being launched; then the stream runs it.
    if (absl::Status s = WaitForState("launching the transfer", deadline); !s.ok()) return s;
    if (cudaError_t e = cudaEventRecord(done_, stream_); e != cudaSuccess) {
      AbortLocked();
      return CudaError("cudaEventRecord", e);
    }
    for (;;) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        AbortLocked();
        return CudaError("the transfer's stream", q);
      }
      ncclResult_t async = ncclSuccess;
      lib_.get_async_error(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return Fail("the transfer", async);
      if (absl::Status late = Late("the NCCL transfer", deadline); !late.ok()) return late;
      absl::SleepFor(kPoll);
    }
  }

  bool broken() const override { return broken_.load(); }

  void Abort() override {
    // A transfer in progress sees the request within one poll and aborts; the communicator is
    // only ever touched by the thread holding mu_ (ncclCommAbort frees it).
    abort_requested_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    AbortLocked();
  }

 private:
  // Polls the communicator until it leaves ncclInProgress; fails (aborted) on an error, on
  // Abort() from another thread, or past `deadline`.
  absl::Status WaitForState(const char* what, absl::Time deadline) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      lib_.get_async_error(comm_, &state);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return Fail(what, state);
      if (absl::Status late = Late(what, deadline); !late.ok()) return late;
      absl::SleepFor(kPoll);
    }
  }

  std::string Message(ncclResult_t r) const {
    const char* last = lib_.last_error(comm_);
    return absl::StrCat(lib_.error_string(r), last != nullptr && *last != '\0' ? ": " : "",
                        last != nullptr ? last : "");
  }

  // OK while the transfer may go on; else the communicator is aborted and the error says why.
  absl::Status Late(const char* what, absl::Time deadline) {
    if (abort_requested_) {
      AbortLocked();
      return absl::CancelledError(absl::StrCat(what, ": the communicator was aborted"));
    }
    if (absl::Now() < deadline) return absl::OkStatus();
    AbortLocked();
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": not done by the deadline (communicator aborted)"));
  }

  absl::Status Fail(const char* what, ncclResult_t r) {
    std::string message = absl::StrCat(what, ": ", Message(r), " (communicator aborted)");
    AbortLocked();
    return absl::UnavailableError(message);
  }

  void AbortLocked() {
    if (broken_.exchange(true)) return;
    cudaSetDevice(device_);
    lib_.abort(comm_);
  }

  const NcclLibrary& lib_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  cudaEvent_t done_;
  const int device_;
  const int rank_;
  const int num_ranks_;
  std::mutex mu_;  // one transfer at a time; the only one touching comm_
  std::atomic<bool> abort_requested_{false};
  std::atomic<bool> broken_{false};
  std::vector<void*> registered_;
};

// Everything a check needs, allocated once: the descriptors, sums and flags on the device (one
// allocation, small beside the pages: 44 bytes a page), the descriptors and flags staged in
// pinned host memory (so the copies are asynchronous on the checker's stream), and the stream.
class SystemDigestChecker final : public DigestChecker {
 public:
  static absl::StatusOr<std::unique_ptr<DigestChecker>> Make(int device, size_t max_pages) {
    if (max_pages == 0) return absl::InvalidArgumentError("a digest checker of 0 pages");
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError("cudaSetDevice", e);
    }
    auto c = std::unique_ptr<SystemDigestChecker>(new SystemDigestChecker(device, max_pages));
    const size_t n = max_pages;
    if (cudaError_t e = cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking);
        e != cudaSuccess) {
      c->stream_ = nullptr;
      return CudaError("cudaStreamCreate (digest check)", e);
    }
    if (cudaError_t e = cudaMalloc(&c->device_scratch_, n * kDeviceBytesPerPage);
        e != cudaSuccess) {
      c->device_scratch_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of the digest check's ", n * kDeviceBytesPerPage,
                       " bytes on cuda:", device, ": ", cudaGetErrorString(e)));
    }
    if (cudaError_t e = cudaMallocHost(&c->host_scratch_, n * kHostBytesPerPage);
        e != cudaSuccess) {
      c->host_scratch_ = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat("cudaMallocHost of the digest check's ",
                                                       n * kHostBytesPerPage,
                                                       " bytes: ", cudaGetErrorString(e)));
    }
    return std::unique_ptr<DigestChecker>(std::move(c));
  }

  ~SystemDigestChecker() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (device_scratch_ != nullptr) cudaFree(device_scratch_);
    if (host_scratch_ != nullptr) cudaFreeHost(host_scratch_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  size_t max_pages() const override { return max_pages_; }

  absl::Status Check(std::span<const DigestCheck> pages) override {
    if (pages.empty()) return absl::OkStatus();
    const size_t n = pages.size();
    if (n > max_pages_) {
      return absl::InvalidArgumentError(
          absl::StrCat(n, " pages to check, above the checker's ", max_pages_));
    }
    if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
      return CudaError("cudaSetDevice", e);
    }
    // Device: [max_pages] descriptors, then [max_pages] sums, then [max_pages] flags; host: the
    // descriptors, then the flags.
    auto* d_copies = static_cast<kernels::PageCopy*>(device_scratch_);
    auto* d_sums = reinterpret_cast<unsigned long long*>(d_copies + max_pages_);
    auto* d_mismatch = reinterpret_cast<uint32_t*>(d_sums + max_pages_);
    auto* h_copies = static_cast<kernels::PageCopy*>(host_scratch_);
    auto* h_mismatch = reinterpret_cast<uint32_t*>(h_copies + max_pages_);
    uint64_t max_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      h_copies[i] = {.src = pages[i].data,
                     .dst = nullptr,
                     .bytes = pages[i].bytes,
                     .expected_digest = pages[i].expected_digest};
      max_bytes = std::max(max_bytes, pages[i].bytes);
    }
    if (cudaError_t e = cudaMemcpyAsync(d_copies, h_copies, n * sizeof(kernels::PageCopy),
                                        cudaMemcpyHostToDevice, stream_);
        e != cudaSuccess) {
      return CudaError("cudaMemcpyAsync (digest check)", e);
    }
    kernels::PageGatherParams params{.copies = d_copies,
                                     .num_pages = static_cast<int>(n),
                                     .max_page_bytes = max_bytes,
                                     .sums = d_sums,
                                     .mismatch = d_mismatch};
    if (cudaError_t e = kernels::LaunchPageGather(params, stream_); e != cudaSuccess) {
      cudaStreamSynchronize(stream_);  // the staged descriptors are reused by the next check
      return CudaError("the digest kernel", e);
    }
    if (cudaError_t e = cudaMemcpyAsync(h_mismatch, d_mismatch, n * sizeof(uint32_t),
                                        cudaMemcpyDeviceToHost, stream_);
        e != cudaSuccess) {
      cudaStreamSynchronize(stream_);
      return CudaError("cudaMemcpyAsync (digest check)", e);
    }
    if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      return CudaError("the digest kernel", e);
    }
    for (size_t i = 0; i < n; ++i) {
      if (h_mismatch[i] != 0) {
        return absl::DataLossError(absl::StrCat("page ", i, " of the transfer: digest mismatch"));
      }
    }
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kDeviceBytesPerPage =
      sizeof(kernels::PageCopy) + sizeof(unsigned long long) + sizeof(uint32_t);
  static constexpr size_t kHostBytesPerPage = sizeof(kernels::PageCopy) + sizeof(uint32_t);

  SystemDigestChecker(int device, size_t max_pages) : device_(device), max_pages_(max_pages) {}

  const int device_;
  const size_t max_pages_;
  cudaStream_t stream_ = nullptr;
  void* device_scratch_ = nullptr;
  void* host_scratch_ = nullptr;
};

class SystemRuntime final : public NcclRuntime {
 public:
  explicit SystemRuntime(NcclLibrary lib) : lib_(std::move(lib)) {}

  absl::StatusOr<std::string> NewUniqueId() override {
    ncclUniqueId id;
    if (ncclResult_t r = lib_.get_unique_id(&id); r != ncclSuccess) {
      return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", lib_.error_string(r)));
    }
    static_assert(sizeof(id.internal) == kNcclUniqueIdBytes);
    return std::string(id.internal, sizeof(id.internal));
  }

  absl::StatusOr<std::unique_ptr<NcclCommunicator>> Join(const std::string& unique_id,
                                                         int num_ranks, int rank, int device,
                                                         absl::Time deadline,
                                                         const std::atomic<bool>* cancel) override {
    if (unique_id.size() != kNcclUniqueIdBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl_unique_id: ", unique_id.size(), " bytes, not ", kNcclUniqueIdBytes));
    }
    if (num_ranks < 1 || rank < 0 || rank >= num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", num_ranks));
    }
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError(absl::StrCat("cudaSetDevice(", device, ")").c_str(), e);
    }
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id.data(), kNcclUniqueIdBytes);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so that a peer that never joins cannot hold this thread
    ncclComm_t comm = nullptr;
    ncclResult_t r = lib_.init_rank_config(&comm, num_ranks, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm != nullptr) lib_.abort(comm);
      return absl::UnavailableError(absl::StrCat("ncclCommInitRankConfig: ", lib_.error_string(r)));
    }
    for (;;) {
      ncclResult_t state = ncclSuccess;
      lib_.get_async_error(comm, &state);
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        std::string message =
            absl::StrCat("NCCL communicator init (rank ", rank, " of ", num_ranks,
                         "): ", lib_.error_string(state), ": ", lib_.last_error(comm));
        lib_.abort(comm);
        return absl::UnavailableError(message);
      }
      if (cancel != nullptr && cancel->load()) {
        lib_.abort(comm);
        return absl::CancelledError("NCCL communicator init: cancelled (aborted)");
      }
      if (absl::Now() >= deadline) {
        lib_.abort(comm);
        return absl::DeadlineExceededError(
            absl::StrCat("NCCL communicator init (rank ", rank, " of ", num_ranks,
                         "): the other ranks did not join by the deadline (aborted)"));
      }
      absl::SleepFor(kPoll);
    }
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      lib_.abort(comm);
      return CudaError("cudaStreamCreate", e);
    }
    if (cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming); e != cudaSuccess) {
      cudaStreamDestroy(stream);
      lib_.abort(comm);
      return CudaError("cudaEventCreate", e);
    }
    return std::make_unique<SystemCommunicator>(lib_, comm, stream, done, device, rank, num_ranks);
  }

  absl::StatusOr<std::shared_ptr<DeviceRange>> Allocate(int device, uint64_t bytes) override {
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
      return CudaError("cudaSetDevice", e);
    }
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cudaMalloc of ", bytes, " bytes on cuda:", device, ": ", cudaGetErrorString(e)));
    }
    auto* range = new DeviceRange{static_cast<uint8_t*>(p), bytes};
    return std::shared_ptr<DeviceRange>(range, [device](DeviceRange* r) {
      cudaSetDevice(device);
      cudaFree(r->data);
      delete r;
    });
  }

  absl::StatusOr<std::unique_ptr<DigestChecker>> NewDigestChecker(int device,
                                                                  size_t max_pages) override {
    return SystemDigestChecker::Make(device, max_pages);
  }

  uint32_t version() const override { return static_cast<uint32_t>(lib_.version); }

 private:
  const NcclLibrary lib_;
};

}  // namespace

absl::StatusOr<NcclRuntime*> SystemNccl() {
  static const absl::StatusOr<NcclRuntime*>* const runtime = [] {
    absl::StatusOr<NcclLibrary> lib = OpenLibrary();
    if (!lib.ok()) return new absl::StatusOr<NcclRuntime*>(lib.status());
    return new absl::StatusOr<NcclRuntime*>(new SystemRuntime(*std::move(lib)));
  }();
  return *runtime;
}

}  // namespace kvstrata::transport

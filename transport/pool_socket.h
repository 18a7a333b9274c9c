#pragma once

// The same-GPU transport's hand-over of the kvstore's HBM pool (docs/api.md#opentransfer): a
// Unix socket on which the store answers every connection with a 32-byte hello — the magic
// "KVSTRATA-POOL v1", then pool_id and pool_bytes as little-endian uint64 — and, in the same
// message, a file descriptor of the pool (SCM_RIGHTS) that the client imports with CUDA's VMM
// API and maps once. The socket file is created mode 0600: only processes of the store's user
// may map its pages. No CUDA here; the descriptor is whatever the store's provider returns.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvstrata::transport {

struct PoolHandle {
  int fd = -1;  // owned by the receiver
  uint64_t pool_id = 0;
  uint64_t pool_bytes = 0;
};

// The hello's fields, and its bytes on the socket: the magic, then pool_id and pool_bytes
// little-endian.
struct PoolHello {
  uint64_t pool_id = 0;
  uint64_t pool_bytes = 0;
};
inline constexpr size_t kPoolHelloBytes = 32;

std::string EncodePoolHello(const PoolHello& hello);
// The hello in `bytes` (what one recvmsg returned). DataLoss when they are not kPoolHelloBytes
// or do not start with the magic, or the pool's size does not fit an int64.
absl::StatusOr<PoolHello> ParsePoolHello(absl::string_view bytes);

class PoolSocketServer {
 public:
  // Serves on `path` (an existing socket file there is replaced). `export_fd` makes a new
  // descriptor per connection (closed here after sending). Errors name the path.
  static absl::StatusOr<std::unique_ptr<PoolSocketServer>> Start(
      const std::string& path, uint64_t pool_id, uint64_t pool_bytes,
      std::function<absl::StatusOr<int>()> export_fd);
  ~PoolSocketServer();  // stops serving and removes the socket file

  const std::string& path() const { return path_; }
  uint64_t handed_out() const { return handed_out_.load(); }

 private:
  PoolSocketServer() = default;
  void Serve();

  std::string path_;
  uint64_t pool_id_ = 0;
  uint64_t pool_bytes_ = 0;
  std::function<absl::StatusOr<int>()> export_fd_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<uint64_t> handed_out_{0};
  std::thread thread_;
};

// Connects to `path` and receives the pool's hello and descriptor, waiting at most
// `timeout_ms`. Unavailable when nothing answers there; DataLoss for a malformed hello.
absl::StatusOr<PoolHandle> ReceivePoolHandle(const std::string& path, int timeout_ms = 2000);

// This host's /proc/sys/kernel/random/boot_id (equal on both ends means the same host), or "".
std::string HostBootId();

}  // namespace kvstrata::transport

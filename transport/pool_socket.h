#pragma once

// The same-GPU transport's hand-over of the kvstore's HBM pool (docs/api.md#opentransfer): a
// Unix socket on which the store answers every connection with a 32-byte hello — the magic
// "KVSTRATA-POOL v1", then pool_id and pool_bytes as little-endian uint64 — and, in the same
// message, a file descriptor of the pool (SCM_RIGHTS) that the client imports with CUDA's VMM
// API and maps once. The socket file is created mode 0600: only processes of the store's user
// may map its pages. No CUDA here; the descriptor is whatever the store's provider returns.
//
// A client that reads pages in place (where they lie in the pool, for as long as its requests
// need them) then keeps the connection open as a *holder*: it sends the 16 bytes
// "KVSTRATA-HOLD v1" and receives an 8-byte little-endian holder token (0: the store holds no
// leases for connections). Leases the client ties to that token (OpenTransferRequest.pool_holder)
// last while the connection is open, with no expiry, and end when it closes — when the client
// process exits, whatever the reason. A client that only copies pages closes after the hello.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

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

inline constexpr char kPoolHoldRequest[] = "KVSTRATA-HOLD v1";  // 16 bytes, no NUL sent
inline constexpr size_t kPoolHoldRequestBytes = 16;

class PoolSocketServer {
 public:
  // Told of holder connections, on the server's thread: open = true when a connection becomes
  // a holder with `holder`, false when it closes.
  using HolderListener = std::function<void(uint64_t holder, bool open)>;

  // Serves on `path` (an existing socket file there is replaced). `export_fd` makes a new
  // descriptor per connection (closed here after sending). Errors name the path.
  static absl::StatusOr<std::unique_ptr<PoolSocketServer>> Start(
      const std::string& path, uint64_t pool_id, uint64_t pool_bytes,
      std::function<absl::StatusOr<int>()> export_fd);
  ~PoolSocketServer();  // stops serving and removes the socket file

  const std::string& path() const { return path_; }
  uint64_t handed_out() const { return handed_out_.load(); }
  // Connections that hold (became holders and are still open).
  int holders() const { return holders_.load(); }
  // Until a listener is set, a hold request is answered with holder 0 (no leases held). Set it
  // once, before the store hands out leases.
  void SetHolderListener(HolderListener listener);

  // Connections kept open at most; beyond, a client gets its hello and descriptor and the
  // connection is closed (it can copy pages, not hold them).
  static constexpr int kMaxConnections = 1024;

 private:
  struct Connection;
  PoolSocketServer() = default;
  void Serve();
  // Hands the hello and a descriptor to a new connection; false when that failed.
  bool HandOut(int conn);
  // Reads what a connection sent; false when it is to be closed.
  bool ReadFrom(Connection& c);
  void Close(Connection& c);

  std::string path_;
  uint64_t pool_id_ = 0;
  uint64_t pool_bytes_ = 0;
  std::function<absl::StatusOr<int>()> export_fd_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  std::atomic<uint64_t> handed_out_{0};
  std::atomic<int> holders_{0};
  std::mutex listener_mu_;
  HolderListener listener_;
  std::thread thread_;
};

// Connects to `path` and receives the pool's hello and descriptor, waiting at most
// `timeout_ms`. Unavailable when nothing answers there; DataLoss for a malformed hello.
absl::StatusOr<PoolHandle> ReceivePoolHandle(const std::string& path, int timeout_ms = 2000);

// A holder connection to a pool socket (see the top of this file): open while this object
// lives. Thread-safe.
class PoolHolder {
 public:
  ~PoolHolder();  // closes the connection: the store drops the leases tied to it
  PoolHolder(const PoolHolder&) = delete;
  PoolHolder& operator=(const PoolHolder&) = delete;

  // The token to tie leases to; 0 when the store holds none for this connection (a store older
  // than holders, or one not ready for them): its pages can then be copied, not read in place.
  uint64_t holder() const { return holder_; }
  // False once the store's end has closed (the store stopped: its pool is no longer its own,
  // and a new store has a new pool). Does not block.
  bool open() const;

 private:
  friend absl::StatusOr<std::pair<PoolHandle, std::unique_ptr<PoolHolder>>> ConnectPoolHolder(
      const std::string& path, int timeout_ms);
  PoolHolder(int fd, uint64_t holder) : fd_(fd), holder_(holder) {}
  int fd_;
  uint64_t holder_;
};

// ReceivePoolHandle, then a hold request on the same connection, kept open in the PoolHolder.
// Errors as ReceivePoolHandle; a store that does not answer the hold request gives holder 0.
absl::StatusOr<std::pair<PoolHandle, std::unique_ptr<PoolHolder>>> ConnectPoolHolder(
    const std::string& path, int timeout_ms = 2000);

// This host's /proc/sys/kernel/random/boot_id (equal on both ends means the same host), or "".
std::string HostBootId();

}  // namespace kvstrata::transport

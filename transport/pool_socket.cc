#include "transport/pool_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvstrata::transport {
namespace {

constexpr char kMagic[16] = {'K', 'V', 'S', 'T', 'R', 'A', 'T', 'A',
                             '-', 'P', 'O', 'O', 'L', ' ', 'v', '1'};

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", strerror(errno)));
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("pool socket path '", path, "': must be 1..",
                                                   sizeof(addr.sun_path) - 1, " characters"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

void PutLe64(uint8_t* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe64(const uint8_t* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{in[i]} << (8 * i);
  return v;
}

}  // namespace

std::string EncodePoolHello(const PoolHello& hello) {
  std::string bytes(kPoolHelloBytes, '\0');
  uint8_t* out = reinterpret_cast<uint8_t*>(bytes.data());
  std::memcpy(out, kMagic, sizeof(kMagic));
  PutLe64(out + 16, hello.pool_id);
  PutLe64(out + 24, hello.pool_bytes);
  return bytes;
}

absl::StatusOr<PoolHello> ParsePoolHello(absl::string_view bytes) {
  if (bytes.size() != kPoolHelloBytes) {
    return absl::DataLossError(
        absl::StrCat("not a kvstrata pool hello: ", bytes.size(), " bytes, not ", kPoolHelloBytes));
  }
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError("not a kvstrata pool hello: no magic");
  }
  const uint8_t* in = reinterpret_cast<const uint8_t*>(bytes.data());
  const PoolHello hello{.pool_id = GetLe64(in + 16), .pool_bytes = GetLe64(in + 24)};
  // The importer sizes its mapping, and bounds every placement, by an int64 (CUDA's VMM API).
  if (hello.pool_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::DataLossError(
        absl::StrCat("not a kvstrata pool hello: a pool of ", hello.pool_bytes, " bytes"));
  }
  return hello;
}

absl::StatusOr<std::unique_ptr<PoolSocketServer>> PoolSocketServer::Start(
    const std::string& path, uint64_t pool_id, uint64_t pool_bytes,
    std::function<absl::StatusOr<int>()> export_fd) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<PoolSocketServer> server(new PoolSocketServer);
  server->path_ = path;
  server->pool_id_ = pool_id;
  server->pool_bytes_ = pool_bytes;
  server->export_fd_ = std::move(export_fd);
  server->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0) return Errno("socket(AF_UNIX)");
  unlink(path.c_str());
  const mode_t old_mask = umask(0177);  // the socket file: 0600
  const int bound = bind(server->listen_fd_, reinterpret_cast<const sockaddr*>(&*addr),
                         sizeof(sockaddr_un));
  umask(old_mask);
  if (bound != 0) return Errno(absl::StrCat("bind ", path));
  if (listen(server->listen_fd_, 64) != 0) return Errno(absl::StrCat("listen ", path));
  if (pipe2(server->wake_, O_CLOEXEC) != 0) return Errno("pipe");
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

PoolSocketServer::~PoolSocketServer() {
  if (wake_[1] >= 0) {
    const char c = 'x';
    (void)!write(wake_[1], &c, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) close(fd);
  }
  if (!path_.empty()) unlink(path_.c_str());
}

struct PoolSocketServer::Connection {
  int fd = -1;
  uint64_t holder = 0;   // nonzero once the client asked to hold and a listener took it
  std::string received;  // a hold request's bytes so far
  bool asked = false;    // the hold request came (answered, holder or not)
};

void PoolSocketServer::SetHolderListener(HolderListener listener) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(listener);
}

bool PoolSocketServer::HandOut(int conn) {
  absl::StatusOr<int> fd = export_fd_();
  if (!fd.ok()) {
    fprintf(stderr, "kvstore: pool socket %s: cannot export the pool: %s\n", path_.c_str(),
            std::string(fd.status().message()).c_str());
    return false;
  }
  std::string hello = EncodePoolHello({.pool_id = pool_id_, .pool_bytes = pool_bytes_});
  iovec iov{hello.data(), hello.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &*fd, sizeof(int));
  const bool sent = sendmsg(conn, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size());
  if (sent) ++handed_out_;
  close(*fd);
  return sent;
}

bool PoolSocketServer::ReadFrom(Connection& c) {
  char buf[64];
  const ssize_t n = recv(c.fd, buf, sizeof(buf), MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;  // else: reset
  if (n == 0) return false;                                                     // the client closed
  // A holder sends nothing after its request: anything else ends the connection.
  if (c.asked) return false;
  c.received.append(buf, static_cast<size_t>(n));
  if (c.received.size() < kPoolHoldRequestBytes) {
    return std::memcmp(c.received.data(), kPoolHoldRequest, c.received.size()) == 0;
  }
  if (c.received.size() != kPoolHoldRequestBytes ||
      std::memcmp(c.received.data(), kPoolHoldRequest, kPoolHoldRequestBytes) != 0) {
    return false;
  }
  c.asked = true;
  uint64_t holder = 0;
  {
    std::lock_guard<std::mutex> lock(listener_mu_);
    if (listener_) {
      std::random_device random;
      while (holder == 0) holder = uint64_t{random()} << 32 | random();
      listener_(holder, true);
    }
  }
  uint8_t answer[8];
  PutLe64(answer, holder);
  if (send(c.fd, answer, sizeof(answer), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(answer))) {
    c.holder = holder;  // told the listener: Close tells it the connection is gone
    return false;
  }
  c.holder = holder;
  return true;
}

void PoolSocketServer::Close(Connection& c) {
  if (c.holder != 0) {
    std::lock_guard<std::mutex> lock(listener_mu_);
    if (listener_) listener_(c.holder, false);
  }
  close(c.fd);
  c.fd = -1;
}

void PoolSocketServer::Serve() {
  std::vector<Connection> conns;
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}});
    for (const Connection& c : conns) fds.push_back({c.fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    for (size_t i = 0; i < conns.size(); ++i) {
      if (fds[i + 2].revents == 0) continue;
      if (!ReadFrom(conns[i])) Close(conns[i]);
    }
    std::erase_if(conns, [](const Connection& c) { return c.fd < 0; });
    holders_.store(static_cast<int>(
        std::count_if(conns.begin(), conns.end(), [](const Connection& c) { return c.holder; })));
    if (fds[0].revents != 0) {
      const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      if (!HandOut(conn) || static_cast<int>(conns.size()) >= kMaxConnections) {
        close(conn);
        continue;
      }
      conns.push_back({.fd = conn});
    }
  }
  for (Connection& c : conns) close(c.fd);  // stopping: the store goes with its leases
}

namespace {

// Connects to `path` and receives the hello and the descriptor; the connected socket in *sock.
absl::StatusOr<PoolHandle> Receive(const std::string& path, int timeout_ms, int* sock_out) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return Errno("socket(AF_UNIX)");
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{sock};
  if (connect(sock, reinterpret_cast<const sockaddr*>(&*addr), sizeof(sockaddr_un)) != 0) {
    return Errno(absl::StrCat("pool socket ", path));
  }
  pollfd pfd{sock, POLLIN, 0};
  if (poll(&pfd, 1, timeout_ms) <= 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("pool socket ", path, ": no answer within ", timeout_ms, " ms"));
  }
  char hello[kPoolHelloBytes];
  iovec iov{hello, sizeof(hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  int fd = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    }
  }
  absl::StatusOr<PoolHello> parsed =
      ParsePoolHello(absl::string_view(hello, n < 0 ? 0 : static_cast<size_t>(n)));
  if (!parsed.ok() || fd < 0) {
    if (fd >= 0) close(fd);
    return absl::DataLossError(absl::StrCat(
        "pool socket ", path, ": ",
        parsed.ok() ? "not a kvstrata pool hello: no descriptor" : parsed.status().message()));
  }
  if (sock_out != nullptr) {
    *sock_out = sock;
    closer.fd = -1;
  }
  return PoolHandle{.fd = fd, .pool_id = parsed->pool_id, .pool_bytes = parsed->pool_bytes};
}

}  // namespace

absl::StatusOr<PoolHandle> ReceivePoolHandle(const std::string& path, int timeout_ms) {
  return Receive(path, timeout_ms, nullptr);
}

absl::StatusOr<std::pair<PoolHandle, std::unique_ptr<PoolHolder>>> ConnectPoolHolder(
    const std::string& path, int timeout_ms) {
  int sock = -1;
  absl::StatusOr<PoolHandle> handle = Receive(path, timeout_ms, &sock);
  if (!handle.ok()) return handle.status();
  // The hold request; a store older than holders closes the connection after the hello, which
  // answers holder 0 below.
  uint64_t holder = 0;
  if (send(sock, kPoolHoldRequest, kPoolHoldRequestBytes, MSG_NOSIGNAL) ==
      static_cast<ssize_t>(kPoolHoldRequestBytes)) {
    uint8_t answer[8];
    size_t got = 0;
    while (got < sizeof(answer)) {
      pollfd pfd{sock, POLLIN, 0};
      if (poll(&pfd, 1, timeout_ms) <= 0) break;
      const ssize_t n = recv(sock, answer + got, sizeof(answer) - got, 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got == sizeof(answer)) holder = GetLe64(answer);
  }
  return std::make_pair(*handle, std::unique_ptr<PoolHolder>(new PoolHolder(sock, holder)));
}

PoolHolder::~PoolHolder() { close(fd_); }

bool PoolHolder::open() const {
  pollfd pfd{fd_, POLLIN, 0};
  if (poll(&pfd, 1, 0) <= 0) return true;  // nothing happened on it
  // The store sends nothing after the token: readable means closed (or reset).
  char c;
  return recv(fd_, &c, 1, MSG_DONTWAIT | MSG_PEEK) > 0;
}

std::string HostBootId() {
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f == nullptr) return "";
  char buf[64] = {};
  const size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  std::string id(buf, n);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

}  // namespace kvstrata::transport

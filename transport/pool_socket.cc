#include "transport/pool_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <limits>

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

void PoolSocketServer::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    absl::StatusOr<int> fd = export_fd_();
    if (!fd.ok()) {
      fprintf(stderr, "kvstore: pool socket %s: cannot export the pool: %s\n", path_.c_str(),
              std::string(fd.status().message()).c_str());
      close(conn);
      continue;
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
    if (sendmsg(conn, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size())) ++handed_out_;
    close(*fd);
    close(conn);
  }
}

absl::StatusOr<PoolHandle> ReceivePoolHandle(const std::string& path, int timeout_ms) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return Errno("socket(AF_UNIX)");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
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
  return PoolHandle{.fd = fd, .pool_id = parsed->pool_id, .pool_bytes = parsed->pool_bytes};
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

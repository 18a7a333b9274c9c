// The same-GPU pool hand-over without a GPU: a memfd stands for the pool's CUDA descriptor, so
// what is checked is the socket protocol — the hello, the descriptor arriving intact (its bytes
// read back through it), the socket file's mode, and the errors a client gets.

#include "transport/pool_socket.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kvstrata::transport {
namespace {

using ::testing::HasSubstr;

std::string TestPath(const char* name) {
  return absl::StrCat(::testing::TempDir(), "/", name, "-", getpid(), ".pool");
}

TEST(PoolSocket, HandsOutTheDescriptorWithTheHello) {
  const int memfd = memfd_create("pool", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  const std::string text = "pages of the pool";
  ASSERT_EQ(pwrite(memfd, text.data(), text.size(), 4096), static_cast<ssize_t>(text.size()));
  const std::string path = TestPath("hello");
  absl::StatusOr<std::unique_ptr<PoolSocketServer>> server = PoolSocketServer::Start(
      path, /*pool_id=*/0x1122334455667788ull, /*pool_bytes=*/1ull << 34,
      [memfd]() -> absl::StatusOr<int> { return dup(memfd); });
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<PoolHandle> handle = ReceivePoolHandle(path);
    ASSERT_TRUE(handle.ok()) << handle.status();
    EXPECT_EQ(handle->pool_id, 0x1122334455667788ull);
    EXPECT_EQ(handle->pool_bytes, 1ull << 34);
    std::string back(text.size(), '\0');
    EXPECT_EQ(pread(handle->fd, back.data(), back.size(), 4096),
              static_cast<ssize_t>(back.size()));
    EXPECT_EQ(back, text);
    close(handle->fd);
  }
  // The server counts a hand-over after its send returns, which may be after the client read.
  for (int i = 0; i < 100 && (*server)->handed_out() < 3; ++i) usleep(10000);
  EXPECT_EQ((*server)->handed_out(), 3u);
  server->reset();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the socket file is removed on stop";
  close(memfd);
}

// What a holder listener heard, in order, from the server's thread.
struct HolderEvents {
  std::mutex mu;
  std::vector<std::pair<uint64_t, bool>> seen;
  PoolSocketServer::HolderListener Listener() {
    return [this](uint64_t holder, bool open) {
      std::lock_guard<std::mutex> lock(mu);
      seen.emplace_back(holder, open);
    };
  }
  std::vector<std::pair<uint64_t, bool>> Get() {
    std::lock_guard<std::mutex> lock(mu);
    return seen;
  }
  // Polls until `n` events came (the server tells them on its own thread), at most 2 s.
  std::vector<std::pair<uint64_t, bool>> WaitFor(size_t n) {
    for (int i = 0; i < 200 && Get().size() < n; ++i) usleep(10000);
    return Get();
  }
};

std::unique_ptr<PoolSocketServer> StartMemfdServer(const std::string& path, int memfd) {
  absl::StatusOr<std::unique_ptr<PoolSocketServer>> server =
      PoolSocketServer::Start(path, /*pool_id=*/7, /*pool_bytes=*/4096,
                              [memfd]() -> absl::StatusOr<int> { return dup(memfd); });
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

TEST(PoolHolder, AHolderIsToldToTheListenerWhileItsConnectionIsOpen) {
  const int memfd = memfd_create("pool", MFD_CLOEXEC);
  const std::string path = TestPath("holder");
  std::unique_ptr<PoolSocketServer> server = StartMemfdServer(path, memfd);
  ASSERT_NE(server, nullptr);
  HolderEvents events;
  server->SetHolderListener(events.Listener());
  auto held = ConnectPoolHolder(path);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->first.pool_id, 7u);
  close(held->first.fd);
  const uint64_t holder = held->second->holder();
  EXPECT_NE(holder, 0u);
  EXPECT_TRUE(held->second->open());
  ASSERT_EQ(events.WaitFor(1), (std::vector<std::pair<uint64_t, bool>>{{holder, true}}));
  for (int i = 0; i < 200 && server->holders() != 1; ++i) usleep(10000);
  EXPECT_EQ(server->holders(), 1);
  // A second holder gets a token of its own; a plain client changes nothing.
  auto other = ConnectPoolHolder(path);
  ASSERT_TRUE(other.ok()) << other.status();
  close(other->first.fd);
  EXPECT_NE(other->second->holder(), holder);
  absl::StatusOr<PoolHandle> plain = ReceivePoolHandle(path);
  ASSERT_TRUE(plain.ok()) << plain.status();
  close(plain->fd);
  ASSERT_EQ(events.WaitFor(2).size(), 2u);
  // Closing a holder's connection (its process exiting does the same) tells the listener.
  held->second.reset();
  const auto seen = events.WaitFor(3);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[2], std::make_pair(holder, false));
  server.reset();
  close(memfd);
}

TEST(PoolHolder, WithoutAListenerTheHolderIsZeroAndThePoolStillComes) {
  const int memfd = memfd_create("pool", MFD_CLOEXEC);
  const std::string path = TestPath("nolistener");
  std::unique_ptr<PoolSocketServer> server = StartMemfdServer(path, memfd);
  ASSERT_NE(server, nullptr);
  auto held = ConnectPoolHolder(path);
  ASSERT_TRUE(held.ok()) << held.status();
  close(held->first.fd);
  EXPECT_EQ(held->second->holder(), 0u);
  server.reset();
  close(memfd);
}

TEST(PoolHolder, AHolderSeesTheStoreGo) {
  const int memfd = memfd_create("pool", MFD_CLOEXEC);
  const std::string path = TestPath("storegoes");
  std::unique_ptr<PoolSocketServer> server = StartMemfdServer(path, memfd);
  ASSERT_NE(server, nullptr);
  HolderEvents events;
  server->SetHolderListener(events.Listener());
  auto held = ConnectPoolHolder(path);
  ASSERT_TRUE(held.ok()) << held.status();
  close(held->first.fd);
  EXPECT_TRUE(held->second->open());
  server.reset();
  EXPECT_FALSE(held->second->open());
  close(memfd);
}

TEST(PoolHolder, AClientSendingAnythingElseIsClosedAndHoldsNothing) {
  const int memfd = memfd_create("pool", MFD_CLOEXEC);
  const std::string path = TestPath("junk");
  std::unique_ptr<PoolSocketServer> server = StartMemfdServer(path, memfd);
  ASSERT_NE(server, nullptr);
  HolderEvents events;
  server->SetHolderListener(events.Listener());
  const int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  ASSERT_EQ(connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  char hello[64];
  ASSERT_EQ(recv(sock, hello, sizeof(hello), 0), static_cast<ssize_t>(kPoolHelloBytes));
  const char junk[] = "GET / HTTP/1.1\r\n";
  ASSERT_GT(send(sock, junk, sizeof(junk) - 1, MSG_NOSIGNAL), 0);
  pollfd pfd{sock, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 2000), 1);
  EXPECT_EQ(recv(sock, hello, sizeof(hello), 0), 0) << "the server closes the connection";
  EXPECT_TRUE(events.Get().empty());
  close(sock);
  server.reset();
  close(memfd);
}

TEST(PoolHello, RoundTripsAndIsLittleEndian) {
  const std::string bytes =
      EncodePoolHello({.pool_id = 0x1122334455667788ull, .pool_bytes = 1ull << 34});
  ASSERT_EQ(bytes.size(), kPoolHelloBytes);
  EXPECT_EQ(bytes.substr(0, 16), "KVSTRATA-POOL v1");
  EXPECT_EQ(bytes[16], '\x88');
  EXPECT_EQ(bytes[23], '\x11');
  EXPECT_EQ(bytes[28], '\x04');  // 1 << 34
  absl::StatusOr<PoolHello> hello = ParsePoolHello(bytes);
  ASSERT_TRUE(hello.ok()) << hello.status();
  EXPECT_EQ(hello->pool_id, 0x1122334455667788ull);
  EXPECT_EQ(hello->pool_bytes, 1ull << 34);
}

TEST(PoolHello, AMalformedHelloIsDataLoss) {
  const std::string good = EncodePoolHello({.pool_id = 1, .pool_bytes = 4096});
  for (const std::string& bad :
       {std::string(), good.substr(0, 31), good + "x", "kvstrata-pool v1" + good.substr(16),
        EncodePoolHello({.pool_id = 1, .pool_bytes = 1ull << 63})}) {
    absl::StatusOr<PoolHello> hello = ParsePoolHello(bad);
    EXPECT_EQ(hello.status().code(), absl::StatusCode::kDataLoss) << bad.size();
    EXPECT_THAT(hello.status().message(), HasSubstr("not a kvstrata pool hello"));
  }
}

TEST(PoolSocket, NothingListeningIsUnavailable) {
  absl::StatusOr<PoolHandle> handle = ReceivePoolHandle(TestPath("absent"));
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(handle.status().message(), HasSubstr("absent"));
  EXPECT_EQ(ReceivePoolHandle(std::string(200, 'x')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A listening Unix socket at `path` that is not a kvstore's.
int Listen(const std::string& path) {
  const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, path.c_str());
  unlink(path.c_str());
  EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(listen(listener, 4), 0);
  return listener;
}

TEST(PoolSocket, ASilentPeerTimesOut) {
  const std::string path = TestPath("silent");
  const int listener = Listen(path);
  absl::StatusOr<PoolHandle> silent = ReceivePoolHandle(path, /*timeout_ms=*/100);
  EXPECT_EQ(silent.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(silent.status().message(), HasSubstr("100 ms"));
  close(listener);
  unlink(path.c_str());
}

TEST(PoolSocket, APeerThatIsNotAPoolIsDataLoss) {
  const std::string path = TestPath("impostor");
  const int listener = Listen(path);
  std::thread impostor([&] {
    const int conn = accept(listener, nullptr, nullptr);
    const char junk[32] = "HTTP/1.1 200 OK";
    (void)!write(conn, junk, sizeof(junk));
    close(conn);
  });
  absl::StatusOr<PoolHandle> handle = ReceivePoolHandle(path, 2000);
  impostor.join();
  EXPECT_EQ(handle.status().code(), absl::StatusCode::kDataLoss) << handle.status();
  EXPECT_THAT(handle.status().message(), HasSubstr("not a kvstrata pool"));
  close(listener);
  unlink(path.c_str());
}

}  // namespace
}  // namespace kvstrata::transport

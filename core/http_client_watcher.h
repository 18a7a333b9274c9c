#pragma once

// Inside the HTTP server (core/http_server.h): the state of one request (Exchange) and the
// thread that notices when the client behind a request hangs up (ClientWatcher). Nothing outside
// http_server.cc uses it.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"

namespace kvstrata::http {

// One request, from its headers until libmicrohttpd reports it complete.
class Exchange {
 public:
  std::string method;
  std::string path;
  std::string body;
  bool body_too_large = false;
  bool answered = false;  // a response is queued

  // Stores `cancel`, or runs it at once when the client is already gone.
  void SetCancel(std::function<void()> cancel);
  // The client is gone: runs the stored callback once; later SetCancel calls run theirs at once.
  void Gone();

 private:
  std::mutex mu_;
  std::function<void()> cancel_;  // guarded by mu_
  bool gone_ = false;             // guarded by mu_
};

// Polls the sockets of requests in flight for a hang-up (POLLRDHUP, POLLHUP, POLLERR) and calls
// Exchange::Gone for each, within about 50 ms. Only the peer's end of the socket is watched: the
// watcher never reads, so a pipelined next request is left for the server.
//
// Thread-safe. A socket is watched from Watch until Unwatch, which the server calls before the
// socket can be closed, so a reused descriptor is never mistaken for a watched one.
class ClientWatcher {
 public:
  ClientWatcher();
  ~ClientWatcher();

  void Watch(int fd, Exchange* exchange);
  // After it returns the watcher no longer touches `exchange`.
  void Unwatch(Exchange* exchange);
  // Every watched request is gone (the server stops), and so is every one watched from now on.
  void AllGone();

 private:
  struct Entry {
    int fd;
    uint64_t id;  // tells a registration from a later one of the same Exchange address
    bool fired;
  };
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  absl::flat_hash_map<Exchange*, Entry> watched_;  // guarded by mu_
  uint64_t next_id_ = 1;                           // guarded by mu_
  bool all_gone_ = false;                          // guarded by mu_
  bool stop_ = false;                              // guarded by mu_
  std::thread thread_;
};

}  // namespace kvstrata::http

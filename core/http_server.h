#pragma once

// The one HTTP/1.1 server of kvstrata's processes (/metrics everywhere, the router's
// OpenAI-compatible front), on GNU libmicrohttpd with one thread per connection: a handler may
// block for as long as its request runs (a model call), and a streamed body is produced by
// blocking calls too.
//
// Why libmicrohttpd: it hands out each connection's socket, so one watcher thread polls the
// sockets of the requests in flight for a hang-up and runs that request's OnClientGone callback
// at once, even while it waits in a queue or prefills a long prompt and writes nothing (civetweb
// would only notice at the next write). And it lets the caller size its threads' stacks:
// civetweb's are fixed at 100 KiB when built, and glibc carves the process's static
// thread-local storage out of each thread's stack, so in a decode worker linked with OpenBLAS and
// the CUDA runtime /metrics failed to start (HttpServerOptions::thread_stack_bytes).
//
// Limits: at most max_connections open connections (one thread each; libmicrohttpd refuses
// connections beyond it), request bodies up to max_body_bytes (413 beyond), and idle keep-alive
// connections closed after idle_timeout.
//
// Thread-safety: Start, port and Stop from one owning thread; the handler runs concurrently on
// the connection threads.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

struct MHD_Connection;
struct MHD_Daemon;

namespace kvstrata::http {

struct HttpServerOptions {
  // Address to bind: an IPv4 or IPv6 literal or a host name ("0.0.0.0", "::", "localhost").
  std::string host = "127.0.0.1";
  // 0: a free port, reported by port().
  int port = 0;
  // Open connections (each one thread) before new ones are refused.
  int max_connections = 2048;
  // Largest request body; a larger one is answered 413 without being read.
  int64_t max_body_bytes = int64_t{8} << 20;
  // A keep-alive connection with no request for this long is closed. 0: never.
  absl::Duration idle_timeout = absl::Seconds(60);
  // Stack of each connection thread, of which glibc takes the process's static thread-local
  // storage (about 70 KiB in a CUDA build). Set rather than left to RLIMIT_STACK, so a small
  // `ulimit -s` cannot starve a handler and a large one does not reserve 8 MiB per connection.
  size_t thread_stack_bytes = size_t{1} << 20;
};

// The body of a streamed response, pulled piece by piece on the connection's thread.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Blocks until the next piece is ready and stores it in `chunk`; false when the body is
  // complete. `aborted` set on return false means the body is broken off (the connection is
  // closed without the end marker, so the client sees an incomplete response).
  virtual bool Next(std::string* chunk, bool* aborted) = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;  // sent when stream is null
  std::vector<std::pair<std::string, std::string>> headers;
  // Non-null: the body is sent chunked, as the source produces it.
  std::unique_ptr<ChunkSource> stream;
};

class Exchange;

// One request as the handler sees it. Valid only during the handler call.
class HttpRequest {
 public:
  HttpRequest(Exchange* exchange, MHD_Connection* connection)
      : exchange_(exchange), connection_(connection) {}
  const std::string& method() const;
  // The path without the query string ("/v1/completions").
  const std::string& path() const;
  const std::string& body() const;
  // The body was over max_body_bytes and was not read: answer 413.
  bool body_too_large() const;
  // A request header (case-insensitive name), or nullopt.
  std::optional<std::string> Header(const char* name) const;
  // `cancel` runs once, on another thread, if the client hangs up (or the server stops) before
  // the response is complete, including while a streamed body is being produced: it must only
  // signal (e.g. cancel an RPC), not block. Registering again replaces it; if the client is
  // already gone it runs at once.
  void OnClientGone(std::function<void()> cancel);

 private:
  Exchange* const exchange_;
  MHD_Connection* const connection_;
};

using Handler = std::function<HttpResponse(HttpRequest&)>;

class ClientWatcher;

class HttpServer {
 public:
  // Binds and starts serving. InvalidArgument for a bad option, Unavailable when the address
  // cannot be bound; both name the address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           Handler handler);
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer();  // Stop()

  int port() const { return port_; }

  // Stops accepting connections; requests in flight go on. Idempotent.
  void StopAccepting();
  // Stops accepting, runs the OnClientGone callback of every request in flight, closes every
  // connection and joins their threads. Idempotent.
  void Stop();

 private:
  HttpServer(HttpServerOptions options, Handler handler);

  friend struct MhdCallbacks;

  const HttpServerOptions options_;
  const Handler handler_;
  std::unique_ptr<ClientWatcher> watcher_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
  bool accepting_ = true;
};

}  // namespace kvstrata::http

#include "core/http_server.h"

#include <microhttpd.h>
#include <netdb.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/http_client_watcher.h"

namespace kvstrata::http {

const std::string& HttpRequest::method() const { return exchange_->method; }
const std::string& HttpRequest::path() const { return exchange_->path; }
const std::string& HttpRequest::body() const { return exchange_->body; }
bool HttpRequest::body_too_large() const { return exchange_->body_too_large; }

std::optional<std::string> HttpRequest::Header(const char* name) const {
  const char* v = MHD_lookup_connection_value(connection_, MHD_HEADER_KIND, name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

void HttpRequest::OnClientGone(std::function<void()> cancel) {
  exchange_->SetCancel(std::move(cancel));
}

namespace {

// Below this a connection thread may not even start once static TLS is taken out of it.
constexpr size_t kMinThreadStack = size_t{256} << 10;

// A streamed body as libmicrohttpd pulls it.
struct StreamState {
  std::unique_ptr<ChunkSource> source;
  std::string pending;
  size_t offset = 0;
};

ssize_t ReadStream(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
  auto* s = static_cast<StreamState*>(cls);
  while (s->offset == s->pending.size()) {
    s->pending.clear();
    s->offset = 0;
    bool aborted = false;
    if (!s->source->Next(&s->pending, &aborted)) {
      return aborted ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
  }
  const size_t n = std::min(max, s->pending.size() - s->offset);
  memcpy(buf, s->pending.data() + s->offset, n);
  s->offset += n;
  return static_cast<ssize_t>(n);
}

void FreeStream(void* cls) { delete static_cast<StreamState*>(cls); }

MHD_Result Queue(MHD_Connection* connection, HttpResponse response) {
  MHD_Response* r;
  if (response.stream != nullptr) {
    auto* state = new StreamState{.source = std::move(response.stream)};
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, /*block_size=*/16 << 10, &ReadStream,
                                          state, &FreeStream);
    if (r == nullptr) delete state;
  } else {
    r = MHD_create_response_from_buffer(response.body.size(), response.body.data(),
                                        MHD_RESPMEM_MUST_COPY);
  }
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, response.content_type.c_str());
  for (const auto& [name, value] : response.headers) {
    MHD_add_response_header(r, name.c_str(), value.c_str());
  }
  const MHD_Result result =
      MHD_queue_response(connection, static_cast<unsigned>(response.status), r);
  MHD_destroy_response(r);
  return result;
}

void LogMhd(void* /*cls*/, const char* format, va_list args) {
  char line[512];
  vsnprintf(line, sizeof(line), format, args);
  const size_t n = strlen(line);
  fprintf(stderr, "kvstrata: http: %s%s", line, n > 0 && line[n - 1] == '\n' ? "" : "\n");
}

}  // namespace

struct MhdCallbacks {
  static MHD_Result Access(void* cls, MHD_Connection* connection, const char* url,
                           const char* method, const char* /*version*/, const char* upload_data,
                           size_t* upload_data_size, void** con_cls) {
    auto* server = static_cast<HttpServer*>(cls);
    auto* exchange = static_cast<Exchange*>(*con_cls);
    if (exchange == nullptr) {  // the headers arrived
      exchange = new Exchange;
      exchange->method = method;
      exchange->path = url;
      *con_cls = exchange;
      const char* length =
          MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
      int64_t n = 0;
      if (length != nullptr && absl::SimpleAtoi(length, &n) &&
          n > server->options_.max_body_bytes) {
        exchange->body_too_large = true;
        // A client waiting for "100 Continue" gets the answer instead and sends no body. One
        // that sends it anyway has it read and dropped: closing the connection under a client
        // still writing would make it see a broken pipe rather than the 413.
        const char* expect =
            MHD_lookup_connection_value(connection, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        if (expect != nullptr && strcasecmp(expect, "100-continue") == 0) {
          return Handle(server, connection, exchange);
        }
      }
      return MHD_YES;
    }
    if (*upload_data_size > 0) {
      if (!exchange->body_too_large && !exchange->answered) {
        if (static_cast<int64_t>(exchange->body.size() + *upload_data_size) >
            server->options_.max_body_bytes) {
          exchange->body_too_large = true;
          exchange->body.clear();
          exchange->body.shrink_to_fit();
        } else {
          exchange->body.append(upload_data, *upload_data_size);
        }
      }
      *upload_data_size = 0;
      return MHD_YES;
    }
    if (exchange->answered) return MHD_YES;
    return Handle(server, connection, exchange);
  }

  static MHD_Result Handle(HttpServer* server, MHD_Connection* connection, Exchange* exchange) {
    exchange->answered = true;
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info != nullptr) server->watcher_->Watch(info->connect_fd, exchange);
    HttpRequest request(exchange, connection);
    return Queue(connection, server->handler_(request));
  }

  static void Completed(void* cls, MHD_Connection* /*connection*/, void** con_cls,
                        MHD_RequestTerminationCode code) {
    auto* server = static_cast<HttpServer*>(cls);
    auto* exchange = static_cast<Exchange*>(*con_cls);
    if (exchange == nullptr) return;
    server->watcher_->Unwatch(exchange);
    // A response broken off (write failed, timeout, shutdown): whatever still runs for it stops.
    if (code != MHD_REQUEST_TERMINATED_COMPLETED_OK) exchange->Gone();
    delete exchange;
    *con_cls = nullptr;
  }
};

HttpServer::HttpServer(HttpServerOptions options, Handler handler)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      watcher_(std::make_unique<ClientWatcher>()) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              Handler handler) {
  const std::string where = absl::StrCat(options.host, " port ", options.port);
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": port must be in [0, 65535]"));
  }
  if (options.max_connections < 1 || options.max_body_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": max_connections and max_body_bytes must be >= 1"));
  }
  if (options.thread_stack_bytes < kMinThreadStack) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": thread_stack_bytes must be >= ", kMinThreadStack));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options.port);
  if (int rc = getaddrinfo(options.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", gai_strerror(rc)));
  }
  sockaddr_storage address{};
  memcpy(&address, found->ai_addr, found->ai_addrlen);
  const bool ipv6 = found->ai_family == AF_INET6;
  freeaddrinfo(found);

  std::unique_ptr<HttpServer> server(new HttpServer(options, std::move(handler)));
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO |
                   MHD_USE_ITC | MHD_USE_ERROR_LOG;
  if (ipv6) flags |= MHD_USE_IPv6;
  server->daemon_ = MHD_start_daemon(
      flags, static_cast<uint16_t>(options.port), nullptr, nullptr, &MhdCallbacks::Access,
      server.get(), MHD_OPTION_EXTERNAL_LOGGER, &LogMhd, nullptr, MHD_OPTION_SOCK_ADDR,
      reinterpret_cast<sockaddr*>(&address), MHD_OPTION_CONNECTION_LIMIT,
      static_cast<unsigned>(options.max_connections), MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned>(absl::ToInt64Seconds(options.idle_timeout)),
      MHD_OPTION_THREAD_STACK_SIZE, options.thread_stack_bytes, MHD_OPTION_NOTIFY_COMPLETED,
      &MhdCallbacks::Completed, server.get(), MHD_OPTION_END);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(where, ": cannot serve HTTP there (address in use or not local?)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr ? info->port : options.port;
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::StopAccepting() {
  if (daemon_ == nullptr || !accepting_) return;
  accepting_ = false;
  const MHD_socket listener = MHD_quiesce_daemon(daemon_);
  if (listener != MHD_INVALID_SOCKET) close(listener);
}

void HttpServer::Stop() {
  if (daemon_ == nullptr) return;
  StopAccepting();
  watcher_->AllGone();
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
}

}  // namespace kvstrata::http

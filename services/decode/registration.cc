#include "services/decode/registration.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace kvstrata::decode {
namespace {

float Rate(int64_t delta, absl::Duration elapsed) {
  const double seconds = absl::ToDoubleSeconds(elapsed);
  return seconds > 0 ? static_cast<float>(std::max<int64_t>(0, delta) / seconds) : 0.0f;
}

}  // namespace

uint64_t NewIncarnation() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(absl::IntervalClosed, gen, 1, UINT64_MAX);
}

RouterRegistration::RouterRegistration(const RouterRegistrationOptions& options,
                                       LocalPageCache* local_pages,
                                       std::function<WorkerLoadSample()> load)
    : options_(options),
      local_pages_(local_pages),
      load_(std::move(load)),
      stub_(v1::WorkerRegistry::NewStub(
          options.dial
              ? options.dial(options.router_address)
              : grpc::CreateChannel(options.router_address, grpc::InsecureChannelCredentials()))),
      interval_(options.initial_interval) {
  if (options_.worker.incarnation() == 0) options_.worker.set_incarnation(NewIncarnation());
  thread_ = std::thread([this] { Loop(); });
}

RouterRegistration::~RouterRegistration() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RouterRegistration::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    drain_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void RouterRegistration::NoteReachable(bool reachable, const std::string& what) {
  const int state = reachable ? 1 : 0;
  if (state == reachable_) return;
  reachable_ = state;
  fprintf(stderr, "kvstrata-decode: router %s: %s\n", options_.router_address.c_str(),
          what.c_str());
}

void RouterRegistration::Loop() {
  last_sample_time_ = absl::Now();
  last_sample_ = load_();
  bool drain = false;
  for (;;) {
    if (!registered_) {
      Register();
    } else {
      Heartbeat(/*draining=*/false);
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(interval_), [&] { return stopping_; });
    if (stopping_) {
      drain = drain_;
      break;
    }
  }
  if (drain && registered_) Heartbeat(/*draining=*/true);
}

bool RouterRegistration::Register() {
  v1::RegisterWorkerRequest request = options_.worker;
  if (local_pages_ != nullptr) {
    // The snapshot is a checkpoint: from here the journal holds changes relative to it.
    for (const PageKey& key : local_pages_->TakeSnapshot(options_.journal))
      request.add_local_page_keys(key.ToBytes());
  }
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + std::min(options_.rpc_deadline, interval_ / 2)));
  v1::RegisterWorkerResponse response;
  const grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  if (!status.ok()) {
    NoteReachable(
        false, absl::StrCat("RegisterWorker failed (", status.error_code(), ": ",
                            status.error_message(), "); serving anyway, retrying every interval"));
    return false;
  }
  if (response.heartbeat_interval_ms() > 0) {
    interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  }
  registered_ = true;
  ++registrations_;
  reachable_ = 1;
  fprintf(stderr,
          "kvstrata-decode: registered with router %s (%s) as %s incarnation %llu at %s with "
          "%d local page keys; heartbeat every %s\n",
          options_.router_address.c_str(), response.router_id().c_str(),
          request.worker_id().c_str(), static_cast<unsigned long long>(request.incarnation()),
          request.address().c_str(), request.local_page_keys_size(),
          absl::FormatDuration(interval_).c_str());
  return true;
}

bool RouterRegistration::Heartbeat(bool draining) {
  PageKeyChanges changes;
  if (local_pages_ != nullptr) changes = local_pages_->TakeChanges(options_.journal);
  if (changes.overflowed && !draining) {
    fprintf(stderr,
            "kvstrata-decode: router %s: too many local page changes for a heartbeat; "
            "registering again with a full snapshot\n",
            options_.router_address.c_str());
    registered_ = false;
    return Register();
  }
  v1::HeartbeatRequest request;
  request.set_worker_id(options_.worker.worker_id());
  request.set_incarnation(options_.worker.incarnation());
  const WorkerLoadSample sample = load_();
  const absl::Time now = absl::Now();
  v1::WorkerLoad* load = request.mutable_load();
  load->set_running_requests(static_cast<uint32_t>(std::max(0, sample.running_requests)));
  load->set_waiting_requests(static_cast<uint32_t>(std::max(0, sample.waiting_requests)));
  load->set_free_pages(static_cast<uint64_t>(std::max<int64_t>(0, sample.free_pages)));
  load->set_total_pages(static_cast<uint64_t>(std::max<int64_t>(0, sample.total_pages)));
  load->set_decode_tokens_per_second(
      Rate(sample.generated_tokens - last_sample_.generated_tokens, now - last_sample_time_));
  load->set_prefill_tokens_per_second(
      Rate(sample.prefilled_tokens - last_sample_.prefilled_tokens, now - last_sample_time_));
  load->set_draining(draining);
  last_sample_ = sample;
  last_sample_time_ = now;
  for (const PageKey& key : changes.stored) request.add_stored_page_keys(key.ToBytes());
  for (const PageKey& key : changes.removed) request.add_removed_page_keys(key.ToBytes());

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(now + std::min(options_.rpc_deadline, interval_ / 2)));
  v1::HeartbeatResponse response;
  const grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (status.ok()) {
    if (response.heartbeat_interval_ms() > 0) {
      interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
    }
    ++accepted_heartbeats_;
    NoteReachable(true, "heartbeats accepted again");
    return true;
  }
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
    // The router forgot us (it restarted, or dropped us as silent): the snapshot that comes
    // with registering again supersedes these changes.
    fprintf(stderr,
            "kvstrata-decode: router %s does not know this worker (%s); registering again\n",
            options_.router_address.c_str(), status.error_message().c_str());
    registered_ = false;
    if (draining) return false;
    return Register();
  }
  if (local_pages_ != nullptr) local_pages_->ReturnChanges(changes, options_.journal);
  NoteReachable(
      false, absl::StrCat("Heartbeat failed (", status.error_code(), ": ", status.error_message(),
                          "); serving anyway, retrying every interval"));
  return false;
}

absl::StatusOr<std::vector<std::string>> ResolveAll(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size()) {
    return absl::InvalidArgumentError(absl::StrCat("'", host_port, "' is not HOST:PORT"));
  }
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host_port, "': ", gai_strerror(rc)));
  }
  std::set<std::string> addresses;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text,
                sizeof(text));
      addresses.insert(absl::StrCat(text, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof(text));
      addresses.insert(absl::StrCat("[", text, "]:", port));
    }
  }
  freeaddrinfo(found);
  return std::vector<std::string>(addresses.begin(), addresses.end());
}

RouterRegistrations::RouterRegistrations(const RouterRegistrationsOptions& options,
                                         LocalPageCache* local_pages,
                                         std::function<WorkerLoadSample()> load)
    : options_(options), local_pages_(local_pages), load_(std::move(load)) {
  if (!options_.resolve) options_.resolve = ResolveAll;
  // One incarnation for the process, whichever routers it reports to.
  if (options_.registration.worker.incarnation() == 0) {
    options_.registration.worker.set_incarnation(NewIncarnation());
  }
  thread_ = std::thread([this] { Loop(); });
}

RouterRegistrations::~RouterRegistrations() { Stop(/*drain=*/false); }

void RouterRegistrations::Drain() { Stop(/*drain=*/true); }

void RouterRegistrations::Stop(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [address, r] : registrations_) {
    if (drain) r->Drain();
    r.reset();
    if (local_pages_ != nullptr) local_pages_->CloseJournal(journals_[address]);
  }
  registrations_.clear();
}

std::vector<std::string> RouterRegistrations::Addresses() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [address, r] : registrations_) out.push_back(address);
  return out;
}

RouterRegistration* RouterRegistrations::Find(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = registrations_.find(address);
  return it == registrations_.end() ? nullptr : it->second.get();
}

void RouterRegistrations::Resolve() {
  std::set<std::string> wanted;
  bool complete = true;
  for (const std::string& entry : options_.routers) {
    absl::StatusOr<std::vector<std::string>> resolved = options_.resolve(entry);
    if (!resolved.ok()) {
      complete = false;
      if (failing_.insert(entry).second) {
        fprintf(stderr, "kvstrata-decode: router %s: %s; keeping its known addresses\n",
                entry.c_str(), std::string(resolved.status().message()).c_str());
      }
      continue;
    }
    failing_.erase(entry);
    wanted.insert(resolved->begin(), resolved->end());
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  for (const std::string& address : wanted) {
    if (registrations_.contains(address)) continue;
    RouterRegistrationOptions o = options_.registration;
    o.router_address = address;
    if (local_pages_ != nullptr) {
      o.journal = local_pages_->OpenJournal();
      journals_[address] = o.journal;
    }
    registrations_[address] = std::make_unique<RouterRegistration>(o, local_pages_, load_);
  }
  // An address no name resolves to any more is a router that went away. Only trust a complete
  // resolution for that: a name that failed to resolve keeps its routers.
  if (!complete) return;
  for (auto it = registrations_.begin(); it != registrations_.end();) {
    if (wanted.contains(it->first)) {
      ++it;
      continue;
    }
    fprintf(stderr, "kvstrata-decode: router %s is gone from %s; no longer reporting to it\n",
            it->first.c_str(), absl::StrJoin(options_.routers, ",").c_str());
    it->second.reset();
    if (local_pages_ != nullptr) local_pages_->CloseJournal(journals_[it->first]);
    journals_.erase(it->first);
    registrations_.erase(it++);
  }
}

void RouterRegistrations::Loop() {
  for (;;) {
    Resolve();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.resolve_interval),
                 [&] { return stopped_; });
    if (stopped_) return;
  }
}

}  // namespace kvstrata::decode

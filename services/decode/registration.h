#pragma once

// A decode worker's membership in the router's pool (kvstrata.v1.WorkerRegistry,
// proto/kvstrata/v1/worker.proto): one background thread registers the worker, then heartbeats
// its load and the net changes of its local page tier every heartbeat_interval_ms the router
// asks for.
//
// Failure handling, so that the router never blocks serving:
//   - the router unreachable at start or later: try again every interval, forever; a log line
//     only when the state changes (registered / unreachable), not on every tick;
//   - Heartbeat NOT_FOUND (the router restarted or dropped us): register again at once, with a
//     full snapshot of the local keys;
//   - a failed heartbeat keeps its key changes for the next one; a journal overflow (more net
//     changes than LocalPageCacheOptions::max_journal_entries) re-registers with a snapshot.
// Every call has a deadline well below the interval (rpc_deadline, at most half the interval).
//
// Drain() (on SIGTERM) sends one last heartbeat with draining = true and stops the thread.
// Thread-safety: the public methods may be called from any thread.

#include <grpcpp/channel.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvstrata/v1/worker.grpc.pb.h"
#include "services/decode/local_pages.h"

namespace kvstrata::decode {

// A worker's load as the service sees it now. Token counts are totals since start; the
// registration turns them into rates over each heartbeat interval.
struct WorkerLoadSample {
  int running_requests = 0;
  int waiting_requests = 0;
  int64_t free_pages = 0;
  int64_t total_pages = 0;
  int64_t generated_tokens = 0;
  int64_t prefilled_tokens = 0;
};

struct RouterRegistrationOptions {
  // HOST:PORT of the router's WorkerRegistry.
  std::string router_address;
  // Everything RegisterWorkerRequest carries except local_page_keys (taken from the cache);
  // incarnation 0 is replaced by a random value.
  v1::RegisterWorkerRequest worker;
  // Heartbeat interval until the router names one.
  absl::Duration initial_interval = absl::Seconds(1);
  // Deadline of each RPC; capped at half the current interval.
  absl::Duration rpc_deadline = absl::Milliseconds(500);
  // The local tier's journal this registration reads its page key changes from (one per
  // router, so that each router gets every change).
  LocalPageCache::JournalId journal = LocalPageCache::kDefaultJournal;
  // Makes the channel to the router (rpc::TransportSecurity::Dial under TLS); empty: plaintext.
  std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> dial;
};

// A random non-zero incarnation.
uint64_t NewIncarnation();

class RouterRegistration {
 public:
  // `local_pages` may be null (no local tier: no keys are reported); it and `load` must stay
  // valid until Drain() returns or the registration is destroyed. Starts the thread.
  RouterRegistration(const RouterRegistrationOptions& options, LocalPageCache* local_pages,
                     std::function<WorkerLoadSample()> load);
  // Stops the thread (without the draining heartbeat unless Drain() ran).
  ~RouterRegistration();

  // Sends a last heartbeat with draining = true (when registered), then stops the thread.
  // Idempotent.
  void Drain();

  uint64_t incarnation() const { return options_.worker.incarnation(); }
  // Counts, for tests and logs.
  int registrations() const { return registrations_.load(); }
  int accepted_heartbeats() const { return accepted_heartbeats_.load(); }

 private:
  void Loop();
  // One RPC each; true when the router accepted it.
  bool Register();
  bool Heartbeat(bool draining);
  void NoteReachable(bool reachable, const std::string& what);

  RouterRegistrationOptions options_;
  LocalPageCache* const local_pages_;
  const std::function<WorkerLoadSample()> load_;
  std::unique_ptr<v1::WorkerRegistry::Stub> stub_;

  // Loop thread only.
  bool registered_ = false;
  int reachable_ = -1;  // last logged state: -1 none yet, 0 unreachable, 1 reachable
  absl::Duration interval_;
  absl::Time last_sample_time_;
  WorkerLoadSample last_sample_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool drain_ = false;
  std::atomic<int> registrations_{0};
  std::atomic<int> accepted_heartbeats_{0};
  std::thread thread_;
};

// Every address `host_port` resolves to (IPv4 "a.b.c.d:port", IPv6 "[...]:port"), sorted;
// a literal address resolves to itself. Unavailable when the name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveAll(const std::string& host_port);

struct RouterRegistrationsOptions {
  // HOST:PORT entries (--router). A name that resolves to several addresses, such as a
  // Kubernetes headless Service in front of the router pods, means one router per address.
  std::vector<std::string> routers;
  // Template of each registration (router_address and journal are filled in per router).
  RouterRegistrationOptions registration;
  // How often the names are resolved again, so routers that come and go are followed.
  absl::Duration resolve_interval = absl::Seconds(5);
  // Name resolution; empty: ResolveAll. Tests inject a fake.
  std::function<absl::StatusOr<std::vector<std::string>>(const std::string&)> resolve;
};

// Registers the worker with every router: one RouterRegistration (thread, journal) per address
// the --router entries resolve to, all with the same incarnation; routers that appear are
// registered with, routers that disappear (a complete resolution no longer names them) are
// dropped. A name that fails to resolve keeps the routers it had.
class RouterRegistrations {
 public:
  RouterRegistrations(const RouterRegistrationsOptions& options, LocalPageCache* local_pages,
                      std::function<WorkerLoadSample()> load);
  ~RouterRegistrations();
  // Every registration sends its draining heartbeat, then everything stops. Idempotent.
  void Drain();

  uint64_t incarnation() const { return options_.registration.worker.incarnation(); }
  // The router addresses registered with now (registered or still trying), sorted.
  std::vector<std::string> Addresses() const;
  // The registration for one address, or nullptr; valid until the next resolution drops it.
  RouterRegistration* Find(const std::string& address);

 private:
  void Loop();
  void Resolve();
  void Stop(bool drain);

  RouterRegistrationsOptions options_;
  LocalPageCache* const local_pages_;
  const std::function<WorkerLoadSample()> load_;
  std::set<std::string> failing_;  // entries whose last resolution failed (loop thread)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::map<std::string, std::unique_ptr<RouterRegistration>> registrations_;  // by address
  std::map<std::string, LocalPageCache::JournalId> journals_;
  std::thread thread_;
};

}  // namespace kvstrata::decode

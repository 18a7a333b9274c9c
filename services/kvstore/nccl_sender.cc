#include "services/kvstore/nccl_sender.h"

#include <cstdio>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvstrata::kvstore {

NcclSender::NcclSender(transport::NcclRuntime* runtime, uint8_t* pool, uint64_t pool_bytes,
                       const NcclSenderOptions& options)
    : runtime_(runtime),
      pool_(pool),
      pool_bytes_(pool_bytes),
      options_(options),
      // Random start, so that ids of a restarted store do not name its predecessor's.
      next_id_(absl::Uniform<uint64_t>(absl::BitGen(), 1, uint64_t{1} << 62)) {}

NcclSender::~NcclSender() {
  std::map<uint64_t, std::unique_ptr<Comm>> comms;
  std::vector<std::shared_ptr<transport::NcclCommunicator>> joined;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, c] : comms_) StopLocked(c.get(), &joined);
    comms.swap(comms_);
  }
  // A transfer in progress ends now rather than at its deadline (seconds for a large prefix),
  // so the store's shutdown does not wait for a worker that is not receiving.
  for (const auto& comm : joined) comm->Abort();
  for (auto& [id, c] : comms) {
    if (c->thread.joinable()) c->thread.join();
  }
}

void NcclSender::StopLocked(Comm* c,
                            std::vector<std::shared_ptr<transport::NcclCommunicator>>* to_abort) {
  c->stopping = true;
  c->cv.notify_all();
  if (c->comm != nullptr) to_abort->push_back(c->comm);
}

absl::StatusOr<NcclSetup> NcclSender::Setup(const std::string& client_id) {
  std::vector<std::unique_ptr<Comm>> done;
  std::vector<std::shared_ptr<transport::NcclCommunicator>> superseded;
  absl::StatusOr<NcclSetup> out = [&]() -> absl::StatusOr<NcclSetup> {
    std::lock_guard<std::mutex> lock(mu_);
    ReapLocked(&done);
    // The worker asks again only when it has lost its communicator: end the old ones now
    // rather than when a transfer on them times out.
    for (auto& [id, c] : comms_) {
      if (c->client_id == client_id && !c->stopping) StopLocked(c.get(), &superseded);
    }
    int live = 0;
    for (auto& [id, c] : comms_) live += c->stopping || c->broken || c->failed ? 0 : 1;
    if (live >= options_.max_communicators) {
      return absl::ResourceExhaustedError(
          absl::StrCat("nccl.setup: the store has max_communicators=", options_.max_communicators,
                       " NCCL communicators already"));
    }
    if (warmup_ == nullptr) {
      absl::StatusOr<std::shared_ptr<transport::DeviceRange>> w =
          runtime_->Allocate(options_.device, transport::kNcclWarmupBytes);
      if (!w.ok()) return w.status();
      warmup_ = *std::move(w);
    }
    absl::StatusOr<std::string> unique_id = runtime_->NewUniqueId();
    if (!unique_id.ok()) return unique_id.status();
    auto c = std::make_unique<Comm>();
    c->id = next_id_++;
    c->client_id = client_id;
    c->unique_id = *unique_id;
    Comm* raw = c.get();
    comms_.emplace(c->id, std::move(c));
    raw->thread = std::thread([this, raw] { Run(raw); });
    return NcclSetup{
        .communicator_id = raw->id, .unique_id = raw->unique_id, .timeout = options_.init_timeout};
  }();
  for (const auto& comm : superseded) comm->Abort();  // outside mu_: an abort may take a while
  for (auto& c : done) c->thread.join();              // they have ended: immediate
  return out;
}

bool NcclSender::Ready(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(id);
  return it != comms_.end() && it->second->ready && !it->second->broken && !it->second->stopping;
}

absl::StatusOr<NcclQueued> NcclSender::Queue(uint64_t id, const std::string& client_id,
                                             std::vector<transport::DeviceRange> sends,
                                             std::function<void(const absl::Status&)> on_done) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < sends.size(); ++i) {
    const transport::DeviceRange& r = sends[i];
    // The ranges come from the store's own pool placements, never from the worker: one outside
    // the pool is this process's bug. Written so that no sum can wrap.
    const uintptr_t at = reinterpret_cast<uintptr_t>(r.data);
    const uintptr_t base = reinterpret_cast<uintptr_t>(pool_);
    if (at < base || r.bytes > pool_bytes_ || at - base > pool_bytes_ - r.bytes) {
      fprintf(stderr,
              "kvstrata-kvstore: BUG: NCCL communicator %llu: send %zu lies outside the pool\n",
              static_cast<unsigned long long>(id), i);
      return absl::InternalError(absl::StrCat("send ", i, " lies outside the pool"));
    }
    bytes += r.bytes;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = comms_.find(id);
  // Before readiness: a communicator carries only its own worker's transfers (another's would
  // take that worker's place in the communicator's order and its bytes would go to the owner).
  if (it != comms_.end() && it->second->client_id != client_id) {
    fprintf(stderr,
            "kvstrata-kvstore: NCCL communicator %llu of %s named by client_id '%s': refused\n",
            static_cast<unsigned long long>(id), it->second->client_id.c_str(), client_id.c_str());
    return absl::PermissionDeniedError(absl::StrCat(
        "nccl.communicator_id: ", id, " was set up by another client_id, not '", client_id, "'"));
  }
  if (it == comms_.end() || !it->second->ready || it->second->broken || it->second->stopping) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl.communicator_id: ", id, " is not a ready communicator of this store"));
  }
  Comm* c = it->second.get();
  const absl::Duration timeout =
      options_.transfer_timeout +
      absl::Seconds(static_cast<double>(bytes) / options_.min_bytes_per_second);
  Job job{.transfer_id = c->next_transfer_id++,
          .sends = std::move(sends),
          .deadline = absl::Now() + timeout,
          .on_done = std::move(on_done)};
  const uint64_t transfer_id = job.transfer_id;
  c->jobs.push_back(std::move(job));
  c->cv.notify_all();
  return NcclQueued{.transfer_id = transfer_id, .timeout = timeout};
}

NcclSenderCounts NcclSender::Counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  NcclSenderCounts out = counts_;
  out.live_communicators = 0;
  // A failed one leaves the count with its failure (the counts above), not when its thread
  // has finished aborting it.
  for (const auto& [id, c] : comms_) {
    out.live_communicators += c->broken || c->stopping || c->failed ? 0 : 1;
  }
  return out;
}

void NcclSender::FailJobs(Comm* c, const absl::Status& why, std::vector<Job>* failed) {
  for (Job& j : c->jobs) failed->push_back(std::move(j));
  c->jobs.clear();
  counts_.transfer_failures += failed->size();
  (void)why;
}

void NcclSender::ReapLocked(std::vector<std::unique_ptr<Comm>>* done) {
  for (auto it = comms_.begin(); it != comms_.end();) {
    if (it->second->broken) {  // set last by its thread, under mu_: the thread has ended
      done->push_back(std::move(it->second));
      it = comms_.erase(it);
    } else {
      ++it;
    }
  }
}

// One communicator's life: join as rank 0, send the warm-up, then the transfers in order, until
// an error, a missed deadline or the store's shutdown ends it (aborted in every case).
void NcclSender::Run(Comm* c) {
  std::atomic<bool> cancel{false};
  auto end = [&](const absl::Status& why, bool init) {
    std::vector<Job> failed;
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->failed = true;
      c->ready = false;
      if (init) ++counts_.init_failures;
      if (!absl::IsCancelled(why) || init) ++counts_.aborts;
      FailJobs(c, why, &failed);
      stopping = c->stopping;
    }
    if (!stopping) {
      fprintf(stderr,
              "kvstrata-kvstore: NCCL communicator %llu with %s %s: %s (aborted; the worker makes "
              "a new one)\n",
              static_cast<unsigned long long>(c->id), c->client_id.c_str(),
              init ? "did not come up" : "failed", why.ToString().c_str());
    }
    for (Job& j : failed) {
      if (j.on_done) j.on_done(why);
    }
    std::shared_ptr<transport::NcclCommunicator> doomed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      doomed = std::move(c->comm);
    }
    if (doomed != nullptr) doomed->Abort();  // idempotent: a stop may have aborted it already
    std::lock_guard<std::mutex> lock(mu_);
    c->ready = false;
    c->broken = true;  // last: the entry may be reaped from here on
  };
  // The store's shutdown or a new setup for the same worker cancels a join in progress.
  std::thread stop_watch([&] {
    std::unique_lock<std::mutex> lock(mu_);
    c->cv.wait(lock, [&] { return c->stopping || c->join_ended; });
    if (c->stopping) cancel = true;
  });
  const absl::Time init_deadline = absl::Now() + options_.init_timeout;
  absl::StatusOr<std::unique_ptr<transport::NcclCommunicator>> joined = runtime_->Join(
      c->unique_id, /*num_ranks=*/2, /*rank=*/0, options_.device, init_deadline, &cancel);
  absl::Status warm = joined.status();
  std::shared_ptr<transport::NcclCommunicator> comm;
  if (joined.ok()) {
    comm = *std::move(joined);
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->comm = comm;  // from here on a stop aborts it, the warm-up too
      stopping = c->stopping;
    }
    if (stopping) comm->Abort();
    // Registration is an optimisation (zero-copy over NVLink); transfers work without it.
    absl::Status reg = comm->Register({pool_, pool_bytes_});
    if (!reg.ok() && !absl::IsUnimplemented(reg) && !stopping) {
      fprintf(stderr, "kvstrata-kvstore: NCCL communicator %llu: registering the pool: %s\n",
              static_cast<unsigned long long>(c->id), reg.ToString().c_str());
    }
    const transport::DeviceRange w = *warmup_;
    warm = comm->Transfer(/*peer=*/1, {&w, 1}, {}, init_deadline);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    c->join_ended = true;
    if (warm.ok()) {
      c->ready = true;
      ++counts_.communicators_made;
    }
    c->cv.notify_all();
  }
  stop_watch.join();
  if (!warm.ok()) {
    end(warm, /*init=*/true);
    return;
  }
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      c->cv.wait(lock, [&] { return c->stopping || !c->jobs.empty(); });
      if (c->stopping) break;
      job = std::move(c->jobs.front());
      c->jobs.pop_front();
    }
    absl::Status sent = comm->Transfer(/*peer=*/1, job.sends, {}, job.deadline);
    if (job.on_done) job.on_done(sent);
    if (!sent.ok()) {
      {
        // Not ready from the moment the failure is counted: no transfer is queued behind it.
        std::lock_guard<std::mutex> lock(mu_);
        ++counts_.transfer_failures;
        c->ready = false;
      }
      end(sent, /*init=*/false);
      return;
    }
    uint64_t bytes = 0;
    for (const transport::DeviceRange& r : job.sends) bytes += r.bytes;
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_.transfers;
    counts_.transfer_bytes += bytes;
  }
  end(absl::CancelledError("the communicator was stopped"), /*init=*/false);
}

}  // namespace kvstrata::kvstore

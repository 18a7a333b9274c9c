#include "loadtest/client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "kvstrata/v1/generate.grpc.pb.h"

namespace kvstrata::loadtest {
namespace {

namespace v1 = ::kvstrata::v1;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

std::string CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK",          "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",   "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",     "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int c = static_cast<int>(code);
  return c >= 0 && c < 17 ? kNames[c] : absl::StrCat("CODE_", c);
}

std::string FinishName(v1::FinishReason reason) {
  absl::string_view name = v1::FinishReason_Name(reason);
  absl::ConsumePrefix(&name, "FINISH_REASON_");
  return absl::AsciiStrToLower(name);
}

// `history`: a session's earlier turns, put between the system prompt and this turn's question.
v1::GenerateRequest ToProto(const RequestSpec& s,
                            const std::vector<std::pair<std::string, std::string>>* history) {
  v1::GenerateRequest r;
  if (!s.token_ids.empty()) {
    for (uint32_t id : s.token_ids) r.mutable_token_ids()->add_ids(id);
  } else {
    v1::ChatInput* chat = r.mutable_chat();
    chat->set_apply_chat_template(true);
    chat->set_add_generation_prompt(true);
    auto add = [chat](const std::string& role, const std::string& content) {
      v1::ChatMessage* m = chat->add_messages();
      m->set_role(role);
      m->set_content(content);
    };
    for (size_t i = 0; i < s.messages.size(); ++i) {
      if (history && i + 1 == s.messages.size()) {
        for (const auto& [role, content] : *history) add(role, content);
      }
      add(s.messages[i].first, s.messages[i].second);
    }
  }
  if (s.session >= 0) r.mutable_cache_hints()->set_session_id(absl::StrCat("s", s.session));
  r.mutable_sampling()->set_temperature(0.0f);
  r.mutable_stop()->set_max_tokens(s.max_tokens);
  r.mutable_stop()->set_ignore_eos(s.ignore_eos);
  return r;
}

class Runner;

// One Generate stream, timed as its messages arrive.
class Stream final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Stream(Runner* runner, RequestRecord* record, v1::GenerateRequest request)
      : runner_(runner), record_(record), request_(std::move(request)) {}
  void Start(v1::Generation::Stub* stub, Clock::time_point run_start, int64_t deadline_ms);
  void Cancel() { context_.TryCancel(); }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  Runner* runner_;
  RequestRecord* record_;
  v1::GenerateRequest request_;
  grpc::ClientContext context_;
  v1::GenerateResponse message_;
  Clock::time_point start_, last_token_;
  bool any_token_ = false;
};

class Runner {
 public:
  Runner(const std::vector<RequestSpec>& requests, const RunOptions& o)
      : requests_(requests), o_(o), records_(requests.size()), launched_(requests.size()) {
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].session >= 0 && requests[i].turn == 0) session_starts_.push_back(i);
    }
    sessions_ = !session_starts_.empty();
    for (const Stage& s : o.stages) stages_end_s_ += s.duration_s;
    for (int c = 0; c < std::max(1, o.channels); ++c) {
      grpc::ChannelArguments args;
      args.SetInt("grpc.channel_id", c);  // distinct arguments: a connection each
      args.SetMaxReceiveMessageSize(-1);
      stubs_.push_back(v1::Generation::NewStub(
          grpc::CreateCustomChannel(o.target, grpc::InsecureChannelCredentials(), args)));
    }
  }

  RunResult Run() {
    start_ = Clock::now();
    std::thread progress([this] { Progress(); });
    if (o_.send_at.empty()) {
      TopUp();
      std::unique_lock<std::mutex> lock(mu_);
      // Woken by every end; a stop (SIGINT) is polled: the flag is set from a signal handler.
      // A stage that raises the concurrency is started when it begins.
      for (;;) {
        const Clock::time_point wake =
            std::min(Clock::now() + std::chrono::milliseconds(200), NextStageStart());
        if (cv_.wait_until(lock, wake, [this] {
              return in_flight_ == 0 && ending_ == 0 && (!MaySend() || NothingLeftLocked());
            })) {
          break;
        }
        if (Stopped()) CancelAllLocked();
        if (!o_.stages.empty()) {
          lock.unlock();
          TopUp();
          lock.lock();
        }
      }
    } else {
      for (size_t i = 0; i < requests_.size(); ++i) {
        const Clock::time_point at =
            start_ + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(o_.send_at[i]));
        Stream* s = nullptr;
        {
          std::unique_lock<std::mutex> lock(mu_);
          while (!Stopped() && Clock::now() < at) {
            cv_.wait_until(lock, std::min(at, Clock::now() + std::chrono::milliseconds(200)));
          }
          if (!MaySend()) break;
          s = PrepareLocked(next_++);
        }
        Begin(s);
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (Stopped()) CancelAllLocked();
      while (!cv_.wait_for(lock, std::chrono::milliseconds(200),
                           [this] { return in_flight_ == 0 && ending_ == 0; })) {
        if (Stopped()) CancelAllLocked();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_running_ = true;
    }
    cv_.notify_all();
    progress.join();
    RunResult r;
    r.wall_s = std::chrono::duration<double>(Clock::now() - start_).count();
    for (size_t i = 0; i < records_.size(); ++i) {
      if (launched_[i]) r.records.push_back(std::move(records_[i]));
    }
    return r;
  }

  // From a stream's OnDone (a gRPC thread); deletes the stream. A session's next turn is
  // prepared under the same lock that counts this one done, so the run never looks finished in
  // between. Run() returns (and the runner goes) once no stream is in flight and no reaction is
  // inside this function: `ending_` counts the reactions still here, and the last thing each
  // does is to uncount itself and notify, under the lock.
  void Finished(Stream* s, const RequestRecord& r) {
    Stream* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --in_flight_;
      ++ending_;
      ++done_;
      if (!r.ok()) ++errors_;
      output_tokens_ += r.completion_tokens;
      live_.erase(s);
      const size_t i = static_cast<size_t>(r.index);
      if (sessions_ && r.ok() && i + 1 < requests_.size() &&
          requests_[i + 1].session == requests_[i].session && MaySend()) {
        auto& h = history_[requests_[i].session];
        h.emplace_back("user", requests_[i].messages.back().second);
        h.emplace_back("assistant", r.text);  // the answer as it came back
        next = PrepareLocked(i + 1);
      }
    }
    delete s;
    if (next) {
      Begin(next);
    } else if (o_.send_at.empty()) {
      TopUp();
    }
    std::lock_guard<std::mutex> lock(mu_);
    --ending_;
    cv_.notify_all();  // under the lock: Run() may destroy the runner as soon as it is released
  }

 private:
  bool Stopped() const { return o_.stop && o_.stop->load(); }
  bool NothingLeftLocked() const {
    return sessions_ ? next_session_ >= session_starts_.size() : next_ >= requests_.size();
  }
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  bool MaySend() const {
    return !Stopped() && (stages_end_s_ <= 0 || Elapsed() < stages_end_s_) &&
           (o_.duration_s <= 0 || Elapsed() < o_.duration_s);
  }
  // Closed loop: the concurrency of the stage we are in.
  int Concurrency() const {
    const int stage = StageAt(o_.stages, Elapsed());
    return stage < 0 ? o_.concurrency
                     : std::max(1, static_cast<int>(std::lround(o_.stages[stage].value)));
  }
  Clock::time_point NextStageStart() const {
    double at = 0;
    for (const Stage& s : o_.stages) {
      at += s.duration_s;
      if (at > Elapsed()) {
        return start_ +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at));
      }
    }
    return Clock::time_point::max();
  }
  // TryCancel never runs a reaction inline: safe under the lock.
  void CancelAllLocked() {
    for (Stream* s : live_) s->Cancel();
  }

  // Closed loop: starts requests until `concurrency` are in flight. Streams start outside the
  // lock, so a reaction that ran inline could take it.
  void TopUp() {
    for (;;) {
      Stream* s = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (in_flight_ >= Concurrency() || !MaySend()) return;
        if (sessions_) {  // a new session, if one is left
          if (next_session_ >= session_starts_.size()) return;
          s = PrepareLocked(session_starts_[next_session_++]);
        } else {
          if (next_ >= requests_.size()) return;
          s = PrepareLocked(next_++);
        }
      }
      Begin(s);
    }
  }

  Stream* PrepareLocked(size_t i) {
    ++sent_;
    launched_[i] = true;
    RequestRecord& rec = records_[i];
    rec.index = static_cast<int64_t>(i);
    rec.group = requests_[i].group;
    rec.warmup = static_cast<int64_t>(sent_) <= o_.warmup_requests;
    // Open loop: the stage whose rate scheduled it, even if it leaves a moment late.
    rec.stage = StageAt(o_.stages, o_.send_at.empty() ? Elapsed() : o_.send_at[i]);
    const RequestSpec& spec = requests_[i];
    auto* s = new Stream(this, &rec,  // deletes itself in OnDone
                         ToProto(spec, spec.session >= 0 ? &history_[spec.session] : nullptr));
    live_.insert(s);
    ++in_flight_;
    stub_of_[s] = i % stubs_.size();
    return s;
  }

  void Begin(Stream* s) {
    size_t stub = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stub = stub_of_[s];
      stub_of_.erase(s);
    }
    s->Start(stubs_[stub].get(), start_, o_.deadline_ms);
  }

  void Progress() {
    if (o_.progress_interval_s <= 0) return;
    std::unique_lock<std::mutex> lock(mu_);
    int64_t last_tokens = 0;
    Clock::time_point last = Clock::now();
    while (!cv_.wait_for(lock, std::chrono::duration<double>(o_.progress_interval_s),
                         [this] { return done_running_; })) {
      const Clock::time_point now = Clock::now();
      const double dt = std::chrono::duration<double>(now - last).count();
      std::fprintf(stderr,
                   "[%6.1f s] sent %zu/%zu  done %lld  in flight %d  errors %lld  output %.0f "
                   "tok/s\n",
                   std::chrono::duration<double>(now - start_).count(), sent_, requests_.size(),
                   static_cast<long long>(done_), in_flight_, static_cast<long long>(errors_),
                   dt > 0 ? (output_tokens_ - last_tokens) / dt : 0.0);
      last_tokens = output_tokens_;
      last = now;
    }
  }

  const std::vector<RequestSpec>& requests_;
  const RunOptions& o_;
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs_;
  std::vector<RequestRecord> records_;  // sized up front: streams hold pointers into it
  Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t next_ = 0;  // the next request to send (not sessions)
  size_t sent_ = 0;
  std::vector<bool> launched_;
  bool sessions_ = false;
  double stages_end_s_ = 0;             // sending stops here (0: no stages)
  std::vector<size_t> session_starts_;  // turn 0 of each session
  size_t next_session_ = 0;
  std::map<int, std::vector<std::pair<std::string, std::string>>> history_;
  int in_flight_ = 0;
  int ending_ = 0;  // reactions inside Finished(): the runner must outlive them
  int64_t done_ = 0, errors_ = 0, output_tokens_ = 0;
  bool done_running_ = false;
  std::set<Stream*> live_;  // started or about to start, not yet done
  std::map<Stream*, size_t> stub_of_;
};

void Stream::Start(v1::Generation::Stub* stub, Clock::time_point run_start, int64_t deadline_ms) {
  start_ = Clock::now();
  record_->sent_s = std::chrono::duration<double>(start_ - run_start).count();
  if (deadline_ms > 0) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(deadline_ms));
  }
  stub->async()->Generate(&context_, &request_, this);
  StartRead(&message_);
  StartCall();
}

void Stream::OnReadDone(bool ok) {
  if (!ok) return;  // the stream is over; OnDone follows
  const Clock::time_point now = Clock::now();
  const int n = message_.token_ids_size();
  if (n > 0) {
    if (!any_token_) {
      record_->ttft_ms = Ms(now - start_);
      any_token_ = true;
    } else {
      const double gap = Ms(now - last_token_) / n;
      for (int i = 0; i < n; ++i) record_->itl_ms.push_back(gap);
    }
    last_token_ = now;
  }
  record_->text += message_.text();
  if (message_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    record_->finish_reason = FinishName(message_.finish_reason());
  }
  if (message_.has_error()) record_->error = message_.error().message();
  if (!message_.worker_id().empty()) record_->worker_id = message_.worker_id();
  if (message_.has_usage()) {
    const v1::Usage& u = message_.usage();
    record_->prompt_tokens = u.prompt_tokens();
    record_->completion_tokens = u.completion_tokens();
    record_->cached_local_tokens = u.cached_local_tokens();
    record_->cached_kvstore_tokens = u.cached_kvstore_tokens();
    record_->uncached_tokens = u.uncached_tokens();
    record_->predicted_cached_tokens = u.predicted_cached_tokens();
  }
  StartRead(&message_);
}

void Stream::OnDone(const grpc::Status& status) {
  record_->e2e_ms = Ms(Clock::now() - start_);
  if (!status.ok()) {
    record_->status = CodeName(status.error_code());
    record_->error = status.error_message();
  }
  runner_->Finished(this, *record_);  // deletes this
}

}  // namespace

absl::StatusOr<TargetInfo> GetTargetInfo(const std::string& target, int64_t timeout_ms) {
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms);
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(
        absl::StrCat("cannot connect to ", target, " within ", timeout_ms, " ms"));
  }
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(deadline);
  v1::GetServerInfoRequest req;
  v1::ServerInfo info;
  const grpc::Status s = stub->GetServerInfo(&ctx, req, &info);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("GetServerInfo on ", target, ": ", s.error_message()));
  }
  TargetInfo t;
  t.role = info.role();
  t.model = info.model();
  t.vocab_size = info.vocab_size();
  t.max_context_tokens = info.max_context_tokens();
  t.available_workers = info.available_workers();
  return t;
}

absl::StatusOr<RunResult> RunLoad(const std::vector<RequestSpec>& requests, const RunOptions& o) {
  if (requests.empty()) return absl::InvalidArgumentError("no requests to send");
  if (!o.send_at.empty() && o.send_at.size() != requests.size()) {
    return absl::InternalError("send times and requests differ in number");
  }
  const bool sessions = std::any_of(requests.begin(), requests.end(),
                                    [](const RequestSpec& r) { return r.session >= 0; });
  if (sessions && !o.send_at.empty()) {
    return absl::InvalidArgumentError("multi-turn sessions run in a closed loop (--arrivals=closed)");
  }
  if (o.send_at.empty() && o.concurrency < 1) {
    return absl::InvalidArgumentError("--concurrency must be >= 1 in a closed loop");
  }
  // On the heap, so a reaction that outlived the run would be a use after free that ASan names.
  auto runner = std::make_unique<Runner>(requests, o);
  return runner->Run();
}

}  // namespace kvstrata::loadtest

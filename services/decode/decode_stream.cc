// The stream of a Generate call: relaying the engine's events as GenerateResponses (tokens,
// logprobs, sharing the prompt's pages once prefill is done), ending before the client's
// deadline, and the final message's Usage and Timings and the finished-request metrics.

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/decode/decode_call.h"
#include "services/decode/decode_internal.h"
#include "services/decode/decode_service.h"

namespace kvstrata::decode {

namespace {

v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kNone:
      return v1::FINISH_REASON_UNSPECIFIED;
    case engine::FinishReason::kEndOfGeneration:
    case engine::FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case engine::FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case engine::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kCancelled:
      return v1::FINISH_REASON_ABORT;
    case engine::FinishReason::kDeadline:
      return v1::FINISH_REASON_DEADLINE;
    case engine::FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_ERROR;
}

uint64_t Micros(absl::Duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, absl::ToInt64Microseconds(d)));
}

}  // namespace

grpc::Status DecodeService::Stream(grpc::ServerContext* context, Call& call,
                                   GenerateWriter* writer) {
  const v1::GenerateRequest& request = call.request;
  const uint32_t interval = std::max<uint32_t>(1, request.stream_interval());
  v1::GenerateResponse pending;
  pending.set_request_id(call.request_id);
  pending.set_worker_id(options_.worker_id);
  int pending_tokens = 0;
  bool client_gone = false;
  bool cancel_sent = false, deadline_cancel = false;
  auto write = [&](v1::GenerateResponse& m) {
    if (!client_gone && !writer->Write(m)) client_gone = true;
    m.Clear();
    m.set_request_id(call.request_id);
    pending_tokens = 0;
  };
  // The final message must leave deadline_margin before the client's deadline. The engine is
  // asked to stop early enough for the step in progress and the next to finish; if its final
  // event is still missing at the margin, the stream ends here with what was streamed.
  const absl::Duration step = std::min(absl::Seconds(1), StepEstimate());
  const absl::Time give_up_at = call.deadline - options_.deadline_margin;
  const absl::Time cancel_at = give_up_at - 2 * step;
  for (;;) {
    std::deque<engine::GenerationEvent> events;
    {
      const absl::Time wake =
          std::min(absl::Now() + absl::Milliseconds(20), cancel_sent ? give_up_at : cancel_at);
      std::unique_lock<std::mutex> lock(call.channel->mu);
      call.channel->cv.wait_until(lock, absl::ToChronoTime(wake),
                                  [&] { return !call.channel->events.empty(); });
      events.swap(call.channel->events);
    }
    for (engine::GenerationEvent& e : events) {
      call.cached_tokens = e.cached_tokens;
      call.recent_window_from_int2_pages = e.recent_window_from_int2_pages;
      call.in_place_pages = e.in_place_pages;
      if (e.token >= 0) {
        const absl::Time now = absl::Now();
        if (call.first_token == absl::InfiniteFuture()) {
          call.first_token = now;
          metrics_->ttft.Get().Observe(absl::ToDoubleSeconds(now - call.start));
        } else {
          metrics_->inter_token.Get().Observe(absl::ToDoubleSeconds(now - call.last_token));
        }
        call.last_token = now;
        ++call.generated;
        pending.add_token_ids(static_cast<uint32_t>(e.token));
        if (request.has_logprobs()) {
          v1::TokenLogprob* lp = pending.add_logprobs();
          lp->set_token_id(static_cast<uint32_t>(e.token));
          lp->set_logprob(e.logprob);
          for (const auto& [id, logprob] : e.top_logprobs) {
            v1::TopLogprob* t = lp->add_top();
            t->set_token_id(static_cast<uint32_t>(id));
            t->set_logprob(logprob);
          }
        }
        ++pending_tokens;
      }
      if (!e.prompt_pages.empty()) {
        // Prefill is done: share the prompt's pages now, with requests waiting on this worker
        // and through the kvstore, rather than when this one finishes.
        StoreLocal(call.request_id, e.prompt_pages);
        EndPrefilling(call.prefilling);
        for (const engine::ExportedPage& p : e.prompt_pages) {
          call.prompt_pages_shared = std::max(call.prompt_pages_shared, p.page_index + 1);
        }
        if (ring_ != nullptr) {
          QueuePublish({call.request_id, call.namespace_key, std::move(e.prompt_pages)});
        }
      }
      pending.mutable_text()->append(e.text);
      if (e.finish == engine::FinishReason::kNone) {
        if (pending_tokens >= static_cast<int>(interval)) write(pending);
        continue;
      }
      // The engine's last event for the sequence.
      StoreLocal(call.request_id, e.published_pages);
      EndPrefilling(call.prefilling);
      if (!e.published_pages.empty() && ring_ != nullptr) {
        QueuePublish({call.request_id, call.namespace_key, std::move(e.published_pages),
                      call.prompt_pages_shared});
      }
      if (e.finish == engine::FinishReason::kDeadline && call.generated == 0) {
        return EndBeforeFirstToken(call);
      }
      pending.set_finish_reason(ToProto(e.finish));
      if (e.finish == engine::FinishReason::kStopString) pending.set_matched_stop(e.matched_stop);
      if (e.finish == engine::FinishReason::kError) {
        pending.mutable_error()->set_code(grpc::StatusCode::INTERNAL);
        pending.mutable_error()->set_message("the engine failed while generating");
      }
      FillUsage(call, pending);
      write(pending);
      CountFinished(call, ToProto(e.finish));
      if (client_gone || context->IsCancelled()) return grpc::Status::CANCELLED;
      if (e.finish == engine::FinishReason::kError) {
        return grpc::Status(grpc::StatusCode::INTERNAL, "the engine failed while generating");
      }
      return grpc::Status::OK;
    }
    const absl::Time now = absl::Now();
    if (deadline_cancel && now >= give_up_at) {
      // The engine is still in a step: end the stream without its final event.
      if (call.generated == 0) return EndBeforeFirstToken(call);
      fprintf(stderr,
              "kvstrata-decode: request %s (sequence %llu): the engine had not stopped by the "
              "deadline margin; ending the stream after %d tokens\n",
              call.request_id.c_str(), static_cast<unsigned long long>(call.sequence_id),
              call.generated);
      pending.set_finish_reason(v1::FINISH_REASON_DEADLINE);
      FillUsage(call, pending);
      write(pending);
      CountFinished(call, v1::FINISH_REASON_DEADLINE);
      return client_gone ? grpc::Status::CANCELLED : grpc::Status::OK;
    }
    if (cancel_sent) continue;
    if (now >= cancel_at) {
      RequestCancel(call.sequence_id, engine::FinishReason::kDeadline);
      cancel_sent = deadline_cancel = true;
    } else if (client_gone || context->IsCancelled()) {
      fprintf(stderr, "kvstrata-decode: request %s (sequence %llu): client went away, cancelling\n",
              call.request_id.c_str(), static_cast<unsigned long long>(call.sequence_id));
      client_gone = true;
      RequestCancel(call.sequence_id, engine::FinishReason::kCancelled);
      cancel_sent = true;
    } else if (call.channel->abort_requested.load()) {
      RequestCancel(call.sequence_id, engine::FinishReason::kCancelled);
      cancel_sent = true;
    }
  }
}

grpc::Status DecodeService::EndBeforeFirstToken(const Call& call) {
  metrics_->rejected.With({absl::StatusCodeToString(absl::StatusCode::kDeadlineExceeded)})
      .Increment();
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      absl::StrCat("the deadline passed before the first token (prompt ",
                                   call.prompt_tokens, " tokens, ",
                                   call.prompt_tokens - call.cached_tokens, " to prefill)"));
}

void DecodeService::FillUsage(const Call& call, v1::GenerateResponse& m) const {
  // The engine imports the pages in order, local run first; when it refused them it imported
  // none and cached is 0.
  const int cached = call.cached_tokens;
  const int fetched_tokens = (call.local_pages + call.kvstore_pages) * page_tokens_;
  const int cached_local = std::min(cached, call.local_pages * page_tokens_);
  const int recomputed = std::max(0, fetched_tokens - cached);
  v1::Usage* usage = m.mutable_usage();
  usage->set_prompt_tokens(call.prompt_tokens);
  usage->set_completion_tokens(call.generated);
  usage->set_cached_local_tokens(cached_local);
  usage->set_cached_kvstore_tokens(cached - cached_local);
  usage->set_recomputed_tokens(recomputed);
  usage->set_uncached_tokens(std::max(0, call.prompt_tokens - cached - recomputed));
  usage->set_inexact_recent_window_tokens(call.recent_window_from_int2_pages * page_tokens_);
  usage->set_predicted_cached_tokens(call.request.routing().predicted_local_cached_tokens() +
                                     call.request.routing().predicted_kvstore_cached_tokens());
  const absl::Time end = absl::Now();
  v1::Timings* t = m.mutable_timings();
  t->set_queue_us(Micros(call.submitted - call.start - call.fetch_time));
  t->set_kvstore_fetch_us(Micros(call.fetch_time));
  if (call.first_token != absl::InfiniteFuture()) {
    t->set_prefill_us(Micros(call.first_token - call.submitted));
    t->set_time_to_first_token_us(Micros(call.first_token - call.start));
    t->set_decode_us(Micros(call.last_token - call.first_token));
  }
  t->set_total_us(Micros(end - call.start));
  m.set_worker_id(options_.worker_id);
}

void DecodeService::CountFinished(const Call& call, v1::FinishReason reason) {
  const int cached_local = std::min(call.cached_tokens, call.local_pages * page_tokens_);
  metrics_->requests.With({v1::FinishReason_Name(reason)}).Increment();
  metrics_->prompt_tokens.With({"local"}).Increment(cached_local);
  metrics_->prompt_tokens.With({"kvstore"}).Increment(call.cached_tokens - cached_local);
  metrics_->prompt_tokens.With({"none"}).Increment(call.prompt_tokens - call.cached_tokens);
  metrics_->generated_tokens.Get().Increment(call.generated);
  metrics_->prefix_pages_in_place.Get().Increment(call.in_place_pages);
  prefilled_tokens_.fetch_add(std::max(0, call.prompt_tokens - call.cached_tokens));
  metrics_->e2e.Get().Observe(absl::ToDoubleSeconds(absl::Now() - call.start));
}

}  // namespace kvstrata::decode

#include "engine/scheduler.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace kvstrata::engine {

struct Scheduler::Sequence {
  uint64_t id = 0;
  GenerationRequest request;
  SequenceKv kv;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StopChecker> stop;
  std::vector<int32_t> generated;
  int64_t prefilled = 0;  // prompt tokens in the cache
  int cached_tokens = 0;
  int recent_window_from_int2_pages = 0;
  int in_place_pages = 0;
  bool finished = false;
};

Scheduler::Scheduler(Backend* backend, KvCache* cache, TokenBytes token_bytes,
                     IsEndOfGeneration is_eog, const SchedulerOptions& options)
    : backend_(backend),
      cache_(cache),
      token_bytes_(std::move(token_bytes)),
      is_eog_(std::move(is_eog)),
      options_(options) {}

Scheduler::~Scheduler() {
  for (auto& s : running_) cache_->Release(s->kv);
}

absl::StatusOr<uint64_t> Scheduler::Submit(GenerationRequest request) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= backend_->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " (id ", request.prompt[i],
                                                     ") is outside the vocabulary"));
    }
  }
  KV_RETURN_IF_ERROR(ValidateSamplingOptions(request.sampling));
  KV_RETURN_IF_ERROR(ValidateStopOptions(request.stop, backend_->vocab_size()));
  // Would it fit an empty cache? If not, no amount of waiting helps.
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.stop.max_tokens;
  if (cache_->Bf16SlotsNeeded(total) > cache_->bf16_pool().num_slots() ||
      cache_->Int2SlotsNeeded(total) >
          (cache_->int2_pool() ? cache_->int2_pool()->num_slots() : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt (", request.prompt.size(), " tokens) + max_tokens (", request.stop.max_tokens,
        ") needs more KV pages than this engine's cache holds; shorten the prompt or lower "
        "max_tokens"));
  }
  if (!request.cached_pages.empty() || !request.device_cached_pages.empty()) {
    if (!request.device_cached_pages.empty() && backend_->device_page_access() == nullptr) {
      return absl::InvalidArgumentError(
          "device_cached_pages: this engine's backend cannot read device pages");
    }
    KV_RETURN_IF_ERROR(cache_
                           ->CheckCachedPrefix(request.namespace_key, request.prompt,
                                               request.cached_pages, request.device_cached_pages)
                           .status());
  }
  if (static_cast<int>(waiting_.size()) >= options_.max_waiting) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request queue is full (", options_.max_waiting, " waiting)"));
  }
  auto s = std::make_unique<Sequence>();
  s->id = next_id_++;
  s->sampler = std::make_unique<Sampler>(request.sampling, options_.seed + s->id);
  s->stop = std::make_unique<StopChecker>(request.stop, is_eog_);
  s->kv.namespace_key = request.namespace_key;
  s->request = std::move(request);
  const uint64_t id = s->id;
  waiting_.push_back(std::move(s));
  return id;
}

void Scheduler::Cancel(uint64_t sequence_id, FinishReason reason) {
  cancelled_.emplace(sequence_id, reason);
}

void Scheduler::Publish(const Sequence& s, GenerationEvent& e) const {
  if (!s.request.publish_pages) return;
  absl::StatusOr<std::vector<ExportedPage>> pages =
      cache_->ExportPages(s.kv, backend_->device_page_access());
  if (!pages.ok()) {
    std::fprintf(stderr, "kvstrata: request %s: pages not published: %s\n",
                 s.request.request_id.c_str(), std::string(pages.status().message()).c_str());
    return;
  }
  e.published_pages = *std::move(pages);
}

void Scheduler::Finish(Sequence& s, FinishReason reason, std::vector<GenerationEvent>* events,
                       std::string text) {
  GenerationEvent e;
  e.sequence_id = s.id;
  e.request_id = s.request.request_id;
  e.finish = reason;
  e.text = std::move(text);
  e.prompt_tokens = static_cast<int>(s.request.prompt.size());
  e.generated_tokens = static_cast<int>(s.generated.size());
  e.cached_tokens = s.cached_tokens;
  e.recent_window_from_int2_pages = s.recent_window_from_int2_pages;
  e.in_place_pages = s.in_place_pages;
  if (reason != FinishReason::kError) Publish(s, e);  // after an error the pages are unknown
  events->push_back(std::move(e));
  cache_->Release(s.kv);
  s.finished = true;
}

absl::Status Scheduler::Step(std::vector<GenerationEvent>* events) {
  // Cancellations, in the queue and among running sequences.
  if (!cancelled_.empty()) {
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      auto c = cancelled_.find((*it)->id);
      if (c != cancelled_.end()) {
        Finish(**it, c->second, events);
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& s : running_) {
      auto c = cancelled_.find(s->id);
      if (c != cancelled_.end() && !s->finished) Finish(*s, c->second, events);
    }
    cancelled_.clear();
    std::erase_if(running_, [](const auto& s) { return s->finished; });
  }
  // Admission, first come first served: a request that does not fit blocks those behind it,
  // so a long prompt is not starved by short ones.
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
    Sequence& s = *waiting_.front();
    const int64_t total = static_cast<int64_t>(s.request.prompt.size()) + s.request.stop.max_tokens;
    absl::Status reserved = cache_->Reserve(s.kv, total);
    if (absl::IsResourceExhausted(reserved)) break;
    if (!reserved.ok()) {  // can never run: end it rather than block the queue behind it
      std::fprintf(stderr, "kvstrata: request %s: %s\n", s.request.request_id.c_str(),
                   std::string(reserved.message()).c_str());
      Finish(s, FinishReason::kError, events);
      waiting_.pop_front();
      continue;
    }
    s.kv.tokens = s.request.prompt;
    if (!s.request.cached_pages.empty() || !s.request.device_cached_pages.empty()) {
      absl::StatusOr<int64_t> dequantised =
          cache_->ImportPrefix(s.kv, s.request.cached_pages, s.request.device_cached_pages,
                               backend_->device_page_access(), s.request.in_place_hold);
      if (!dequantised.ok()) {
        // A cached prefix that cannot be imported (a device page that failed its digest, a
        // copy that failed) is a miss: the sequence computes its whole prompt instead.
        std::fprintf(stderr,
                     "kvstrata: request %s: cached prefix not imported (%s); prefilling the "
                     "whole prompt\n",
                     s.request.request_id.c_str(),
                     std::string(dequantised.status().message()).c_str());
        cache_->Release(s.kv);
        s.kv = SequenceKv{.tokens = s.request.prompt, .namespace_key = s.request.namespace_key};
        if (absl::Status again = cache_->Reserve(s.kv, total); !again.ok()) {
          Finish(s, FinishReason::kError, events);
          waiting_.pop_front();
          continue;
        }
      } else {
        s.prefilled = s.kv.num_tokens;
        s.cached_tokens = static_cast<int>(s.kv.num_tokens);
        s.recent_window_from_int2_pages = static_cast<int>(*dequantised);
        s.in_place_pages = static_cast<int>(s.kv.in_place_pages);
      }
      s.request.cached_pages.clear();
      s.request.cached_pages.shrink_to_fit();
      s.request.device_cached_pages.clear();
    }
    // Nothing reads the cached pages' memory again (the copies into the slots have ended;
    // pages read in place are held by the sequence itself).
    s.request.cached_pages_owner.reset();
    s.request.in_place_hold.reset();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  if (running_.empty()) return absl::OkStatus();

  // The batch: every decoding sequence's last token, then prefill chunks within the budget.
  std::vector<ForwardItem> batch;
  std::vector<Sequence*> owners;
  int budget = options_.max_step_tokens;
  for (auto& s : running_) {
    if (s->prefilled < static_cast<int64_t>(s->request.prompt.size())) continue;
    batch.push_back({&s->kv, s->kv.num_tokens, 1, false});
    owners.push_back(s.get());
    --budget;
  }
  for (auto& s : running_) {
    const int64_t remaining = static_cast<int64_t>(s->request.prompt.size()) - s->prefilled;
    if (remaining <= 0) continue;
    // An empty batch always takes at least one token, so every step makes progress.
    const int64_t allowed = std::max<int64_t>(budget, batch.empty() ? 1 : 0);
    const int chunk = static_cast<int>(
        std::min<int64_t>({remaining, static_cast<int64_t>(options_.prefill_chunk), allowed}));
    if (chunk <= 0) break;
    batch.push_back({&s->kv, s->prefilled, chunk, false});
    owners.push_back(s.get());
    budget -= chunk;
  }
  // Which items draw a token after this pass, and where: on the backend's device when it can
  // and the request's sampling allows, else on the host from its row of logits. Logits come
  // back only when some item needs them.
  const bool on_device = backend_->samples_on_device();
  std::vector<DeviceDraw> draw_storage(on_device ? batch.size() : 0);
  std::vector<const DeviceDraw*> draws(batch.size(), nullptr);
  bool host_logits = !on_device;
  for (size_t i = 0; i < batch.size() && on_device; ++i) {
    Sequence& s = *owners[i];
    if (s.prefilled + batch[i].n < static_cast<int64_t>(s.request.prompt.size())) continue;
    if (!s.sampler->DeviceSampleable()) {
      host_logits = true;
      continue;
    }
    draw_storage[i] = s.sampler->PrepareDeviceDraw(s.generated);
    draws[i] = &draw_storage[i];
  }
  const absl::Status forward =
      on_device ? backend_->ForwardAndSample(batch, draws, host_logits, &logits_, &device_sampled_)
                : backend_->Forward(batch, &logits_);
  if (!forward.ok()) {
    // The batch's cache state is unknown now: end every sequence in it (with an error event)
    // so the engine keeps serving the others and later requests.
    for (Sequence* s : owners) {
      if (!s->finished) Finish(*s, FinishReason::kError, events);
    }
    std::erase_if(running_, [](const auto& s) { return s->finished; });
    return forward;
  }

  const int vocab = backend_->vocab_size();
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *owners[i];
    const bool was_prefill = s.prefilled < static_cast<int64_t>(s.request.prompt.size());
    if (was_prefill) {
      s.prefilled += batch[i].n;
      if (s.prefilled < static_cast<int64_t>(s.request.prompt.size())) continue;  // more chunks
    }
    SampledToken t;
    if (draws[i] != nullptr) {
      t.token = device_sampled_[i].token;
      t.logprob = device_sampled_[i].logprob;
    } else {
      t = s.sampler->Sample(std::span<const float>(logits_.data() + i * vocab, vocab),
                            s.generated);
    }
    s.generated.push_back(t.token);
    const StopChecker::Step stop =
        s.stop->Add(t.token, token_bytes_(t.token), static_cast<int>(s.generated.size()));
    GenerationEvent e;
    e.sequence_id = s.id;
    e.request_id = s.request.request_id;
    e.token = t.token;
    e.logprob = t.logprob;
    e.top_logprobs = t.top;
    e.text = stop.text;
    e.prompt_tokens = static_cast<int>(s.request.prompt.size());
    e.generated_tokens = static_cast<int>(s.generated.size());
    e.finish = stop.finish;
    e.matched_stop = stop.matched_stop;
    e.cached_tokens = s.cached_tokens;
    e.recent_window_from_int2_pages = s.recent_window_from_int2_pages;
    e.in_place_pages = s.in_place_pages;
    if (stop.finish != FinishReason::kNone) {
      Publish(s, e);
    } else if (s.generated.size() == 1 && s.request.publish_pages) {
      // Prefill is done: the prompt's full pages are final, share them now.
      absl::StatusOr<std::vector<ExportedPage>> pages =
          cache_->ExportPages(s.kv, backend_->device_page_access());
      if (pages.ok()) e.prompt_pages = *std::move(pages);
    }
    events->push_back(std::move(e));
    if (stop.finish != FinishReason::kNone) {
      cache_->Release(s.kv);
      s.finished = true;
    } else {
      s.kv.tokens.push_back(t.token);  // the next step's input
    }
  }
  std::erase_if(running_, [](const auto& s) { return s->finished; });
  return absl::OkStatus();
}

}  // namespace kvstrata::engine

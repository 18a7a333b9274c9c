#pragma once

// Continuous batching on one engine: requests queue, are admitted when the KV cache can hold
// them whole (prompt + max_tokens, reserved up front so a running sequence never runs out of
// pages), prefill in chunks, and decode together; every Step() runs one forward pass over
// the decode tokens of all running sequences plus prefill chunks up to a token budget.
// Thread-compatible: the owner calls it from one thread (the decode service's engine loop).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/radix_hash.h"
#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"
#include "engine/stop.h"

namespace kvstrata::engine {

struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt;  // token ids, non-empty
  SamplingOptions sampling;
  StopOptions stop;
  PageKey namespace_key;  // radix-hash root for this request's pages (model, format, salt)
  // A cached prefix (e.g. fetched from the kvstore): whole page bytes for the prompt's first N
  // full pages, N*64 <= prompt size - 1, an INT2 and/or a BF16 copy per page
  // (KvCache::CheckCachedPrefix). The sequence starts with these pages and prefills only the
  // rest. Submit rejects a corrupt page, a wrong key or a wrong shape with InvalidArgument; the
  // caller counts the miss and may resubmit without cached_pages (a full prefill).
  std::vector<std::string> cached_pages;
  // More of the cached prefix, in the device memory of another process on this GPU (the GPU
  // kvstore's pool, mapped here, or the worker's NCCL receive slab): imported device to device.
  // The memory must stay mapped and the pages leased until the request's first event.
  std::vector<DevicePage> device_cached_pages;
  // Owns memory the cached pages lie in that is wanted back as soon as they are copied out (the
  // NCCL receive slab, which takes one transfer at a time): the scheduler lets go of it once the
  // prefix is imported into the sequence's own slots (or fails to be), or when the request ends
  // before that. Null: nothing to let go of.
  std::shared_ptr<void> cached_pages_owner;
  // Set when the device cached pages may be read where they lie for the whole request: what
  // keeps their memory mapped and the pages leased (the GPU kvstore's pool on this GPU, and a
  // lease held by this worker's connection to it). The history pages the backend can reach are
  // then not copied (KvCache::ImportPrefix); the sequence keeps this until it ends. Null: every
  // device page is copied into the sequence's own slots.
  std::shared_ptr<void> in_place_hold;
  // When true, the final event carries the sequence's full pages (published_pages), and the
  // event of the first generated token, if the sequence goes on, its full prompt pages
  // (prompt_pages), so they can be shared while it decodes.
  bool publish_pages = false;
};

struct GenerationEvent {
  uint64_t sequence_id = 0;
  std::string request_id;
  int32_t token = -1;  // the generated token, -1 when the event carries none
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  std::string text;  // text that may be streamed now
  FinishReason finish = FinishReason::kNone;
  std::string matched_stop;  // for kStopString: the stop string that matched
  int prompt_tokens = 0;
  int generated_tokens = 0;
  int cached_tokens = 0;  // prompt tokens taken from cached_pages rather than computed
  // Cached pages that had to be BF16 (sink or recent window) but came only as INT2 and were
  // dequantised (those tokens' K/V are approximate, not what prefill computes).
  int recent_window_from_int2_pages = 0;
  // Cached history pages the sequence reads where they lie (GenerationRequest::in_place_hold).
  int in_place_pages = 0;
  // Final event only, when the request asked (publish_pages) and the sequence did not fail:
  // its full pages as the kvstore stores them, taken before the pages were freed.
  std::vector<ExportedPage> published_pages;
  // First generated token's event only, when the request asked (publish_pages) and the sequence
  // goes on: the full pages of the prompt as they are right after prefill (pages in the recent
  // window are BF16 then). The final event's published_pages includes them again.
  std::vector<ExportedPage> prompt_pages;
};

struct SchedulerOptions {
  int max_running = 8;             // sequences decoding together
  int max_waiting = 256;           // queued requests before Submit answers ResourceExhausted
  int max_step_tokens = 512;       // tokens per forward pass (decode tokens + prefill chunks)
  int prefill_chunk = 256;         // largest chunk of one prompt per step
  uint64_t seed = 0x6b7673747261;  // default sampling seed base for unseeded requests
};

class Scheduler {
 public:
  using TokenBytes = std::function<std::string(int32_t)>;
  using IsEndOfGeneration = std::function<bool(int32_t)>;

  Scheduler(Backend* backend, KvCache* cache, TokenBytes token_bytes, IsEndOfGeneration is_eog,
            const SchedulerOptions& options);
  ~Scheduler();

  // Validates and queues a request. InvalidArgument (naming the field) for bad options or a
  // request the KV cache could never hold; ResourceExhausted when the queue is full.
  absl::StatusOr<uint64_t> Submit(GenerationRequest request);
  // Ends a sequence at the next Step with the given reason (idempotent; unknown ids ignored).
  void Cancel(uint64_t sequence_id, FinishReason reason = FinishReason::kCancelled);
  // Runs one forward pass (if there is work) and appends the resulting events.
  absl::Status Step(std::vector<GenerationEvent>* events);

  bool idle() const { return running_.empty() && waiting_.empty(); }
  int running() const { return static_cast<int>(running_.size()); }
  int waiting() const { return static_cast<int>(waiting_.size()); }

 private:
  struct Sequence;
  // Fills e.published_pages when the request asked for them.
  void Publish(const Sequence& s, GenerationEvent& e) const;
  void Finish(Sequence& s, FinishReason reason, std::vector<GenerationEvent>* events,
              std::string text = "");

  Backend* backend_;
  KvCache* cache_;
  TokenBytes token_bytes_;
  IsEndOfGeneration is_eog_;
  SchedulerOptions options_;
  uint64_t next_id_ = 1;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::unordered_map<uint64_t, FinishReason> cancelled_;
  std::vector<float> logits_;
  std::vector<DeviceSampled> device_sampled_;
};

}  // namespace kvstrata::engine

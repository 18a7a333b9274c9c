#pragma once

// DecodeService::Call: the state of one Generate call, shared by its steps before the stream
// (decode_generate.cc) and the stream itself (decode_stream.cc). Internal to the decode service.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/decode/decode_service.h"

namespace kvstrata::decode {

struct DecodeService::Call {
  Call(const v1::GenerateRequest& r, absl::Time deadline) : request(r), deadline(deadline) {}

  const v1::GenerateRequest& request;
  const absl::Time start = absl::Now();
  const absl::Time deadline;  // the client's; InfiniteFuture when it set none
  std::string request_id;
  engine::GenerationRequest engine_request;  // moved to the engine at submit
  int prompt_tokens = 0;
  PageKey namespace_key;
  std::vector<PageKey> keys;  // the prompt's cacheable pages
  int local_pages = 0;        // leading pages taken from the local tier
  int kvstore_pages = 0;      // the pages after them fetched from the kvstore
  absl::Duration fetch_time;
  std::shared_ptr<RequestChannel> channel;
  std::shared_ptr<Prefilling> prefilling;
  // Holds the kvstore lease of pages the engine reads from a same-GPU pool, for the call's life.
  std::shared_ptr<void> kvstore_lease;
  uint64_t sequence_id = 0;
  absl::Time submitted;
  // What has been streamed so far.
  int generated = 0;
  int cached_tokens = 0;  // as the engine's events report it
  int recent_window_from_int2_pages = 0;
  int in_place_pages = 0;           // cached pages the engine reads in a same-GPU store's pool
  int64_t prompt_pages_shared = 0;  // prompt pages published right after prefill
  absl::Time first_token = absl::InfiniteFuture();
  absl::Time last_token = absl::InfinitePast();
};

}  // namespace kvstrata::decode

#pragma once

// What kvstrata-loadtest sends: the requests of a workload and when each is due. No gRPC here;
// loadtest/client.h turns a RequestSpec into a Generate call.
//
// Workloads:
//   shared-prefix  groups x prompts-per-group chat requests: each group has its own system prompt
//                  of about --system-tokens tokens of real English text, each request its own
//                  question of about --question-tokens tokens (text cut from other places of the
//                  same file), so a group's requests share a prefix and the groups do not.
//   sessions       multi-turn chat: --sessions conversations of --turns turns each; turn k+1 is
//                  sent when turn k has returned and carries the whole conversation so far (the
//                  system prompt, every question and the answers as they came back), with the
//                  session id as a routing hint, so each turn's prompt extends the last one's.
//   trace          Mooncake JSONL replay (timestamp ms, input_length, output_length, hash_ids):
//                  every 512-token block gets token ids derived from its hash id alone, so equal
//                  ids give equal tokens and the trace's chains stay chains; the last block is cut
//                  to input_length; output_length becomes max_tokens with ignore_eos.
//
// Arrivals: a rate with Poisson or gamma gaps (burstiness = 1 / shape: 1 is Poisson, more is
// burstier), the trace's own timestamps (divided by --speedup), or a closed loop of --concurrency
// requests in flight (no arrival times at all).

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvstrata::loadtest {

struct RequestSpec {
  // Exactly one input: token ids, or chat messages (role, content).
  std::vector<uint32_t> token_ids;
  std::vector<std::pair<std::string, std::string>> messages;
  uint32_t max_tokens = 32;
  bool ignore_eos = false;
  std::string group;       // what the request shares a prefix with ("g3", "trace"), for reports
  double trace_time_s = -1;  // the trace's arrival time (before --speedup), -1 if none
  // Multi-turn sessions: turn `turn` of session `session` (-1: not part of one). Its messages
  // are the system prompt and this turn's question; the client puts the conversation so far
  // between them when it sends the turn.
  int session = -1;
  int turn = 0;
};

// One line of a Mooncake trace.
struct TraceRecord {
  double timestamp_ms = 0;
  uint32_t input_length = 0;
  uint32_t output_length = 0;
  std::vector<int64_t> hash_ids;
};

// Parses one JSONL line; InvalidArgument naming the field and the line number otherwise.
absl::StatusOr<TraceRecord> ParseTraceLine(std::string_view line, int line_number);
// Reads a whole trace file (blank lines skipped); at most `limit` records when limit > 0.
absl::StatusOr<std::vector<TraceRecord>> ReadTrace(const std::string& path, int64_t limit);

// How trace blocks become token ids.
struct BlockMapping {
  int block_tokens = 512;     // tokens per block in the request (the trace's 512, or scaled)
  uint32_t first_id = 256;    // token ids are drawn from [first_id, end_id)
  uint32_t end_id = 32000;
};
// The mapping for a target whose vocabulary has `vocab` ids, at `scale` of the trace's lengths:
// ids clear of the first and last 256 (byte and control tokens in most vocabularies), or the
// whole vocabulary when it is small (a byte-level tokenizer); blocks of 512 x scale tokens.
BlockMapping MappingFor(uint32_t vocab, double scale);
// The ids of one block: a function of its hash id alone.
std::vector<uint32_t> BlockTokens(int64_t hash_id, const BlockMapping& m);
// A request's prompt: its blocks' tokens in order, cut to input_length (scaled by
// block_tokens / 512, at least 1 token). FailedPrecondition when the blocks are too few.
absl::StatusOr<std::vector<uint32_t>> TracePrompt(const TraceRecord& r, const BlockMapping& m);

struct SharedPrefixOptions {
  int groups = 8;
  int prompts_per_group = 16;
  int system_tokens = 600;   // about: 4 characters of English per token
  int question_tokens = 40;
  uint32_t max_tokens = 32;
  uint64_t seed = 1;
};
// The requests of a shared-prefix workload over `text` (real English), shuffled with `seed` so
// groups interleave. InvalidArgument when the text is too short for the lengths asked.
absl::StatusOr<std::vector<RequestSpec>> SharedPrefixRequests(const SharedPrefixOptions& o,
                                                             std::string_view text);

struct SessionOptions {
  int sessions = 4;
  int turns = 4;
  int system_tokens = 300;
  int question_tokens = 30;
  uint32_t max_tokens = 32;
  uint64_t seed = 1;
};
// The turns of a multi-turn workload, session by session (turn 0 first in each), over `text`.
absl::StatusOr<std::vector<RequestSpec>> SessionRequests(const SessionOptions& o,
                                                        std::string_view text);

// Send times (seconds from the start) of n requests at `rate` per second with gamma-distributed
// gaps of shape 1 / burstiness (burstiness 1: exponential gaps, a Poisson process).
std::vector<double> GammaArrivals(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace kvstrata::loadtest

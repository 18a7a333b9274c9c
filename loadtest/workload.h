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
//   agent          agent loops: --agents loops of --steps steps; step 0 is a task under a
//                  system prompt all agents share (their tool definitions), every later step
//                  appends the model's last answer and a tool output of about --tool_tokens
//                  tokens (the next piece of a document the agent is reading) to the whole
//                  context so far, and is sent when the step before it has returned.
//   docqa          long-document QA: --documents documents of about --document_tokens tokens,
//                  each request one document and a new question after it, in the order a
//                  hit:miss pattern gives (--hit_miss=H:M: M requests on documents not sent
//                  before, then H on documents already sent, again and again).
//   trace          Mooncake JSONL replay (timestamp ms, input_length, output_length, hash_ids):
//                  every 512-token block gets token ids derived from its hash id alone, so equal
//                  ids give equal tokens and the trace's chains stay chains; the last block is cut
//                  to input_length; output_length becomes max_tokens with ignore_eos.
//
// Arrivals: stages (--stages=VALUE:SECONDS,...: open loop, a rate per stage; closed loop, a
// concurrency per stage), a rate with Poisson or gamma gaps (burstiness = 1 / shape: 1 is Poisson,
// more is burstier), the trace's own timestamps (divided by --speedup), or a closed loop of
// --concurrency requests in flight (no arrival times at all).

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

struct AgentOptions {
  int agents = 4;
  int steps = 6;            // requests per loop: the task, then a tool output per step
  int system_tokens = 300;  // shared by every agent
  int task_tokens = 40;
  int tool_tokens = 200;
  uint32_t max_tokens = 32;
  uint64_t seed = 1;
};
// The steps of agent loops, loop by loop (step 0 first in each), as sessions: the client puts
// the loop's context so far (earlier steps and the answers as they came back) between the
// system prompt and the step's own message. InvalidArgument for bad counts or too little text.
absl::StatusOr<std::vector<RequestSpec>> AgentRequests(const AgentOptions& o,
                                                       std::string_view text);

struct DocQaOptions {
  int documents = 8;
  int document_tokens = 2000;
  int question_tokens = 30;
  int hits = 1;  // the pattern: `misses` requests on new documents, then `hits` on sent ones
  int misses = 1;
  uint32_t max_tokens = 32;
  uint64_t seed = 1;
};
// Long-document QA over `text`: the documents are consecutive, non-overlapping pieces of it (so
// they share no prefix), each request "document, then question" in group "d<k>". A hit picks
// a document already sent, uniformly; the requests end with the hits after the last new
// document: documents + hits x ceil(documents / misses) in all. InvalidArgument when the text
// is too short for the documents asked.
absl::StatusOr<std::vector<RequestSpec>> DocQaRequests(const DocQaOptions& o,
                                                       std::string_view text);
// "H:M" (integers, H >= 0, M >= 1) as {H, M}.
absl::StatusOr<std::pair<int, int>> ParseHitMiss(std::string_view spec);

// One stage of a run: `value` is the rate (requests/s, open loop) or the concurrency (closed
// loop) for `duration_s` seconds.
struct Stage {
  double value = 0;
  double duration_s = 0;
};
// "VALUE:SECONDS,VALUE:SECONDS,..." (each > 0); InvalidArgument naming the bad part.
absl::StatusOr<std::vector<Stage>> ParseStages(std::string_view spec);
// The stage that second t of the run falls in (the last one past the end); -1 with no stages.
int StageAt(const std::vector<Stage>& stages, double t);
// Send times of at most n requests through the stages: gamma gaps (as GammaArrivals) at each
// stage's rate, from its start to its end.
std::vector<double> StagedArrivals(int64_t n, const std::vector<Stage>& stages, double burstiness,
                                   uint64_t seed);

// Send times (seconds from the start) of n requests at `rate` per second with gamma-distributed
// gaps of shape 1 / burstiness (burstiness 1: exponential gaps, a Poisson process).
std::vector<double> GammaArrivals(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace kvstrata::loadtest

#include "loadtest/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvstrata::loadtest {

absl::StatusOr<TraceRecord> ParseTraceLine(std::string_view line, int line_number) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("trace line ", line_number, ": ", what));
  };
  if (!j.is_object()) return bad("not a JSON object");
  TraceRecord r;
  for (const char* field : {"timestamp", "input_length", "output_length", "hash_ids"}) {
    if (!j.contains(field)) return bad(absl::StrCat("no \"", field, "\""));
  }
  if (!j["timestamp"].is_number() || j["timestamp"].get<double>() < 0) {
    return bad("\"timestamp\" must be a number >= 0 (ms)");
  }
  for (const char* field : {"input_length", "output_length"}) {
    if (!j[field].is_number_unsigned() && !(j[field].is_number_integer() && j[field] >= 0)) {
      return bad(absl::StrCat("\"", field, "\" must be an integer >= 0"));
    }
  }
  if (!j["hash_ids"].is_array()) return bad("\"hash_ids\" must be an array");
  r.timestamp_ms = j["timestamp"].get<double>();
  r.input_length = j["input_length"].get<uint32_t>();
  r.output_length = j["output_length"].get<uint32_t>();
  for (const auto& h : j["hash_ids"]) {
    if (!h.is_number_integer()) return bad("\"hash_ids\" must hold integers");
    r.hash_ids.push_back(h.get<int64_t>());
  }
  return r;
}

absl::StatusOr<std::vector<TraceRecord>> ReadTrace(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the trace file ", path));
  std::vector<TraceRecord> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    absl::StatusOr<TraceRecord> r = ParseTraceLine(line, n);
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", r.status().message()));
    out.push_back(*std::move(r));
    if (limit > 0 && static_cast<int64_t>(out.size()) >= limit) break;
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no requests"));
  return out;
}

BlockMapping MappingFor(uint32_t vocab, double scale) {
  BlockMapping m;
  m.block_tokens = std::max(1, static_cast<int>(std::lround(512 * scale)));
  m.first_id = vocab > 512 ? 256 : 0;
  m.end_id = vocab > 512 ? vocab - 256 : vocab;
  return m;
}

std::vector<uint32_t> BlockTokens(int64_t hash_id, const BlockMapping& m) {
  // splitmix64 over (hash id, position): no state shared between blocks.
  std::vector<uint32_t> ids(m.block_tokens);
  const uint64_t span = m.end_id > m.first_id ? m.end_id - m.first_id : 1;
  for (int i = 0; i < m.block_tokens; ++i) {
    uint64_t x = static_cast<uint64_t>(hash_id) * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    ids[i] = m.first_id + static_cast<uint32_t>(x % span);
  }
  return ids;
}

absl::StatusOr<std::vector<uint32_t>> TracePrompt(const TraceRecord& r, const BlockMapping& m) {
  const uint64_t want = std::max<uint64_t>(
      1, static_cast<uint64_t>(std::llround(static_cast<double>(r.input_length) * m.block_tokens / 512.0)));
  if (r.hash_ids.size() * static_cast<uint64_t>(m.block_tokens) < want) {
    return absl::FailedPreconditionError(absl::StrCat(
        "input_length ", r.input_length, " needs more than its ", r.hash_ids.size(), " blocks"));
  }
  std::vector<uint32_t> prompt;
  prompt.reserve(want);
  for (int64_t h : r.hash_ids) {
    if (prompt.size() >= want) break;
    const std::vector<uint32_t> block = BlockTokens(h, m);
    prompt.insert(prompt.end(), block.begin(), block.end());
  }
  prompt.resize(want);
  return prompt;
}

namespace {

// About `tokens` tokens of `text` from byte `at` (wrapping), cut at word boundaries.
std::string TextSlice(std::string_view text, size_t at, int tokens) {
  const size_t chars = static_cast<size_t>(tokens) * 4;
  std::string out;
  size_t i = at % text.size();
  while (i < text.size() && text[i] != ' ' && text[i] != '\n') ++i;  // start on a word
  while (out.size() < chars) {
    if (i >= text.size()) i = 0;
    const char c = text[i++];
    out.push_back(c == '\n' || c == '\t' ? ' ' : c);
  }
  while (!out.empty() && out.back() != ' ') out.pop_back();
  if (out.empty()) out = std::string(text.substr(0, std::min(chars, text.size())));
  return out;
}

}  // namespace

namespace {

// `groups` x `per_group` chat requests over `text`, group by group: each group its own system
// prompt, each request its own question. As sessions, a group is a conversation and its
// requests are the turns in order.
absl::StatusOr<std::vector<RequestSpec>> GroupedChats(int groups, int per_group,
                                                      int system_tokens, int question_tokens,
                                                      uint32_t max_tokens, bool sessions,
                                                      std::string_view text,
                                                      std::mt19937_64& rng) {
  if (system_tokens < 1 || question_tokens < 1) {
    return absl::InvalidArgumentError("--system_tokens and --question_tokens must be >= 1");
  }
  if (text.size() < 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text file holds ", text.size(), " bytes; at least 4096 are needed"));
  }
  std::uniform_int_distribution<size_t> offset(0, text.size() - 1);
  std::vector<RequestSpec> out;
  for (int g = 0; g < groups; ++g) {
    const std::string system = absl::StrCat("You are assistant number ", g, ". Background: ",
                                            TextSlice(text, offset(rng), system_tokens));
    for (int p = 0; p < per_group; ++p) {
      RequestSpec r;
      r.messages = {{"system", system},
                    {"user", absl::StrCat(sessions && p > 0 ? "And this: " : "Summarise this: ",
                                          TextSlice(text, offset(rng), question_tokens))}};
      r.max_tokens = max_tokens;
      r.group = absl::StrCat(sessions ? "s" : "g", g);
      if (sessions) {
        r.session = g;
        r.turn = p;
      }
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<RequestSpec>> SharedPrefixRequests(const SharedPrefixOptions& o,
                                                             std::string_view text) {
  if (o.groups < 1 || o.prompts_per_group < 1) {
    return absl::InvalidArgumentError("--groups and --prompts_per_group must be >= 1");
  }
  std::mt19937_64 rng(o.seed);
  absl::StatusOr<std::vector<RequestSpec>> out =
      GroupedChats(o.groups, o.prompts_per_group, o.system_tokens, o.question_tokens,
                   o.max_tokens, /*sessions=*/false, text, rng);
  if (out.ok()) std::shuffle(out->begin(), out->end(), rng);  // groups interleave
  return out;
}

absl::StatusOr<std::vector<RequestSpec>> SessionRequests(const SessionOptions& o,
                                                        std::string_view text) {
  if (o.sessions < 1 || o.turns < 1) {
    return absl::InvalidArgumentError("--sessions and --turns must be >= 1");
  }
  std::mt19937_64 rng(o.seed);
  return GroupedChats(o.sessions, o.turns, o.system_tokens, o.question_tokens, o.max_tokens,
                      /*sessions=*/true, text, rng);
}

namespace {

// The text with every run of whitespace made one space: documents cut from manuals (indented,
// in columns) hold about as many tokens as their length in characters / 4 says.
std::string OneSpace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f';
    if (space) {
      if (!out.empty() && out.back() != ' ') out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Consecutive pieces of about `tokens` tokens each, cut at spaces, from `*at` on (moved past).
std::string NextPiece(std::string_view text, size_t* at, int tokens) {
  const size_t want = static_cast<size_t>(tokens) * 4;
  size_t end = std::min(text.size(), *at + want);
  while (end < text.size() && text[end] != ' ') ++end;
  std::string piece(text.substr(*at, end - *at));
  *at = end < text.size() ? end + 1 : 0;  // a loop past the end starts the text again
  return piece;
}

}  // namespace

absl::StatusOr<std::vector<RequestSpec>> AgentRequests(const AgentOptions& o,
                                                       std::string_view text) {
  if (o.agents < 1 || o.steps < 1) {
    return absl::InvalidArgumentError("--agents and --steps must be >= 1");
  }
  if (o.system_tokens < 1 || o.task_tokens < 1 || o.tool_tokens < 1) {
    return absl::InvalidArgumentError(
        "--system_tokens, --question_tokens and --tool_tokens must be >= 1");
  }
  const std::string prose = OneSpace(text);
  const size_t need = static_cast<size_t>(o.system_tokens + o.agents * o.task_tokens) * 4 + 4096;
  if (prose.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the text holds ", prose.size(), " characters; these agents need at least ", need));
  }
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<size_t> offset(0, prose.size() - 1);
  const std::string system = absl::StrCat(
      "You are an agent that solves a task step by step. After each of your answers a tool "
      "runs and its output follows as the next message. Reference: ",
      TextSlice(prose, offset(rng), o.system_tokens));
  std::vector<RequestSpec> out;
  for (int a = 0; a < o.agents; ++a) {
    size_t reading = offset(rng);  // where this agent's document reader starts
    while (reading < prose.size() && prose[reading] != ' ') ++reading;
    if (reading >= prose.size()) reading = 0;
    for (int k = 0; k < o.steps; ++k) {
      RequestSpec r;
      r.messages = {{"system", system},
                    {"user", k == 0 ? absl::StrCat("Task: find what this is about and report: ",
                                                   TextSlice(prose, offset(rng), o.task_tokens))
                                    : absl::StrCat("Tool output (read_document, part ", k, "): ",
                                                   NextPiece(prose, &reading, o.tool_tokens))}};
      r.max_tokens = o.max_tokens;
      r.group = absl::StrCat("a", a);
      r.session = a;
      r.turn = k;
      out.push_back(std::move(r));
    }
  }
  return out;
}

absl::StatusOr<std::pair<int, int>> ParseHitMiss(std::string_view spec_in) {
  const absl::string_view spec(spec_in.data(), spec_in.size());  // Debian's Abseil: its own type
  const size_t colon = spec.find(':');
  int h = 0, m = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(spec.substr(0, colon), &h) ||
      !absl::SimpleAtoi(spec.substr(colon + 1), &m) || h < 0 || m < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--hit_miss=", spec, ": expected HITS:MISSES, integers, HITS >= 0 and MISSES >= 1"));
  }
  return std::make_pair(h, m);
}

absl::StatusOr<std::vector<RequestSpec>> DocQaRequests(const DocQaOptions& o,
                                                       std::string_view text) {
  if (o.documents < 1 || o.document_tokens < 1 || o.question_tokens < 1) {
    return absl::InvalidArgumentError(
        "--documents, --document_tokens and --question_tokens must be >= 1");
  }
  if (o.hits < 0 || o.misses < 1) {
    return absl::InvalidArgumentError("--hit_miss: HITS >= 0 and MISSES >= 1");
  }
  const std::string prose = OneSpace(text);
  const size_t need = static_cast<size_t>(o.documents) * o.document_tokens * 4 + 4096;
  if (prose.size() < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text holds ", prose.size(), " characters; ", o.documents,
                     " documents of ", o.document_tokens, " tokens need about ", need,
                     " (fewer or shorter documents, or more text: scripts/fetch-text.sh)"));
  }
  std::mt19937_64 rng(o.seed);
  // The documents from the start of the text on; the questions from the part no document uses.
  std::vector<std::string> docs;
  size_t at = 0;
  for (int d = 0; d < o.documents; ++d) docs.push_back(NextPiece(prose, &at, o.document_tokens));
  std::uniform_int_distribution<size_t> question_at(at, prose.size() - 1);
  std::vector<RequestSpec> out;
  auto add = [&](int d) {
    RequestSpec r;
    r.messages = {{"system", "Answer the question about the document."},
                  {"user", absl::StrCat("Document:\n", docs[d],
                                        "\n\nQuestion: what does it say "
                                        "about this? ",
                                        TextSlice(prose, question_at(rng), o.question_tokens))}};
    r.max_tokens = o.max_tokens;
    r.group = absl::StrCat("d", d);
    out.push_back(std::move(r));
  };
  int sent = 0;
  while (sent < o.documents) {
    for (int m = 0; m < o.misses && sent < o.documents; ++m) add(sent++);
    std::uniform_int_distribution<int> seen(0, sent - 1);
    for (int h = 0; h < o.hits; ++h) add(seen(rng));
  }
  return out;
}

absl::StatusOr<std::vector<Stage>> ParseStages(std::string_view spec_in) {
  const absl::string_view spec(spec_in.data(), spec_in.size());
  std::vector<Stage> out;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    const size_t colon = part.find(':');
    Stage s;
    if (colon == absl::string_view::npos || !absl::SimpleAtod(part.substr(0, colon), &s.value) ||
        !absl::SimpleAtod(part.substr(colon + 1), &s.duration_s) || !(s.value > 0) ||
        !(s.duration_s > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--stages: \"", part, "\" is not VALUE:SECONDS with both > 0"));
    }
    out.push_back(s);
  }
  return out;
}

int StageAt(const std::vector<Stage>& stages, double t) {
  if (stages.empty()) return -1;
  double end = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    end += stages[i].duration_s;
    if (t < end) return static_cast<int>(i);
  }
  return static_cast<int>(stages.size()) - 1;
}

std::vector<double> StagedArrivals(int64_t n, const std::vector<Stage>& stages, double burstiness,
                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double shape = 1.0 / std::max(burstiness, 1e-6);
  std::vector<double> at;
  double start = 0;
  for (const Stage& s : stages) {
    std::gamma_distribution<double> gap(shape, 1.0 / (s.value * shape));
    for (double t = start; t < start + s.duration_s && static_cast<int64_t>(at.size()) < n;
         t += gap(rng)) {
      at.push_back(t);
    }
    start += s.duration_s;
  }
  return at;
}

std::vector<double> GammaArrivals(int64_t n, double rate, double burstiness, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double shape = 1.0 / std::max(burstiness, 1e-6);
  std::gamma_distribution<double> gap(shape, 1.0 / (rate * shape));  // mean 1 / rate
  std::vector<double> at(n);
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    at[i] = t;
    t += gap(rng);
  }
  return at;
}

}  // namespace kvstrata::loadtest

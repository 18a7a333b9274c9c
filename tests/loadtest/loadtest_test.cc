// kvstrata-loadtest's parts that need no server: the trace parser, the block-to-token mapping,
// the shared-prefix workload, the arrival process and the statistics.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "loadtest/report.h"
#include "loadtest/workload.h"

namespace kvstrata::loadtest {
namespace {

TEST(TraceTest, ParsesALineAndNamesWhatIsWrong) {
  absl::StatusOr<TraceRecord> r = ParseTraceLine(
      R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]})",
      3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->timestamp_ms, 27482);
  EXPECT_EQ(r->input_length, 6955u);
  EXPECT_EQ(r->output_length, 52u);
  EXPECT_EQ(r->hash_ids, (std::vector<int64_t>{46, 47, 48}));

  absl::StatusOr<TraceRecord> missing =
      ParseTraceLine(R"({"timestamp": 1, "input_length": 5, "hash_ids": []})", 7);
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_NE(missing.status().message().find("line 7"), std::string::npos);
  EXPECT_NE(missing.status().message().find("output_length"), std::string::npos);
  EXPECT_FALSE(ParseTraceLine("{not json", 1).ok());
  EXPECT_FALSE(ParseTraceLine(
                   R"({"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": []})", 1)
                   .ok());
  EXPECT_FALSE(ParseTraceLine(
                   R"({"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]})",
                   1)
                   .ok());
}

TEST(TraceTest, ReadsTheCommittedSliceOfTheMooncakeTrace) {
  absl::StatusOr<std::vector<TraceRecord>> t =
      ReadTrace("tests/loadtest/data/mooncake_conversation_head.jsonl", 0);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 40u);
  // Every request of the trace starts with block 0 (its README says so).
  for (const TraceRecord& r : *t) EXPECT_EQ(r.hash_ids.front(), 0);
  absl::StatusOr<std::vector<TraceRecord>> five =
      ReadTrace("tests/loadtest/data/mooncake_conversation_head.jsonl", 5);
  ASSERT_TRUE(five.ok());
  EXPECT_EQ(five->size(), 5u);
  EXPECT_TRUE(absl::IsNotFound(ReadTrace("no/such/trace.jsonl", 0).status()));
}

TEST(BlockTokensTest, AreAFunctionOfTheHashIdAlone) {
  BlockMapping m;
  m.block_tokens = 512;
  m.first_id = 256;
  m.end_id = 1000;
  const std::vector<uint32_t> a = BlockTokens(46, m), b = BlockTokens(46, m), c = BlockTokens(47, m);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  ASSERT_EQ(a.size(), 512u);
  for (uint32_t id : a) {
    EXPECT_GE(id, 256u);
    EXPECT_LT(id, 1000u);
  }
  // Not a constant or a short cycle: most of the 744 ids in range appear.
  std::vector<bool> seen(1000);
  for (uint32_t id : a) seen[id] = true;
  EXPECT_GT(std::count(seen.begin(), seen.end(), true), 300);
}

TEST(BlockTokensTest, IdsStayInsideTheTargetsVocabulary) {
  for (uint32_t vocab : {259u, 49152u, 151936u}) {
    const BlockMapping m = MappingFor(vocab, 0.0625);
    EXPECT_EQ(m.block_tokens, 32);
    for (int64_t h : {0, 1, 77, 123456}) {
      for (uint32_t id : BlockTokens(h, m)) EXPECT_LT(id, vocab) << vocab;
    }
  }
  EXPECT_EQ(MappingFor(49152, 1.0).first_id, 256u);
  EXPECT_EQ(MappingFor(49152, 1.0).end_id, 49152u - 256);
}

TEST(BlockTokensTest, PromptsSharingBlocksShareTokensAndAreCutToTheirLength) {
  BlockMapping m;
  m.block_tokens = 16;  // a 1/32 scale
  TraceRecord r1{0, 1200, 10, {0, 1, 2}}, r2{0, 1500, 10, {0, 1, 5}}, r3{0, 20, 1, {9, 1, 2}};
  absl::StatusOr<std::vector<uint32_t>> p1 = TracePrompt(r1, m), p2 = TracePrompt(r2, m),
                                        p3 = TracePrompt(r3, m);
  ASSERT_TRUE(p1.ok() && p2.ok() && p3.ok());
  EXPECT_EQ(p1->size(), 38u);  // round(1200 / 32)
  EXPECT_EQ(p2->size(), 47u);  // round(1500 / 32)
  EXPECT_EQ(p3->size(), 1u);   // at least one token
  // Blocks 0 and 1 are shared: the first 32 tokens agree, block 2 vs 5 differ.
  const size_t common = std::mismatch(p1->begin(), p1->end(), p2->begin()).first - p1->begin();
  EXPECT_EQ(common >= 32 && common < 40, true) << common;
  // A chain that starts elsewhere shares nothing, even with equal later ids.
  EXPECT_NE((*p3)[0], (*p1)[0]);
  // More tokens than blocks hold.
  EXPECT_TRUE(absl::IsFailedPrecondition(TracePrompt({0, 5000, 1, {0, 1}}, m).status()));
}

TEST(SharedPrefixTest, GroupsShareTheirSystemPromptAndNothingElse) {
  std::ifstream in("/usr/share/common-licenses/GPL-3");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 10000u);
  SharedPrefixOptions o;
  o.groups = 3;
  o.prompts_per_group = 4;
  o.system_tokens = 200;
  o.question_tokens = 30;
  absl::StatusOr<std::vector<RequestSpec>> r = SharedPrefixRequests(o, text);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 12u);
  std::map<std::string, std::set<std::string>> systems, questions;
  for (const RequestSpec& s : *r) {
    ASSERT_EQ(s.messages.size(), 2u);
    EXPECT_EQ(s.messages[0].first, "system");
    systems[s.group].insert(s.messages[0].second);
    questions[s.group].insert(s.messages[1].second);
    // About 4 characters per token, cut at a word.
    EXPECT_NEAR(static_cast<double>(s.messages[0].second.size()), 200 * 4 + 40, 60);
  }
  ASSERT_EQ(systems.size(), 3u);
  std::set<std::string> all;
  for (const auto& [g, set] : systems) {
    EXPECT_EQ(set.size(), 1u) << g;  // one system prompt per group
    all.insert(*set.begin());
    EXPECT_EQ(questions[g].size(), 4u);  // every question its own
  }
  EXPECT_EQ(all.size(), 3u);  // the groups' prompts differ
  EXPECT_FALSE(SharedPrefixRequests(o, "too short").ok());
}

TEST(SessionsTest, TurnsComeSessionBySessionWithTheirOwnSystemPrompt) {
  std::ifstream in("/usr/share/common-licenses/GPL-3");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  SessionOptions o;
  o.sessions = 3;
  o.turns = 4;
  absl::StatusOr<std::vector<RequestSpec>> r = SessionRequests(o, text);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 12u);
  for (size_t i = 0; i < r->size(); ++i) {
    const RequestSpec& s = (*r)[i];
    EXPECT_EQ(s.session, static_cast<int>(i / 4));
    EXPECT_EQ(s.turn, static_cast<int>(i % 4));
    ASSERT_EQ(s.messages.size(), 2u);
    EXPECT_EQ(s.messages[0].second, (*r)[i - i % 4].messages[0].second);  // the session's system
    if (i % 4) {
      EXPECT_NE(s.messages[1].second, (*r)[i - 1].messages[1].second);  // a new question
    }
  }
  EXPECT_NE((*r)[0].messages[0].second, (*r)[4].messages[0].second);
  o.turns = 0;
  EXPECT_FALSE(SessionRequests(o, text).ok());
}

std::string Gpl3() {
  std::ifstream in("/usr/share/common-licenses/GPL-3");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The text of a step's tool output, after its "Tool output (...): " label.
std::string ToolOutput(const RequestSpec& s) {
  const std::string& m = s.messages[1].second;
  return m.substr(m.find("): ") + 3);
}

TEST(AgentTest, LoopsShareTheSystemPromptAndReadTheirDocumentOnward) {
  const std::string text = Gpl3();
  AgentOptions o;
  o.agents = 3;
  o.steps = 4;
  o.system_tokens = 100;
  o.task_tokens = 20;
  o.tool_tokens = 150;
  absl::StatusOr<std::vector<RequestSpec>> r = AgentRequests(o, text);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 12u);
  // The text as the tool outputs are cut from it: one space between words.
  std::string prose;
  for (char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c));
    if (!space)
      prose.push_back(c);
    else if (!prose.empty() && prose.back() != ' ')
      prose.push_back(' ');
  }
  for (size_t i = 0; i < r->size(); ++i) {
    const RequestSpec& s = (*r)[i];
    EXPECT_EQ(s.session, static_cast<int>(i / 4));
    EXPECT_EQ(s.turn, static_cast<int>(i % 4));
    EXPECT_EQ(s.group, "a" + std::to_string(i / 4));
    ASSERT_EQ(s.messages.size(), 2u);
    EXPECT_EQ(s.messages[0].second, (*r)[0].messages[0].second);  // one system prompt for all
    if (i % 4 == 0) {
      EXPECT_EQ(s.messages[1].second.rfind("Task: ", 0), 0u) << s.messages[1].second;
      continue;
    }
    const std::string out = ToolOutput(s);
    EXPECT_NEAR(static_cast<double>(out.size()), 150 * 4, 30) << out;
    EXPECT_NE(prose.find(out), std::string::npos) << "not a piece of the text: " << out;
    if (i % 4 >= 2) {  // the next piece of the same document, right after the last one
      EXPECT_NE(prose.find(ToolOutput((*r)[i - 1]) + " " + out), std::string::npos) << i;
    }
  }
  EXPECT_NE(ToolOutput((*r)[1]), ToolOutput((*r)[5]));  // agents read from different places
  o.steps = 0;
  EXPECT_FALSE(AgentRequests(o, text).ok());
  o.steps = 2;
  EXPECT_FALSE(AgentRequests(o, "too short").ok());
}

TEST(DocQaTest, TheHitMissPatternOrdersNewAndSentDocuments) {
  const std::string text = Gpl3();
  DocQaOptions o;
  o.documents = 5;
  o.document_tokens = 300;
  o.question_tokens = 20;
  o.hits = 2;
  o.misses = 1;
  absl::StatusOr<std::vector<RequestSpec>> r = DocQaRequests(o, text);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 15u);                  // 5 documents + 2 hits after each
  std::map<std::string, std::string> doc_of;  // group -> its document text
  std::set<std::string> questions;
  for (size_t i = 0; i < r->size(); ++i) {
    const RequestSpec& s = (*r)[i];
    const std::string& m = s.messages[1].second;
    const std::string doc = m.substr(0, m.find("\n\nQuestion: "));
    questions.insert(m.substr(doc.size()));
    const bool seen = doc_of.count(s.group) > 0;
    if (i % 3 == 0) {
      EXPECT_FALSE(seen) << i << ": a miss must bring a new document";
      EXPECT_EQ(s.group, "d" + std::to_string(i / 3));
      doc_of[s.group] = doc;
    } else {
      ASSERT_TRUE(seen) << i << ": a hit must reuse a sent document";
      EXPECT_EQ(doc, doc_of[s.group]);  // the same document, byte for byte
    }
  }
  EXPECT_EQ(questions.size(), 15u);  // every question its own
  // Documents are distinct pieces: no two share their first 100 characters, none holds another.
  for (const auto& [g, d] : doc_of) {
    EXPECT_NEAR(static_cast<double>(d.size()), std::string("Document:\n").size() + 300 * 4, 30);
    for (const auto& [h, e] : doc_of) {
      if (g != h) {
        EXPECT_NE(d.substr(0, 100), e.substr(0, 100)) << g << " " << h;
      }
    }
  }
  o.hits = 1;
  o.misses = 2;  // two new documents, then one sent: 5 + 1 x 3
  r = DocQaRequests(o, text);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 8u);
  EXPECT_EQ((*r)[0].group, "d0");
  EXPECT_EQ((*r)[1].group, "d1");
  o.documents = 100;  // 100 x 300 tokens: more than GPL-3 holds
  EXPECT_TRUE(absl::IsInvalidArgument(DocQaRequests(o, text).status()));

  absl::StatusOr<std::pair<int, int>> hm = ParseHitMiss("3:1");
  ASSERT_TRUE(hm.ok());
  EXPECT_EQ(*hm, std::make_pair(3, 1));
  EXPECT_TRUE(ParseHitMiss("0:1").ok());
  for (const char* bad : {"3", "1:0", "a:b", "-1:2", ""})
    EXPECT_FALSE(ParseHitMiss(bad).ok()) << bad;
}

TEST(StagesTest, ParsedAndLabelledAndSentAtEachStagesRate) {
  absl::StatusOr<std::vector<Stage>> st = ParseStages("10:200,40:100");
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_EQ(st->size(), 2u);
  EXPECT_EQ((*st)[1].value, 40);
  EXPECT_EQ((*st)[1].duration_s, 100);
  for (const char* bad : {"", "2", "0:5", "2:0", "a:b", "2:5,", "2:-1"}) {
    EXPECT_FALSE(ParseStages(bad).ok()) << bad;
  }
  EXPECT_EQ(StageAt(*st, 0), 0);
  EXPECT_EQ(StageAt(*st, 199.9), 0);
  EXPECT_EQ(StageAt(*st, 200), 1);
  EXPECT_EQ(StageAt(*st, 1e6), 1);
  EXPECT_EQ(StageAt({}, 3), -1);

  const std::vector<double> at = StagedArrivals(1000000, *st, 1.0, 3);
  int64_t first = 0, second = 0;
  for (double t : at) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, 300);
    (t < 200 ? first : second)++;
  }
  EXPECT_NEAR(first, 2000, 150);   // 10/s for 200 s
  EXPECT_NEAR(second, 4000, 250);  // 40/s for 100 s
  EXPECT_TRUE(std::is_sorted(at.begin(), at.end()));
  EXPECT_EQ(StagedArrivals(100, *st, 1.0, 3).size(), 100u);  // at most n
}

TEST(ArrivalsTest, GammaGapsHaveTheRateAndTheBurstinessAsked) {
  for (double burstiness : {1.0, 4.0}) {
    const int n = 40000;
    const std::vector<double> at = GammaArrivals(n, 10.0, burstiness, 7);
    ASSERT_EQ(at.size(), static_cast<size_t>(n));
    EXPECT_EQ(at[0], 0.0);
    std::vector<double> gaps;
    for (int i = 1; i < n; ++i) gaps.push_back(at[i] - at[i - 1]);
    const double mean = std::accumulate(gaps.begin(), gaps.end(), 0.0) / gaps.size();
    double var = 0;
    for (double g : gaps) var += (g - mean) * (g - mean);
    var /= gaps.size();
    EXPECT_NEAR(mean, 0.1, 0.005) << burstiness;
    // Gamma gaps of shape 1/b: squared coefficient of variation b.
    EXPECT_NEAR(var / (mean * mean), burstiness, 0.1 * burstiness) << burstiness;
  }
}

TEST(StatsTest, PercentilesInterpolateBetweenRanks) {
  const std::vector<double> v = {10, 1, 9, 2, 8, 3, 7, 4, 6, 5};  // 1..10, unordered
  // numpy.percentile([1..10], [50, 90, 99]) = 5.5, 9.1, 9.91
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 5.5);
  EXPECT_NEAR(Percentile(v, 0.9), 9.1, 1e-12);
  EXPECT_NEAR(Percentile(v, 0.99), 9.91, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 1.0), 10);
  EXPECT_DOUBLE_EQ(Percentile({42}, 0.99), 42);
  EXPECT_TRUE(std::isnan(Percentile({}, 0.5)));
}

RequestRecord Record(double ttft, double e2e, uint32_t completion, uint32_t prompt,
                     uint32_t cached, const std::string& status = "OK") {
  RequestRecord r;
  r.ttft_ms = ttft;
  r.e2e_ms = e2e;
  r.completion_tokens = completion;
  r.prompt_tokens = prompt;
  r.cached_local_tokens = cached;
  r.status = status;
  r.worker_id = "w0";
  r.finish_reason = status == "OK" ? "length" : "";
  return r;
}

TEST(StatsTest, SummaryLeavesOutTheWarmupAndCountsGoodputCacheAndErrors) {
  std::vector<RequestRecord> rs;
  RequestRecord warm = Record(5000, 9000, 10, 100, 0);
  warm.warmup = true;
  rs.push_back(warm);
  rs.push_back(Record(100, 1000, 10, 100, 64));  // TPOT 100 ms
  rs.push_back(Record(300, 1200, 10, 100, 64));  // TTFT over the SLO
  rs.push_back(Record(100, 2800, 10, 100, 0));   // TPOT 300 ms: over
  rs.push_back(Record(-1, 50, 0, 0, 0, "RESOURCE_EXHAUSTED"));
  for (size_t i = 1; i < rs.size(); ++i) rs[i].sent_s = static_cast<double>(i);
  const Summary s = Summarise(rs, Slo{200, 150}, 0.5, 10.0, 2);
  EXPECT_EQ(s.requests, 4);
  EXPECT_EQ(s.ok, 3);
  EXPECT_EQ(s.good, 1);
  EXPECT_EQ(s.by_status.at("OK"), 3);
  EXPECT_EQ(s.by_status.at("RESOURCE_EXHAUSTED"), 1);
  EXPECT_EQ(s.by_worker.at("w0"), 3);
  EXPECT_EQ(s.prompt_tokens, 300);
  EXPECT_NEAR(s.hit_ratio, 128.0 / 300, 1e-12);
  EXPECT_EQ(s.ttft_ms.n, 3);
  EXPECT_DOUBLE_EQ(s.ttft_ms.p50, 100);
  // The last measured stream ends at 3 s + 2.8 s; the first was sent at 1 s.
  EXPECT_NEAR(s.wall_s, 4.8, 1e-9);
  EXPECT_NEAR(s.output_tokens_per_s, 30 / 4.8, 1e-9);
  EXPECT_NEAR(s.client_cpu_cores, 0.05, 1e-12);
  EXPECT_FALSE(s.client_bound);
  EXPECT_TRUE(Summarise(rs, Slo{}, 9.0, 10.0, 2).client_bound);
}

TEST(ReportTest, CsvQuotesTheErrorMessage) {
  RequestRecord r = Record(-1, 5, 0, 0, 0, "INVALID_ARGUMENT");
  r.error = R"(field "stop.max_tokens", too large)";
  const std::string line = CsvLine(r);
  EXPECT_NE(line.find(R"("field ""stop.max_tokens"", too large")"), std::string::npos) << line;
  const std::string header = CsvHeader();
  EXPECT_EQ(std::count(header.begin(), header.end(), ','),
            std::count(line.begin(), line.end(), ',') - 1);  // the message holds one comma
}

}  // namespace
}  // namespace kvstrata::loadtest

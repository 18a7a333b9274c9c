#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/sampler.h"
#include "engine/stop.h"

namespace kvstrata::engine {
namespace {

TEST(Sampler, GreedyPicksTheArgmaxWithItsLogprob) {
  Sampler s(SamplingOptions{}, 1);
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f};
  const SampledToken t = s.Sample(logits, {});
  EXPECT_EQ(t.token, 1);
  const double z = std::exp(0.0) + std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-5);
}

TEST(Sampler, SeededSamplingIsReproducibleAndFollowsTheDistribution) {
  SamplingOptions o;
  o.temperature = 1.0f;
  o.seed = 42;
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler a(o, 0), b(o, 999);  // an explicit seed wins over the engine's
  std::map<int, int> counts;
  for (int i = 0; i < 20000; ++i) {
    const int x = a.Sample(logits, {}).token;
    EXPECT_EQ(x, b.Sample(logits, {}).token);
    ++counts[x];
  }
  EXPECT_NEAR(counts[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(counts[1] / 20000.0, 0.3, 0.02);
  EXPECT_NEAR(counts[2] / 20000.0, 0.2, 0.02);
}

TEST(Sampler, TopKTopPAndMinPRestrictTheCandidates) {
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f),
                                     std::log(0.1f)};
  auto support = [&](SamplingOptions o) {
    o.temperature = 1.0f;
    o.seed = 7;
    Sampler s(o, 0);
    std::map<int, int> seen;
    for (int i = 0; i < 4000; ++i) ++seen[s.Sample(logits, {}).token];
    return seen;
  };
  SamplingOptions k;
  k.top_k = 2;
  auto seen = support(k);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen.count(0) && seen.count(1));
  SamplingOptions p;
  p.top_p = 0.65f;  // 0.4 + 0.3 >= 0.65
  seen = support(p);
  EXPECT_EQ(seen.size(), 2u);
  SamplingOptions mp;
  mp.min_p = 0.45f;  // keeps p >= 0.18: tokens 0, 1, 2
  seen = support(mp);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_FALSE(seen.count(3));
}

TEST(Sampler, PenaltiesDiscourageRepeats) {
  SamplingOptions o;
  o.repetition_penalty = 4.0f;
  Sampler s(o, 0);
  const std::vector<float> logits = {2.0f, 1.0f};
  EXPECT_EQ(s.Sample(logits, {}).token, 0);
  const std::vector<int32_t> generated = {0};
  EXPECT_EQ(s.Sample(logits, generated).token, 1);  // 2/4 < 1
}

TEST(Sampler, TopLogprobsAreSortedAndNormalised) {
  SamplingOptions o;
  o.top_logprobs = 2;
  Sampler s(o, 0);
  const SampledToken t = s.Sample(std::vector<float>{1.0f, 3.0f, 2.0f}, {});
  ASSERT_EQ(t.top.size(), 2u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 2);
  EXPECT_FLOAT_EQ(t.top[0].second, t.logprob);
}

// The documented device draw, written out independently: penalties, then the first maximum
// (greedy) or the first token whose running sum of exp((z - max) / T) passes u · Σ.
int32_t ReferenceDraw(std::vector<float> z, const DeviceDraw& d) {
  for (const auto& [t, n] : d.counts) {
    if (d.repetition_penalty != 1.0f) {
      z[t] = z[t] > 0 ? z[t] / d.repetition_penalty : z[t] * d.repetition_penalty;
    }
    z[t] -= d.frequency_penalty * static_cast<float>(n) + d.presence_penalty;
  }
  int32_t best = 0;
  for (size_t i = 1; i < z.size(); ++i) {
    if (z[i] > z[best]) best = static_cast<int32_t>(i);
  }
  if (d.temperature == 0.0f) return best;
  std::vector<double> w(z.size());
  double sum = 0.0;
  for (size_t i = 0; i < z.size(); ++i) {
    sum += w[i] = std::exp((double{z[i]} - z[best]) / d.temperature);
  }
  const double target = d.uniform * sum;
  double running = 0.0;
  for (size_t i = 0; i < z.size(); ++i) {
    running += w[i];
    if (running > target) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(z.size()) - 1;
}

TEST(Sampler, ADeviceDrawGivesTheTokenSampleGives) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  int drawn = 0;
  for (float temperature : {0.0f, 0.6f, 1.0f, 1.7f}) {
    for (int penalised = 0; penalised < 2; ++penalised) {
      SamplingOptions o;
      o.temperature = temperature;
      o.seed = 1234 + drawn;
      if (penalised) {
        o.repetition_penalty = 1.3f;
        o.frequency_penalty = 0.4f;
        o.presence_penalty = 0.2f;
      }
      Sampler host(o, 0), device(o, 0);
      ASSERT_TRUE(device.DeviceSampleable());
      std::vector<int32_t> generated;
      for (int step = 0; step < 300; ++step) {
        std::vector<float> logits(257);
        for (float& v : logits) v = normal(gen);
        const SampledToken expected = host.Sample(logits, generated);
        const DeviceDraw draw = device.PrepareDeviceDraw(generated);
        ASSERT_GE(draw.uniform, 0.0);
        ASSERT_LT(draw.uniform, 1.0);
        ASSERT_EQ(ReferenceDraw(logits, draw), expected.token)
            << "temperature " << temperature << " penalties " << penalised << " step " << step;
        generated.push_back(expected.token);
        ++drawn;
      }
    }
  }
  // Filters and alternatives need the sorted vocabulary: those stay on the host.
  for (auto edit : {+[](SamplingOptions& o) { o.top_k = 5; },
                    +[](SamplingOptions& o) { o.top_p = 0.9f; },
                    +[](SamplingOptions& o) { o.min_p = 0.05f; },
                    +[](SamplingOptions& o) { o.top_logprobs = 2; }}) {
    SamplingOptions o;
    o.temperature = 1.0f;
    edit(o);
    EXPECT_FALSE(Sampler(o, 0).DeviceSampleable());
  }
}

TEST(Sampler, InvalidOptionsNameTheField) {
  SamplingOptions o;
  o.top_p = 0.0f;
  EXPECT_NE(ValidateSamplingOptions(o).message().find("top_p"), std::string::npos);
  o = {};
  o.temperature = -1.0f;
  EXPECT_NE(ValidateSamplingOptions(o).message().find("temperature"), std::string::npos);
  o = {};
  o.min_p = 1.0f;
  EXPECT_NE(ValidateSamplingOptions(o).message().find("min_p"), std::string::npos);
  EXPECT_TRUE(ValidateSamplingOptions(SamplingOptions{}).ok());
}

StopChecker Checker(StopOptions o) {
  return StopChecker(o, [](int32_t t) { return t == 0; });
}

TEST(Stop, StopStringIsCutAndHeldBackWhilePartial) {
  StopOptions o;
  o.stop_strings = {"END"};
  StopChecker c = Checker(o);
  EXPECT_EQ(c.Add(5, "hello E", 1).text, "hello ");  // "E" could start "END"
  StopChecker::Step s = c.Add(6, "Nx", 2);           // "ENx" cannot
  EXPECT_EQ(s.text, "ENx");
  s = c.Add(7, " fooEN", 3);
  EXPECT_EQ(s.text, " foo");
  s = c.Add(8, "D tail", 4);
  EXPECT_EQ(s.finish, FinishReason::kStopString);
  EXPECT_EQ(s.matched_stop, "END");
  EXPECT_EQ(s.text, "");
  EXPECT_EQ(c.text(), "hello ENx foo");
}

TEST(Stop, StreamedTextIsValidUtf8WhateverTheTokenBytes) {
  StopOptions o;
  o.max_tokens = 3;
  StopChecker c = Checker(o);
  EXPECT_EQ(c.Add(5, "a\x80", 1).text, "a\xEF\xBF\xBD");  // a lone continuation byte
  EXPECT_EQ(c.Add(6, "\xF0\x9F", 2).text, "");            // may still become a character
  StopChecker::Step s = c.Add(7, "\x98", 3);               // ... but max_tokens ends it inside
  EXPECT_EQ(s.finish, FinishReason::kLength);
  EXPECT_EQ(s.text, "\xEF\xBF\xBD");
}

TEST(Stop, TheEarliestMatchIsTheStopStringReported) {
  StopOptions o;
  o.stop_strings = {"world", "lo w"};
  StopChecker c = Checker(o);
  StopChecker::Step s = c.Add(5, "hello world", 1);
  EXPECT_EQ(s.finish, FinishReason::kStopString);
  EXPECT_EQ(s.matched_stop, "lo w");
  EXPECT_EQ(s.text, "hel");
}

TEST(Stop, IncludeStopStringAndMinTokens) {
  StopOptions o;
  o.stop_strings = {"!"};
  o.include_stop_string = true;
  o.min_tokens = 2;
  StopChecker c = Checker(o);
  EXPECT_EQ(c.Add(5, "a!", 1).finish, FinishReason::kNone);  // too early to stop
  StopChecker::Step s = c.Add(5, "b!", 2);
  EXPECT_EQ(s.finish, FinishReason::kStopString);
  EXPECT_EQ(c.text(), "a!b!");
}

TEST(Stop, EosStopTokensAndLength) {
  StopOptions o;
  o.stop_token_ids = {9};
  o.max_tokens = 3;
  StopChecker c = Checker(o);
  EXPECT_EQ(c.Add(4, "x", 1).finish, FinishReason::kNone);
  EXPECT_EQ(c.Add(0, "<eos>", 2).finish, FinishReason::kEndOfGeneration);
  StopChecker d = Checker(o);
  EXPECT_EQ(d.Add(9, "s", 1).finish, FinishReason::kStopToken);
  StopChecker e = Checker(o);
  e.Add(4, "a", 1);
  e.Add(4, "b", 2);
  StopChecker::Step s = e.Add(4, "c", 3);
  EXPECT_EQ(s.finish, FinishReason::kLength);
  EXPECT_EQ(s.text, "c");
  o.ignore_eos = true;
  StopChecker f = Checker(o);
  EXPECT_EQ(f.Add(0, "", 1).finish, FinishReason::kNone);
}

TEST(Stop, IncompleteUtf8IsHeldUntilComplete) {
  StopChecker c = Checker(StopOptions{});
  const std::string euro = "\xE2\x82\xAC";  // €
  EXPECT_EQ(c.Add(5, euro.substr(0, 1), 1).text, "");
  EXPECT_EQ(c.Add(5, euro.substr(1, 1), 2).text, "");
  EXPECT_EQ(c.Add(5, euro.substr(2) + "a", 3).text, euro + "a");
}

TEST(Stop, ValidationNamesTheField) {
  StopOptions o;
  o.max_tokens = 0;
  EXPECT_NE(ValidateStopOptions(o, 10).message().find("max_tokens"), std::string::npos);
  o = {};
  o.stop_token_ids = {10};
  EXPECT_NE(ValidateStopOptions(o, 10).message().find("stop_token_ids[0]"), std::string::npos);
}

}  // namespace
}  // namespace kvstrata::engine

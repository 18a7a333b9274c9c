#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/cpu_backend.h"
#include "tests/engine/random_model.h"

namespace kvstrata::engine {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::RandomModel({});
    rot_ = IdentityRotations(model_.config.num_layers, model_.config.num_kv_heads,
                             model_.config.head_dim);
  }
  std::unique_ptr<Scheduler> Make(int64_t capacity_bytes, SchedulerOptions so = {}) {
    KvCacheOptions o;
    o.format = KvCacheFormat::kInt2;
    o.capacity_bytes = capacity_bytes;
    o.max_sequences = 4;
    o.max_chunk_tokens = so.prefill_chunk;
    cache_ =
        *KvCache::Create({model_.config.num_layers, model_.config.num_kv_heads, 64, 64, 64}, o);
    backend_ = CreateCpuBackend(model_, rot_, cache_.get());
    return std::make_unique<Scheduler>(
        backend_.get(), cache_.get(), [](int32_t t) { return "<" + std::to_string(t) + ">"; },
        [](int32_t t) { return t == 0; }, so);
  }
  static GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    return r;
  }
  // Runs until idle; returns the generated tokens and finish reason per sequence.
  static std::map<uint64_t, std::pair<std::vector<int32_t>, FinishReason>> Drain(Scheduler& s) {
    std::map<uint64_t, std::pair<std::vector<int32_t>, FinishReason>> out;
    for (int guard = 0; !s.idle() && guard < 10000; ++guard) {
      std::vector<GenerationEvent> events;
      EXPECT_TRUE(s.Step(&events).ok());
      for (const auto& e : events) {
        if (e.token >= 0) out[e.sequence_id].first.push_back(e.token);
        if (e.finish != FinishReason::kNone) out[e.sequence_id].second = e.finish;
      }
    }
    return out;
  }
  std::vector<int32_t> RandomPrompt(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = 1 + static_cast<int32_t>(rng() % (model_.config.vocab_size - 1));
    return p;
  }

  model::LoadedModel model_;
  RotationSet rot_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(SchedulerTest, BatchedSequencesMatchSequentialRuns) {
  const std::vector<std::vector<int32_t>> prompts = {RandomPrompt(5, 1), RandomPrompt(300, 2),
                                                     RandomPrompt(70, 3)};
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    auto s = Make(64 << 20, {.prefill_chunk = 64});
    ASSERT_TRUE(s->Submit(Request(p, 40)).ok());
    alone.push_back(Drain(*s).begin()->second.first);
    ASSERT_EQ(alone.back().size(), 40u);
  }
  auto s = Make(64 << 20, {.prefill_chunk = 64});
  std::vector<uint64_t> ids;
  for (const auto& p : prompts) ids.push_back(*s->Submit(Request(p, 40)));
  auto together = Drain(*s);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(together[ids[i]].first, alone[i]) << "sequence " << i;
    EXPECT_EQ(together[ids[i]].second, FinishReason::kLength);
  }
  EXPECT_EQ(cache_->free_bf16_slots(), cache_->bf16_pool().num_slots());  // all released
}

TEST_F(SchedulerTest, AdmissionIsBoundedByFreePages) {
  // Room for the BF16 working set of 4 sequences (8 pages each with 64-token chunks) but only
  // 10 INT2 pages.
  const int64_t int2_page =
      kernels::PageBytes({2, 2, 64, 64, 64}, kernels::PageEncoding::kInt2Uniform);
  const int64_t bf16_page = kernels::PageBytes({2, 2, 64, 64, 64}, kernels::PageEncoding::kBf16);
  auto s = Make(bf16_page * 8 * 4 + int2_page * 10, {.prefill_chunk = 64});
  ASSERT_EQ(cache_->int2_pool()->num_slots(), 10);
  // 1300 tokens need 15 INT2 pages (history ends at token 1024): more than 10, never runs.
  absl::StatusOr<uint64_t> too_big = s->Submit(Request(RandomPrompt(1200, 4), 100));
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("max_tokens"), std::string::npos);
  // Two requests of 750 tokens that each need 6 INT2 pages: the second waits for the first.
  const uint64_t a = *s->Submit(Request(RandomPrompt(700, 5), 50));
  const uint64_t b = *s->Submit(Request(RandomPrompt(700, 6), 50));
  std::vector<GenerationEvent> events;
  ASSERT_TRUE(s->Step(&events).ok());
  EXPECT_EQ(s->running(), 1);
  EXPECT_EQ(s->waiting(), 1);
  auto out = Drain(*s);
  EXPECT_EQ(out[a].first.size(), 50u);
  EXPECT_EQ(out[b].first.size(), 50u);
}

TEST_F(SchedulerTest, CancelFreesPagesAndReportsTheReason) {
  auto s = Make(64 << 20);
  const uint64_t a = *s->Submit(Request(RandomPrompt(100, 7), 1000));
  const uint64_t queued = *s->Submit(Request(RandomPrompt(10, 8), 5));
  std::vector<GenerationEvent> events;
  ASSERT_TRUE(s->Step(&events).ok());
  s->Cancel(a, FinishReason::kDeadline);
  s->Cancel(queued);
  s->Cancel(12345);  // unknown: ignored
  events.clear();
  ASSERT_TRUE(s->Step(&events).ok());
  std::map<uint64_t, FinishReason> finished;
  for (const auto& e : events) {
    if (e.finish != FinishReason::kNone) finished[e.sequence_id] = e.finish;
  }
  EXPECT_EQ(finished[a], FinishReason::kDeadline);
  EXPECT_TRUE(s->idle() || finished.count(queued));
  Drain(*s);
  EXPECT_EQ(cache_->free_int2_slots(), cache_->int2_pool()->num_slots());
}

TEST_F(SchedulerTest, BadRequestsAreRejectedWithTheFieldNamed) {
  auto s = Make(64 << 20);
  EXPECT_NE(s->Submit(Request({}, 5)).status().message().find("prompt is empty"),
            std::string::npos);
  EXPECT_NE(s->Submit(Request({1, 99999}, 5)).status().message().find("prompt token 1"),
            std::string::npos);
  GenerationRequest r = Request({1, 2}, 5);
  r.sampling.top_p = 2.0f;
  EXPECT_NE(s->Submit(r).status().message().find("top_p"), std::string::npos);
}

TEST_F(SchedulerTest, QueueLimitAnswersResourceExhausted) {
  auto s = Make(64 << 20, {.max_waiting = 2});
  ASSERT_TRUE(s->Submit(Request({1}, 1)).ok());
  ASSERT_TRUE(s->Submit(Request({1}, 1)).ok());
  EXPECT_EQ(s->Submit(Request({1}, 1)).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace kvstrata::engine

namespace kvstrata::engine {
namespace {

// A backend that fails every forward pass: the scheduler must end the batch's sequences with
// an error event and keep working (a failure a real backend can only produce rarely).
class FailingBackend final : public Backend {
 public:
  absl::Status Forward(const std::vector<ForwardItem>&, std::vector<float>*,
                       ForwardObserver*) override {
    return absl::InternalError("injected failure");
  }
  int vocab_size() const override { return 10; }
  std::string Describe() const override { return "failing"; }
};

TEST(SchedulerFailures, AFailedForwardEndsItsSequencesAndFreesTheirPages) {
  KvCacheOptions o;
  o.capacity_bytes = 16 << 20;
  o.max_sequences = 2;
  auto cache = *KvCache::Create({1, 1, 64, 64, 64}, o);
  FailingBackend backend;
  Scheduler s(
      &backend, cache.get(), [](int32_t) { return std::string("x"); },
      [](int32_t) { return false; }, {});
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.stop.max_tokens = 4;
  const uint64_t id = *s.Submit(r);
  std::vector<GenerationEvent> events;
  EXPECT_FALSE(s.Step(&events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].sequence_id, id);
  EXPECT_EQ(events[0].finish, FinishReason::kError);
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(cache->free_bf16_slots(), cache->bf16_pool().num_slots());
}

}  // namespace
}  // namespace kvstrata::engine

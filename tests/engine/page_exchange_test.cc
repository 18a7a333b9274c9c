// Page export and import (KvCache::ExportPages / ImportPrefix, GenerationRequest::cached_pages):
// the exactness principle end to end. Importing the pages another sequence exported and
// prefilling the rest must give the same greedy tokens and the same pages as prefilling the
// whole prompt; a corrupt page or a page of another prompt must be rejected.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <span>

#include "core/page_digest.h"
#include "core/page_format.h"
#include "engine/cpu_backend.h"
#include "engine/scheduler.h"
#include "tests/engine/random_model.h"

namespace kvstrata::engine {
namespace {

struct RunResult {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::kNone;
  int cached_tokens = 0;
  int recent_window_from_int2_pages = 0;
  std::vector<ExportedPage> pages;
  std::vector<ExportedPage> prompt_pages;  // from the first token's event
};

// A served KV format and, for the codec format, whether its recipes code uniform levels (then
// its history pages are codec fragment blocks, page encoding 5).
struct ExchangeFormat {
  KvCacheFormat format = KvCacheFormat::kBf16;
  bool uniform_levels = false;
  std::string name;  // the test's name
};

class PageExchangeTest : public ::testing::TestWithParam<ExchangeFormat> {
 protected:
  KvCacheFormat format() const { return GetParam().format; }
  void SetUp() override {
    model_ = testing::RandomModel({});
    rot_ = IdentityRotations(model_.config.num_layers, model_.config.num_kv_heads,
                             model_.config.head_dim);
    namespace_key_ = *NamespaceKey({.model_fingerprint = model_.fingerprint,
                                    .kv_format = GetParam().name,
                                    .rotation_digest = "identity"});
  }
  // A fresh cache, backend and scheduler (a fresh engine): nothing carries over between runs.
  void Make() {
    KvCacheOptions o;
    o.format = format();
    o.capacity_bytes = 64 << 20;
    o.max_sequences = 2;
    o.max_chunk_tokens = 64;
    o.demotion_key_clip = rot_.k_clip;
    o.demotion_value_clip = rot_.v_clip;
    if (format() == KvCacheFormat::kCodec) {
      o.codec = testing::TestCodec(GetParam().uniform_levels);
    }
    cache_ =
        *KvCache::Create({model_.config.num_layers, model_.config.num_kv_heads, 64, 64, 64}, o);
    backend_ = CreateCpuBackend(model_, rot_, cache_.get());
    scheduler_ = std::make_unique<Scheduler>(
        backend_.get(), cache_.get(), [](int32_t t) { return "<" + std::to_string(t) + ">"; },
        [](int32_t t) { return t == 0; }, SchedulerOptions{.prefill_chunk = 64});
  }
  GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens) const {
    GenerationRequest r;
    r.request_id = "page-exchange";
    r.prompt = std::move(prompt);
    r.stop.max_tokens = max_tokens;
    r.stop.ignore_eos = true;
    r.namespace_key = namespace_key_;
    r.publish_pages = true;
    return r;
  }
  RunResult Run(GenerationRequest r) {
    Make();
    RunResult out;
    absl::StatusOr<uint64_t> id = scheduler_->Submit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    for (int guard = 0; !scheduler_->idle() && guard < 10000; ++guard) {
      std::vector<GenerationEvent> events;
      EXPECT_TRUE(scheduler_->Step(&events).ok());
      for (GenerationEvent& e : events) {
        if (e.token >= 0) out.tokens.push_back(e.token);
        if (!e.prompt_pages.empty()) out.prompt_pages = std::move(e.prompt_pages);
        if (e.finish == FinishReason::kNone) continue;
        out.finish = e.finish;
        out.cached_tokens = e.cached_tokens;
        out.recent_window_from_int2_pages = e.recent_window_from_int2_pages;
        out.pages = std::move(e.published_pages);
      }
    }
    return out;
  }
  std::vector<int32_t> RandomPrompt(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::vector<int32_t> p(n);
    for (auto& t : p) t = 1 + static_cast<int32_t>(rng() % (model_.config.vocab_size - 1));
    return p;
  }
  static std::vector<std::string> Bytes(const std::vector<ExportedPage>& pages, size_t n) {
    std::vector<std::string> out;
    for (size_t i = 0; i < n && i < pages.size(); ++i) out.push_back(pages[i].bytes);
    return out;
  }
  kernels::KvGeometry Geometry() const {
    return {model_.config.num_layers, model_.config.num_kv_heads, 64, 64, 64};
  }

  model::LoadedModel model_;
  RotationSet rot_;
  PageKey namespace_key_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Scheduler> scheduler_;
};

// 8 full prompt pages + 20 tokens: with sink 64 and recent 256, pages 1..3 are INT2 history at
// 512 tokens and pages 4..7 are still in the recent window (BF16).
constexpr int kPromptTokens = 8 * 64 + 20;
constexpr int kCachedPages = 8;

TEST_P(PageExchangeTest, ExportedPagesParseAndCarryTheRadixChain) {
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 7);
  const RunResult run = Run(Request(prompt, 12));
  ASSERT_EQ(run.finish, FinishReason::kLength);
  const int64_t held = kPromptTokens + 12 - 1;  // the last token's K/V is never computed
  ASSERT_EQ(run.pages.size(), static_cast<size_t>(held / 64));
  PageKey parent = namespace_key_;
  int int2_pages = 0;
  for (size_t p = 0; p < run.pages.size(); ++p) {
    const ExportedPage& e = run.pages[p];
    std::vector<uint32_t> ids(prompt.begin() + p * 64, prompt.begin() + (p + 1) * 64);
    const PageKey key = ChainPageKey(parent, ids);
    absl::StatusOr<PageRef> page = ParsePage(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(e.bytes.data()), e.bytes.size()));
    ASSERT_TRUE(page.ok()) << "page " << p << ": " << page.status();
    EXPECT_TRUE(CheckPageMatches(*page, cache_->geometry(), e.encoding, key).ok());
    EXPECT_EQ(page->parent_key(), parent);
    EXPECT_EQ(page->header.page_index, p);
    EXPECT_EQ(e.key, key);
    const bool history = format() != KvCacheFormat::kBf16 && p >= 1 &&
                         static_cast<int64_t>(p) < cache_->DemotedPagesEnd(held);
    EXPECT_EQ(e.encoding, history ? cache_->int2_encoding() : kernels::PageEncoding::kBf16)
        << "page " << p;
    int2_pages += e.encoding != kernels::PageEncoding::kBf16;
    parent = key;
  }
  EXPECT_EQ(int2_pages > 0, format() != KvCacheFormat::kBf16);
}

// Right after prefill a sequence hands out its prompt's full pages, exactly those a sequence
// that ended with the prompt would publish, so a concurrent request can use them at once.
TEST_P(PageExchangeTest, PromptPagesAreSharedRightAfterPrefill) {
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 23);
  const RunResult running = Run(Request(prompt, 6));
  ASSERT_EQ(running.prompt_pages.size(), static_cast<size_t>(kPromptTokens / 64));
  const RunResult ended = Run(Request(prompt, 1));  // stops at its first token: holds the prompt
  EXPECT_TRUE(ended.prompt_pages.empty());          // its final event has them all
  ASSERT_EQ(ended.pages.size(), running.prompt_pages.size());
  for (size_t p = 0; p < ended.pages.size(); ++p) {
    EXPECT_EQ(running.prompt_pages[p].key, ended.pages[p].key);
    EXPECT_EQ(running.prompt_pages[p].encoding, ended.pages[p].encoding) << "page " << p;
    EXPECT_TRUE(running.prompt_pages[p].bytes == ended.pages[p].bytes) << "page " << p;
  }
}

TEST_P(PageExchangeTest, ImportedPrefixMatchesFullPrefillExactly) {
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 11);
  const RunResult scratch = Run(Request(prompt, 16));
  ASSERT_EQ(scratch.tokens.size(), 16u);
  EXPECT_EQ(scratch.cached_tokens, 0);
  // A donor that stopped at exactly the cached length exports each page in the copy a sequence
  // of that length holds (INT2 history, BF16 sink and recent window).
  const RunResult donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kCachedPages * 64), 1));
  ASSERT_EQ(donor.pages.size(), static_cast<size_t>(kCachedPages));

  GenerationRequest r = Request(prompt, 16);
  r.cached_pages = Bytes(donor.pages, kCachedPages);
  const RunResult imported = Run(std::move(r));
  EXPECT_EQ(imported.cached_tokens, kCachedPages * 64);
  EXPECT_EQ(imported.recent_window_from_int2_pages, 0);
  EXPECT_EQ(imported.tokens, scratch.tokens);
  ASSERT_EQ(imported.pages.size(), scratch.pages.size());
  for (size_t p = 0; p < scratch.pages.size(); ++p) {
    EXPECT_EQ(imported.pages[p].encoding, scratch.pages[p].encoding) << "page " << p;
    EXPECT_TRUE(imported.pages[p].bytes == scratch.pages[p].bytes) << "page " << p;
  }
}

// A prefix put together from two exporters, as a worker's local tier and the kvstore hand it
// over: pages 0..7 from a sequence that ended at 8 pages (4..7 still BF16, in its window) and
// 8..13 from a longer one. At 14 pages, 4..7 are history: they are demoted on import, bit for
// bit as a full prefill stores them, so nothing is lost and nothing is approximate.
TEST_P(PageExchangeTest, WindowPagesThatBecomeHistoryAreDemotedExactly) {
  if (format() == KvCacheFormat::kBf16) GTEST_SKIP() << "no INT2 pages in the bf16 format";
  constexpr int kLongPages = 14;
  const std::vector<int32_t> prompt = RandomPrompt(kLongPages * 64 + 20, 17);
  const RunResult scratch = Run(Request(prompt, 8));
  const RunResult short_donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kCachedPages * 64), 1));
  ASSERT_EQ(short_donor.pages.size(), static_cast<size_t>(kCachedPages));
  ASSERT_EQ(short_donor.pages[kCachedPages - 1].encoding, kernels::PageEncoding::kBf16);
  const RunResult long_donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kLongPages * 64), 1));
  ASSERT_EQ(long_donor.pages.size(), static_cast<size_t>(kLongPages));

  std::vector<std::string> pages = Bytes(short_donor.pages, kCachedPages);
  for (int p = kCachedPages; p < kLongPages; ++p) pages.push_back(long_donor.pages[p].bytes);
  GenerationRequest r = Request(prompt, 8);
  r.cached_pages = pages;
  const RunResult imported = Run(std::move(r));
  EXPECT_EQ(imported.cached_tokens, kLongPages * 64);
  EXPECT_EQ(imported.recent_window_from_int2_pages, 0);
  EXPECT_EQ(imported.tokens, scratch.tokens);
  ASSERT_EQ(imported.pages.size(), scratch.pages.size());
  for (size_t p = 0; p < scratch.pages.size(); ++p) {
    EXPECT_EQ(imported.pages[p].encoding, scratch.pages[p].encoding) << "page " << p;
    EXPECT_TRUE(imported.pages[p].bytes == scratch.pages[p].bytes) << "page " << p;
  }
}

TEST_P(PageExchangeTest, RecentPagesOnlyInInt2AreDequantisedAndCounted) {
  if (format() == KvCacheFormat::kBf16) GTEST_SKIP() << "no INT2 pages in the bf16 format";
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 13);
  // A donor that ran on for 300 tokens has demoted pages 4..7 too: only INT2 copies of them.
  const RunResult donor = Run(Request(prompt, 300));
  ASSERT_GE(donor.pages.size(), static_cast<size_t>(kCachedPages));
  GenerationRequest r = Request(prompt, 4);
  r.cached_pages = Bytes(donor.pages, kCachedPages);
  const RunResult imported = Run(std::move(r));
  EXPECT_EQ(imported.cached_tokens, kCachedPages * 64);
  EXPECT_EQ(imported.recent_window_from_int2_pages,
            kCachedPages - cache_->DemotedPagesEnd(kCachedPages * 64));
  EXPECT_GT(imported.recent_window_from_int2_pages, 0);
  EXPECT_EQ(imported.tokens.size(), 4u);
}

// The memory a prefix arrived in (a worker's NCCL receive slab, GenerationRequest::
// cached_pages_owner) is let go of once the prefix is in the sequence's own slots, while the
// sequence runs on: the next transfer can use it without changing what this one computes. A
// request cancelled before it was admitted lets go of it too.
TEST_P(PageExchangeTest, TheCachedPagesOwnerIsLetGoOnceThePrefixIsImported) {
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 19);
  const RunResult scratch = Run(Request(prompt, 16));
  const RunResult donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kCachedPages * 64), 1));
  ASSERT_EQ(donor.pages.size(), static_cast<size_t>(kCachedPages));
  Make();
  GenerationRequest r = Request(prompt, 16);
  r.cached_pages = Bytes(donor.pages, kCachedPages);
  auto owner = std::make_shared<int>(0);
  const std::weak_ptr<int> watch = owner;
  r.cached_pages_owner = std::move(owner);
  GenerationRequest cancelled = Request(prompt, 16);
  auto cancelled_owner = std::make_shared<int>(0);
  const std::weak_ptr<int> cancelled_watch = cancelled_owner;
  cancelled.cached_pages_owner = std::move(cancelled_owner);
  absl::StatusOr<uint64_t> id = scheduler_->Submit(std::move(r));
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<uint64_t> cancelled_id = scheduler_->Submit(std::move(cancelled));
  ASSERT_TRUE(cancelled_id.ok()) << cancelled_id.status();
  EXPECT_FALSE(watch.expired());  // queued: not imported yet
  scheduler_->Cancel(*cancelled_id, FinishReason::kCancelled);

  RunResult imported;
  for (int guard = 0; !scheduler_->idle() && guard < 10000; ++guard) {
    std::vector<GenerationEvent> events;
    ASSERT_TRUE(scheduler_->Step(&events).ok());
    // From the step that admitted it on, and while it still runs.
    EXPECT_TRUE(watch.expired()) << "step " << guard;
    EXPECT_TRUE(cancelled_watch.expired()) << "step " << guard;
    for (GenerationEvent& e : events) {
      if (e.sequence_id != *id) continue;
      if (e.token >= 0) imported.tokens.push_back(e.token);
      if (e.finish != FinishReason::kNone) imported.cached_tokens = e.cached_tokens;
    }
  }
  EXPECT_EQ(imported.cached_tokens, kCachedPages * 64);
  EXPECT_EQ(imported.tokens, scratch.tokens);
}

TEST_P(PageExchangeTest, CorruptOrForeignPagesAreRejectedAtSubmit) {
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 17);
  const RunResult donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kCachedPages * 64), 1));
  ASSERT_EQ(donor.pages.size(), static_cast<size_t>(kCachedPages));
  Make();
  auto submit_error = [&](std::vector<std::string> pages, std::vector<int32_t> p) {
    GenerationRequest r = Request(std::move(p), 4);
    r.cached_pages = std::move(pages);
    absl::StatusOr<uint64_t> id = scheduler_->Submit(std::move(r));
    EXPECT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(scheduler_->waiting(), 0);
    return std::string(id.status().message());
  };
  std::vector<std::string> corrupt = Bytes(donor.pages, kCachedPages);
  corrupt[2][0] ^= 0x5a;  // the magic
  EXPECT_NE(submit_error(corrupt, prompt).find("cached page 2 is not a valid page"),
            std::string::npos);
  std::vector<int32_t> other = prompt;
  other[100] = other[100] % 200 + 1;  // page 1 onwards now have other keys
  EXPECT_NE(submit_error(Bytes(donor.pages, kCachedPages), other)
                .find("page_index 1 does not "
                      "belong"),
            std::string::npos);
  // Too many pages: the last prompt token must be computed.
  const std::vector<int32_t> exact(prompt.begin(), prompt.begin() + kCachedPages * 64);
  EXPECT_NE(submit_error(Bytes(donor.pages, kCachedPages), exact).find("at most 7 cached pages"),
            std::string::npos);
  // A gap in the chain.
  std::vector<std::string> gap = Bytes(donor.pages, kCachedPages);
  gap.erase(gap.begin() + 3);
  EXPECT_NE(submit_error(gap, prompt).find("no page_index 3"), std::string::npos);
  // The same pages are accepted for the right prompt.
  GenerationRequest ok = Request(prompt, 4);
  ok.cached_pages = Bytes(donor.pages, kCachedPages);
  EXPECT_TRUE(scheduler_->Submit(std::move(ok)).ok());
}

// Pages in "another process's memory" on the CPU: a buffer standing for a GPU kvstore's pool,
// and a DevicePageAccess over host memory that copies, digests and reads pages there as the
// CUDA backend's does on the GPU. Pages lying in `pool` can be read in place.
class HostPageAccess final : public DevicePageAccess {
 public:
  explicit HostPageAccess(const std::vector<uint8_t>* pool) : pool_(pool) {}
  absl::Status CopyPages(std::span<const Copy> copies) override {
    for (const Copy& c : copies) {
      ++digests;
      if (PageDigest64(c.src, static_cast<size_t>(c.bytes)) != c.digest64) {
        return absl::DataLossError("a device page failed its digest");
      }
      if (c.dst != nullptr) {
        std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
        ++copied;
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ReadPage(const DevicePage& page) override {
    ++reads;
    return std::string(reinterpret_cast<const char*>(page.bytes),
                       static_cast<size_t>(page.byte_length));
  }
  bool CanReadInPlace(const DevicePage& page) const override {
    return kernels::IsInt2(page.encoding) && page.bytes >= pool_->data() &&
           page.bytes + page.byte_length <= pool_->data() + pool_->size();
  }
  int digests = 0, copied = 0, reads = 0;

 private:
  const std::vector<uint8_t>* pool_;
};

// The CPU backend with HostPageAccess as its device page access.
class BackendWithHostPages final : public Backend {
 public:
  BackendWithHostPages(std::unique_ptr<Backend> inner, HostPageAccess* access)
      : inner_(std::move(inner)), access_(access) {}
  absl::Status Forward(const std::vector<ForwardItem>& batch, std::vector<float>* logits,
                       ForwardObserver* observer) override {
    return inner_->Forward(batch, logits, observer);
  }
  int vocab_size() const override { return inner_->vocab_size(); }
  DevicePageAccess* device_page_access() override { return access_; }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  std::unique_ptr<Backend> inner_;
  HostPageAccess* access_;
};

class InPlaceTest : public PageExchangeTest {
 protected:
  // The donor's pages laid out in `pool_` (each 64-byte aligned, as in a store's pool), as the
  // device pages a same-GPU fetch hands the engine.
  std::vector<DevicePage> PlaceInPool(const std::vector<ExportedPage>& pages, size_t n) {
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += (pages[i].bytes.size() + 63) / 64 * 64 + 64;
    pool_.assign(bytes, 0);
    std::vector<DevicePage> out;
    size_t at = 64;  // not at the pool's start
    PageKey parent = namespace_key_;
    for (size_t i = 0; i < n; ++i) {
      const ExportedPage& e = pages[i];
      std::memcpy(pool_.data() + at, e.bytes.data(), e.bytes.size());
      out.push_back({.key = e.key,
                     .parent_key = parent,
                     .page_index = e.page_index,
                     .encoding = e.encoding,
                     .bytes = pool_.data() + at,
                     .byte_length = static_cast<int64_t>(e.bytes.size()),
                     .digest64 = PageDigest64(e.bytes.data(), e.bytes.size())});
      parent = e.key;
      at += (e.bytes.size() + 63) / 64 * 64;
    }
    return out;
  }
  void MakeWithHostPages() {
    Make();
    access_ = std::make_unique<HostPageAccess>(&pool_);
    backend_ = std::make_unique<BackendWithHostPages>(std::move(backend_), access_.get());
    scheduler_ = std::make_unique<Scheduler>(
        backend_.get(), cache_.get(), [](int32_t t) { return "<" + std::to_string(t) + ">"; },
        [](int32_t t) { return t == 0; }, SchedulerOptions{.prefill_chunk = 64});
  }
  // Runs `r` on the current scheduler to its end; *in_place the pages it read in place, and
  // `hold` must stay alive exactly while the sequence runs.
  RunResult RunHere(GenerationRequest r, const std::weak_ptr<void>& hold, int* in_place) {
    RunResult out;
    absl::StatusOr<uint64_t> id = scheduler_->Submit(std::move(r));
    EXPECT_TRUE(id.ok()) << id.status();
    for (int guard = 0; !scheduler_->idle() && guard < 10000; ++guard) {
      std::vector<GenerationEvent> events;
      EXPECT_TRUE(scheduler_->Step(&events).ok());
      for (GenerationEvent& e : events) {
        if (e.token >= 0) out.tokens.push_back(e.token);
        *in_place = e.in_place_pages;
        if (e.finish == FinishReason::kNone) {
          if (*in_place > 0) EXPECT_FALSE(hold.expired()) << "the pages are still read";
          continue;
        }
        out.finish = e.finish;
        out.cached_tokens = e.cached_tokens;
        out.pages = std::move(e.published_pages);
      }
    }
    return out;
  }

  std::vector<uint8_t> pool_;
  std::unique_ptr<HostPageAccess> access_;
};

TEST_P(InPlaceTest, HistoryPagesReadWhereTheyLieGiveTheSameTokensAndPages) {
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 29);
  const RunResult scratch = Run(Request(prompt, 16));
  const RunResult donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kCachedPages * 64), 1));
  ASSERT_EQ(donor.pages.size(), static_cast<size_t>(kCachedPages));
  const std::vector<DevicePage> device = PlaceInPool(donor.pages, kCachedPages);
  MakeWithHostPages();
  const int64_t free_before = cache_->free_int2_slots();
  GenerationRequest r = Request(prompt, 16);
  r.device_cached_pages = device;
  auto hold = std::make_shared<int>(0);
  const std::weak_ptr<void> watch = hold;
  r.in_place_hold = std::move(hold);
  int in_place = -1;
  const RunResult imported = RunHere(std::move(r), watch, &in_place);
  EXPECT_EQ(imported.cached_tokens, kCachedPages * 64);
  EXPECT_EQ(imported.tokens, scratch.tokens);
  // Pages 1..3 are INT2 history at 8 pages: read in place (their digests checked), the sink and
  // the window pages copied; the published pages are byte for byte a full prefill's.
  const int history = format() == KvCacheFormat::kBf16
                          ? 0
                          : static_cast<int>(cache_->DemotedPagesEnd(kCachedPages * 64)) - 1;
  EXPECT_EQ(in_place, history);
  EXPECT_EQ(access_->copied, kCachedPages - history);
  EXPECT_EQ(access_->digests, kCachedPages);
  // Published twice (the prompt's pages after prefill, every page at the end), each time read
  // where they lie.
  EXPECT_EQ(access_->reads, 2 * history);
  ASSERT_EQ(imported.pages.size(), scratch.pages.size());
  for (size_t p = 0; p < scratch.pages.size(); ++p) {
    EXPECT_EQ(imported.pages[p].encoding, scratch.pages[p].encoding) << "page " << p;
    EXPECT_TRUE(imported.pages[p].bytes == scratch.pages[p].bytes) << "page " << p;
  }
  EXPECT_TRUE(watch.expired()) << "let go once the sequence ended";
  EXPECT_EQ(cache_->free_int2_slots(), free_before);
}

TEST_P(InPlaceTest, PagesReadInPlaceTakeNoRoomInTheCache) {
  if (format() == KvCacheFormat::kBf16) GTEST_SKIP() << "no INT2 pages in the bf16 format";
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 31);
  const RunResult donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kCachedPages * 64), 1));
  const std::vector<DevicePage> device = PlaceInPool(donor.pages, kCachedPages);
  MakeWithHostPages();
  const int64_t free_before = cache_->free_int2_slots();
  GenerationRequest r = Request(prompt, 4);
  r.device_cached_pages = device;
  r.in_place_hold = std::make_shared<int>(0);
  ASSERT_TRUE(scheduler_->Submit(std::move(r)).ok());
  std::vector<GenerationEvent> events;
  ASSERT_TRUE(scheduler_->Step(&events).ok());  // admitted and imported
  const int64_t reserved = cache_->Int2SlotsNeeded(kPromptTokens + 4);
  const int64_t in_place = cache_->DemotedPagesEnd(kCachedPages * 64) - 1;
  EXPECT_EQ(free_before - cache_->free_int2_slots(), reserved - in_place);
}

TEST_P(InPlaceTest, WithoutAHoldOrWithACorruptPageNothingIsReadInPlace) {
  const std::vector<int32_t> prompt = RandomPrompt(kPromptTokens, 37);
  const RunResult scratch = Run(Request(prompt, 8));
  const RunResult donor =
      Run(Request(std::vector<int32_t>(prompt.begin(), prompt.begin() + kCachedPages * 64), 1));
  const std::vector<DevicePage> device = PlaceInPool(donor.pages, kCachedPages);
  {  // No hold: every page is copied into the cache's slots.
    MakeWithHostPages();
    GenerationRequest r = Request(prompt, 8);
    r.device_cached_pages = device;
    int in_place = -1;
    const RunResult run = RunHere(std::move(r), {}, &in_place);
    EXPECT_EQ(in_place, 0);
    EXPECT_EQ(access_->copied, kCachedPages);
    EXPECT_EQ(run.cached_tokens, kCachedPages * 64);
    EXPECT_EQ(run.tokens, scratch.tokens);
  }
  if (format() == KvCacheFormat::kBf16) return;
  {  // A history page that changed in the pool: a miss, the whole prompt computed.
    MakeWithHostPages();
    pool_[device[2].bytes - pool_.data() + 4096] ^= 0x40;
    GenerationRequest r = Request(prompt, 8);
    r.device_cached_pages = device;
    r.in_place_hold = std::make_shared<int>(0);
    int in_place = -1;
    const RunResult run = RunHere(std::move(r), {}, &in_place);
    EXPECT_EQ(in_place, 0);
    EXPECT_EQ(run.cached_tokens, 0);
    EXPECT_EQ(run.tokens, scratch.tokens);
  }
}

const ExchangeFormat kBf16Format{KvCacheFormat::kBf16, false, "Bf16"};
const ExchangeFormat kInt2Format{KvCacheFormat::kInt2, false, "Int2"};
const ExchangeFormat kCodecFormat{KvCacheFormat::kCodec, false, "Codec"};
const ExchangeFormat kCodecFragmentFormat{KvCacheFormat::kCodec, true, "CodecFragment"};

std::string FormatName(const ::testing::TestParamInfo<ExchangeFormat>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Formats, InPlaceTest, ::testing::Values(kBf16Format, kInt2Format),
                         FormatName);

INSTANTIATE_TEST_SUITE_P(Formats, PageExchangeTest,
                         ::testing::Values(kBf16Format, kInt2Format, kCodecFormat,
                                           kCodecFragmentFormat),
                         FormatName);

}  // namespace
}  // namespace kvstrata::engine

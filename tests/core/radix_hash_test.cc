#include "core/radix_hash.h"

#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace kvstrata {
namespace {

using ::testing::HasSubstr;

// Tests run with the repository root as working directory (kv_cc_test sets it).
constexpr char kVectorsPath[] = "docs/hash-vectors.json";

std::vector<std::string> ToHex(const std::vector<PageKey>& keys) {
  std::vector<std::string> hex;
  for (const PageKey& key : keys) hex.push_back(key.ToHex());
  return hex;
}

HashNamespace TestNamespace(uint32_t page_tokens = 4) {
  HashNamespace ns;
  ns.model_fingerprint = "llama-3.2-1b@0123abcd";
  ns.kv_format = "int2-g128-sink64-recent256";
  ns.rotation_digest = "identity";
  ns.page_tokens = page_tokens;
  ns.cache_salt = "";
  return ns;
}

std::vector<int32_t> Iota(int count, int32_t first = 100) {
  std::vector<int32_t> tokens(count);
  for (int i = 0; i < count; ++i) tokens[i] = first + 7 * i;
  return tokens;
}

std::vector<PageKey> KeysOrDie(const HashNamespace& ns, const std::vector<int32_t>& tokens) {
  absl::StatusOr<std::vector<PageKey>> keys = PrefixPageKeys(ns, tokens);
  EXPECT_TRUE(keys.ok()) << keys.status();
  return keys.ok() ? *keys : std::vector<PageKey>{};
}

// --- The shared test vectors (docs/hash-vectors.json, from tools/hashvectors) -----------------

TEST(RadixHashVectorsTest, MatchesEveryVector) {
  std::ifstream file(kVectorsPath);
  ASSERT_TRUE(file.is_open()) << "cannot open " << kVectorsPath << " (run from the repo root)";
  const nlohmann::json doc = nlohmann::json::parse(file, /*cb=*/nullptr,
                                                   /*allow_exceptions=*/false);
  ASSERT_FALSE(doc.is_discarded()) << kVectorsPath << " is not valid JSON";
  ASSERT_EQ(doc.value("spec", ""), "kvstrata.radix.v1");
  const nlohmann::json& cases = doc["cases"];
  ASSERT_TRUE(cases.is_array());
  ASSERT_GE(cases.size(), 6u);

  int page_keys_checked = 0;
  for (const nlohmann::json& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    const nlohmann::json& n = c["namespace"];
    HashNamespace ns;
    ns.model_fingerprint = n["model_fingerprint"].get<std::string>();
    ns.kv_format = n["kv_format"].get<std::string>();
    ns.rotation_digest = n["rotation_digest"].get<std::string>();
    ns.page_tokens = n["page_tokens"].get<uint32_t>();
    ns.cache_salt = n["cache_salt"].get<std::string>();
    if (n.contains("tenant")) {
      EXPECT_EQ(
          TenantCacheSalt(n["tenant"].get<std::string>(), n["client_salt"].get<std::string>()),
          ns.cache_salt);
    }
    const std::vector<int64_t> wide_tokens = c["tokens"].get<std::vector<int64_t>>();
    const std::vector<int32_t> tokens(wide_tokens.begin(), wide_tokens.end());
    ASSERT_EQ(std::vector<int64_t>(tokens.begin(), tokens.end()), wide_tokens);
    const std::vector<std::string> expected = c["page_keys"].get<std::vector<std::string>>();
    ASSERT_EQ(expected.size(), tokens.size() / ns.page_tokens);

    absl::StatusOr<PageKey> ns_key = NamespaceKey(ns);
    ASSERT_TRUE(ns_key.ok()) << ns_key.status();
    EXPECT_EQ(ns_key->ToHex(), c["namespace_key"].get<std::string>());

    absl::StatusOr<std::vector<PageKey>> keys = PrefixPageKeys(ns, tokens);
    ASSERT_TRUE(keys.ok()) << keys.status();
    EXPECT_EQ(ToHex(*keys), expected);

    // The same chain through ChainPageKey, one page at a time.
    PageKey key = *ns_key;
    for (size_t page = 0; page < expected.size(); ++page) {
      const std::vector<uint32_t> page_tokens(tokens.begin() + page * ns.page_tokens,
                                              tokens.begin() + (page + 1) * ns.page_tokens);
      key = ChainPageKey(key, page_tokens);
      EXPECT_EQ(key.ToHex(), expected[page]) << "page " << page;
      absl::StatusOr<PageKey> parsed = PageKey::FromHex(expected[page]);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(*parsed, key);
      ++page_keys_checked;
    }
  }
  EXPECT_GT(page_keys_checked, 0);
}

// --- PageKey ----------------------------------------------------------------------------------

TEST(PageKeyTest, HexRoundTrip) {
  PageKey key;
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(i * 17 + 3);
  const std::string hex = key.ToHex();
  EXPECT_EQ(hex, "031425364758697a8b9cadbecfe0f102");
  absl::StatusOr<PageKey> parsed = PageKey::FromHex(hex);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, key);

  absl::StatusOr<PageKey> upper = PageKey::FromHex("031425364758697A8B9CADBECFE0F102");
  ASSERT_TRUE(upper.ok()) << upper.status();
  EXPECT_EQ(*upper, key);

  EXPECT_EQ(PageKey{}.ToHex(), std::string(32, '0'));
  absl::StatusOr<PageKey> zero = PageKey::FromHex(std::string(32, '0'));
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, PageKey{});
}

TEST(PageKeyTest, RawBytesRoundTripAndOnlySixteenBytesParse) {
  PageKey key;
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(255 - i);
  const std::string raw = key.ToBytes();
  ASSERT_EQ(raw.size(), 16u);
  EXPECT_EQ(static_cast<uint8_t>(raw[0]), 255);
  EXPECT_EQ(static_cast<uint8_t>(raw[15]), 240);
  absl::StatusOr<PageKey> parsed = PageKey::FromBytes(raw);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, key);
  for (size_t n : {0, 15, 17, 32}) {
    absl::StatusOr<PageKey> bad = PageKey::FromBytes(std::string(n, 'k'));
    ASSERT_FALSE(bad.ok()) << n;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find(std::to_string(n)), std::string::npos);
  }
}

TEST(PageKeyTest, BadHexRejected) {
  for (const std::string& hex :
       {std::string(""), std::string(31, 'a'), std::string(33, 'a'), std::string(64, 'a')}) {
    absl::StatusOr<PageKey> key = PageKey::FromHex(hex);
    ASSERT_FALSE(key.ok()) << hex;
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(key.status().message(), HasSubstr("got " + std::to_string(hex.size())));
  }

  std::string bad = std::string(32, 'a');
  bad[5] = 'g';
  absl::StatusOr<PageKey> key = PageKey::FromHex(bad);
  ASSERT_FALSE(key.ok());
  EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(key.status().message(), HasSubstr("'g'"));
  EXPECT_THAT(key.status().message(), HasSubstr("position 5"));

  bad = std::string(32, 'a');
  bad[31] = ' ';
  EXPECT_THAT(PageKey::FromHex(bad).status().message(), HasSubstr("position 31"));
}

TEST(PageKeyTest, OrderIsBytewiseAndMatchesHexOrder) {
  PageKey low, high;
  low.bytes[0] = 0x01;
  low.bytes[15] = 0xff;
  high.bytes[0] = 0x02;
  EXPECT_LT(low, high);
  EXPECT_FALSE(high < low);
  EXPECT_LT(low.ToHex(), high.ToHex());
  EXPECT_NE(low, high);
  EXPECT_LT(PageKey{}, low);
}

// absl::flat_hash_map<PageKey, V> needs absl::Hash<PageKey> to be usable. Checked at compile time
// and through a recording hash state, so this test need not link Abseil's hash libraries.
static_assert(std::is_invocable_v<absl::Hash<PageKey>, const PageKey&>,
              "PageKey must work as an absl::flat_hash_map key");

// Stands in for absl's hash state: records what AbslHashValue feeds it.
struct RecordingHashState {
  std::vector<uint8_t> fed;
  static RecordingHashState combine_contiguous(RecordingHashState state, const uint8_t* data,
                                               size_t size) {
    state.fed.insert(state.fed.end(), data, data + size);
    return state;
  }
};

TEST(PageKeyTest, AbslHashValueFeedsAllSixteenBytes) {
  const std::vector<PageKey> keys = KeysOrDie(TestNamespace(), Iota(8));
  ASSERT_EQ(keys.size(), 2u);
  for (const PageKey& key : {keys[0], keys[1], PageKey{}}) {
    const RecordingHashState state = AbslHashValue(RecordingHashState{}, key);
    EXPECT_EQ(state.fed, std::vector<uint8_t>(key.bytes.begin(), key.bytes.end()));
  }
}

// --- Namespace validation ---------------------------------------------------------------------

TEST(NamespaceKeyTest, InvalidFieldsAreNamed) {
  struct Case {
    std::string field;
    std::function<void(HashNamespace&)> breaks;
  };
  const std::vector<Case> cases = {
      {"model_fingerprint", [](HashNamespace& ns) { ns.model_fingerprint.clear(); }},
      {"kv_format", [](HashNamespace& ns) { ns.kv_format.clear(); }},
      {"rotation_digest", [](HashNamespace& ns) { ns.rotation_digest.clear(); }},
      {"page_tokens", [](HashNamespace& ns) { ns.page_tokens = 0; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    HashNamespace ns = TestNamespace();
    c.breaks(ns);
    absl::StatusOr<PageKey> key = NamespaceKey(ns);
    ASSERT_FALSE(key.ok());
    EXPECT_EQ(key.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(key.status().message(), HasSubstr(c.field));

    absl::StatusOr<std::vector<PageKey>> keys = PrefixPageKeys(ns, Iota(8));
    ASSERT_FALSE(keys.ok());
    EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(keys.status().message(), HasSubstr(c.field));
  }
}

TEST(NamespaceKeyTest, EmptySaltIsValid) {
  HashNamespace ns = TestNamespace();
  ns.cache_salt = "";
  EXPECT_TRUE(NamespaceKey(ns).ok());
}

TEST(PrefixPageKeysTest, NegativeTokenNamesPosition) {
  std::vector<int32_t> tokens = Iota(12);
  tokens[5] = -3;
  absl::StatusOr<std::vector<PageKey>> keys = PrefixPageKeys(TestNamespace(), tokens);
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(keys.status().message(), HasSubstr("position 5"));
  EXPECT_THAT(keys.status().message(), HasSubstr("-3"));

  // In the trailing partial page too: the sequence is corrupt either way.
  tokens = Iota(10);
  tokens[9] = -1;
  keys = PrefixPageKeys(TestNamespace(), tokens);
  ASSERT_FALSE(keys.ok());
  EXPECT_THAT(keys.status().message(), HasSubstr("position 9"));
}

// --- What the key binds -----------------------------------------------------------------------

TEST(PrefixPageKeysTest, EveryNamespaceFieldChangesEveryKey) {
  const std::vector<int32_t> tokens = Iota(12);
  const HashNamespace base = TestNamespace();
  const absl::StatusOr<PageKey> base_ns_key = NamespaceKey(base);
  ASSERT_TRUE(base_ns_key.ok());
  const std::vector<PageKey> base_keys = KeysOrDie(base, tokens);
  ASSERT_EQ(base_keys.size(), 3u);

  const std::vector<std::pair<std::string, std::function<void(HashNamespace&)>>> changes = {
      {"model_fingerprint", [](HashNamespace& ns) { ns.model_fingerprint += "x"; }},
      {"kv_format", [](HashNamespace& ns) { ns.kv_format = "int2-g64-sink64-recent256"; }},
      {"rotation_digest", [](HashNamespace& ns) { ns.rotation_digest = std::string(64, 'a'); }},
      {"cache_salt", [](HashNamespace& ns) { ns.cache_salt = "tenant-a"; }},
      // Keep 3 full pages so the comparison is page for page.
      {"page_tokens", [](HashNamespace& ns) { ns.page_tokens = 3; }},
  };
  for (const auto& [field, change] : changes) {
    SCOPED_TRACE(field);
    HashNamespace ns = base;
    change(ns);
    const absl::StatusOr<PageKey> ns_key = NamespaceKey(ns);
    ASSERT_TRUE(ns_key.ok());
    EXPECT_NE(*ns_key, *base_ns_key);
    std::vector<int32_t> same_pages = tokens;
    same_pages.resize(3 * ns.page_tokens);
    const std::vector<PageKey> keys = KeysOrDie(ns, same_pages);
    ASSERT_EQ(keys.size(), 3u);
    for (size_t i = 0; i < keys.size(); ++i) EXPECT_NE(keys[i], base_keys[i]) << "page " << i;
  }
}

TEST(NamespaceKeyTest, FieldBoundariesMatter) {
  // The length prefixes keep ("ab", "c") apart from ("a", "bc").
  HashNamespace a = TestNamespace();
  a.model_fingerprint = "model-ab";
  a.kv_format = "cformat";
  HashNamespace b = a;
  b.model_fingerprint = "model-a";
  b.kv_format = "bcformat";
  ASSERT_TRUE(NamespaceKey(a).ok());
  EXPECT_NE(*NamespaceKey(a), *NamespaceKey(b));
}

TEST(PrefixPageKeysTest, ChangingATokenChangesItsPageAndEveryLaterPage) {
  const HashNamespace ns = TestNamespace(/*page_tokens=*/4);
  const std::vector<int32_t> tokens = Iota(16);
  const std::vector<PageKey> base = KeysOrDie(ns, tokens);
  ASSERT_EQ(base.size(), 4u);
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    SCOPED_TRACE("position " + std::to_string(pos));
    std::vector<int32_t> changed = tokens;
    changed[pos] += 1;
    const std::vector<PageKey> keys = KeysOrDie(ns, changed);
    ASSERT_EQ(keys.size(), base.size());
    const size_t page = pos / ns.page_tokens;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i < page) {
        EXPECT_EQ(keys[i], base[i]) << "page " << i;
      } else {
        EXPECT_NE(keys[i], base[i]) << "page " << i;
      }
    }
  }
}

TEST(PrefixPageKeysTest, TokenOrderWithinAPageMatters) {
  const HashNamespace ns = TestNamespace(/*page_tokens=*/4);
  const std::vector<PageKey> a = KeysOrDie(ns, {1, 2, 3, 4});
  const std::vector<PageKey> b = KeysOrDie(ns, {2, 1, 3, 4});
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(a[0], b[0]);
}

TEST(PrefixPageKeysTest, PartialTrailingPageGetsNoKey) {
  const HashNamespace ns = TestNamespace(/*page_tokens=*/4);
  const std::vector<int32_t> full = Iota(12);
  const std::vector<PageKey> full_keys = KeysOrDie(ns, full);
  ASSERT_EQ(full_keys.size(), 3u);

  const std::vector<int32_t> with_tail(full.begin(), full.begin() + 11);
  const std::vector<PageKey> keys = KeysOrDie(ns, with_tail);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0], full_keys[0]);
  EXPECT_EQ(keys[1], full_keys[1]);

  EXPECT_TRUE(KeysOrDie(ns, Iota(3)).empty());
  EXPECT_TRUE(KeysOrDie(ns, {}).empty());
}

TEST(PrefixPageKeysTest, LargeTokenIdsAreAccepted) {
  const HashNamespace ns = TestNamespace(/*page_tokens=*/2);
  const std::vector<PageKey> a = KeysOrDie(ns, {2147483647, 151935});
  const std::vector<PageKey> b = KeysOrDie(ns, {2147483646, 151935});
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(a[0], b[0]);
}

}  // namespace
}  // namespace kvstrata

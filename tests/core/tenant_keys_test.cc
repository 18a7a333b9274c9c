#include "core/tenant_keys.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/radix_hash.h"
#include "tests/testing/fake_clock.h"

namespace kvstrata {
namespace {

using ::testing::HasSubstr;

class TenantKeysTest : public ::testing::Test {
 protected:
  void Write(const std::string& text) {
    // A new file renamed into place, as a Kubernetes Secret update does.
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp) << text;
    std::filesystem::rename(tmp, path_);
  }

  std::string path_ = absl::StrCat(::testing::TempDir(), "/api-keys-", getpid(), ".txt");
  test_util::FakeClock clock_;
};

TEST_F(TenantKeysTest, MapsHashedKeysToTenants) {
  Write(absl::StrCat("# tenant  sha256(key)\n\nacme ", HashApiKey("key-acme-1"), "\nacme\t",
                     HashApiKey("key-acme-2"), "\nglobex ", HashApiKey("key-globex"), "\n"));
  absl::StatusOr<std::unique_ptr<TenantKeys>> keys =
      TenantKeys::Load(path_, absl::Seconds(10), &clock_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ((*keys)->size(), 3u);
  EXPECT_EQ(*(*keys)->TenantFor("key-acme-1"), "acme");
  EXPECT_EQ(*(*keys)->TenantFor("key-acme-2"), "acme");
  EXPECT_EQ(*(*keys)->TenantFor("key-globex"), "globex");
  EXPECT_EQ((*keys)->TenantFor("key-unknown").status().code(), absl::StatusCode::kUnauthenticated);
  const absl::Status none = (*keys)->TenantFor("").status();
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.message(), HasSubstr("authorization: Bearer"));
  // The file holds hashes: a key itself written there is not a key.
  EXPECT_EQ((*keys)->TenantFor(HashApiKey("key-acme-1")).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(TenantKeysTest, ReloadsWhenTheFileChangesAndKeepsTheTableOnErrors) {
  Write(absl::StrCat("acme ", HashApiKey("old"), "\n"));
  absl::StatusOr<std::unique_ptr<TenantKeys>> keys =
      TenantKeys::Load(path_, absl::Seconds(10), &clock_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  Write(absl::StrCat("acme ", HashApiKey("new"), "\n"));
  EXPECT_FALSE((*keys)->TenantFor("new").ok());  // not checked before the interval
  clock_.Advance(absl::Seconds(11));
  EXPECT_EQ(*(*keys)->TenantFor("new"), "acme");
  EXPECT_FALSE((*keys)->TenantFor("old").ok());  // rotated out

  Write("acme not-a-hash\n");
  clock_.Advance(absl::Seconds(11));
  EXPECT_EQ(*(*keys)->TenantFor("new"), "acme");  // the previous table stays
  EXPECT_THAT((*keys)->ReloadIfChanged().message(), HasSubstr("64 hex digits"));
}

TEST_F(TenantKeysTest, RefusesBadFiles) {
  Write("acme\n");
  EXPECT_THAT(TenantKeys::Load(path_, absl::Seconds(1), &clock_).status().message(),
              HasSubstr("line 1"));
  Write(absl::StrCat("a ", HashApiKey("k"), "\nb ", HashApiKey("k"), "\n"));
  EXPECT_THAT(TenantKeys::Load(path_, absl::Seconds(1), &clock_).status().message(),
              HasSubstr("tenants a and b"));
  EXPECT_EQ(TenantKeys::Load(path_ + ".missing", absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TenantKeysTest, RefusesTenantNamesThatCouldForgeLogsOrLabels) {
  const std::string hash = HashApiKey("k");
  // A control character, a byte outside ASCII, a quote: none splits the line, all refused.
  Write(absl::StrCat("# tenants\nacme ", HashApiKey("a"), "\nev\x1b[2Jil ", hash, "\n"));
  absl::Status s = TenantKeys::Load(path_, absl::Seconds(1), &clock_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(path_, "\" line 3: byte 0x1b at offset 2")));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("\x1b")));
  Write(absl::StrCat("caf\xc3\xa9 ", hash, "\n"));
  EXPECT_THAT(TenantKeys::Load(path_, absl::Seconds(1), &clock_).status().message(),
              HasSubstr("line 1: byte 0xc3 at offset 3"));
  Write(absl::StrCat("a\"b ", hash, "\n"));
  EXPECT_THAT(TenantKeys::Load(path_, absl::Seconds(1), &clock_).status().message(),
              HasSubstr("line 1: byte 0x22 at offset 1"));
  // \r inside the name (not at the line's end, where it is CRLF and stripped).
  Write(absl::StrCat("a\rb ", hash, "\r\n"));
  EXPECT_THAT(TenantKeys::Load(path_, absl::Seconds(1), &clock_).status().message(),
              HasSubstr("line 1: byte 0x0d at offset 1"));

  // Every allowed byte, and a CRLF line end, still load.
  Write(absl::StrCat("Team-7.prod_eu:svc@example.org/ml ", hash, "\r\n"));
  absl::StatusOr<std::unique_ptr<TenantKeys>> keys =
      TenantKeys::Load(path_, absl::Seconds(1), &clock_);
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*(*keys)->TenantFor("k"), "Team-7.prod_eu:svc@example.org/ml");
}

TEST(FirstBadTenantByteTest, AllowsLettersDigitsAndTheListedPunctuationOnly) {
  for (int c = 0; c < 256; ++c) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' || c == '@' ||
                         c == '/' || c == '-';
    const std::string name = absl::StrCat("ok", std::string(1, static_cast<char>(c)));
    EXPECT_EQ(FirstBadTenantByte(name), allowed ? absl::string_view::npos : 2) << "byte " << c;
  }
  EXPECT_EQ(FirstBadTenantByte(""), absl::string_view::npos);
}

TEST(BearerTokenTest, TakesTheKeyOfABearerValue) {
  EXPECT_EQ(BearerToken("Bearer abc"), "abc");
  EXPECT_EQ(BearerToken("bearer  abc "), "abc");
  EXPECT_EQ(BearerToken("Basic abc"), "");
  EXPECT_EQ(BearerToken("Bearer"), "");
}

TEST(TenantCacheSaltTest, TenantsNeverShareANamespace) {
  const std::string acme = TenantCacheSalt("acme", "");
  EXPECT_EQ(acme.size(), kTenantSaltPrefixBytes);
  EXPECT_NE(acme, TenantCacheSalt("globex", ""));
  // A client salt narrows its tenant's namespace: a fixed-length prefix, then the client's.
  const std::string narrowed = TenantCacheSalt("acme", "project-7");
  EXPECT_EQ(narrowed.substr(0, kTenantSaltPrefixBytes), acme);
  EXPECT_EQ(narrowed.substr(kTenantSaltPrefixBytes), "project-7");
  // Whatever salt globex sends, it cannot produce acme's.
  EXPECT_NE(TenantCacheSalt("globex", acme.substr(kTenantSaltPrefixBytes)), acme);
  EXPECT_NE(TenantCacheSalt("globex", narrowed), narrowed);

  // So their pages differ for the same prompt.
  HashNamespace ns{.model_fingerprint = "m",
                   .kv_format = "int2",
                   .rotation_digest = "identity",
                   .page_tokens = 4};
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  ns.cache_salt = acme;
  const std::vector<PageKey> a = *PrefixPageKeys(ns, prompt);
  ns.cache_salt = TenantCacheSalt("globex", "");
  const std::vector<PageKey> b = *PrefixPageKeys(ns, prompt);
  for (const PageKey& k : a) EXPECT_THAT(b, ::testing::Not(::testing::Contains(k)));
}

}  // namespace
}  // namespace kvstrata

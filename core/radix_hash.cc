#include "core/radix_hash.h"

#include <openssl/evp.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status_macros.h"

namespace kvstrata {
namespace {

// Domain tags: the first byte of every hash input. They keep a namespace input from ever being
// parsed as a page input and vice versa.
constexpr uint8_t kNamespaceTag = 0x00;
constexpr uint8_t kPageTag = 0x01;
// Versions the definition: a future change of the byte layout changes this string, so old and
// new keys can never collide.
constexpr std::string_view kDomain = "kvstrata.radix.v1";

// SHA-256 failing means OpenSSL is broken or memory is exhausted: no caller could recover, and
// returning some key instead would risk serving another prefix's KV.
[[noreturn]] void DieOnOpenSslFailure(const char* what) {
  std::fprintf(stderr, "kvstrata radix_hash: OpenSSL %s failed\n", what);
  std::abort();
}

// Fetched once: EVP_sha256() would repeat the provider lookup on every digest. Never freed.
const EVP_MD* Sha256() {
  static const EVP_MD* const md = [] {
    EVP_MD* fetched = EVP_MD_fetch(/*ctx=*/nullptr, "SHA256", /*properties=*/nullptr);
    if (fetched == nullptr) DieOnOpenSslFailure("EVP_MD_fetch(SHA256)");
    return fetched;
  }();
  return md;
}

// SHA-256 truncated to a PageKey, reusing one context across digests (a long prompt has
// thousands of pages).
class TruncatedSha256 {
 public:
  TruncatedSha256() : ctx_(EVP_MD_CTX_new()) {
    if (ctx_ == nullptr) DieOnOpenSslFailure("EVP_MD_CTX_new");
  }
  ~TruncatedSha256() { EVP_MD_CTX_free(ctx_); }
  TruncatedSha256(const TruncatedSha256&) = delete;
  TruncatedSha256& operator=(const TruncatedSha256&) = delete;

  PageKey Digest(std::span<const uint8_t> input) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;
    if (EVP_DigestInit_ex2(ctx_, Sha256(), /*params=*/nullptr) != 1 ||
        EVP_DigestUpdate(ctx_, input.data(), input.size()) != 1 ||
        EVP_DigestFinal_ex(ctx_, digest, &digest_len) != 1 || digest_len != 32) {
      DieOnOpenSslFailure("SHA-256 digest");
    }
    PageKey key;
    std::memcpy(key.bytes.data(), digest, kPageKeyBytes);
    return key;
  }

 private:
  EVP_MD_CTX* ctx_;
};

// Byte by byte, so the encoding does not depend on the host's byte order.
void AppendU32Le(uint32_t value, std::vector<uint8_t>& out) {
  out.push_back(static_cast<uint8_t>(value));
  out.push_back(static_cast<uint8_t>(value >> 8));
  out.push_back(static_cast<uint8_t>(value >> 16));
  out.push_back(static_cast<uint8_t>(value >> 24));
}

void AppendField(std::string_view s, std::vector<uint8_t>& out) {
  AppendU32Le(static_cast<uint32_t>(s.size()), out);
  out.insert(out.end(), s.begin(), s.end());
}

absl::Status CheckField(absl::string_view name, std::string_view value, bool required) {
  if (required && value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("HashNamespace.", name, " is empty"));
  }
  if (value.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("HashNamespace.", name, " is ", value.size(),
                                                   " bytes, more than a u32 length allows"));
  }
  return absl::OkStatus();
}

absl::Status ValidateNamespace(const HashNamespace& ns) {
  KV_RETURN_IF_ERROR(CheckField("model_fingerprint", ns.model_fingerprint, /*required=*/true));
  KV_RETURN_IF_ERROR(CheckField("kv_format", ns.kv_format, /*required=*/true));
  KV_RETURN_IF_ERROR(CheckField("rotation_digest", ns.rotation_digest, /*required=*/true));
  if (ns.page_tokens == 0) {
    return absl::InvalidArgumentError("HashNamespace.page_tokens must be > 0, got 0");
  }
  KV_RETURN_IF_ERROR(CheckField("cache_salt", ns.cache_salt, /*required=*/false));
  return absl::OkStatus();
}

// h_i from h_{i-1} and the page's token ids, already known to be non-negative. `input` is
// scratch space, reused across pages.
template <typename Token>
PageKey HashPage(const PageKey& parent, std::span<const Token> tokens, TruncatedSha256& sha,
                 std::vector<uint8_t>& input) {
  input.clear();
  input.reserve(1 + kPageKeyBytes + 4 * tokens.size());
  input.push_back(kPageTag);
  input.insert(input.end(), parent.bytes.begin(), parent.bytes.end());
  for (const Token token : tokens) AppendU32Le(static_cast<uint32_t>(token), input);
  return sha.Digest(input);
}

// This Abseil is built with its own string_view, which std::string_view does not convert to.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string PageKey::ToHex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(2 * kPageKeyBytes, '\0');
  for (size_t i = 0; i < kPageKeyBytes; ++i) {
    hex[2 * i] = kDigits[bytes[i] >> 4];
    hex[2 * i + 1] = kDigits[bytes[i] & 0xf];
  }
  return hex;
}

absl::StatusOr<PageKey> PageKey::FromBytes(std::string_view raw) {
  if (raw.size() != kPageKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a page key is ", kPageKeyBytes, " bytes, got ", raw.size()));
  }
  PageKey key;
  std::memcpy(key.bytes.data(), raw.data(), kPageKeyBytes);
  return key;
}

absl::StatusOr<PageKey> PageKey::FromHex(std::string_view hex) {
  if (hex.size() != 2 * kPageKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("page key hex must be ", 2 * kPageKeyBytes, " characters, got ", hex.size()));
  }
  PageKey key;
  for (size_t i = 0; i < hex.size(); ++i) {
    const int value = HexDigitValue(hex[i]);
    if (value < 0) {
      return absl::InvalidArgumentError(absl::StrCat("page key hex has a non-hex character '",
                                                     absl::CHexEscape(AsAbsl(hex.substr(i, 1))),
                                                     "' at position ", i));
    }
    key.bytes[i / 2] = static_cast<uint8_t>((key.bytes[i / 2] << 4) | value);
  }
  return key;
}

absl::StatusOr<PageKey> NamespaceKey(const HashNamespace& ns) {
  KV_RETURN_IF_ERROR(ValidateNamespace(ns));
  std::vector<uint8_t> input;
  input.push_back(kNamespaceTag);
  input.insert(input.end(), kDomain.begin(), kDomain.end());
  AppendField(ns.model_fingerprint, input);
  AppendField(ns.kv_format, input);
  AppendField(ns.rotation_digest, input);
  AppendU32Le(ns.page_tokens, input);
  AppendField(ns.cache_salt, input);
  TruncatedSha256 sha;
  return sha.Digest(input);
}

PageKey ChainPageKey(const PageKey& parent, std::span<const uint32_t> page_tokens) {
  TruncatedSha256 sha;
  std::vector<uint8_t> input;
  return HashPage(parent, page_tokens, sha, input);
}

absl::StatusOr<std::vector<PageKey>> PrefixPageKeys(const HashNamespace& ns,
                                                    std::span<const int32_t> tokens) {
  KV_ASSIGN_OR_RETURN(PageKey key, NamespaceKey(ns));
  // Every token is checked, the trailing partial page's too: a negative id anywhere means the
  // caller's sequence is corrupt, and keys of its full pages would be keys of garbage.
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    if (tokens[pos] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", tokens[pos], " at position ", pos, " is negative"));
    }
  }
  const size_t page_tokens = ns.page_tokens;
  const size_t num_pages = tokens.size() / page_tokens;
  std::vector<PageKey> keys;
  keys.reserve(num_pages);
  TruncatedSha256 sha;
  std::vector<uint8_t> input;
  for (size_t page = 0; page < num_pages; ++page) {
    key = HashPage(key, tokens.subspan(page * page_tokens, page_tokens), sha, input);
    keys.push_back(key);
  }
  return keys;
}

std::string TenantCacheSalt(std::string_view tenant, std::string_view client_salt) {
  static constexpr char kDomain[] = "kvstrata.tenant.v1";  // with its terminating 0x00
  const std::span<const uint8_t> parts[] = {
      {reinterpret_cast<const uint8_t*>(kDomain), sizeof(kDomain)},
      {reinterpret_cast<const uint8_t*>(tenant.data()), tenant.size()}};
  return absl::StrCat("t:", Sha256Hex(parts).substr(0, 32), ":",
                      absl::string_view(client_salt.data(), client_salt.size()));
}

}  // namespace kvstrata

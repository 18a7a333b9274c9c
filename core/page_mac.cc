#include "core/page_mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"

namespace kvstrata {
namespace {

constexpr char kDomain[] = "kvstrata.page-mac.v1";  // followed by a 0x00 byte

absl::StatusOr<std::vector<uint8_t>> ParseHexKey(absl::string_view hex, const std::string& where) {
  hex = absl::StripAsciiWhitespace(hex);
  if (hex.size() % 2 != 0 || hex.size() < 2 * kMinPageMacKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a page MAC key is at least ",
                                                   2 * kMinPageMacKeyBytes,
                                                   " hex digits (32 bytes), got ", hex.size()));
  }
  for (size_t i = 0; i < hex.size(); ++i) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(hex[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not a hex digit at position ", i));
    }
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

}  // namespace

PageMacKeys::PageMacKeys(std::vector<std::vector<uint8_t>> keys) : keys_(std::move(keys)) {}

PageMacKeys::~PageMacKeys() {
  for (std::vector<uint8_t>& key : keys_) OPENSSL_cleanse(key.data(), key.size());
}

absl::StatusOr<std::shared_ptr<const PageMacKeys>> PageMacKeys::FromHex(
    const std::vector<std::string>& hex_keys) {
  if (hex_keys.empty()) return absl::InvalidArgumentError("page MAC keys: none given");
  std::vector<std::vector<uint8_t>> keys;
  for (size_t i = 0; i < hex_keys.size(); ++i) {
    absl::StatusOr<std::vector<uint8_t>> key =
        ParseHexKey(hex_keys[i], absl::StrCat("page MAC key ", i + 1));
    if (!key.ok()) return key.status();
    keys.push_back(*std::move(key));
  }
  return std::shared_ptr<const PageMacKeys>(new PageMacKeys(std::move(keys)));
}

absl::StatusOr<std::shared_ptr<const PageMacKeys>> PageMacKeys::FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("page MAC key file \"", path, "\": cannot be read"));
  std::vector<std::vector<uint8_t>> keys;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text.front() == '#') continue;
    absl::StatusOr<std::vector<uint8_t>> key =
        ParseHexKey(text, absl::StrCat("page MAC key file \"", path, "\" line ", number));
    if (!key.ok()) return key.status();
    keys.push_back(*std::move(key));
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("page MAC key file \"", path, "\": no key"));
  }
  return std::shared_ptr<const PageMacKeys>(new PageMacKeys(std::move(keys)));
}

std::string PageMacKeys::Mac(size_t key_index, const PageKey& key,
                             std::span<const uint8_t> page) const {
  // EVP_MAC, fetched once; a context per call (cheap beside hashing a page of 100s of KiB).
  static EVP_MAC* const hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  KV_CHECK(hmac != nullptr) << "OpenSSL has no HMAC";
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(hmac);
  KV_CHECK(ctx != nullptr);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  const std::vector<uint8_t>& secret = keys_[key_index];
  KV_CHECK(EVP_MAC_init(ctx, secret.data(), secret.size(), params) == 1);
  KV_CHECK(EVP_MAC_update(ctx, reinterpret_cast<const uint8_t*>(kDomain), sizeof(kDomain)) == 1);
  KV_CHECK(EVP_MAC_update(ctx, key.bytes.data(), key.bytes.size()) == 1);
  KV_CHECK(EVP_MAC_update(ctx, page.data(), page.size()) == 1);
  std::string mac(kPageMacBytes, '\0');
  size_t length = 0;
  KV_CHECK(EVP_MAC_final(ctx, reinterpret_cast<uint8_t*>(mac.data()), &length, mac.size()) == 1 &&
           length == kPageMacBytes);
  EVP_MAC_CTX_free(ctx);
  return mac;
}

std::string PageMacKeys::Sign(const PageKey& key, std::span<const uint8_t> page) const {
  return Mac(0, key, page);
}

absl::Status PageMacKeys::Verify(const PageKey& key, std::span<const uint8_t> page,
                                 absl::string_view mac) const {
  if (mac.empty()) {
    return absl::DataLossError(absl::StrCat("page ", key.ToHex(),
                                            ": no MAC (published without "
                                            "the pool key)"));
  }
  if (mac.size() != kPageMacBytes) {
    return absl::DataLossError(
        absl::StrCat("page ", key.ToHex(), ": MAC of ", mac.size(), " bytes, not ", kPageMacBytes));
  }
  for (size_t i = 0; i < keys_.size(); ++i) {
    const std::string expected = Mac(i, key, page);
    if (CRYPTO_memcmp(expected.data(), mac.data(), kPageMacBytes) == 0) return absl::OkStatus();
  }
  return absl::DataLossError(
      absl::StrCat("page ", key.ToHex(), ": MAC does not match (forged or altered page)"));
}

}  // namespace kvstrata

#include "core/sha256.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace kvstrata {

namespace {

[[noreturn]] void DieOnOpenSslFailure(const char* what) {
  std::fprintf(stderr, "kvstrata model: OpenSSL %s failed\n", what);
  std::abort();
}

}  // namespace

std::string Sha256Hex(std::span<const std::span<const uint8_t>> parts) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) DieOnOpenSslFailure("EVP_MD_CTX_new");
  if (EVP_DigestInit_ex(ctx, EVP_sha256(), /*impl=*/nullptr) != 1) {
    DieOnOpenSslFailure("EVP_DigestInit_ex");
  }
  // Piecewise, so a mapped file is read once, front to back, never copied.
  constexpr size_t kChunk = size_t{8} << 20;
  for (std::span<const uint8_t> part : parts) {
    for (size_t pos = 0; pos < part.size(); pos += kChunk) {
      const size_t n = std::min(kChunk, part.size() - pos);
      if (EVP_DigestUpdate(ctx, part.data() + pos, n) != 1) DieOnOpenSslFailure("EVP_DigestUpdate");
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_len = 0;
  if (EVP_DigestFinal_ex(ctx, digest, &digest_len) != 1 || digest_len != 32) {
    DieOnOpenSslFailure("EVP_DigestFinal_ex");
  }
  EVP_MD_CTX_free(ctx);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex(2 * digest_len, '\0');
  for (unsigned int i = 0; i < digest_len; ++i) {
    hex[2 * i] = kDigits[digest[i] >> 4];
    hex[2 * i + 1] = kDigits[digest[i] & 0xf];
  }
  return hex;
}

std::string Sha256Hex(std::string_view bytes) {
  const std::span<const uint8_t> part(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return Sha256Hex(std::span<const std::span<const uint8_t>>(&part, 1));
}

}  // namespace kvstrata

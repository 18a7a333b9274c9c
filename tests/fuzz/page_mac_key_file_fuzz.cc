// The decode worker's --page_mac_key_file: any bytes are read or refused with INVALID_ARGUMENT
// naming the file, and keys that are read sign with the file's first key as core/page_mac.h
// specifies (checked against OpenSSL's one-shot HMAC on the hex read here) and verify their own
// MACs, and no MAC with a bit flipped.

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "core/page_mac.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {
namespace {

// The file's first key line, read the simplest way the format allows.
std::string FirstKeyHex(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line.front() != '#') return std::string(line);
  }
  return "";
}

std::string ReferenceMac(const std::string& secret, const PageKey& key, absl::string_view page) {
  std::string message("kvstrata.page-mac.v1", 21);  // the domain and its 0x00
  message.append(reinterpret_cast<const char*>(key.bytes.data()), key.bytes.size());
  message.append(page.data(), page.size());
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  FUZZ_CHECK(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                  reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
                  &length) != nullptr);
  return std::string(reinterpret_cast<const char*>(mac), length);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fuzz::InputFile input("page_mac_keys");
  const std::string& path = input.Write(data, size);
  absl::StatusOr<std::shared_ptr<const PageMacKeys>> keys = PageMacKeys::FromFile(path);
  if (!keys.ok()) {
    FUZZ_CHECK(keys.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(absl::StrContains(keys.status().message(), path));
    return 0;
  }
  FUZZ_CHECK((*keys)->size() >= 1);
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string hex = FirstKeyHex(text);
  FUZZ_CHECK(hex.size() >= 2 * kMinPageMacKeyBytes);
  PageKey key;
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(i * 7);
  const absl::string_view page = text.substr(0, 64);
  const std::span<const uint8_t> page_bytes(data, page.size());
  const std::string mac = (*keys)->Sign(key, page_bytes);
  FUZZ_CHECK(mac.size() == kPageMacBytes);
  FUZZ_CHECK(mac == ReferenceMac(absl::HexStringToBytes(hex), key, page));
  FUZZ_CHECK((*keys)->Verify(key, page_bytes, mac).ok());
  std::string flipped = mac;
  flipped[size % kPageMacBytes] ^= static_cast<char>(1 << (size % 8));
  FUZZ_CHECK((*keys)->Verify(key, page_bytes, flipped).code() == absl::StatusCode::kDataLoss);
  return 0;
}

}  // namespace kvstrata

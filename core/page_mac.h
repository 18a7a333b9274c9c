#pragma once

// Page MACs: what keeps a wrong page in a store from ever being served. The page key names a
// page's content (core/radix_hash.h), but the kvstore cannot check that bytes match their key:
// computing KV needs the model. So the worker that publishes a page MACs it with a key shared
// by the pool (every decode worker, never the stores or the clients), the store keeps the MAC
// beside the page (PageHeader.mac), and a worker that fetches a page checks the MAC before
// using it. A page put by anyone without the pool key, or altered in a store, is refused
// (DATA_LOSS, which the client treats as a miss: the worker recomputes the page).
//
//   mac = HMAC-SHA256(pool_key, "kvstrata.page-mac.v1" || 0x00 || page_key (16 bytes)
//                                || page bytes (header and body, docs/kv-format.md))
//
// The page bytes carry the parent key, page index and encoding in their header, so the MAC
// binds all of them; the page key binds the bytes to the key they are stored under.
//
// Key rotation: the key file holds one or more keys; the first signs, every key verifies. Add
// the new key second everywhere, then move it first, then drop the old one
// (docs/operations.md).
//
// Thread-safety: immutable after construction; Sign and Verify may be called concurrently.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/radix_hash.h"

namespace kvstrata {

inline constexpr size_t kPageMacBytes = 32;
inline constexpr size_t kMinPageMacKeyBytes = 32;

class PageMacKeys {
 public:
  // Keys as lowercase or uppercase hex, at least 64 digits (32 bytes) each; the first signs.
  // INVALID_ARGUMENT naming the key's position otherwise.
  static absl::StatusOr<std::shared_ptr<const PageMacKeys>> FromHex(
      const std::vector<std::string>& hex_keys);
  // A file of such keys, one a line; blank lines and lines starting with '#' are skipped.
  // NOT_FOUND / INVALID_ARGUMENT naming the file and line.
  static absl::StatusOr<std::shared_ptr<const PageMacKeys>> FromFile(const std::string& path);

  ~PageMacKeys();

  // The MAC of `page` stored under `key`, with the first (signing) key: kPageMacBytes bytes.
  std::string Sign(const PageKey& key, std::span<const uint8_t> page) const;
  // OK when `mac` is the MAC of the page under any of the keys. DATA_LOSS naming the page
  // otherwise (no MAC, a MAC of the wrong length, or one no key produces).
  absl::Status Verify(const PageKey& key, std::span<const uint8_t> page,
                      absl::string_view mac) const;

  size_t size() const { return keys_.size(); }

 private:
  explicit PageMacKeys(std::vector<std::vector<uint8_t>> keys);
  std::string Mac(size_t key_index, const PageKey& key, std::span<const uint8_t> page) const;

  std::vector<std::vector<uint8_t>> keys_;
};

}  // namespace kvstrata

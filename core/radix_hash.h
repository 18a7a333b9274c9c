#pragma once

// The radix hash: the key of every KV page, shared by the decode workers, the router and the
// kvstore, which must all compute it bit for bit the same way. docs/hashing.md is the spec and
// docs/hash-vectors.json holds test vectors for other implementations.
//
// Page i of a token sequence (tokens i*P .. i*P+P-1, P = page_tokens) has the key
//
//   h_{-1} = SHA-256(namespace input)[0:16]
//   h_i    = SHA-256(0x01 || h_{i-1} || u32le(token_{i*P}) || ... || u32le(token_{i*P+P-1}))[0:16]
//
//   namespace input = 0x00 || "kvstrata.radix.v1" (17 ASCII bytes, no length prefix)
//                     || field(model_fingerprint) || field(kv_format) || field(rotation_digest)
//                     || u32le(page_tokens) || field(cache_salt)
//   field(s)        = u32le(byte length of s) || the bytes of s (as given, no terminator)
//
// u32le is an unsigned 32-bit integer written least significant byte first. The tags 0x00 and
// 0x01 keep namespace inputs and page inputs in separate domains. Because each key chains from
// its parent, a key names a page *and its whole prefix*: equal keys mean equal namespaces and
// equal token prefixes (barring a SHA-256 collision), which is what lets a worker trust a page
// someone else computed.
//
// SHA-256 truncated to 128 bits, because the cache is shared across tenants and must resist
// deliberately crafted collisions, not just accidental ones (2^64 work for a birthday attack).
//
// Thread-safety: every function here is pure and may be called concurrently.

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace kvstrata {

inline constexpr size_t kPageKeyBytes = 16;

// A 128-bit page key. A plain value: compare, order (bytewise, which is also the order of the
// hex strings) and hash it. Every value is a valid key; the all-zero key is not special.
struct PageKey {
  std::array<uint8_t, kPageKeyBytes> bytes{};

  // 32 lowercase hex digits, most significant (first) byte first.
  std::string ToHex() const;

  // Parses exactly 32 hex digits (either case). Anything else is InvalidArgument naming the
  // problem: the wrong length, or the first non-hex character and its position.
  static absl::StatusOr<PageKey> FromHex(std::string_view hex);

  // The 16 raw bytes, as the API carries keys (`bytes` fields).
  std::string ToBytes() const {
    return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  // Exactly 16 bytes; anything else is InvalidArgument naming the length.
  static absl::StatusOr<PageKey> FromBytes(std::string_view raw);

  friend bool operator==(const PageKey&, const PageKey&) = default;
  friend std::strong_ordering operator<=>(const PageKey&, const PageKey&) = default;

  // For absl::flat_hash_map / absl::Hash. The bytes are already uniformly distributed.
  template <typename H>
  friend H AbslHashValue(H h, const PageKey& key) {
    return H::combine_contiguous(std::move(h), key.bytes.data(), key.bytes.size());
  }
};

// Everything that must match for a page's KV bytes to be reusable. Changing any field changes
// every key, so a mismatch (new weights, another KV format, a refitted rotation, another page
// size, another tenant) is a cache miss, never wrong KV. Strings are hashed as the bytes given
// (UTF-8 by convention; not validated or normalised).
struct HashNamespace {
  // Identifies the model weights and architecture (e.g. a digest of the checkpoint). Non-empty.
  std::string model_fingerprint;
  // The stored KV format, e.g. "int2-g128-sink64-recent256". Non-empty.
  std::string kv_format;
  // Lowercase hex SHA-256 of the rotation file, or "identity" when unrotated. Non-empty.
  std::string rotation_digest;
  // Tokens per page (P). Must be > 0.
  uint32_t page_tokens = 64;
  // The tenant's cache salt; empty means the shared (unsalted) namespace. Tenants with
  // different salts never share pages.
  std::string cache_salt;
};

// h_{-1}, the key a sequence's first page chains from. InvalidArgument naming the field if
// page_tokens is 0, if model_fingerprint, kv_format or rotation_digest is empty, or if a string
// is too long for its u32 length prefix.
absl::StatusOr<PageKey> NamespaceKey(const HashNamespace& ns);

// h_i from h_{i-1} (`parent`) and the tokens of page i, [page_tokens]. The caller passes
// exactly the namespace's page_tokens tokens; this function does not know P and hashes what it
// is given, so a short span yields a key no other implementation will produce.
PageKey ChainPageKey(const PageKey& parent, std::span<const uint32_t> page_tokens);

// The keys of every full page of `tokens` [num_tokens], in order: floor(num_tokens / P) keys.
// A trailing partial page gets no key (it is not cached until it fills). InvalidArgument if the
// namespace is invalid (see NamespaceKey) or a token id is negative (the message names the
// first such position).
absl::StatusOr<std::vector<PageKey>> PrefixPageKeys(const HashNamespace& ns,
                                                    std::span<const int32_t> tokens);

// The cache_salt of a request from an authenticated tenant (docs/hashing.md, "Tenants"):
//
//   "t:" || hex(SHA-256("kvstrata.tenant.v1" || 0x00 || tenant))[0:32] || ":" || client_salt
//
// The router sets it; a client never chooses it. The prefix has a fixed length, so different
// tenants never produce equal salts whatever their client salts, and a client's own salt only
// splits its tenant's namespace further. Without tenants (no API keys configured) the salt is
// the client's, unchanged, and every key is as before.
inline constexpr size_t kTenantSaltPrefixBytes = 35;
std::string TenantCacheSalt(std::string_view tenant, std::string_view client_salt);

}  // namespace kvstrata

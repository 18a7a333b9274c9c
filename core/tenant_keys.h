#pragma once

// API keys to tenants, for the router: a client authenticates with an API key (gRPC metadata
// or HTTP header "authorization: Bearer <key>"), and the tenant the key belongs to, not a
// string the client chose, names its cache namespace (TenantCacheSalt in core/radix_hash.h).
//
// The key file holds hashes only, one key a line:
//
//   # tenant   sha256 of the key (lowercase hex)
//   acme       9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//
// A tenant name is 1 or more of A-Z a-z 0-9 . _ : @ / - (kTenantNameChars): it reaches logs
// and metrics labels, so control characters, quotes and non-ASCII bytes are refused.
//
// A tenant may have several keys (one line each), which is how keys rotate: add the new line,
// hand out the new key, remove the old line. The file is re-read when it changes (checked at
// most every reload interval, on the next authentication), so rotation needs no restart; a
// file that no longer parses keeps the previous table and logs a warning.
//
// Thread-safety: thread-safe.

#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/clock.h"

namespace kvstrata {

// The key from an "authorization" value "Bearer <key>" (the scheme in any case); empty when
// the value is not of that form.
std::string BearerToken(absl::string_view authorization);

// Lowercase hex SHA-256 of a key: what the key file holds (`kvstrata hash-api-key` prints it).
std::string HashApiKey(absl::string_view api_key);

// The bytes a tenant name may hold, besides ASCII letters and digits.
inline constexpr absl::string_view kTenantNameChars = "._:@/-";

// The offset of the first byte of `tenant` outside [A-Za-z0-9] and kTenantNameChars;
// npos when there is none (an empty name is valid here: callers refuse it themselves).
size_t FirstBadTenantByte(absl::string_view tenant);

class TenantKeys {
 public:
  // Reads `path` now; INVALID_ARGUMENT / NOT_FOUND naming the file and line. `clock` is
  // borrowed (null: the system clock).
  static absl::StatusOr<std::unique_ptr<TenantKeys>> Load(const std::string& path,
                                                          absl::Duration reload_interval,
                                                          const Clock* clock = nullptr);

  // The tenant of `api_key`. UNAUTHENTICATED when the key is empty or unknown.
  absl::StatusOr<std::string> TenantFor(absl::string_view api_key);

  // Re-reads the file now if it changed since the last read. OK when nothing changed or the
  // new table is in place; the parse error otherwise (the previous table stays).
  absl::Status ReloadIfChanged();

  size_t size();

 private:
  struct FileStamp {
    int64_t mtime_ns = 0;
    uintmax_t size = 0;
    uint64_t inode = 0;
    bool operator==(const FileStamp&) const = default;
  };
  TenantKeys(std::string path, absl::Duration reload_interval, const Clock* clock);
  static absl::StatusOr<absl::flat_hash_map<std::string, std::string>> Parse(
      const std::string& path);
  static FileStamp Stamp(const std::string& path);
  absl::Status ReloadLocked();

  const std::string path_;
  const absl::Duration reload_interval_;
  const Clock* clock_;
  SystemClock system_clock_;
  std::mutex mu_;
  absl::flat_hash_map<std::string, std::string> tenant_by_hash_;  // guarded by mu_
  FileStamp stamp_;                                               // guarded by mu_
  absl::Time next_check_;                                         // guarded by mu_
};

}  // namespace kvstrata

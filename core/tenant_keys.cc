#include "core/tenant_keys.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/sha256.h"

namespace kvstrata {

std::string BearerToken(absl::string_view authorization) {
  authorization = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::StartsWithIgnoreCase(authorization, kScheme)) {
    return "";
  }
  return std::string(absl::StripAsciiWhitespace(authorization.substr(kScheme.size())));
}

std::string HashApiKey(absl::string_view api_key) {
  return Sha256Hex(std::string_view(api_key.data(), api_key.size()));
}

size_t FirstBadTenantByte(absl::string_view tenant) {
  for (size_t i = 0; i < tenant.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(tenant[i]);
    if (!absl::ascii_isalnum(c) && !absl::StrContains(kTenantNameChars, tenant[i])) return i;
  }
  return absl::string_view::npos;
}

TenantKeys::TenantKeys(std::string path, absl::Duration reload_interval, const Clock* clock)
    : path_(std::move(path)), reload_interval_(reload_interval), clock_(clock) {
  if (clock_ == nullptr) clock_ = &system_clock_;
}

absl::StatusOr<std::unique_ptr<TenantKeys>> TenantKeys::Load(const std::string& path,
                                                             absl::Duration reload_interval,
                                                             const Clock* clock) {
  std::unique_ptr<TenantKeys> keys(new TenantKeys(path, reload_interval, clock));
  std::lock_guard<std::mutex> lock(keys->mu_);
  if (absl::Status s = keys->ReloadLocked(); !s.ok()) return s;
  return keys;
}

TenantKeys::FileStamp TenantKeys::Stamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {};
  return {.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
          .size = static_cast<uintmax_t>(st.st_size),
          .inode = static_cast<uint64_t>(st.st_ino)};
}

absl::StatusOr<absl::flat_hash_map<std::string, std::string>> TenantKeys::Parse(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("API key file \"", path, "\": cannot be read"));
  absl::flat_hash_map<std::string, std::string> table;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text.front() == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(text, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("API key file \"", path, "\" line ", number);
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": want \"<tenant> <sha256 hex of the key>\""));
    }
    // The name itself stays out of the message: its bad byte is what must not reach a log.
    if (const size_t bad = FirstBadTenantByte(fields[0]); bad != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": byte 0x",
          absl::Hex(static_cast<unsigned char>(fields[0][bad]), absl::kZeroPad2), " at offset ",
          bad, " of the tenant name; a tenant name holds only A-Z a-z 0-9 and ", kTenantNameChars));
    }
    std::string hash = absl::AsciiStrToLower(fields[1]);
    if (hash.size() != 64 || !std::all_of(hash.begin(), hash.end(), [](char c) {
          return absl::ascii_isxdigit(static_cast<unsigned char>(c));
        })) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the key hash must be 64 hex digits (SHA-256), never the key"));
    }
    auto [it, inserted] = table.emplace(std::move(hash), std::string(fields[0]));
    if (!inserted && it->second != fields[0]) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the same key is listed for tenants ",
                                                     it->second, " and ", fields[0]));
    }
  }
  return table;
}

absl::Status TenantKeys::ReloadLocked() {
  next_check_ = clock_->Now() + reload_interval_;
  const FileStamp stamp = Stamp(path_);
  if (stamp == stamp_ && stamp.mtime_ns != 0) return absl::OkStatus();
  absl::StatusOr<absl::flat_hash_map<std::string, std::string>> table = Parse(path_);
  if (!table.ok()) return table.status();
  tenant_by_hash_ = *std::move(table);
  stamp_ = stamp;
  return absl::OkStatus();
}

absl::Status TenantKeys::ReloadIfChanged() {
  std::lock_guard<std::mutex> lock(mu_);
  return ReloadLocked();
}

absl::StatusOr<std::string> TenantKeys::TenantFor(absl::string_view api_key) {
  if (api_key.empty()) {
    return absl::UnauthenticatedError(
        "no API key: send \"authorization: Bearer <key>\" (gRPC metadata or HTTP header)");
  }
  const std::string hash = HashApiKey(api_key);
  std::lock_guard<std::mutex> lock(mu_);
  if (clock_->Now() >= next_check_) {
    if (absl::Status s = ReloadLocked(); !s.ok()) {
      fprintf(stderr, "warning: keeping the previous API keys: %s\n", s.ToString().c_str());
    }
  }
  auto it = tenant_by_hash_.find(hash);
  if (it == tenant_by_hash_.end()) return absl::UnauthenticatedError("API key not recognised");
  return it->second;
}

size_t TenantKeys::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return tenant_by_hash_.size();
}

}  // namespace kvstrata

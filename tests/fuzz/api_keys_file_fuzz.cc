// The router's --api_keys_file, written by hand and re-read while the router serves: any bytes
// are read or refused with INVALID_ARGUMENT naming the line; a file with a tenant name outside
// [A-Za-z0-9._:@/-] is refused; and a table that is read gives the tenant its line names to the
// key whose hash the seeds list (fuzz::kApiKey), and nothing to an empty key. The same bytes as an
// "authorization" value: BearerToken returns "" or a trimmed part of them.

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "core/tenant_keys.h"
#include "tests/fuzz/fuzz_keys.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {
namespace {

// The documented tenant name bytes, spelled out here rather than taken from TenantKeys.
bool PlainTenantName(absl::string_view name) {
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '@' || c == '/' || c == '-';
  });
}

// Whether a line of the form "<tenant> <hash>" names a tenant outside the documented bytes.
bool HasBadTenantName(absl::string_view text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() == 2 && !PlainTenantName(fields[0])) return true;
  }
  return false;
}

// The tenant named by the file's first line that lists `hash`; "" when none does. Read the
// simplest way the file format allows, to check TenantKeys against.
std::string ExpectedTenant(absl::string_view text, const std::string& hash) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() == 2 && absl::EqualsIgnoreCase(fields[1], hash)) {
      return std::string(fields[0]);
    }
  }
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string token = BearerToken(text);
  if (!token.empty()) {
    FUZZ_CHECK(absl::StrContains(text, token));
    FUZZ_CHECK(!absl::ascii_isspace(static_cast<unsigned char>(token.front())) &&
               !absl::ascii_isspace(static_cast<unsigned char>(token.back())));
  }

  static fuzz::InputFile input("api_keys");
  const std::string& path = input.Write(data, size);
  absl::StatusOr<std::unique_ptr<TenantKeys>> keys =
      TenantKeys::Load(path, /*reload_interval=*/absl::InfiniteDuration());
  if (!keys.ok()) {
    FUZZ_CHECK(keys.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(absl::StrContains(keys.status().message(), " line "));
    return 0;
  }
  FUZZ_CHECK(!HasBadTenantName(text));
  FUZZ_CHECK((*keys)->size() <=
             static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) + 1);
  FUZZ_CHECK((*keys)->TenantFor("").status().code() == absl::StatusCode::kUnauthenticated);
  const std::string expected = ExpectedTenant(text, HashApiKey(fuzz::kApiKey));
  absl::StatusOr<std::string> tenant = (*keys)->TenantFor(fuzz::kApiKey);
  if (expected.empty()) {
    FUZZ_CHECK(tenant.status().code() == absl::StatusCode::kUnauthenticated);
  } else {
    FUZZ_CHECK(tenant.ok() && *tenant == expected && PlainTenantName(*tenant));
  }
  return 0;
}

}  // namespace kvstrata

// kvstrata hash-api-key: prints the line of the router's --api_keys_file for an API key, so
// the key itself is never written to the file:
//
//   kvstrata hash-api-key --tenant=acme < key.txt >> api-keys.txt
//
// Reads the key from stdin (one line; surrounding whitespace is dropped).

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "core/tenant_keys.h"
#include "tools/kvstrata/commands.h"

ABSL_FLAG(std::string, tenant, "", "hash-api-key: the tenant the key belongs to");

namespace kvstrata::cli {
namespace {

int RunHashApiKey() {
  const std::string tenant = absl::GetFlag(FLAGS_tenant);
  if (tenant.empty() || FirstBadTenantByte(tenant) != absl::string_view::npos) {
    std::fprintf(stderr,
                 "kvstrata hash-api-key: --tenant: a name of A-Z a-z 0-9 and %s is required\n",
                 std::string(kTenantNameChars).c_str());
    return 2;
  }
  std::string key;
  std::getline(std::cin, key);
  const std::string trimmed(absl::StripAsciiWhitespace(key));
  if (trimmed.empty()) {
    std::fprintf(stderr, "kvstrata hash-api-key: no key on stdin\n");
    return 2;
  }
  std::printf("%s %s\n", tenant.c_str(), HashApiKey(trimmed).c_str());
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(hash_api_key, "hash-api-key",
                 "print the --api_keys_file line (tenant, SHA-256) of the key on stdin",
                 RunHashApiKey);

}  // namespace kvstrata::cli

#pragma once

// Secrets the fuzz seeds are made with and the targets check against: an API key whose hash the
// api_keys_file seeds list. Test values only.

namespace kvstrata::fuzz {

inline constexpr char kApiKey[] = "kvstrata-fuzz-key";

}  // namespace kvstrata::fuzz

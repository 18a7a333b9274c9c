#pragma once

// Secrets the fuzz seeds are made with and the targets check against: an API key whose hash the
// api_keys_file seeds list, and two page MAC keys (A signs the page_mac seeds, B is the key a
// rotation brings in). Test values only.

namespace kvstrata::fuzz {

inline constexpr char kApiKey[] = "kvstrata-fuzz-key";
inline constexpr char kPageMacKeyA[] =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
inline constexpr char kPageMacKeyB[] =
    "f0e1d2c3b4a5968778695a4b3c2d1e0ff0e1d2c3b4a5968778695a4b3c2d1e0f";

}  // namespace kvstrata::fuzz

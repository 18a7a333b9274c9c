#pragma once

// SHA-256 as lowercase hex: model fingerprints, rotation-file and calibration-data digests.
// (The radix hash in core/radix_hash.h keeps its own context: it hashes millions of tiny inputs.)

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvstrata {

// The digest of the concatenation of `parts`, read front to back in chunks (a mapped file is
// never copied). Aborts if OpenSSL itself fails: callers cannot do anything useful about it.
std::string Sha256Hex(std::span<const std::span<const uint8_t>> parts);
std::string Sha256Hex(std::string_view bytes);

}  // namespace kvstrata

#pragma once

// The page digest (docs/kv-format.md §8): a 64-bit checksum of a page's bytes that a GPU
// computes at memory speed, so pages moved GPU to GPU are verified where they land, without a
// trip through host memory. XXH3 (the wire checksum of Put and Fetch) is a chain over the
// input and cannot be split across thousands of threads; this digest is a sum, so any thread
// may add any word's term in any order:
//
//   word i  = bytes [8i, 8i + 8) as a little-endian uint64 (the last one zero-padded)
//   term i  = mix64(word_i + (i + 1) * 0x9E3779B97F4A7C15)
//   digest  = mix64((sum of the terms mod 2^64) ^ byte_length)
//
// with mix64 SplitMix64's finaliser. The position enters every term, so moved or swapped words
// change the digest; one flipped bit changes one term completely. It guards against corruption
// and truncation, not against an adversary (docs/operations.md: page MACs are that).

#include <cstddef>
#include <cstdint>

namespace kvstrata {

inline constexpr uint64_t kPageDigestGolden = 0x9E3779B97F4A7C15ull;

// SplitMix64's finaliser; __host__ __device__ through the CUDA kernel's own copy.
constexpr uint64_t PageDigestMix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The digest of `n` bytes at `data`.
uint64_t PageDigest64(const void* data, size_t n);

}  // namespace kvstrata

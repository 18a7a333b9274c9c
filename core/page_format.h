#pragma once

// Building, parsing and validating KV pages (docs/kv-format.md). The byte layout itself lives
// in kernels/kv_layout.h, shared with the kernels; this is the checked boundary where pages
// come from peers, files and the network, so every field is validated and every error names
// the field. Thread-compatible: no shared state.

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/radix_hash.h"
#include "kernels/kv_layout.h"

namespace kvstrata {

using kernels::KvGeometry;
using kernels::PageEncoding;

// Supported shapes: head_dim 64 or 128; INT2 group_size a multiple of 16 dividing head_dim;
// page_tokens 1..4096; 1..1024 layers; 1..256 KV heads. The error names the field.
absl::Status ValidateGeometry(const KvGeometry& g, PageEncoding encoding);

// What a page is: its shape, encoding, position and radix keys.
struct PageSpec {
  KvGeometry geometry;
  PageEncoding encoding = PageEncoding::kBf16;
  uint32_t page_index = 0;
  PageKey key;
  PageKey parent_key;  // the namespace key for page 0
};

// Per-block clip ratios for INT2 pages, [num_layers][2][num_kv_heads] (K = 0, V = 1). Empty
// means no clipping (ratio 1).
using ClipRatios = std::span<const float>;

// Encodes a page from float rows kv [num_layers][2][num_kv_heads][page_tokens][head_dim],
// already rotated (k·R_K, v·R_V). Pages are always full: only full pages are keyed and stored.
// BF16 and INT2 only (codec pages are laid out by engine/kv_cache.h).
absl::StatusOr<std::vector<uint8_t>> EncodePage(const PageSpec& spec, std::span<const float> kv,
                                                ClipRatios clip_ratios = {});

// A validated view of page bytes (does not own them).
struct PageRef {
  kernels::PageHeader header;
  KvGeometry geometry;
  PageEncoding encoding;
  std::span<const uint8_t> bytes;  // header + body

  PageKey key() const;
  PageKey parent_key() const;
};

// Validates the header (magic, version, encoding, shape, reserved bytes) and that the buffer
// length equals the header's size. A codec page's size depends on its codec (the engine checks
// it): here its body must be a multiple of 16 bytes, no larger than a BF16 page's and no smaller
// than every block's row scales and one region ratio. Never reads out of bounds, whatever the bytes.
absl::StatusOr<PageRef> ParsePage(std::span<const uint8_t> bytes);

// Checks that a parsed page is the one a reader expects: same geometry, encoding and key.
absl::Status CheckPageMatches(const PageRef& page, const KvGeometry& geometry,
                              PageEncoding encoding, const PageKey& key);

// Decodes every block back to float rows kv [num_layers][2][num_kv_heads][page_tokens][head_dim].
// BF16 and INT2 only: FailedPrecondition for a codec page.
absl::Status DecodePage(const PageRef& page, std::span<float> kv);

const char* PageEncodingName(PageEncoding encoding);

}  // namespace kvstrata

// KV page bytes as they arrive from a peer or a store: ParsePage must never read out of bounds,
// and a page it accepts must decode, match its own geometry and key, and (BF16) re-encode to the
// same bytes; a codec page, which only its engine can decode, must keep to its size bounds.

#include <cstring>
#include <vector>

#include "core/page_format.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<PageRef> page = ParsePage(std::span<const uint8_t>(data, size));
  if (!page.ok()) return 0;
  const KvGeometry& g = page->geometry;
  FUZZ_CHECK(CheckPageMatches(*page, g, page->encoding, page->key()).ok());
  if (kernels::IsCodec(page->encoding)) {
    // Laid out by its codec (either codec encoding), which only its engine knows: sized within
    // the header's bounds, and never decoded without the codec.
    FUZZ_CHECK(size % 16 == 0 && static_cast<int64_t>(size) <=
                                      kernels::PageBytes(g, PageEncoding::kBf16));
    std::vector<float> none;
    FUZZ_CHECK(DecodePage(*page, none).code() == absl::StatusCode::kFailedPrecondition);
    return 0;
  }
  const size_t elements = static_cast<size_t>(g.num_layers) * 2 * g.num_kv_heads * g.page_tokens *
                          g.head_dim;
  FUZZ_CHECK(elements <= size * 16);  // a page cannot decode to more than its codes allow
  std::vector<float> kv(elements);
  FUZZ_CHECK(DecodePage(*page, kv).ok());
  if (page->encoding == PageEncoding::kBf16) {
    bool finite = true;
    for (float v : kv) finite = finite && v == v;  // NaN payloads need not survive
    if (!finite) return 0;
    PageSpec spec{.geometry = g, .encoding = page->encoding,
                  .page_index = page->header.page_index, .key = page->key(),
                  .parent_key = page->parent_key()};
    absl::StatusOr<std::vector<uint8_t>> again = EncodePage(spec, kv);
    FUZZ_CHECK(again.ok());
    FUZZ_CHECK(again->size() == size && std::memcmp(again->data(), data, size) == 0);
  }
  return 0;
}

}  // namespace kvstrata

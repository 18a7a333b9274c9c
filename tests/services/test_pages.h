#pragma once

// Tiny real pages for kvstore tests: core EncodePage on a 1-layer, 1-head, head_dim-64 geometry
// (a BF16 page is 16,448 bytes, an INT2 page 3,136 with group 64).

#include <xxhash.h>

#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/page_format.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore::testing {

inline KvGeometry TinyGeometry() {
  return {.num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .group_size = 64, .page_tokens = 64};
}

// A key whose bytes are all `id` (the namespace key of the tests' chains is Key(0xEE)).
inline PageKey Key(uint8_t id) {
  PageKey key;
  key.bytes.fill(id);
  return key;
}

struct TestPage {
  PageMeta meta;
  std::vector<uint8_t> bytes;
};

// Page `index` of a chain: its parent is `parent` (the namespace key for index 0).
inline TestPage MakePage(const PageKey& key, const PageKey& parent, uint32_t index,
                         PageForm form = PageForm::kBf16) {
  const KvGeometry g = TinyGeometry();
  const PageEncoding encoding =
      form == PageForm::kInt2 ? PageEncoding::kInt2Uniform : PageEncoding::kBf16;
  std::vector<float> kv(static_cast<size_t>(2) * g.page_tokens * g.head_dim);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<float>((i * 7 + key.bytes[0]) % 13);
  absl::StatusOr<std::vector<uint8_t>> bytes = EncodePage({g, encoding, index, key, parent}, kv);
  KV_CHECK(bytes.ok()) << bytes.status();
  TestPage page;
  page.meta = {.key = key,
               .parent_key = parent,
               .page_index = index,
               .form = form,
               .byte_length = bytes->size(),
               .checksum_xxh3_64 = XXH3_64bits(bytes->data(), bytes->size())};
  page.bytes = *std::move(bytes);
  return page;
}

// Pages ids[0..n) as one chain rooted at the namespace key Key(0xEE).
inline std::vector<TestPage> MakeChain(const std::vector<uint8_t>& ids) {
  std::vector<TestPage> pages;
  PageKey parent = Key(0xEE);
  for (size_t i = 0; i < ids.size(); ++i) {
    pages.push_back(MakePage(Key(ids[i]), parent, static_cast<uint32_t>(i)));
    parent = Key(ids[i]);
  }
  return pages;
}

}  // namespace kvstrata::kvstore::testing

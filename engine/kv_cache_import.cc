// KvCache's prefix import: checking cached pages against a prompt's keys and taking them
// into a sequence (copies into the cache's pools, or pages read where they lie). The rest of
// KvCache is in kv_cache.cc.

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/page_format.h"
#include "core/status_macros.h"
#include "engine/kv_cache.h"
#include "kernels/quant.h"

namespace kvstrata::engine {

namespace {

// One cached page, from host memory or from a device's.
struct PrefixSource {
  const std::string* host = nullptr;
  const DevicePage* device = nullptr;
};

// Per page of a cached prefix: its INT2 and BF16 copies (absent: neither pointer set).
struct PrefixCopies {
  PrefixSource int2;
  PrefixSource bf16;
};

bool Present(const PrefixSource& s) { return s.host != nullptr || s.device != nullptr; }

// What CheckPageMatches needs of a page: its header, from the bytes (host) or rebuilt from what
// the store said (device: the store parsed the real header on Put, and the digest binds it).
absl::StatusOr<PageRef> ParseSource(const PrefixSource& s, const kernels::KvGeometry& g,
                                    int64_t history_page_bytes, kernels::PageHeader* storage) {
  if (s.host != nullptr) {
    return ParsePage(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.host->data()), s.host->size()));
  }
  const DevicePage& d = *s.device;
  const int64_t want = d.encoding == kernels::PageEncoding::kBf16
                           ? kernels::PageBytes(g, d.encoding)
                           : history_page_bytes;
  if (d.bytes == nullptr || d.byte_length != want) {
    return absl::InvalidArgumentError(absl::StrCat("device page of ", d.byte_length,
                                                   " bytes, but a ", PageEncodingName(d.encoding),
                                                   " page of this engine has ", want));
  }
  *storage = kernels::PageHeader{};
  storage->page_index = static_cast<uint32_t>(d.page_index);
  std::memcpy(storage->key, d.key.bytes.data(), 16);
  std::memcpy(storage->parent_key, d.parent_key.bytes.data(), 16);
  PageRef ref;
  ref.header = *storage;
  ref.geometry = g;
  ref.encoding = d.encoding;
  return ref;
}

absl::StatusOr<std::vector<PrefixCopies>> SelectPrefixCopies(
    const kernels::KvGeometry& g, bool split, kernels::PageEncoding int2_encoding,
    int64_t history_page_bytes, const PageKey& namespace_key, std::span<const int32_t> prompt,
    std::span<const std::string> pages, std::span<const DevicePage> device_pages) {
  const int64_t P = g.page_tokens;
  std::vector<PrefixCopies> copies;
  const size_t total = pages.size() + device_pages.size();
  for (size_t i = 0; i < total; ++i) {
    const PrefixSource source = i < pages.size()
                                    ? PrefixSource{.host = &pages[i]}
                                    : PrefixSource{.device = &device_pages[i - pages.size()]};
    kernels::PageHeader storage;
    absl::StatusOr<PageRef> page = ParseSource(source, g, history_page_bytes, &storage);
    if (!page.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cached page ", i, " is not a valid page: ", page.status().message()));
    }
    const int64_t index = page->header.page_index;
    if ((index + 1) * P > static_cast<int64_t>(prompt.size()) - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cached page ", i, " has page_index ", index, " but a prompt of ", prompt.size(),
          " tokens can take at most ", (static_cast<int64_t>(prompt.size()) - 1) / P,
          " cached pages (at least one prompt token is computed)"));
    }
    if (static_cast<int64_t>(copies.size()) <= index) copies.resize(index + 1);
    const bool is_bf16 = page->encoding == kernels::PageEncoding::kBf16;
    if (!is_bf16 && !split) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cached page ", i, " (page_index ", index, ") is ", PageEncodingName(page->encoding),
          " but this engine's KV format keeps every page BF16"));
    }
    PrefixSource& slot = is_bf16 ? copies[index].bf16 : copies[index].int2;
    if (Present(slot)) {
      return absl::InvalidArgumentError(absl::StrCat("cached page ", i, " repeats page_index ",
                                                     index, " in ",
                                                     PageEncodingName(page->encoding)));
    }
    slot = source;
  }
  // Keys of the prompt's first pages, then every copy checked against them.
  PageKey parent = namespace_key;
  for (int64_t p = 0; p < static_cast<int64_t>(copies.size()); ++p) {
    if (!Present(copies[p].int2) && !Present(copies[p].bf16)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cached prefix has no page_index ", p, " (pages must be 0..N-1)"));
    }
    std::vector<uint32_t> ids(prompt.begin() + p * P, prompt.begin() + (p + 1) * P);
    const PageKey key = ChainPageKey(parent, ids);
    for (const bool bf16 : {false, true}) {
      const PrefixSource& source = bf16 ? copies[p].bf16 : copies[p].int2;
      if (!Present(source)) continue;
      kernels::PageHeader storage;
      absl::StatusOr<PageRef> page = ParseSource(source, g, history_page_bytes, &storage);
      const kernels::PageEncoding want = bf16 ? kernels::PageEncoding::kBf16 : int2_encoding;
      absl::Status match = CheckPageMatches(*page, g, want, key);
      if (match.ok() && !bf16 && static_cast<int64_t>(page->bytes.size()) != history_page_bytes &&
          source.host != nullptr) {
        // A codec page's size is its codec's (ParsePage cannot know it).
        match = absl::FailedPreconditionError(
            absl::StrCat("page of ", page->bytes.size(), " bytes but this engine's ",
                         PageEncodingName(want), " pages have ", history_page_bytes));
      }
      if (match.ok() && page->parent_key() != parent) {
        match = absl::FailedPreconditionError(absl::StrCat(
            "page parent key ", page->parent_key().ToHex(), " but expected ", parent.ToHex()));
      }
      if (!match.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cached page_index ", p,
                         " does not belong to this prompt and engine: ", match.message()));
      }
    }
    parent = key;
  }
  return copies;
}

}  // namespace

absl::StatusOr<int64_t> KvCache::CheckCachedPrefix(const PageKey& namespace_key,
                                                   std::span<const int32_t> prompt,
                                                   std::span<const std::string> pages,
                                                   std::span<const DevicePage> device_pages) const {
  if (IsEvaluationFormat(options_.format) && (!pages.empty() || !device_pages.empty())) {
    return absl::InvalidArgumentError("evaluation KV formats cannot import cached pages");
  }
  KV_ASSIGN_OR_RETURN(std::vector<PrefixCopies> copies,
                      SelectPrefixCopies(geometry_, split(), int2_encoding(), history_page_bytes_,
                                         namespace_key, prompt, pages, device_pages));
  const int64_t n = static_cast<int64_t>(copies.size());
  const int64_t sink_pages = options_.layout.sink_tokens / options_.layout.page_tokens;
  const bool can_demote = !options_.demotion_key_clip.empty();
  for (int64_t p = sink_pages; p < DemotedPagesEnd(n * options_.layout.page_tokens); ++p) {
    if (!Present(copies[p].int2) && !can_demote) {
      return absl::InvalidArgumentError(
          absl::StrCat("cached page_index ", p, " is INT2 history at ", n,
                       " cached pages but came only as BF16 (an INT2 copy is needed)"));
    }
  }
  return n;
}

absl::StatusOr<int64_t> KvCache::ImportPrefix(SequenceKv& seq, std::span<const std::string> pages,
                                              std::span<const DevicePage> device_pages,
                                              DevicePageAccess* access,
                                              std::shared_ptr<void> in_place_hold) {
  const int64_t P = options_.layout.page_tokens;
  if (seq.num_tokens != 0) {
    return absl::FailedPreconditionError("a cached prefix is imported into an empty sequence");
  }
  if (!device_pages.empty() && access == nullptr) {
    return absl::InvalidArgumentError("device pages need the backend's device page access");
  }
  KV_ASSIGN_OR_RETURN(const int64_t n,
                      CheckCachedPrefix(seq.namespace_key, seq.tokens, pages, device_pages));
  if (n == 0) return 0;
  KV_ASSIGN_OR_RETURN(std::vector<PrefixCopies> copies,
                      SelectPrefixCopies(geometry_, split(), int2_encoding(), history_page_bytes_,
                                         seq.namespace_key, seq.tokens, pages, device_pages));
  // Device pages that are already in the form their slot holds are gathered at the end in one
  // copy; any other is read to the host here and imported as a host page.
  std::vector<DevicePageAccess::Copy> gathers;
  std::vector<std::string> staged;  // host copies of device pages that need converting
  staged.reserve(2 * copies.size());
  auto host_bytes = [&](const PrefixSource& source) -> absl::StatusOr<const std::string*> {
    if (source.host != nullptr || source.device == nullptr) return source.host;
    KV_ASSIGN_OR_RETURN(std::string bytes, access->ReadPage(*source.device));
    staged.push_back(std::move(bytes));
    return &staged.back();
  };
  auto release_slots = [&] {
    for (int32_t& slot : seq.bf16_slot) {
      if (slot >= 0) bf16_pool_->Free(slot);
      slot = -1;
    }
    for (int32_t& slot : seq.int2_slot) {
      if (slot >= 0) int2_pool_->Free(slot);
      slot = -1;
    }
    seq.int2_in_place.clear();
    seq.in_place_pages = 0;
  };
  seq.bf16_slot.assign(n, -1);
  seq.int2_slot.assign(n, -1);
  seq.int2_in_place.clear();
  seq.in_place_pages = 0;
  // History pages read where they lie: their digests are checked there, with the gathers.
  const bool in_place = in_place_hold != nullptr && access != nullptr && split();
  seq.page_keys.clear();
  const int64_t sink_pages = options_.layout.sink_tokens / P;
  const int64_t demoted_end = DemotedPagesEnd(n * P);
  int64_t dequantised = 0;
  for (int64_t p = 0; p < n; ++p) {
    const PrefixSource& int2_source = copies[p].int2;
    const PrefixSource& bf16_source = copies[p].bf16;
    {
      const PrefixSource& any = Present(bf16_source) ? bf16_source : int2_source;
      kernels::PageHeader storage;
      seq.page_keys.push_back(ParseSource(any, geometry_, history_page_bytes_, &storage)->key());
    }
    const bool history = split() && p >= sink_pages && p < demoted_end;
    const PrefixSource& exact = history ? int2_source : bf16_source;
    if (exact.device != nullptr && history && in_place &&
        exact.device->byte_length == int2_pool_->slot_bytes() &&
        access->CanReadInPlace(*exact.device)) {
      if (seq.int2_in_place.empty()) seq.int2_in_place.resize(n);
      seq.int2_in_place[p] = *exact.device;
      ++seq.in_place_pages;
      gathers.push_back({.src = exact.device->bytes,
                         .dst = nullptr,
                         .bytes = exact.device->byte_length,
                         .digest64 = exact.device->digest64});
      continue;
    }
    if (exact.device != nullptr) {
      PagePool& pool = history ? *int2_pool_ : *bf16_pool_;
      std::optional<int32_t> s = pool.Allocate();
      if (!s) {
        release_slots();
        return absl::ResourceExhaustedError("page pool exhausted (reservation broken)");
      }
      (history ? seq.int2_slot : seq.bf16_slot)[p] = *s;
      gathers.push_back({.src = exact.device->bytes,
                         .dst = pool.slot(*s),
                         .bytes = exact.device->byte_length,
                         .digest64 = exact.device->digest64});
      continue;
    }
    absl::StatusOr<const std::string*> int2_bytes = host_bytes(int2_source);
    absl::StatusOr<const std::string*> bf16_bytes = host_bytes(bf16_source);
    if (!int2_bytes.ok() || !bf16_bytes.ok()) {
      release_slots();
      return int2_bytes.ok() ? bf16_bytes.status() : int2_bytes.status();
    }
    const std::string* int2 = *int2_bytes;
    const std::string* bf16 = *bf16_bytes;
    if (history) {
      std::optional<int32_t> s = int2_pool_->Allocate();
      if (!s) return absl::ResourceExhaustedError("INT2 page pool exhausted (reservation broken)");
      seq.int2_slot[p] = *s;
      if (int2 == nullptr) {
        // History here, but only its BF16 copy came (it was in the exporter's window): demote it
        // as the backend does, from the BF16 values with the same clips, into a host copy of
        // the page that is then written to its slot.
        std::string page(static_cast<size_t>(int2_pool_->slot_bytes()), '\0');
        const kernels::PageHeader h = Header(seq, p, int2_encoding());
        std::memcpy(page.data(), &h, sizeof(h));
        const auto* body = reinterpret_cast<const uint8_t*>(bf16->data());
        std::vector<float> rows(static_cast<size_t>(P) * geometry_.head_dim);
        for (int layer = 0; layer < geometry_.num_layers; ++layer) {
          for (int kind = 0; kind < 2; ++kind) {
            for (int h = 0; h < geometry_.num_kv_heads; ++h) {
              kernels::DecodeBf16Block(
                  body +
                      kernels::BlockOffset(geometry_, kernels::PageEncoding::kBf16, layer, kind, h),
                  static_cast<int>(P), geometry_, rows.data());
              const size_t c = static_cast<size_t>(layer) * geometry_.num_kv_heads + h;
              EncodeHistoryBlock(
                  options_.format, geometry_, rows.data(), layer, kind, h,
                  kind == 0 ? options_.demotion_key_clip[c] : options_.demotion_value_clip[c],
                  reinterpret_cast<uint8_t*>(page.data()) + HistoryBlockOffset(layer, kind, h),
                  options_.codec.get());
            }
          }
        }
        KV_RETURN_IF_ERROR(int2_pool_->Write(*s, 0, page.data(), int2_pool_->slot_bytes()));
        continue;
      }
      if (static_cast<int64_t>(int2->size()) != int2_pool_->slot_bytes()) {
        return absl::InternalError("INT2 page size differs from the pool's slot size");
      }
      KV_RETURN_IF_ERROR(
          int2_pool_->Write(*s, 0, int2->data(), static_cast<int64_t>(int2->size())));
      continue;
    }
    std::string converted;
    if (bf16 == nullptr) {
      // BF16 at this length, but only the history copy exists: dequantise (not exact).
      absl::StatusOr<PageRef> page = ParsePage(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(int2->data()), int2->size()));
      std::vector<float> kv(static_cast<size_t>(kernels::NumBlocks(geometry_)) * P *
                            geometry_.head_dim);
      DecodeHistoryPage(reinterpret_cast<const uint8_t*>(int2->data()), kv.data());
      PageSpec spec;
      spec.geometry = geometry_;
      spec.encoding = kernels::PageEncoding::kBf16;
      spec.page_index = static_cast<uint32_t>(p);
      spec.key = page->key();
      spec.parent_key = page->parent_key();
      KV_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, EncodePage(spec, kv));
      converted.assign(bytes.begin(), bytes.end());
      bf16 = &converted;
      ++dequantised;
    }
    if (static_cast<int64_t>(bf16->size()) != bf16_pool_->slot_bytes()) {
      return absl::InternalError("BF16 page size differs from the pool's slot size");
    }
    std::optional<int32_t> s = bf16_pool_->Allocate();
    if (!s) return absl::ResourceExhaustedError("BF16 page pool exhausted (reservation broken)");
    seq.bf16_slot[p] = *s;
    KV_RETURN_IF_ERROR(bf16_pool_->Write(*s, 0, bf16->data(), static_cast<int64_t>(bf16->size())));
  }
  if (!gathers.empty()) {
    if (absl::Status copied = access->CopyPages(gathers); !copied.ok()) {
      release_slots();
      seq.page_keys.clear();
      return copied;
    }
  }
  if (seq.in_place_pages > 0) {
    seq.in_place_hold = std::move(in_place_hold);
    // Those pages never take a slot of this cache: their reservation is free for others.
    const int64_t freed = std::min(seq.in_place_pages, seq.reserved_int2);
    seq.reserved_int2 -= freed;
    reserved_int2_ -= freed;
  }
  seq.num_tokens = n * P;
  return dequantised;
}

}  // namespace kvstrata::engine

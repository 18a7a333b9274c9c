#include "core/page_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "kernels/quant.h"

namespace kvstrata {

namespace {

using kernels::PageHeader;

bool KnownEncoding(uint8_t e) {
  return e == static_cast<uint8_t>(PageEncoding::kBf16) ||
         e == static_cast<uint8_t>(PageEncoding::kInt2Uniform) ||
         e == static_cast<uint8_t>(PageEncoding::kInt2LloydMax) ||
         e == static_cast<uint8_t>(PageEncoding::kCodec) ||
         e == static_cast<uint8_t>(PageEncoding::kCodecFragment);
}

int64_t FloatsPerPage(const KvGeometry& g) {
  return kernels::NumBlocks(g) * g.page_tokens * g.head_dim;
}

}  // namespace

const char* PageEncodingName(PageEncoding encoding) {
  switch (encoding) {
    case PageEncoding::kBf16:
      return "bf16";
    case PageEncoding::kInt2Uniform:
      return "int2";
    case PageEncoding::kInt2LloydMax:
      return "int2-lloyd-max";
    case PageEncoding::kCodec:
      return "codec";
    case PageEncoding::kCodecFragment:
      return "codec-fragment";
  }
  return "unknown";
}

absl::Status ValidateGeometry(const KvGeometry& g, PageEncoding encoding) {
  if (g.head_dim != 64 && g.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported head_dim=", g.head_dim, " (supported: 64, 128)"));
  }
  if (g.num_layers < 1 || g.num_layers > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_layers=", g.num_layers, " is outside 1..1024"));
  }
  if (g.num_kv_heads < 1 || g.num_kv_heads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads=", g.num_kv_heads, " is outside 1..256"));
  }
  if (g.page_tokens < 1 || g.page_tokens > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_tokens=", g.page_tokens, " is outside 1..4096"));
  }
  if (kernels::IsInt2(encoding) &&
      (g.group_size < 16 || g.group_size % 16 != 0 || g.head_dim % g.group_size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported group_size=", g.group_size,
                                                   " for head_dim=", g.head_dim,
                                                   " (a multiple of 16 that divides head_dim)"));
  }
  if ((kernels::IsInt2(encoding) || kernels::IsCodec(encoding)) && g.page_tokens != 64) {
    return absl::InvalidArgumentError(absl::StrCat("page_tokens=", g.page_tokens,
                                                   " is unsupported for ",
                                                   PageEncodingName(encoding), " pages (64)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> EncodePage(const PageSpec& spec, std::span<const float> kv,
                                                ClipRatios clip_ratios) {
  const KvGeometry& g = spec.geometry;
  KV_RETURN_IF_ERROR(ValidateGeometry(g, spec.encoding));
  if (kernels::IsCodec(spec.encoding)) {
    return absl::InvalidArgumentError(
        "codec pages are laid out by their codec: the engine's KV cache encodes them");
  }
  if (static_cast<int64_t>(kv.size()) != FloatsPerPage(g)) {
    return absl::InvalidArgumentError(absl::StrCat("kv has ", kv.size(), " floats; a page of ",
                                                   g.page_tokens, " tokens needs ",
                                                   FloatsPerPage(g)));
  }
  if (!clip_ratios.empty() && static_cast<int64_t>(clip_ratios.size()) != kernels::NumBlocks(g)) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip_ratios has ", clip_ratios.size(),
                     " entries; expected num_layers*2*num_kv_heads=", kernels::NumBlocks(g)));
  }
  for (float r : clip_ratios) {
    if (!(r > 0.0f && r <= 1.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("clip ratio ", r, " is outside (0, 1]"));
    }
  }
  std::vector<uint8_t> page(kernels::PageBytes(g, spec.encoding), 0);
  PageHeader h{};
  h.magic = kernels::kPageMagic;
  h.version = kernels::kPageFormatVersion;
  h.encoding = static_cast<uint8_t>(spec.encoding);
  h.page_tokens = static_cast<uint16_t>(g.page_tokens);
  h.num_layers = static_cast<uint16_t>(g.num_layers);
  h.num_kv_heads = static_cast<uint16_t>(g.num_kv_heads);
  h.head_dim = static_cast<uint16_t>(g.head_dim);
  h.group_size = kernels::IsInt2(spec.encoding) ? static_cast<uint16_t>(g.group_size) : 0;
  h.page_index = spec.page_index;
  h.body_bytes = page.size() - kernels::kPageHeaderBytes;
  std::memcpy(h.key, spec.key.bytes.data(), kPageKeyBytes);
  std::memcpy(h.parent_key, spec.parent_key.bytes.data(), kPageKeyBytes);
  std::memcpy(page.data(), &h, sizeof(h));

  const int64_t rows = int64_t{g.page_tokens} * g.head_dim;
  for (int l = 0; l < g.num_layers; ++l) {
    for (int kind = 0; kind < 2; ++kind) {
      for (int head = 0; head < g.num_kv_heads; ++head) {
        const int64_t b = (int64_t{l} * 2 + kind) * g.num_kv_heads + head;
        uint8_t* block = page.data() + kernels::BlockOffset(g, spec.encoding, l, kind, head);
        const float* src = kv.data() + b * rows;
        if (kernels::IsInt2(spec.encoding)) {
          const float ratio = clip_ratios.empty() ? 1.0f : clip_ratios[b];
          kernels::EncodeInt2Block(src, g.page_tokens, g, ratio, spec.encoding, kind, block);
        } else {
          kernels::EncodeBf16Block(src, g.page_tokens, g, block);
        }
      }
    }
  }
  return page;
}

PageKey PageRef::key() const {
  PageKey k;
  std::memcpy(k.bytes.data(), header.key, kPageKeyBytes);
  return k;
}

PageKey PageRef::parent_key() const {
  PageKey k;
  std::memcpy(k.bytes.data(), header.parent_key, kPageKeyBytes);
  return k;
}

absl::StatusOr<PageRef> ParsePage(std::span<const uint8_t> bytes) {
  if (bytes.size() < static_cast<size_t>(kernels::kPageHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("page is ", bytes.size(),
                                                   " bytes, shorter than its ",
                                                   kernels::kPageHeaderBytes, "-byte header"));
  }
  PageRef ref;
  std::memcpy(&ref.header, bytes.data(), sizeof(PageHeader));
  const PageHeader& h = ref.header;
  if (h.magic != kernels::kPageMagic) {
    return absl::InvalidArgumentError("page header: bad magic (expected \"KVPG\")");
  }
  if (h.version != kernels::kPageFormatVersion) {
    return absl::InvalidArgumentError(absl::StrCat("page header: unsupported version=", h.version,
                                                   " (this build reads version ",
                                                   kernels::kPageFormatVersion, ")"));
  }
  if (!KnownEncoding(h.encoding)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page header: unknown encoding=", static_cast<int>(h.encoding)));
  }
  if (h.reserved0 != 0 || h.reserved1 != 0) {
    return absl::InvalidArgumentError("page header: reserved fields must be zero");
  }
  ref.encoding = static_cast<PageEncoding>(h.encoding);
  ref.geometry = KvGeometry{.num_layers = h.num_layers,
                            .num_kv_heads = h.num_kv_heads,
                            .head_dim = h.head_dim,
                            .group_size = h.group_size,
                            .page_tokens = h.page_tokens};
  if (!kernels::IsInt2(ref.encoding)) {
    if (h.group_size != 0) {
      return absl::InvalidArgumentError(absl::StrCat("page header: group_size must be 0 for a ",
                                                     PageEncodingName(ref.encoding), " page"));
    }
    ref.geometry.group_size = h.head_dim;  // unused by BF16 and codec blocks
  }
  if (absl::Status s = ValidateGeometry(ref.geometry, ref.encoding); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("page header: ", s.message()));
  }
  int64_t expect = kernels::PageBytes(ref.geometry, ref.encoding);
  if (kernels::IsCodec(ref.encoding)) {
    // Its size depends on its codec, which only the engines of its namespace know (they check
    // it); here it must be a multiple of 16 bytes, no larger than the BF16 page, and hold at
    // least every block's row scales and one region ratio (kernels/codec_page.h).
    const uint64_t bf16_body = static_cast<uint64_t>(
        kernels::PageBytes(ref.geometry, PageEncoding::kBf16) - kernels::kPageHeaderBytes);
    const uint64_t least = static_cast<uint64_t>(kernels::NumBlocks(ref.geometry)) *
                           ((ref.geometry.page_tokens + 1 + 15) / 16 * 16);
    if (h.body_bytes < least || h.body_bytes % 16 != 0 || h.body_bytes > bf16_body) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page header: body_bytes=", h.body_bytes,
          " for a codec page must be a multiple of 16 in [", least, ", ", bf16_body, "]"));
    }
    expect = static_cast<int64_t>(h.body_bytes) + kernels::kPageHeaderBytes;
  }
  if (h.body_bytes != static_cast<uint64_t>(expect - kernels::kPageHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat("page header: body_bytes=", h.body_bytes,
                                                   " but the shape needs ",
                                                   expect - kernels::kPageHeaderBytes));
  }
  if (static_cast<int64_t>(bytes.size()) != expect) {
    return absl::InvalidArgumentError(
        absl::StrCat("page buffer is ", bytes.size(), " bytes; its header says ", expect));
  }
  ref.bytes = bytes;
  return ref;
}

absl::Status CheckPageMatches(const PageRef& page, const KvGeometry& g, PageEncoding encoding,
                              const PageKey& key) {
  const KvGeometry& p = page.geometry;
  if (page.encoding != encoding) {
    return absl::FailedPreconditionError(
        absl::StrCat("page encoding ", PageEncodingName(page.encoding), " but expected ",
                     PageEncodingName(encoding)));
  }
  if (p.num_layers != g.num_layers || p.num_kv_heads != g.num_kv_heads ||
      p.head_dim != g.head_dim || p.page_tokens != g.page_tokens ||
      (kernels::IsInt2(encoding) && p.group_size != g.group_size)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "page shape (layers=", p.num_layers, ", kv_heads=", p.num_kv_heads,
        ", head_dim=", p.head_dim, ", page_tokens=", p.page_tokens, ", group_size=", p.group_size,
        ") does not match the engine's (layers=", g.num_layers, ", kv_heads=", g.num_kv_heads,
        ", head_dim=", g.head_dim, ", page_tokens=", g.page_tokens, ", group_size=", g.group_size,
        ")"));
  }
  if (page.key() != key) {
    return absl::FailedPreconditionError(
        absl::StrCat("page key ", page.key().ToHex(), " but expected ", key.ToHex()));
  }
  return absl::OkStatus();
}

absl::Status DecodePage(const PageRef& page, std::span<float> kv) {
  const KvGeometry& g = page.geometry;
  if (kernels::IsCodec(page.encoding)) {
    return absl::FailedPreconditionError(
        "a codec page decodes only with its codec (the engine's KV cache)");
  }
  if (static_cast<int64_t>(kv.size()) != FloatsPerPage(g)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv has ", kv.size(), " floats; the page holds ", FloatsPerPage(g)));
  }
  const int64_t rows = int64_t{g.page_tokens} * g.head_dim;
  for (int l = 0; l < g.num_layers; ++l) {
    for (int kind = 0; kind < 2; ++kind) {
      for (int head = 0; head < g.num_kv_heads; ++head) {
        const int64_t b = (int64_t{l} * 2 + kind) * g.num_kv_heads + head;
        const uint8_t* block =
            page.bytes.data() + kernels::BlockOffset(g, page.encoding, l, kind, head);
        if (kernels::IsInt2(page.encoding)) {
          kernels::DecodeInt2Block(block, g.page_tokens, g, page.encoding, kind,
                                   kv.data() + b * rows);
        } else {
          kernels::DecodeBf16Block(block, g.page_tokens, g, kv.data() + b * rows);
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvstrata

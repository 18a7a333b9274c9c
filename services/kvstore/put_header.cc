#include "services/kvstore/put_header.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/radix_hash.h"
#include "core/status_macros.h"

namespace kvstrata::kvstore {
namespace {

absl::StatusOr<PageKey> ParseKey(const std::string& bytes, const std::string& field) {
  absl::StatusOr<PageKey> key = PageKey::FromBytes(bytes);
  if (!key.ok())
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", key.status().message()));
  return key;
}

}  // namespace

absl::StatusOr<PageMeta> ParsePutHeader(const v1::PageHeader& header, int page_number) {
  const std::string where = absl::StrCat("page ", page_number, " of the stream");
  PageMeta meta;
  KV_ASSIGN_OR_RETURN(meta.key, ParseKey(header.key(), absl::StrCat(where, ": header.key")));
  // PageHeader (common.proto): page 0 carries the namespace key as its parent, like the page's
  // own header (docs/kv-format.md), so every page has a 16-byte parent_key.
  KV_ASSIGN_OR_RETURN(meta.parent_key,
                      ParseKey(header.parent_key(), absl::StrCat(where, " (", meta.key.ToHex(),
                                                                 "): header.parent_key")));
  meta.page_index = header.page_index();
  switch (header.encoding()) {
    case v1::PAGE_ENCODING_BF16:
      meta.form = PageForm::kBf16;
      break;
    case v1::PAGE_ENCODING_INT2:
      meta.form = PageForm::kInt2;
      break;
    case v1::PAGE_ENCODING_BF16_RECENT:
      meta.form = PageForm::kBf16Recent;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          where, " (", meta.key.ToHex(), "): header.encoding is unspecified or unknown"));
  }
  if (header.byte_length() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " (", meta.key.ToHex(), "): header.byte_length is 0"));
  }
  meta.byte_length = header.byte_length();
  meta.checksum_xxh3_64 = header.checksum_xxh3_64();
  if (header.mac().size() > kMaxPutMacBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, " (", meta.key.ToHex(),
                                                   "): header.mac of ", header.mac().size(),
                                                   " bytes exceeds ", kMaxPutMacBytes));
  }
  meta.mac = header.mac();
  return meta;
}

}  // namespace kvstrata::kvstore

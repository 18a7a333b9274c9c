// The header a client sends before each page of a KvStore.Put stream (ParsePutHeader,
// services/kvstore/put_header.h), on any bytes that parse as a v1::PageHeader: it never crashes,
// refuses with INVALID_ARGUMENT naming the page of the stream, and accepts exactly the headers
// the documented rules allow (checked here without PageKey or PageForm), copying every field.
//
// Input: a serialized v1::PageHeader.

#include <google/protobuf/stubs/logging.h>

#include <string>

#include "absl/strings/match.h"
#include "kvstrata/v1/common.pb.h"
#include "services/kvstore/put_header.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata::kvstore {
namespace {

constexpr int kPageNumber = 7;

// PageHeader's rules as common.proto states them: 16-byte key and parent_key, a known encoding,
// some bytes to follow, a MAC of at most 64 bytes.
bool AllowedByTheRules(const v1::PageHeader& h) {
  const int e = h.encoding();
  return h.key().size() == 16 && h.parent_key().size() == 16 &&
         (e == v1::PAGE_ENCODING_BF16 || e == v1::PAGE_ENCODING_INT2 ||
          e == v1::PAGE_ENCODING_BF16_RECENT) &&
         h.byte_length() > 0 && h.mac().size() <= 64;
}

v1::PageEncoding EncodingOf(PageForm form) {
  switch (form) {
    case PageForm::kBf16:
      return v1::PAGE_ENCODING_BF16;
    case PageForm::kInt2:
      return v1::PAGE_ENCODING_INT2;
    case PageForm::kBf16Recent:
      return v1::PAGE_ENCODING_BF16_RECENT;
  }
  return v1::PAGE_ENCODING_UNSPECIFIED;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static google::protobuf::LogSilencer quiet;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  v1::PageHeader header;
  if (!header.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::StatusOr<PageMeta> meta = ParsePutHeader(header, kPageNumber);
  FUZZ_CHECK(meta.ok() == AllowedByTheRules(header));
  if (!meta.ok()) {
    FUZZ_CHECK(meta.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(absl::StartsWith(meta.status().message(), "page 7 of the stream"));
    FUZZ_CHECK(absl::StrContains(meta.status().message(), "header."));
    return 0;
  }
  FUZZ_CHECK(meta->key.ToBytes() == header.key());
  FUZZ_CHECK(meta->parent_key.ToBytes() == header.parent_key());
  FUZZ_CHECK(meta->page_index == header.page_index());
  FUZZ_CHECK(EncodingOf(meta->form) == header.encoding());
  FUZZ_CHECK(meta->byte_length == header.byte_length());
  FUZZ_CHECK(meta->checksum_xxh3_64 == header.checksum_xxh3_64());
  FUZZ_CHECK(meta->mac == header.mac());
  FUZZ_CHECK(meta->digest64 == 0);  // the store's to compute
  return 0;
}

}  // namespace kvstrata::kvstore

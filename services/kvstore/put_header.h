#pragma once

// The header a KvStore.Put stream sends before each page's chunks (kvstrata.v1.PageHeader),
// checked and read as the store's PageMeta. Pure: no store, no gRPC, so it is fuzzed on its own
// (tests/fuzz/put_header_fuzz.cc).

#include <cstddef>

#include "absl/status/statusor.h"
#include "kvstrata/v1/common.pb.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore {

// A PageHeader.mac longer than this is refused (core/page_mac.h uses 32 bytes).
inline constexpr size_t kMaxPutMacBytes = 64;

// `header` as a PageMeta, or INVALID_ARGUMENT naming page `page_number` of the stream and the
// field. Accepted only with: key and parent_key of 16 bytes each (page 0's parent is the
// namespace key), encoding BF16, INT2 or BF16_RECENT, byte_length > 0, and mac of at most
// kMaxPutMacBytes. page_index, checksum and mac are copied as given; digest64 is left 0 (the
// store computes it). The chain and capacity rules belong to the store and the handler.
absl::StatusOr<PageMeta> ParsePutHeader(const v1::PageHeader& header, int page_number);

}  // namespace kvstrata::kvstore

#pragma once

// The kvstore's byte-stream seam: how Fetch sends the bytes of a page (kvstore_service.cc streams
// them as gRPC chunks). The other transports do not send bytes through the store's RPC threads:
// OpenTransfer negotiates them (the same-GPU pool: the worker reads the store's HBM pool itself,
// docs/kvstore.md#transfers-opentransfer; NCCL later).

#include "absl/status/status.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore {

class PageTransport {
 public:
  virtual ~PageTransport() = default;
  // Sends one whole page: its description (key, form, length, checksum), then its bytes.
  // Returns once the bytes are handed to the transport; an error (e.g. Cancelled when the peer
  // went away) ends the transfer. `page.bytes` is shared, so the page may be evicted meanwhile.
  virtual absl::Status SendPage(const StoredPage& page) = 0;
};

}  // namespace kvstrata::kvstore

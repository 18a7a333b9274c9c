#pragma once

// The kvstore's data path seam: how the bytes of a fetched page reach a client. Today one
// implementation streams them as gRPC chunks (kvstore_service.cc); the NCCL GPU-to-GPU transport
// of a later issue implements the same interface for OpenTransfer.

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

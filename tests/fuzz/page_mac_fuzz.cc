// A fetched page's MAC check (core/page_mac.h) on any header and body a store could return:
// Verify accepts or refuses with DATA_LOSS, never crashes, and accepts only a MAC that one of the
// pool's keys makes for these bytes under this key. The pool is mid-rotation: key A signs, keys
// A and B verify.
//
// Input: a little-endian uint16 n, then n bytes of a serialized v1::PageHeader (key, mac, ...),
// then the page body.

#include <google/protobuf/stubs/logging.h>

#include <cstring>
#include <string>

#include "core/page_mac.h"
#include "kvstrata/v1/common.pb.h"
#include "tests/fuzz/fuzz_keys.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {
namespace {

struct Pool {
  std::shared_ptr<const PageMacKeys> rotating;  // A signs; A and B verify
  std::shared_ptr<const PageMacKeys> a, b;
};

const Pool& Keys() {
  static const Pool* pool = [] {
    auto get = [](std::vector<std::string> hex) {
      absl::StatusOr<std::shared_ptr<const PageMacKeys>> keys = PageMacKeys::FromHex(hex);
      FUZZ_CHECK(keys.ok());
      return *std::move(keys);
    };
    return new Pool{get({fuzz::kPageMacKeyA, fuzz::kPageMacKeyB}), get({fuzz::kPageMacKeyA}),
                    get({fuzz::kPageMacKeyB})};
  }();
  return *pool;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static google::protobuf::LogSilencer quiet;
  Keys();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t n = std::min<size_t>(data[0] | size_t{data[1]} << 8, size - 2);
  v1::PageHeader header;
  if (!header.ParseFromArray(data + 2, static_cast<int>(n))) return 0;
  absl::StatusOr<PageKey> key = PageKey::FromBytes(header.key());
  if (!key.ok()) return 0;  // the client refuses such a header before any MAC check
  const std::span<const uint8_t> page(data + 2 + n, size - 2 - n);
  const Pool& keys = Keys();

  const absl::Status verified = keys.rotating->Verify(*key, page, header.mac());
  FUZZ_CHECK(verified.ok() || verified.code() == absl::StatusCode::kDataLoss);
  const bool by_a = keys.a->Verify(*key, page, header.mac()).ok();
  const bool by_b = keys.b->Verify(*key, page, header.mac()).ok();
  FUZZ_CHECK(verified.ok() == (by_a || by_b));
  if (verified.ok()) {
    FUZZ_CHECK(header.mac() == (by_a ? keys.a : keys.b)->Sign(*key, page));
  }

  // What the pool signs, it verifies; under another page key, or with another body, it does not.
  const std::string mac = keys.rotating->Sign(*key, page);
  FUZZ_CHECK(mac == keys.a->Sign(*key, page));
  FUZZ_CHECK(keys.rotating->Verify(*key, page, mac).ok());
  FUZZ_CHECK(!keys.b->Verify(*key, page, mac).ok());
  PageKey other = *key;
  other.bytes[0] ^= 1;
  FUZZ_CHECK(keys.rotating->Verify(other, page, mac).code() == absl::StatusCode::kDataLoss);
  if (!page.empty()) {
    FUZZ_CHECK(keys.rotating->Verify(*key, page.first(page.size() - 1), mac).code() ==
               absl::StatusCode::kDataLoss);
  }
  return 0;
}

}  // namespace kvstrata

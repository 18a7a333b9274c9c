// The pool socket's hello, as a worker receives it from whatever answers on the socket path a
// kvstore named: ParsePoolHello refuses all but a hello with DATA_LOSS, and a hello it accepts is
// kPoolHelloBytes that re-encode to themselves, with a pool size an int64 holds.

#include <cstdint>
#include <limits>

#include "tests/fuzz/fuzz_util.h"
#include "transport/pool_socket.h"

namespace kvstrata {

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<transport::PoolHello> hello = transport::ParsePoolHello(bytes);
  if (!hello.ok()) {
    FUZZ_CHECK(hello.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  FUZZ_CHECK(size == transport::kPoolHelloBytes);
  FUZZ_CHECK(transport::EncodePoolHello(*hello) == bytes);
  FUZZ_CHECK(hello->pool_bytes <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
  return 0;
}

}  // namespace kvstrata

#pragma once

// CHECK for broken invariants (programming errors), never for anything a peer, a file or the
// environment can cause: those are absl::Status. This Abseil has no logging library.
//
//   KV_CHECK(slot >= 0) << "slot " << slot;

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace kvstrata::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition) {
    stream_ << file << ":" << line << ": check failed: " << condition << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::cerr << stream_.str() << std::endl;
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace kvstrata::internal

#define KV_CHECK(condition) \
  if (condition) {          \
  } else                    \
    ::kvstrata::internal::CheckFailure(__FILE__, __LINE__, #condition).stream()

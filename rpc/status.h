#pragma once

// Conversion between absl::Status, the error type of every kvstrata library, and grpc::Status,
// which only RPC handlers and clients see. Code and message survive both ways; absl payloads and
// gRPC binary error details do not (nothing in kvstrata uses them yet).

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace kvstrata::rpc {

// A handler ends with `return ToGrpcStatus(status);`. An absl code that gRPC does not know
// becomes UNKNOWN with the message kept.
grpc::Status ToGrpcStatus(const absl::Status& status);

// For clients: a failed call becomes an absl::Status with the same code and message, ready to be
// returned through library code. An unknown gRPC code becomes kUnknown.
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace kvstrata::rpc

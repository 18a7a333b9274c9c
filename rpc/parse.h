#pragma once

// Parsing request messages in the handler rather than in gRPC. When gRPC parses a request that
// is not valid (random bytes, a truncated message, invalid UTF-8 in a string field) it answers
// INTERNAL with an empty message, which tells the caller nothing and reads as a server fault.
// A handler that takes the raw bytes and calls ParseRequest answers INVALID_ARGUMENT naming the
// message type and, where the bytes allow, the field ("chat.messages[2].content: invalid
// UTF-8").

#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace google::protobuf {
class Descriptor;
class Message;
}  // namespace google::protobuf

namespace kvstrata::rpc {

// Parses `bytes` into `message` (cleared first). InvalidArgument with DescribeParseFailure's
// text when they are not a valid message of its type; `message` is then unspecified.
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* message);
absl::Status ParseRequest(std::string_view bytes, google::protobuf::Message* message);

// Why `bytes` do not parse as `type`: the first problem found walking the wire format against
// the descriptor, with the field path and byte offset ("kvstrata.v1.GenerateRequest:
// chat.messages[0].content (byte 6): invalid UTF-8 in a string field"). Empty when the walk finds
// nothing wrong. Never fails on any input (it is fuzzed); nesting deeper than 100 levels is a
// problem, as it is for the parser.
std::string DescribeParseFailure(std::string_view bytes, const google::protobuf::Descriptor& type);

}  // namespace kvstrata::rpc

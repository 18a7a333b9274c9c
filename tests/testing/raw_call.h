#pragma once

// Calls a gRPC method with raw message bytes, so tests can send what no generated stub would:
// invalid UTF-8 in a string field, truncated or random bytes. Header-only, sync API.

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>
#include <grpcpp/support/sync_stream.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace kvstrata::test_util {

inline grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

inline std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

struct RawResult {
  grpc::Status status;
  std::vector<std::string> messages;  // responses, as bytes
};

// A server-streaming call of `method` ("/package.Service/Method") with one request message.
inline RawResult RawServerStreamingCall(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& method, const std::string& request,
                                        std::chrono::milliseconds timeout =
                                            std::chrono::milliseconds(10000)) {
  grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::SERVER_STREAMING,
                                channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), rpc, &context,
                                                                    ToByteBuffer(request)));
  RawResult result;
  grpc::ByteBuffer message;
  while (reader->Read(&message)) result.messages.push_back(FromByteBuffer(message));
  result.status = reader->Finish();
  return result;
}

// A client-streaming call of `method` with these request messages.
inline RawResult RawClientStreamingCall(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& method,
                                        const std::vector<std::string>& requests,
                                        std::chrono::milliseconds timeout =
                                            std::chrono::milliseconds(10000)) {
  grpc::internal::RpcMethod rpc(method.c_str(), grpc::internal::RpcMethod::CLIENT_STREAMING,
                                channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::ByteBuffer response;
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), rpc, &context,
                                                                    &response));
  for (const std::string& r : requests) {
    if (!writer->Write(ToByteBuffer(r))) break;
  }
  writer->WritesDone();
  RawResult result;
  result.status = writer->Finish();
  if (result.status.ok()) result.messages.push_back(FromByteBuffer(response));
  return result;
}

}  // namespace kvstrata::test_util

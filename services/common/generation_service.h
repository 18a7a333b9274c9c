#pragma once

// kvstrata.v1.Generation with the request parsed by kvstrata rather than by gRPC. gRPC answers a
// request it cannot parse (random bytes, invalid UTF-8 in a string field) with INTERNAL and an
// empty message; a server built on this base answers INVALID_ARGUMENT naming the message and the
// field (rpc/parse.h). The router and the decode workers derive from it and implement
// ServeGenerate; Abort and GetServerInfo stay the generated sync methods.
//
// Generate is registered with gRPC as a split stream (read one message, then write any number),
// which is what a server-streaming method is on the wire, so clients see no difference.

#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/status/status.h"
#include "kvstrata/v1/generate.grpc.pb.h"

namespace kvstrata {

// What a Generate handler writes its response stream to.
using GenerateWriter = grpc::internal::WriterInterface<v1::GenerateResponse>;

class GenerationService : public v1::Generation::Service {
 public:
  GenerationService();

  // One Generate call, with its request parsed but not validated.
  virtual grpc::Status ServeGenerate(grpc::ServerContext* context,
                                     const v1::GenerateRequest& request,
                                     GenerateWriter* writer) = 0;

 protected:
  // A request that did not parse: count it, then return the status sent to the client.
  virtual grpc::Status RejectUnparseable(grpc::ServerContext* context,
                                         const absl::Status& status) = 0;

 private:
  grpc::Status GenerateFromBytes(
      grpc::ServerContext* context,
      grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::GenerateResponse>* stream);
};

}  // namespace kvstrata

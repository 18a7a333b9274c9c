#include "services/common/generation_service.h"

#include <grpcpp/support/method_handler.h>

#include "rpc/parse.h"

namespace kvstrata {

GenerationService::GenerationService() {
  // Method 0 of kvstrata.v1.Generation is Generate (proto order).
  using Stream = grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::GenerateResponse>;
  MarkMethodStreamed(
      0, new grpc::internal::TemplatedBidiStreamingHandler<Stream, false>(
             [this](grpc::ServerContext* context, Stream* stream) {
               return GenerateFromBytes(context, stream);
             }));
}

grpc::Status GenerationService::GenerateFromBytes(
    grpc::ServerContext* context,
    grpc::ServerSplitStreamer<grpc::ByteBuffer, v1::GenerateResponse>* stream) {
  grpc::ByteBuffer bytes;
  if (!stream->Read(&bytes)) {
    if (context->IsCancelled()) return grpc::Status::CANCELLED;  // the client left first
    return RejectUnparseable(context,
                             absl::InvalidArgumentError("no GenerateRequest message was sent"));
  }
  v1::GenerateRequest request;
  if (absl::Status s = rpc::ParseRequest(bytes, &request); !s.ok()) {
    return RejectUnparseable(context, s);
  }
  return ServeGenerate(context, request, stream);
}

}  // namespace kvstrata

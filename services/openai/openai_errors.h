#pragma once

// kvstrata errors as OpenAI error objects: the HTTP status a client library branches on, and
// {"error": {"message", "type", "param", "code"}} with the parameter at fault named as the
// OpenAI API names it.
//
//   status code          HTTP  type                   code
//   INVALID_ARGUMENT     400   invalid_request_error  (none)
//   OUT_OF_RANGE         400   invalid_request_error  context_length_exceeded
//   FAILED_PRECONDITION  400   invalid_request_error  (none)
//   NOT_FOUND            404   invalid_request_error  model_not_found
//   ALREADY_EXISTS       409   invalid_request_error  request_in_flight
//   RESOURCE_EXHAUSTED   429   rate_limit_error       queue_full  (413 request_too_large for a
//                                                     message over the size limit)
//   UNAVAILABLE          503   server_error           unavailable
//   DEADLINE_EXCEEDED    504   timeout_error          deadline_exceeded
//   CANCELLED            499   server_error           cancelled
//   UNAUTHENTICATED      401, PERMISSION_DENIED 403, UNIMPLEMENTED 501, anything else 500.
//
// Messages from the server name kvstrata.v1 fields ("sampling.top_p=2 must be in [0, 1]"); they
// are rewritten with the OpenAI names ("top_p=2 must be in [0, 1]"), and the leading name becomes
// `param`.

#include <string>

#include "absl/status/status.h"
#include "services/openai/openai_request.h"

namespace kvstrata::openai {

struct ApiError {
  int http_status = 500;
  std::string type;
  std::string code;   // empty: null
  std::string param;  // empty: null
  std::string message;
};

// `status` (not OK) from the request parser or from the Generate call of `endpoint`.
ApiError ErrorFromStatus(const absl::Status& status, Endpoint endpoint);

// An error for something the HTTP layer itself refuses (unknown path, wrong method, body too
// large): `http_status` with the matching type.
ApiError HttpError(int http_status, std::string message, std::string code = "");

// {"error": {...}} as sent in a response body or, streamed, as a `data:` event.
std::string ErrorBody(const ApiError& error);

}  // namespace kvstrata::openai

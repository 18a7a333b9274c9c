#pragma once

// What the OpenAI front's translation units share: its metrics and response helpers.

#include <string>

#include "core/http_server.h"
#include "core/metrics.h"
#include "services/openai/openai_errors.h"

namespace kvstrata::openai {

class FrontMetrics {
 public:
  explicit FrontMetrics(MetricsRegistry* r)
      : requests(r->AddCounter("kvstrata_router_http_requests_total",
                               "HTTP requests answered by the OpenAI front, by endpoint and HTTP "
                               "status (of the headers, for a streamed response).",
                               {"endpoint", "status"})),
        streams(r->AddGauge("kvstrata_router_http_open_streams",
                            "Streamed (server-sent events) responses in progress.")),
        client_gone(r->AddCounter("kvstrata_router_http_client_disconnects_total",
                                  "Generation requests cancelled because the HTTP client hung up "
                                  "before the response was complete.")) {}

  Family<Counter>& requests;
  Family<Gauge>& streams;
  Family<Counter>& client_gone;
};

http::HttpResponse JsonResponse(int status, const std::string& body);
http::HttpResponse ErrorResponse(const ApiError& error);

}  // namespace kvstrata::openai

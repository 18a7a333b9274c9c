#include "services/kvstore/kvstore_service.h"

#include <grpcpp/support/method_handler.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "rpc/parse.h"
#include "rpc/status.h"
#include "services/kvstore/kvstore_metrics.h"
#include "services/kvstore/put_header.h"
#include "services/kvstore/transport.h"

namespace kvstrata::kvstore {

v1::PageEncoding ToProto(PageForm form) {
  switch (form) {
    case PageForm::kBf16:
      return v1::PAGE_ENCODING_BF16;
    case PageForm::kInt2:
      return v1::PAGE_ENCODING_INT2;
    case PageForm::kBf16Recent:
      return v1::PAGE_ENCODING_BF16_RECENT;
  }
  return v1::PAGE_ENCODING_UNSPECIFIED;
}

namespace {

constexpr size_t kEventsPerBatch = 256;
// How often a WatchEvents stream with no events checks for cancellation.
constexpr absl::Duration kWatchPoll = absl::Milliseconds(200);

absl::StatusOr<PageKey> ParseKey(const std::string& bytes, const std::string& field) {
  absl::StatusOr<PageKey> key = PageKey::FromBytes(bytes);
  if (!key.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", key.status().message()));
  return key;
}

absl::StatusOr<std::vector<PageKey>> ParseKeys(
    const google::protobuf::RepeatedPtrField<std::string>& keys, const char* field,
    uint32_t max_keys) {
  if (keys.size() > static_cast<int>(max_keys)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", keys.size(), " keys, more than max_keys_per_request=", max_keys));
  }
  std::vector<PageKey> out;
  out.reserve(keys.size());
  for (int i = 0; i < keys.size(); ++i) {
    // The field's name is formatted only for an error, not for each of a long prefix's keys.
    absl::StatusOr<PageKey> key = PageKey::FromBytes(keys[i]);
    if (!key.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: ", key.status().message()));
    }
    out.push_back(*key);
  }
  return out;
}

v1::RemovalReason ToProto(RemovalReason reason) {
  switch (reason) {
    case RemovalReason::kEvicted:
      return v1::REMOVAL_REASON_EVICTED;
    case RemovalReason::kCorrupted:
      return v1::REMOVAL_REASON_CORRUPTED;
    case RemovalReason::kAdmin:
      return v1::REMOVAL_REASON_ADMIN;
  }
  return v1::REMOVAL_REASON_UNSPECIFIED;
}

void FillHeader(const PageMeta& meta, v1::PageHeader* header) {
  header->set_key(meta.key.ToBytes());
  header->set_parent_key(meta.parent_key.ToBytes());
  header->set_page_index(meta.page_index);
  header->set_encoding(ToProto(meta.form));
  header->set_byte_length(meta.byte_length);
  header->set_checksum_xxh3_64(meta.checksum_xxh3_64);
  header->set_mac(meta.mac);
}

// Streams a page as one header then chunks of at most chunk_bytes.
class GrpcStreamTransport final : public PageTransport {
 public:
  GrpcStreamTransport(grpc::ServerContext* context, grpc::ServerWriter<v1::FetchResponse>* writer,
                      size_t chunk_bytes)
      : context_(context), writer_(writer), chunk_bytes_(chunk_bytes) {}

  absl::Status SendPage(const StoredPage& page) override {
    v1::FetchResponse response;
    FillHeader(page.meta, response.mutable_header());
    if (!writer_->Write(response)) return Cancelled(page);
    const std::vector<uint8_t>& bytes = *page.bytes;
    for (size_t offset = 0; offset < bytes.size(); offset += chunk_bytes_) {
      if (context_->IsCancelled()) return Cancelled(page);
      const size_t n = std::min(chunk_bytes_, bytes.size() - offset);
      response.set_chunk(reinterpret_cast<const char*>(bytes.data()) + offset, n);
      if (!writer_->Write(response)) return Cancelled(page);
    }
    return absl::OkStatus();
  }

 private:
  static absl::Status Cancelled(const StoredPage& page) {
    return absl::CancelledError(
        absl::StrCat("stream closed while sending page ", page.meta.key.ToHex()));
  }

  grpc::ServerContext* context_;
  grpc::ServerWriter<v1::FetchResponse>* writer_;
  size_t chunk_bytes_;
};

std::string RandomStoreId() {
  absl::BitGen gen;
  return absl::StrFormat("kvstore-%016x", absl::Uniform<uint64_t>(gen));
}

}  // namespace

KvStoreService::KvStoreService(PageStore* store, const KvStoreServiceOptions& options,
                               MetricsRegistry* registry)
    : store_(store),
      options_(options),
      store_id_(options.store_id.empty() ? RandomStoreId() : options.store_id),
      start_time_unix_ms_(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now()))),
      metrics_(std::make_unique<KvStoreMetrics>(*registry)) {
  metrics_->Sync(store_->Stats());
  // Method 1 of kvstrata.v1.KvStore is Put (proto order), served as a stream of raw messages.
  MarkMethodStreamed(1, new grpc::internal::TemplatedBidiStreamingHandler<PutStream, false>(
                            [this](grpc::ServerContext* context, PutStream* stream) {
                              return Put(context, stream);
                            }));
}

KvStoreService::~KvStoreService() = default;

grpc::Status KvStoreService::CheckRole(const grpc::ServerContext& context,
                                       const char* method) const {
  if (options_.authorizer == nullptr) return grpc::Status::OK;
  return options_.authorizer->Require(context, method, rpc::PeerRole::kWorker);
}

grpc::Status KvStoreService::Finish(const char* method, absl::Time start,
                                    const absl::Status& status) {
  metrics_->Record(method, absl::Now() - start, status.code());
  metrics_->Sync(store_->Stats());
  if (options_.nccl != nullptr) metrics_->SyncNccl(options_.nccl->Counts());
  return rpc::ToGrpcStatus(status);
}

grpc::Status KvStoreService::Lookup(grpc::ServerContext* context,
                                    const v1::LookupRequest* request,
                                    v1::LookupResponse* response) {
  // A Lookup that leases its hits pins them: the worker's, like Pin.
  if (request->lease_ttl_ms() > 0) {
    if (grpc::Status s = CheckRole(*context, "Lookup with a lease"); !s.ok()) return s;
  }
  const absl::Time start = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    KV_ASSIGN_OR_RETURN(std::vector<PageKey> keys, ParseKeys(request->page_keys(), "page_keys",
                                                             options_.max_keys_per_request));
    if (absl::Milliseconds(request->lease_ttl_ms()) > store_->options().max_lease_ttl) {
      return absl::InvalidArgumentError(
          absl::StrCat("lease_ttl_ms: ", request->lease_ttl_ms(), " is above max_lease_ttl_ms=",
                       absl::ToInt64Milliseconds(store_->options().max_lease_ttl)));
    }
    KV_ASSIGN_OR_RETURN(LookupResult result,
                        store_->Lookup(keys, absl::Milliseconds(request->lease_ttl_ms())));
    response->set_matched_pages(static_cast<uint32_t>(result.pages.size()));
    response->set_page_size_tokens(store_->page_size_tokens());
    response->set_lease_id(result.lease_id);
    if (request->matched_count_only()) return absl::OkStatus();
    for (const PageInfo& info : result.pages) {
      v1::PageInfo* out = response->add_pages();
      out->set_key(info.key.ToBytes());
      out->set_primary_encoding(ToProto(info.primary_form));
      out->set_primary_bytes(info.primary_bytes);
      out->set_has_bf16_recent(info.has_bf16_recent);
      out->set_bf16_recent_bytes(info.bf16_recent_bytes);
    }
    return absl::OkStatus();
  }();
  return Finish("Lookup", start, status);
}

grpc::Status KvStoreService::Put(grpc::ServerContext* context, PutStream* stream) {
  if (grpc::Status s = CheckRole(*context, "Put"); !s.ok()) return s;
  const absl::Time start = absl::Now();
  v1::PutResponse reply;
  v1::PutResponse* response = &reply;
  absl::Status status = [&]() -> absl::Status {
    std::optional<PageMeta> current;
    std::vector<uint8_t> buffer;
    int page_number = 0;
    int message_number = 0;
    v1::PutRequest request;
    grpc::ByteBuffer bytes;
    while (stream->Read(&bytes)) {
      if (absl::Status s = rpc::ParseRequest(bytes, &request); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "message ", message_number, " of the stream",
            current.has_value() ? absl::StrCat(" (page ", current->key.ToHex(), ")") : "", ": ",
            s.message(), "; that page is not stored"));
      }
      ++message_number;
      switch (request.part_case()) {
        case v1::PutRequest::kHeader: {
          if (current.has_value()) {
            return absl::InvalidArgumentError(
                absl::StrCat("page ", current->key.ToHex(), ": header of the next page after ",
                             buffer.size(), " of ", current->byte_length, " bytes"));
          }
          KV_ASSIGN_OR_RETURN(current, ParsePutHeader(request.header(), page_number++));
          if (current->byte_length > store_->options().capacity_bytes) {
            return absl::ResourceExhaustedError(absl::StrCat(
                "page ", current->key.ToHex(), ": ", current->byte_length,
                " bytes exceed the store capacity of ", store_->options().capacity_bytes));
          }
          buffer.clear();
          buffer.reserve(current->byte_length);
          break;
        }
        case v1::PutRequest::kChunk: {
          if (!current.has_value()) {
            return absl::InvalidArgumentError("chunk: page data before any header");
          }
          const std::string& chunk = request.chunk();
          if (buffer.size() + chunk.size() > current->byte_length) {
            return absl::InvalidArgumentError(absl::StrCat("page ", current->key.ToHex(),
                                                           ": chunks exceed byte_length ",
                                                           current->byte_length));
          }
          buffer.insert(buffer.end(), chunk.begin(), chunk.end());
          break;
        }
        case v1::PutRequest::PART_NOT_SET:
          return absl::InvalidArgumentError("part: a PutRequest with neither header nor chunk");
      }
      if (current.has_value() && buffer.size() == current->byte_length) {
        KV_ASSIGN_OR_RETURN(PutResult result, store_->Put(*current, std::move(buffer)));
        buffer = {};
        current.reset();
        response->set_pages_stored(response->pages_stored() + (result.stored ? 1 : 0));
        response->set_pages_already_present(response->pages_already_present() +
                                            (result.duplicate ? 1 : 0));
        response->set_pages_evicted(response->pages_evicted() + result.evicted);
      }
    }
    if (current.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("page ", current->key.ToHex(),
                                                     ": stream ended after ", buffer.size(), " of ",
                                                     current->byte_length, " bytes"));
    }
    return absl::OkStatus();
  }();
  if (status.ok() && !stream->Write(reply)) {
    status = absl::CancelledError("the client went away before the reply");
  }
  return Finish("Put", start, status);
}

grpc::Status KvStoreService::Fetch(grpc::ServerContext* context, const v1::FetchRequest* request,
                                   grpc::ServerWriter<v1::FetchResponse>* writer) {
  const absl::Time start = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    if (request->pages_size() > static_cast<int>(options_.max_keys_per_request)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages: ", request->pages_size(),
                       " refs, more than max_keys_per_request=", options_.max_keys_per_request));
    }
    KV_ASSIGN_OR_RETURN(std::vector<FormRef> refs, ParsePageRefs(request->pages()));
    const uint32_t chunk = request->max_chunk_bytes() == 0
                               ? options_.max_chunk_bytes
                               : std::min(request->max_chunk_bytes(), options_.max_chunk_bytes);
    GrpcStreamTransport transport(context, writer, chunk);
    for (size_t i = 0; i < refs.size(); ++i) {
      KV_ASSIGN_OR_RETURN(StoredPage page,
                          store_->Fetch(refs[i].first, refs[i].second, request->lease_id()));
      // A primary asked for by a specific encoding must be that encoding.
      const v1::PageEncoding asked = request->pages(static_cast<int>(i)).encoding();
      if (!refs[i].second && asked != v1::PAGE_ENCODING_UNSPECIFIED &&
          asked != ToProto(page.meta.form)) {
        return absl::NotFoundError(absl::StrCat("page ", refs[i].first.ToHex(), " is stored as ",
                                                PageFormName(page.meta.form)));
      }
      KV_RETURN_IF_ERROR(transport.SendPage(page));
    }
    return absl::OkStatus();
  }();
  return Finish("Fetch", start, status);
}

grpc::Status KvStoreService::Pin(grpc::ServerContext* context, const v1::PinRequest* request,
                                 v1::PinResponse* response) {
  if (grpc::Status s = CheckRole(*context, "Pin"); !s.ok()) return s;
  const absl::Time start = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    KV_ASSIGN_OR_RETURN(std::vector<PageKey> keys, ParseKeys(request->page_keys(), "page_keys",
                                                             options_.max_keys_per_request));
    KV_ASSIGN_OR_RETURN(PinResult result, store_->Pin(keys, absl::Milliseconds(request->ttl_ms()),
                                                      request->lease_id()));
    response->set_lease_id(result.lease_id);
    response->set_pinned_pages(result.pinned_pages);
    for (uint32_t i : result.missing_indices) response->add_missing_indices(i);
    response->set_expires_in_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(result.expires_in)));
    return absl::OkStatus();
  }();
  return Finish("Pin", start, status);
}

grpc::Status KvStoreService::Release(grpc::ServerContext* context,
                                     const v1::ReleaseRequest* request,
                                     v1::ReleaseResponse* response) {
  if (grpc::Status s = CheckRole(*context, "Release"); !s.ok()) return s;
  const absl::Time start = absl::Now();
  response->set_released(store_->Release(request->lease_id()));
  return Finish("Release", start, absl::OkStatus());
}

grpc::Status KvStoreService::Stats(grpc::ServerContext* /*context*/,
                                   const v1::StatsRequest* /*request*/,
                                   v1::StatsResponse* response) {
  const absl::Time start = absl::Now();
  const PageStoreStats s = store_->Stats();
  response->set_store_id(store_id_);
  response->set_store_epoch(store_->epoch());
  response->set_start_time_unix_ms(start_time_unix_ms_);
  response->set_tier(store_->has_fast_tier() ? v1::STORAGE_TIER_GPU : v1::STORAGE_TIER_HOST);
  response->set_page_size_tokens(store_->page_size_tokens());
  v1::StoreLimits* limits = response->mutable_limits();
  limits->set_max_keys_per_request(options_.max_keys_per_request);
  limits->set_max_lease_ttl_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(store_->options().max_lease_ttl)));
  limits->set_max_leases(store_->options().max_leases);
  limits->set_max_chunk_bytes(options_.max_chunk_bytes);
  response->set_pages(s.pages);
  response->set_bf16_recent_copies(s.bf16_recent_copies);
  response->set_bytes_used(s.bytes_used);
  response->set_bytes_capacity(s.bytes_capacity);
  response->set_pinned_pages(s.pinned_pages);
  response->set_active_leases(s.active_leases);
  response->set_lookups_total(s.lookups_total);
  response->set_lookup_pages_total(s.lookup_pages_total);
  response->set_lookup_hit_pages_total(s.lookup_hit_pages_total);
  response->set_pages_stored_total(s.pages_stored_total);
  response->set_put_duplicates_total(s.put_duplicates_total);
  response->set_evictions_total(s.evictions_total);
  response->set_evicted_bytes_total(s.evicted_bytes_total);
  response->set_fetched_pages_total(s.fetched_pages_total);
  response->set_fetched_bytes_total(s.fetched_bytes_total);
  response->set_checksum_failures_total(s.checksum_failures_total);
  response->set_leases_expired_total(s.leases_expired_total);
  response->set_last_event_sequence(s.last_event_sequence);
  response->set_gpu_bytes_used(s.fast_bytes_used);
  response->set_gpu_bytes_capacity(s.fast_bytes_capacity);
  response->set_gpu_page_forms(s.fast_forms);
  response->set_host_bytes_used(s.host_bytes_used);
  response->set_host_bytes_capacity(s.bytes_capacity - s.fast_bytes_capacity);
  response->set_host_page_forms(s.host_forms);
  response->set_tier_demotions_total(s.demotions_total);
  response->set_tier_promotions_total(s.promotions_total);
  response->set_gpu_uuid(options_.same_gpu_pool.gpu_uuid);
  return Finish("Stats", start, absl::OkStatus());
}

grpc::Status KvStoreService::WatchEvents(grpc::ServerContext* context,
                                         const v1::WatchEventsRequest* request,
                                         grpc::ServerWriter<v1::WatchEventsResponse>* writer) {
  const absl::Time start = absl::Now();
  auto to_proto = [](const PageEvent& e, v1::PageEvent* out) {
    out->set_sequence(e.sequence);
    out->set_time_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(e.time)));
    out->set_snapshot(e.snapshot);
    switch (e.kind) {
      case PageEvent::Kind::kStored: {
        v1::PageStored* stored = out->mutable_stored();
        stored->set_key(e.page.key.ToBytes());
        // PageStored: empty parent for page 0 (and for a copy, whose primary carries it).
        if (e.page.page_index > 0) stored->set_parent_key(e.page.parent_key.ToBytes());
        stored->set_page_index(e.page.page_index);
        stored->set_encoding(ToProto(e.page.form));
        stored->set_byte_length(e.page.byte_length);
        break;
      }
      case PageEvent::Kind::kRemoved: {
        v1::PageRemoved* removed = out->mutable_removed();
        removed->set_key(e.page.key.ToBytes());
        removed->set_encoding(ToProto(e.page.form));
        removed->set_reason(ToProto(e.reason));
        break;
      }
    }
  };
  auto send = [&](const std::vector<PageEvent>& events, size_t begin, size_t end) {
    v1::WatchEventsResponse response;
    response.set_store_epoch(store_->epoch());
    for (size_t i = begin; i < end; ++i) to_proto(events[i], response.add_events());
    return writer->Write(response);
  };

  uint64_t after = request->after_sequence();
  if (request->include_snapshot()) {
    auto [snapshot, last] = store_->Snapshot();
    after = last;
    for (size_t i = 0; i < snapshot.size(); i += kEventsPerBatch) {
      if (!send(snapshot, i, std::min(snapshot.size(), i + kEventsPerBatch))) {
        return Finish("WatchEvents", start, absl::OkStatus());
      }
    }
    if (snapshot.empty()) send(snapshot, 0, 0);  // tells the watcher the epoch at once
  } else {
    // 0 asks for new events only; a sequence beyond the latest one comes from an earlier epoch
    // (a restarted store), so the watcher starts afresh and learns the new epoch.
    const uint64_t last = store_->Stats().last_event_sequence;
    if (after == 0 || after > last) after = last;
  }
  while (!context->IsCancelled()) {
    std::vector<PageEvent> events =
        store_->WaitForEvents(after, absl::Now() + kWatchPoll, kEventsPerBatch);
    if (events.empty()) continue;
    after = events.back().sequence;
    if (!send(events, 0, events.size())) break;
  }
  // The watcher went away (cancelled or its deadline passed): the normal end of a watch.
  return Finish("WatchEvents", start, absl::OkStatus());
}

absl::StatusOr<std::vector<KvStoreService::FormRef>> KvStoreService::ParsePageRefs(
    const google::protobuf::RepeatedPtrField<v1::PageRef>& pages) const {
  if (pages.size() > static_cast<int>(options_.max_keys_per_request)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pages: ", pages.size(), " refs, more than max_keys_per_request=",
        options_.max_keys_per_request));
  }
  std::vector<FormRef> refs;
  refs.reserve(pages.size());
  for (int i = 0; i < pages.size(); ++i) {
    const v1::PageRef& ref = pages[i];
    absl::StatusOr<PageKey> parsed = PageKey::FromBytes(ref.key());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("pages[", i, "].key: ", parsed.status().message()));
    }
    const PageKey& key = *parsed;
    const v1::PageEncoding e = ref.encoding();
    if (e == v1::PAGE_ENCODING_BF16_RECENT) {
      refs.emplace_back(key, true);
    } else if (e == v1::PAGE_ENCODING_UNSPECIFIED || e == v1::PAGE_ENCODING_BF16 ||
               e == v1::PAGE_ENCODING_INT2) {
      refs.emplace_back(key, false);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("pages[", i, "].encoding: unknown"));
    }
  }
  return refs;
}

absl::StatusOr<std::vector<KvStoreService::FormRef>> KvStoreService::TransferRefs(
    const v1::OpenTransferRequest& request) const {
  if (!request.has_chain()) {
    if (request.pages().empty()) return absl::InvalidArgumentError("pages: empty (and no chain)");
    return ParsePageRefs(request.pages());
  }
  if (!request.pages().empty()) {
    return absl::InvalidArgumentError("pages and chain: name the pages with one of them, not both");
  }
  const v1::PageChain& chain = request.chain();
  KV_ASSIGN_OR_RETURN(PageKey last, ParseKey(chain.last_key(), "chain.last_key"));
  KV_ASSIGN_OR_RETURN(PageKey first_parent,
                      ParseKey(chain.first_parent_key(), "chain.first_parent_key"));
  if (chain.page_count() == 0 || chain.page_count() > options_.max_keys_per_request) {
    return absl::InvalidArgumentError(
        absl::StrCat("chain.page_count: ", chain.page_count(),
                     ", must be 1..max_keys_per_request=", options_.max_keys_per_request));
  }
  absl::StatusOr<std::vector<PageKey>> keys =
      store_->ChainEndingAt(last, chain.page_count(), first_parent);
  if (!keys.ok()) {
    // InvalidArgument is a count no chain ending there can have; NotFound a miss.
    const bool bad_count = keys.status().code() == absl::StatusCode::kInvalidArgument;
    return absl::Status(
        keys.status().code(),
        absl::StrCat(bad_count ? "chain.page_count: " : "chain: ", keys.status().message()));
  }
  std::vector<FormRef> refs;
  refs.reserve(keys->size());
  for (const PageKey& key : *keys) refs.emplace_back(key, /*bf16_recent=*/false);
  return refs;
}

// The transport both ends share, in the client's order: the pool needs a GPU tier on the
// client's own GPU of the same host; NCCL a GPU tier on another GPU and a ready communicator.
v1::Transport KvStoreService::ChooseTransport(const v1::OpenTransferRequest& request,
                                              bool allow_nccl) const {
  std::vector<v1::Transport> asked;
  for (int t : request.transports()) asked.push_back(static_cast<v1::Transport>(t));
  if (asked.empty()) asked.push_back(v1::TRANSPORT_GRPC_STREAM);
  const SameGpuPoolOffer& pool = options_.same_gpu_pool;
  const bool pool_possible = store_->has_fast_tier() && !pool.socket_path.empty() &&
                             !pool.gpu_uuid.empty() &&
                             request.device().gpu_uuid() == pool.gpu_uuid &&
                             request.device().host_boot_id() == pool.host_boot_id;
  std::string why_not_nccl;
  const bool nccl_possible = allow_nccl && NcclPossible(request, &why_not_nccl) &&
                             options_.nccl->Ready(request.nccl().communicator_id());
  for (v1::Transport t : asked) {
    if (t == v1::TRANSPORT_SAME_GPU_POOL && pool_possible) return t;
    if (t == v1::TRANSPORT_NCCL && nccl_possible) return t;
    if (t == v1::TRANSPORT_GRPC_STREAM) return t;
  }
  return v1::TRANSPORT_UNSPECIFIED;
}

grpc::Status KvStoreService::OpenTransfer(grpc::ServerContext* context,
                                          const v1::OpenTransferRequest* request,
                                          v1::OpenTransferResponse* response) {
  if (grpc::Status s = CheckRole(*context, "OpenTransfer"); !s.ok()) return s;
  const absl::Time start = absl::Now();
  absl::Status status = [&]() -> absl::Status {
    if (request->nccl().setup()) return OpenNcclSetup(*request, response);
    KV_ASSIGN_OR_RETURN(std::vector<FormRef> refs, TransferRefs(*request));
    v1::Transport transport = ChooseTransport(*request, /*allow_nccl=*/true);
    if (transport == v1::TRANSPORT_UNSPECIFIED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "transports: none of those listed is possible here (this store offers ",
          store_->has_fast_tier() ? "TRANSPORT_SAME_GPU_POOL on GPU " : "",
          store_->has_fast_tier() ? options_.same_gpu_pool.gpu_uuid : "",
          store_->has_fast_tier() ? ", " : "",
          options_.nccl != nullptr
              ? "TRANSPORT_NCCL to other GPUs with a ready nccl.communicator_id, "
              : "",
          "TRANSPORT_GRPC_STREAM)"));
    }
    // The lease: the client's, extended over these pages, or a new one.
    std::vector<PageKey> keys;
    keys.reserve(refs.size());
    for (const FormRef& ref : refs) keys.push_back(ref.first);
    const uint32_t ttl_ms = request->lease_ttl_ms() == 0 ? 10000 : request->lease_ttl_ms();
    KV_ASSIGN_OR_RETURN(PinResult pin,
                        store_->Pin(keys, absl::Milliseconds(ttl_ms), request->lease_id()));
    response->set_lease_id(pin.lease_id);
    if (!pin.missing_indices.empty()) {
      if (request->lease_id() == 0) store_->Release(pin.lease_id);
      const uint32_t missing = pin.missing_indices[0];
      return absl::NotFoundError(
          absl::StrCat("page ", keys[missing].ToHex(),
                       request->has_chain() ? absl::StrCat(" (page ", missing, " of the chain)")
                                            : absl::StrCat(" (pages[", missing, "])"),
                       " is absent"));
    }
    if (transport == v1::TRANSPORT_SAME_GPU_POOL) {
      absl::StatusOr<std::vector<FastTierPlacement>> placed =
          store_->PlaceInFastTier(refs, pin.lease_id);
      if (placed.ok()) {
        if (request->pool_holder() != 0) {
          // A client that reads the pages in place: its lease lasts while its pool connection
          // is open. An unknown holder (a connection that closed meanwhile) leaves the lease
          // expiring as usual, which the client learns from lease_held.
          response->set_lease_held(store_->HoldLease(pin.lease_id, request->pool_holder()).ok());
        }
        v1::SameGpuPool* pool = response->mutable_pool();
        pool->set_socket_path(options_.same_gpu_pool.socket_path);
        pool->set_pool_id(options_.same_gpu_pool.pool_id);
        pool->set_pool_bytes(store_->fast_tier()->size());
        if (request->compact()) {
          v1::PoolPlacements* out = response->mutable_placements();
          out->mutable_offset_bytes()->Reserve(static_cast<int>(placed->size()));
          out->mutable_digest64()->Reserve(static_cast<int>(placed->size()));
          for (const FastTierPlacement& p : *placed) {
            out->add_offset_bytes(p.offset);
            out->add_digest64(p.meta.digest64);
            out->add_byte_length(p.meta.byte_length);
            out->add_encoding(ToProto(p.meta.form));
          }
        } else {
          for (const FastTierPlacement& p : *placed) {
            v1::TransferSegment* segment = response->add_segments();
            FillHeader(p.meta, segment->mutable_header());
            segment->set_offset_bytes(p.offset);
            segment->set_digest64(p.meta.digest64);
          }
        }
      } else if (placed.status().code() == absl::StatusCode::kResourceExhausted) {
        transport = v1::TRANSPORT_GRPC_STREAM;  // the pool is full of leased pages: use Fetch
      } else {
        if (request->lease_id() == 0) store_->Release(pin.lease_id);
        return placed.status();
      }
    }
    if (transport == v1::TRANSPORT_NCCL) {
      absl::StatusOr<bool> queued = QueueNcclTransfer(*request, refs, pin.lease_id, response);
      if (queued.ok() && !*queued) {
        transport = ChooseTransport(*request, /*allow_nccl=*/false);
        metrics_->RecordNcclFallback();
      } else if (!queued.ok() && queued.status().code() == absl::StatusCode::kResourceExhausted) {
        transport = ChooseTransport(*request, /*allow_nccl=*/false);  // the pool is full
        metrics_->RecordNcclFallback();
      } else if (!queued.ok()) {
        if (request->lease_id() == 0) store_->Release(pin.lease_id);
        return queued.status();
      }
      if (transport == v1::TRANSPORT_UNSPECIFIED) {
        if (request->lease_id() == 0) store_->Release(pin.lease_id);
        return absl::FailedPreconditionError(
            "transports: the NCCL transfer does not fit device.free_memory_bytes or the pool, "
            "and no other transport listed is possible");
      }
    }
    response->set_transport(transport);
    metrics_->RecordTransfer(transport);
    return absl::OkStatus();
  }();
  return Finish("OpenTransfer", start, status);
}

}  // namespace kvstrata::kvstore

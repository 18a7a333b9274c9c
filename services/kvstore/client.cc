#include "services/kvstore/client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace kvstrata::kvstore {

namespace {

absl::StatusOr<PageKey> KeyFromBytes(const std::string& bytes) {
  absl::StatusOr<PageKey> key = PageKey::FromBytes(bytes);
  if (!key.ok()) return absl::DataLossError(key.status().message());
  return key;
}

std::span<const uint8_t> AsBytes(const std::string& bytes) {
  return {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
}

void SetDeadline(grpc::ClientContext& context, absl::Duration deadline) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
}

// gRPC and absl share status code numbers; the message names the store and the call.
absl::Status FromGrpc(const grpc::Status& status, const std::string& address, const char* call) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat("kvstore ", address, " ", call, ": ", status.error_message()));
}

uint64_t RingPoint(const std::string& node, int i) {
  const std::string s = absl::StrCat(node, "#", i);
  return XXH3_64bits(s.data(), s.size());
}

}  // namespace

bool IsStoreMiss(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kResourceExhausted:
      return true;
    default:
      return false;
  }
}

KvStoreClient::KvStoreClient(std::string address, const KvStoreClientOptions& options)
    : address_(std::move(address)),
      options_(options),
      stub_(v1::KvStore::NewStub(
          options_.dial ? options_.dial(address_)
                        : grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()))) {}

KvStoreClient::~KvStoreClient() = default;

absl::StatusOr<LookupReply> KvStoreClient::Lookup(std::span<const PageKey> keys,
                                                  uint32_t lease_ttl_ms, bool page_infos) {
  v1::LookupRequest request;
  for (const PageKey& key : keys) request.add_page_keys(key.ToBytes());
  request.set_lease_ttl_ms(lease_ttl_ms);
  request.set_matched_count_only(!page_infos);
  v1::LookupResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options_.lookup_deadline);
  const grpc::Status status = stub_->Lookup(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, address_, "Lookup");
  // A store that predates matched_count_only answers the page infos anyway.
  const uint32_t infos = static_cast<uint32_t>(response.pages_size());
  if (response.matched_pages() > keys.size() ||
      (infos != response.matched_pages() && (page_infos || infos != 0))) {
    return absl::DataLossError(
        absl::StrCat("kvstore ", address_, " Lookup: matched_pages ", response.matched_pages(),
                     " with ", response.pages_size(), " page infos for ", keys.size(), " keys"));
  }
  LookupReply result;
  result.matched_pages = response.matched_pages();
  result.lease_id = response.lease_id();
  if (page_infos) result.pages.assign(response.pages().begin(), response.pages().end());
  return result;
}

absl::Status KvStoreClient::Release(uint64_t lease_id) {
  v1::ReleaseRequest request;
  request.set_lease_id(lease_id);
  v1::ReleaseResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options_.lookup_deadline);
  const grpc::Status status = stub_->Release(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, address_, "Release");
  return absl::OkStatus();
}

absl::StatusOr<v1::OpenTransferResponse> KvStoreClient::OpenTransfer(
    const v1::OpenTransferRequest& request) {
  v1::OpenTransferResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options_.lookup_deadline);
  const grpc::Status status = stub_->OpenTransfer(&context, request, &response);
  if (!status.ok()) return FromGrpc(status, address_, "OpenTransfer");
  return response;
}

absl::StatusOr<PutSummary> KvStoreClient::Put(std::span<const PutPage> pages) {
  v1::PutResponse response;
  grpc::ClientContext context;
  SetDeadline(context, options_.put_deadline);
  std::unique_ptr<grpc::ClientWriter<v1::PutRequest>> writer = stub_->Put(&context, &response);
  const size_t chunk = std::max<size_t>(1, options_.put_chunk_bytes);
  bool open = true;
  for (const PutPage& page : pages) {
    if (!open) break;
    v1::PutRequest request;
    v1::PageHeader* header = request.mutable_header();
    header->set_key(page.key.ToBytes());
    header->set_parent_key(page.parent_key.ToBytes());
    header->set_page_index(page.page_index);
    header->set_encoding(page.encoding);
    header->set_byte_length(page.bytes.size());
    header->set_checksum_xxh3_64(XXH3_64bits(page.bytes.data(), page.bytes.size()));
    if (options_.page_mac_keys != nullptr) {
      header->set_mac(options_.page_mac_keys->Sign(page.key, AsBytes(page.bytes)));
    }
    open = writer->Write(request);
    for (size_t offset = 0; open && offset < page.bytes.size(); offset += chunk) {
      request.set_chunk(page.bytes.data() + offset, std::min(chunk, page.bytes.size() - offset));
      open = writer->Write(request);
    }
  }
  if (open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!status.ok()) return FromGrpc(status, address_, "Put");
  return PutSummary{.pages_stored = response.pages_stored(),
                    .pages_already_present = response.pages_already_present(),
                    .pages_evicted = response.pages_evicted()};
}

absl::StatusOr<std::vector<FetchedPage>> KvStoreClient::Fetch(
    std::span<const std::pair<PageKey, v1::PageEncoding>> pages, uint64_t lease_id) {
  v1::FetchRequest request;
  for (const auto& [key, encoding] : pages) {
    v1::PageRef* ref = request.add_pages();
    ref->set_key(key.ToBytes());
    ref->set_encoding(encoding);
  }
  request.set_lease_id(lease_id);
  request.set_max_chunk_bytes(options_.fetch_max_chunk_bytes);
  grpc::ClientContext context;
  SetDeadline(context, options_.fetch_deadline);
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> reader = stub_->Fetch(&context, request);
  std::vector<FetchedPage> out;
  v1::PageHeader header;
  absl::Status problem;
  auto complete = [&]() -> absl::Status {
    if (out.empty()) return absl::OkStatus();
    const FetchedPage& page = out.back();
    if (page.bytes.size() != header.byte_length() ||
        XXH3_64bits(page.bytes.data(), page.bytes.size()) != header.checksum_xxh3_64()) {
      return absl::DataLossError(absl::StrCat(
          "kvstore ", address_, " Fetch: page ", page.key.ToHex(), " arrived with ",
          page.bytes.size(), " bytes of ", header.byte_length(), " or a wrong checksum"));
    }
    if (options_.page_mac_keys != nullptr) {
      if (absl::Status mac =
              options_.page_mac_keys->Verify(page.key, AsBytes(page.bytes), header.mac());
          !mac.ok()) {
        return absl::DataLossError(absl::StrCat("kvstore ", address_, " Fetch: ", mac.message()));
      }
    }
    return absl::OkStatus();
  };
  v1::FetchResponse response;
  while (problem.ok() && reader->Read(&response)) {
    if (response.has_header()) {
      problem = complete();
      if (!problem.ok()) break;
      header = response.header();
      absl::StatusOr<PageKey> key = KeyFromBytes(header.key());
      if (!key.ok()) {
        problem = key.status();
        break;
      }
      out.push_back({.key = *key, .encoding = header.encoding()});
      out.back().bytes.reserve(header.byte_length());
    } else if (out.empty()) {
      problem = absl::DataLossError(
          absl::StrCat("kvstore ", address_, " Fetch: a chunk before any header"));
    } else {
      out.back().bytes += response.chunk();
    }
  }
  if (!problem.ok()) {
    context.TryCancel();
    reader->Finish().IgnoreError();
    return problem;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpc(status, address_, "Fetch");
  if (absl::Status last = complete(); !last.ok()) return last;
  if (out.size() != pages.size()) {
    return absl::DataLossError(absl::StrCat("kvstore ", address_, " Fetch: ", out.size(),
                                            " pages for ", pages.size(), " asked"));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].key != pages[i].first) {
      return absl::DataLossError(absl::StrCat("kvstore ", address_, " Fetch: page ", i, " is ",
                                              out[i].key.ToHex(), ", asked ",
                                              pages[i].first.ToHex()));
    }
  }
  return out;
}

HashRing::HashRing(int virtual_nodes) : virtual_nodes_(std::max(1, virtual_nodes)) {}

void HashRing::Add(const std::string& node) {
  if (!members_.insert(node).second) return;
  for (int i = 0; i < virtual_nodes_; ++i) points_.emplace(RingPoint(node, i), node);
}

void HashRing::Remove(const std::string& node) {
  if (members_.erase(node) == 0) return;
  for (int i = 0; i < virtual_nodes_; ++i) {
    auto it = points_.find(RingPoint(node, i));
    if (it != points_.end() && it->second == node) points_.erase(it);
  }
}

std::string HashRing::NodeFor(const PageKey& first_page_key) const {
  if (points_.empty()) return "";
  uint64_t point = 0;
  for (int i = 0; i < 8; ++i) point = (point << 8) | first_page_key.bytes[i];
  auto it = points_.lower_bound(point);
  if (it == points_.end()) it = points_.begin();
  return it->second;
}

KvStoreRing::KvStoreRing(const KvStoreClientOptions& options, int virtual_nodes,
                         const KvStoreRingHealthOptions& health)
    : options_(options), health_options_(health), ring_(virtual_nodes) {}

void KvStoreRing::AddStore(const std::string& address) {
  if (clients_.contains(address)) return;
  clients_.emplace(address, std::make_unique<KvStoreClient>(address, options_));
  ring_.Add(address);
}

void KvStoreRing::RemoveStore(const std::string& address) {
  ring_.Remove(address);
  clients_.erase(address);
  health_.erase(address);
}

bool KvStoreRing::ReportResult(const std::string& address, const absl::Status& status) {
  auto client = clients_.find(address);
  if (client == clients_.end()) return false;
  Health& h = health_[address];
  const bool down = status.code() == absl::StatusCode::kUnavailable ||
                    status.code() == absl::StatusCode::kDeadlineExceeded;
  if (!down) {
    h.consecutive_failures = 0;
    return false;
  }
  if (h.ejected || ++h.consecutive_failures < health_options_.failures_to_eject) return false;
  h.ejected = true;
  h.back_at = absl::Now() + health_options_.ejection;
  ring_.Remove(address);
  return true;
}

std::vector<std::string> KvStoreRing::Ejected() const {
  std::vector<std::string> out;
  for (const auto& [address, h] : health_) {
    if (h.ejected) out.push_back(address);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<KvStoreClient*> KvStoreRing::Clients() const {
  std::vector<KvStoreClient*> out;
  for (const auto& [address, client] : clients_) out.push_back(client.get());
  return out;
}

KvStoreClient* KvStoreRing::ForChain(const PageKey& first_page_key) {
  const absl::Time now = absl::Now();
  for (auto& [address, h] : health_) {
    if (!h.ejected || now < h.back_at) continue;
    // Back on probation: one more failure takes it out again.
    h.ejected = false;
    h.consecutive_failures = std::max(0, health_options_.failures_to_eject - 1);
    ring_.Add(address);
  }
  const std::string node = ring_.NodeFor(first_page_key);
  if (node.empty()) return nullptr;
  auto it = clients_.find(node);
  return it == clients_.end() ? nullptr : it->second.get();
}

}  // namespace kvstrata::kvstore

// The decode worker's page paths: the local page tier, the kvstore's cached prefix (by gRPC, or
// from a kvstore's HBM pool on this worker's GPU), and publishing finished pages. Member
// functions of DecodeService (decode_service.h); the call handling is in decode_generate.cc and
// decode_stream.cc.

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "services/decode/decode_internal.h"
#include "services/decode/decode_service.h"

namespace kvstrata::decode {

void UpdateLocalGauges(const LocalPageCache* cache, DecodeMetrics& metrics) {
  if (cache == nullptr) return;
  metrics.local_cache_bytes.Get().Set(static_cast<double>(cache->bytes()));
  metrics.local_cache_pages.Get().Set(static_cast<double>(cache->pages()));
}

void DecodeService::StoreLocal(const std::string& request_id,
                               const std::vector<engine::ExportedPage>& pages) {
  if (local_pages_ == nullptr || pages.empty()) return;
  // One form per key: BF16 when the page came in both forms (exact wherever it lands; see
  // local_pages.h), else the one.
  std::vector<const engine::ExportedPage*> primary;
  for (const engine::ExportedPage& e : pages) {
    if (e.page_index < 0) continue;
    if (e.page_index >= static_cast<int64_t>(primary.size())) primary.resize(e.page_index + 1);
    const engine::ExportedPage*& slot = primary[e.page_index];
    if (slot == nullptr || e.encoding == kernels::PageEncoding::kBf16) slot = &e;
  }
  std::vector<LocalPage> chain;
  for (const engine::ExportedPage* e : primary) {
    if (e == nullptr) break;  // a gap: only the leading run is a chain
    chain.push_back(
        {.key = e->key, .int2 = e->encoding != kernels::PageEncoding::kBf16, .bytes = e->bytes});
  }
  const LocalPageCache::PutResult put = local_pages_->PutChain(chain);
  if (put.evicted > 0) {
    metrics_->local_cache_evictions.Get().Increment(put.evicted);
    fprintf(stderr,
            "kvstrata-decode: request %s: local page tier full, evicted %d pages for %d new ones\n",
            request_id.c_str(), put.evicted, put.stored);
  }
  if (put.refused > 0) {
    fprintf(stderr,
            "kvstrata-decode: request %s: %d pages larger than the local page tier, not kept\n",
            request_id.c_str(), put.refused);
  }
  UpdateLocalGauges(local_pages_.get(), *metrics_);
}

DecodeService::FetchedPrefix DecodeService::FetchCachedPrefix(const std::string& request_id,
                                                              const PageKey& namespace_key,
                                                              const std::vector<PageKey>& keys,
                                                              size_t skip, absl::Time deadline) {
  if (ring_ == nullptr || keys.empty() || skip >= keys.size()) return {};
  kvstore::KvStoreClient* client;
  {
    std::lock_guard<std::mutex> lock(ring_mu_);
    client = ring_->ForChain(keys[0]);
  }
  if (client == nullptr) return {};
  const absl::Time start = absl::Now();
  struct Timer {
    DecodeMetrics& metrics;
    absl::Time start;
    ~Timer() {
      metrics.kvstore_fetch_seconds.Get().Observe(absl::ToDoubleSeconds(absl::Now() - start));
    }
  } timer{*metrics_, start};
  // Only the count and the lease: the keys are ours, and the transfer answers the rest.
  absl::StatusOr<kvstore::LookupReply> lookup =
      client->Lookup(keys, kLookupLeaseMs, /*page_infos=*/false);
  ReportStoreResult(client->address(), lookup.status());
  if (!lookup.ok()) {
    metrics_->kvstore_errors.With({"lookup"}).Increment();
    fprintf(stderr, "kvstrata-decode: request %s: kvstore %s lookup failed (a miss): %s\n",
            request_id.c_str(), client->address().c_str(), lookup.status().ToString().c_str());
    return {};
  }
  // The lease goes when the last holder lets go: right after a gRPC fetch, or when the request
  // that imports device pages (from the store's pool, or received over NCCL) ends. Failing to
  // release is harmless, the lease expires on its own.
  const uint64_t lease_id = lookup->lease_id;
  std::shared_ptr<void> lease(nullptr, [client, lease_id](void*) {
    if (lease_id != 0) client->Release(lease_id).IgnoreError();
  });
  if (lookup->matched_pages <= skip) return {};
  std::vector<std::pair<PageKey, v1::PageEncoding>> refs;
  for (size_t i = skip; i < lookup->matched_pages && i < keys.size(); ++i) {
    refs.push_back({keys[i], v1::PAGE_ENCODING_UNSPECIFIED});
  }
  FetchedPrefix out;
  // A kvstore on another GPU: its NCCL communicator, if one is ready and free (else one is made
  // in the background, and this prefix comes another way).
  std::shared_ptr<NcclPeers::Lane> lane =
      nccl_ != nullptr && lease_id != 0 ? nccl_->Acquire(client) : nullptr;
  if ((same_gpu_ != nullptr && same_gpu_->enabled()) || lane != nullptr) {
    const std::span<const PageKey> run = std::span<const PageKey>(keys).subspan(skip, refs.size());
    v1::Transport used = v1::TRANSPORT_UNSPECIFIED;
    bool miss = false;
    std::shared_ptr<void> in_place_mapping;
    std::optional<std::vector<engine::DevicePage>> device =
        OpenSameGpuTransfer(client, request_id, run, skip == 0 ? namespace_key : keys[skip - 1],
                            static_cast<int64_t>(skip), lease_id, deadline, lane.get(), &used,
                            &miss, &in_place_mapping);
    if (nccl_ != nullptr) SyncNcclMetrics();
    if (device) {
      out.device_pages = *std::move(device);
      if (in_place_mapping != nullptr) {
        // The engine may read these pages where they lie until the sequence ends: it keeps the
        // lease (held by this worker's pool connection) and the pool's mapping until then. The
        // last holder may be the engine thread, which must not wait on the store's Release:
        // that call is made on the publisher thread.
        auto held = std::make_shared<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>>(
            lease, std::move(in_place_mapping));
        out.in_place_hold = std::shared_ptr<void>(
            held.get(), [this, held](void*) mutable { DropLater(std::move(held)); });
      }
      out.lease = std::move(lease);
      if (used == v1::TRANSPORT_NCCL) {
        // The pages lie in the lane's receive slab: the engine lets go of the lane once it has
        // copied them into its own slots, so the next fetch from this store can take it while
        // this request still runs. The lease is held to the end of the request, as for the pool.
        out.device_pages_owner = std::move(lane);
        metrics_->kvstore_transfers.With({"nccl"}).Increment();
      } else {
        metrics_->kvstore_transfers.With({"same_gpu_pool"}).Increment();
      }
      return out;
    }
    if (miss) return {};  // an NCCL transfer failed: computing the prefix is the fallback
    lane.reset();
  }
  absl::StatusOr<std::vector<kvstore::FetchedPage>> fetched = client->Fetch(refs, lease_id);
  ReportStoreResult(client->address(), fetched.status());
  lease.reset();  // the bytes are here (or the fetch failed)
  if (!fetched.ok()) {
    metrics_->kvstore_errors.With({"fetch"}).Increment();
    fprintf(stderr,
            "kvstrata-decode: request %s: kvstore %s fetch of %zu pages failed (a miss): %s\n",
            request_id.c_str(), client->address().c_str(), refs.size(),
            fetched.status().ToString().c_str());
    return {};
  }
  metrics_->kvstore_transfers.With({"grpc_stream"}).Increment();
  out.pages.reserve(fetched->size());
  size_t bytes = 0;
  for (kvstore::FetchedPage& p : *fetched) {
    bytes += p.bytes.size();
    out.pages.push_back(std::move(p.bytes));
  }
  metrics_->kvstore_fetched_bytes.Get().Increment(static_cast<double>(bytes));
  if (!out.pages.empty()) metrics_->kvstore_fetch_bytes.Get().Observe(static_cast<double>(bytes));
  return out;
}

std::optional<std::vector<engine::DevicePage>> DecodeService::OpenSameGpuTransfer(
    kvstore::KvStoreClient* client, const std::string& request_id, std::span<const PageKey> keys,
    const PageKey& first_parent, int64_t first_index, uint64_t lease_id, absl::Time deadline,
    NcclPeers::Lane* lane, v1::Transport* used, bool* miss,
    std::shared_ptr<void>* in_place_mapping) {
  if (lease_id == 0) return std::nullopt;
  v1::OpenTransferRequest request;
  request.set_client_id(options_.worker_id);
  request.set_compact(true);
  same_gpu_->Describe(&request, client->address());
  if (lane != nullptr) nccl_->Offer(*lane, &request);
  request.set_lease_id(lease_id);
  bool every_key = false;
  absl::StatusOr<v1::OpenTransferResponse> answer =
      OpenTransferOfChain(*client, request, keys, first_parent, &every_key);
  if (every_key) {
    // A store older than the chain form: it works, at the cost of sending every key.
    metrics_->kvstore_chain_fallbacks.Get().Increment();
    if (!chain_fallback_logged_.exchange(true)) {
      fprintf(stderr,
              "kvstrata-decode: request %s: kvstore %s refused a page chain in OpenTransfer; "
              "sending every key instead (logged once; "
              "kvstrata_decode_kvstore_chain_fallbacks_total counts them)\n",
              request_id.c_str(), client->address().c_str());
    }
  }
  if (!answer.ok()) {
    // An older store (UNIMPLEMENTED) or one that cannot: the byte stream still works.
    if (answer.status().code() != absl::StatusCode::kUnimplemented) {
      fprintf(stderr, "kvstrata-decode: request %s: kvstore %s OpenTransfer: %s (using Fetch)\n",
              request_id.c_str(), client->address().c_str(), answer.status().ToString().c_str());
    }
    return std::nullopt;
  }
  if (used != nullptr) *used = answer->transport();
  if (answer->transport() == v1::TRANSPORT_NCCL && lane != nullptr) {
    absl::StatusOr<std::vector<engine::DevicePage>> pages =
        nccl_->Receive(*lane, *answer, keys, first_parent, first_index, deadline);
    if (!pages.ok()) {
      *miss = true;
      metrics_->kvstore_errors.With({"transfer"}).Increment();
      fprintf(stderr,
              "kvstrata-decode: request %s: NCCL transfer of %zu pages from kvstore %s failed (a "
              "miss): %s\n",
              request_id.c_str(), keys.size(), client->address().c_str(),
              pages.status().ToString().c_str());
      return std::nullopt;
    }
    size_t bytes = 0;
    for (const engine::DevicePage& p : *pages) bytes += static_cast<size_t>(p.byte_length);
    metrics_->kvstore_fetched_bytes.Get().Increment(static_cast<double>(bytes));
    if (bytes > 0) metrics_->kvstore_fetch_bytes.Get().Observe(static_cast<double>(bytes));
    return *std::move(pages);
  }
  if (lane != nullptr) nccl_->NotChosen(*lane, *answer);
  if (answer->transport() != v1::TRANSPORT_SAME_GPU_POOL) return std::nullopt;
  absl::StatusOr<SameGpuPools::Placed> placed =
      same_gpu_->Pages(*answer, keys, first_parent, first_index, client->address());
  if (!placed.ok()) {
    metrics_->kvstore_errors.With({"transfer"}).Increment();
    fprintf(stderr, "kvstrata-decode: request %s: same-GPU pool of kvstore %s: %s (using Fetch)\n",
            request_id.c_str(), client->address().c_str(), placed.status().ToString().c_str());
    return std::nullopt;
  }
  bool held = answer->lease_held();
  if (!held && options_.same_gpu_in_place && placed->holder != 0 && request.pool_holder() == 0) {
    // The pool was mapped by this very answer: ask again with its holder, so that these pages,
    // which the lease keeps where they are, can be read in place too (the store only re-pins).
    request.set_pool_holder(placed->holder);
    request.set_lease_id(answer->lease_id());
    absl::StatusOr<v1::OpenTransferResponse> again =
        OpenTransferOfChain(*client, request, keys, first_parent, &every_key);
    held = again.ok() && again->transport() == v1::TRANSPORT_SAME_GPU_POOL && again->lease_held();
  }
  if (held && options_.same_gpu_in_place && in_place_mapping != nullptr) {
    *in_place_mapping = placed->mapping;
  }
  size_t bytes = 0;
  for (const engine::DevicePage& p : placed->pages) bytes += static_cast<size_t>(p.byte_length);
  metrics_->kvstore_fetched_bytes.Get().Increment(static_cast<double>(bytes));
  if (bytes > 0) metrics_->kvstore_fetch_bytes.Get().Observe(static_cast<double>(bytes));
  return std::move(placed->pages);
}

void DecodeService::SyncNcclMetrics() {
  const NcclPeersCounts now = nccl_->Counts();
  std::lock_guard<std::mutex> lock(nccl_metrics_mu_);
  auto advance = [](Family<Counter>& c, uint64_t now, uint64_t before) {
    if (now > before) c.Get().Increment(static_cast<double>(now - before));
  };
  const NcclPeersCounts& was = nccl_synced_;
  advance(metrics_->nccl_communicators_made, now.communicators_made, was.communicators_made);
  advance(metrics_->nccl_setup_failures, now.setup_failures, was.setup_failures);
  advance(metrics_->nccl_transfers, now.transfers, was.transfers);
  advance(metrics_->nccl_transfer_bytes, now.transfer_bytes, was.transfer_bytes);
  advance(metrics_->nccl_transfer_failures, now.transfer_failures, was.transfer_failures);
  advance(metrics_->nccl_digest_failures, now.digest_failures, was.digest_failures);
  advance(metrics_->nccl_aborts, now.aborts, was.aborts);
  advance(metrics_->nccl_busy, now.busy, was.busy);
  nccl_synced_ = now;
}

void DecodeService::PublishLoop() {
  for (;;) {
    PublishJob job;
    std::vector<std::shared_ptr<void>> drops;
    {
      std::unique_lock<std::mutex> lock(publish_mu_);
      publish_cv_.wait(lock,
                       [&] { return publish_stopping_ || !publishes_.empty() || !drops_.empty(); });
      drops.swap(drops_);
      if (publishes_.empty()) {
        const bool stopping = publish_stopping_;
        lock.unlock();
        drops.clear();         // their kvstore calls, here
        if (stopping) return;  // and nothing left to send
        continue;
      }
      job = std::move(publishes_.front());
      publishes_.pop_front();
      ++publishes_in_progress_;
    }
    drops.clear();
    Publish(job);
    {
      std::lock_guard<std::mutex> lock(publish_mu_);
      --publishes_in_progress_;
    }
    publish_cv_.notify_all();
  }
}

void DecodeService::DropLater(std::shared_ptr<void> held) {
  {
    std::lock_guard<std::mutex> lock(publish_mu_);
    if (!publish_stopping_) {
      drops_.push_back(std::move(held));
      held = nullptr;
    }
  }
  publish_cv_.notify_all();
  held.reset();  // the publisher has stopped: here
}

void DecodeService::QueuePublish(PublishJob job) {
  {
    std::lock_guard<std::mutex> lock(publish_mu_);
    publishes_.push_back(std::move(job));
  }
  publish_cv_.notify_all();
}

std::vector<LocalPage> DecodeService::LocalPrefix(const std::string& request_id,
                                                  const std::vector<PageKey>& keys,
                                                  absl::Time deadline,
                                                  const std::function<bool()>& cancelled,
                                                  std::shared_ptr<Prefilling>* registered) {
  registered->reset();
  if (local_pages_ == nullptr || keys.empty()) return {};
  // However long the other request takes, stop waiting in time to prefill before the deadline
  // would have allowed, and never longer than a couple of minutes.
  const absl::Time give_up = std::min(deadline, absl::Now() + absl::Minutes(2));
  bool waited = false;
  std::unique_lock<std::mutex> lock(prefill_mu_);
  for (;;) {
    std::vector<LocalPage> run = local_pages_->GetPrefix(keys);
    std::shared_ptr<Prefilling> best;
    size_t best_common = run.size();
    for (const std::shared_ptr<Prefilling>& p : prefilling_) {
      size_t common = 0;
      while (common < keys.size() && common < p->keys.size() && keys[common] == p->keys[common]) {
        ++common;
      }
      if (common > best_common) {
        best_common = common;
        best = p;
      }
    }
    if (best == nullptr || absl::Now() >= give_up) {
      if (run.size() < keys.size()) {
        *registered = std::make_shared<Prefilling>(Prefilling{keys});
        prefilling_.push_back(*registered);
      }
      return run;
    }
    if (!waited) {
      waited = true;
      metrics_->prefix_waits.Get().Increment();
      fprintf(stderr,
              "kvstrata-decode: request %s: waiting for %zu prompt pages another request on this "
              "worker is computing\n",
              request_id.c_str(), best_common - run.size());
    }
    // In slices, so a client that goes away stops waiting (and computes nothing).
    const bool shared = prefill_cv_.wait_until(
        lock, absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Milliseconds(20))), [&] {
          return std::find(prefilling_.begin(), prefilling_.end(), best) == prefilling_.end();
        });
    if (!shared && cancelled()) return {};
  }
}

void DecodeService::EndPrefilling(const std::shared_ptr<Prefilling>& p) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(prefill_mu_);
    auto it = std::find(prefilling_.begin(), prefilling_.end(), p);
    if (it == prefilling_.end()) return;
    prefilling_.erase(it);
  }
  prefill_cv_.notify_all();
}

void DecodeService::Publish(const PublishJob& job) {
  if (job.pages.empty()) return;
  // Keys by page index, for the parent links (a page may come in two forms).
  std::vector<PageKey> keys;
  for (const engine::ExportedPage& e : job.pages) {
    if (e.page_index >= static_cast<int64_t>(keys.size())) keys.resize(e.page_index + 1);
    keys[e.page_index] = e.key;
  }
  // A key exported in both forms is INT2 history plus its exact BF16 copy: the store keeps the
  // BF16 one as BF16_RECENT beside the INT2 primary, which must be put first.
  std::vector<int> forms(keys.size(), 0);
  for (const engine::ExportedPage& e : job.pages) ++forms[e.page_index];
  std::vector<kvstore::PutPage> put;
  put.reserve(job.pages.size());
  for (const engine::ExportedPage& e : job.pages) {
    const bool bf16 = e.encoding == kernels::PageEncoding::kBf16;
    v1::PageEncoding encoding = v1::PAGE_ENCODING_INT2;
    if (bf16) {
      encoding = forms[e.page_index] > 1 ? v1::PAGE_ENCODING_BF16_RECENT : v1::PAGE_ENCODING_BF16;
    }
    put.push_back({.key = e.key,
                   .parent_key = e.page_index == 0 ? job.namespace_key : keys[e.page_index - 1],
                   .page_index = static_cast<uint32_t>(e.page_index),
                   .encoding = encoding,
                   .bytes = e.bytes});
  }
  std::erase_if(put, [&](const kvstore::PutPage& p) {
    return static_cast<int64_t>(p.page_index) < job.skip_before_index;
  });
  if (put.empty()) return;
  std::stable_sort(
      put.begin(), put.end(), [](const kvstore::PutPage& a, const kvstore::PutPage& b) {
        if (a.page_index != b.page_index) return a.page_index < b.page_index;
        return a.encoding == v1::PAGE_ENCODING_INT2 && b.encoding == v1::PAGE_ENCODING_BF16_RECENT;
      });
  kvstore::KvStoreClient* client;
  {
    std::lock_guard<std::mutex> lock(ring_mu_);
    client = ring_->ForChain(keys[0]);
  }
  if (client == nullptr) return;
  absl::StatusOr<kvstore::PutSummary> summary = client->Put(put);
  ReportStoreResult(client->address(), summary.status());
  if (!summary.ok()) {
    metrics_->kvstore_errors.With({"put"}).Increment();
    fprintf(stderr, "kvstrata-decode: request %s: publishing %zu pages to kvstore %s failed: %s\n",
            job.request_id.c_str(), put.size(), client->address().c_str(),
            summary.status().ToString().c_str());
  }
}

void DecodeService::ReportStoreResult(const std::string& address, const absl::Status& status) {
  bool ejected;
  {
    std::lock_guard<std::mutex> lock(ring_mu_);
    ejected = ring_->ReportResult(address, status);
  }
  if (!ejected) return;
  metrics_->kvstore_ejections.Get().Increment();
  fprintf(stderr,
          "kvstrata-decode: kvstore %s keeps failing (%s); its share of the prefix chains goes "
          "to the other stores until it is tried again\n",
          address.c_str(), status.ToString().c_str());
}

void DecodeService::WaitForPublishes() {
  std::unique_lock<std::mutex> lock(publish_mu_);
  publish_cv_.wait(lock, [&] { return publishes_.empty() && publishes_in_progress_ == 0; });
}

// ---- Generate, step by step --------------------------------------------------------------

// One Generate call's state, shared by its steps.
}  // namespace kvstrata::decode

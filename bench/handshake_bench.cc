// kvstrata_bench_handshake: where the time of OpenTransfer's same-GPU handshake goes, on the CPU
// (docs/benchmarks/kvstore-gpu.md "GPU: fetching a prefix from the GPU kvstore" has the GPU
// figure). A real PageStore with its fast tier in host memory (the HBM pool's stand-in: the store's
// work per page is the same, only the memory differs) and the real KvStoreService, served in this
// process on loopback gRPC, hold a chain of pages. For each prefix length and each request form the
// benchmark times, median of --rounds:
//   rpc        the whole OpenTransfer call over loopback gRPC as a worker makes it, from filling
//              the request to the parsed answer
//   build      the client filling the request (part of rpc)
//   req ser    serialising the request      req parse  parsing it (what the server does)
//   handler    the service's handler called directly (refs, lease, placement, the answer)
//   walk       PageStore::ChainEndingAt (the chain form only)
//   pin        PageStore::Pin of the keys    place      PageStore::PlaceInFastTier
//   ans ser    serialising the answer       ans parse  parsing it (what the client does)
// Each lease is released outside the timed part. The pages are small (1 layer, 1 KV head): the
// handshake never touches page bytes once the pages are in the fast tier, so its cost is per
// page, not per byte.
//
//   build/bin/kvstrata_bench_handshake [--pages=1,32,512,1600] [--rounds=200]

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "core/check.h"
#include "core/metrics.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "rpc/server.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/page_store.h"
#include "tests/services/host_tier_memory.h"
#include "tests/services/test_pages.h"

ABSL_FLAG(std::string, pages, "1,32,512,1600", "prefix lengths in pages");
ABSL_FLAG(int, rounds, 200, "timed rounds per length and form (the median is reported)");

namespace kvstrata {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kGpu[] = "GPU-00000000-0000-4000-8000-00000000bench";
constexpr char kBoot[] = "bench-boot-id";

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs `f` `rounds` times and returns the median time of one run in ms; `after` (untimed) runs
// after each, e.g. to release the lease `f` made.
double Time(int rounds, const std::function<void()>& f, const std::function<void()>& after = {}) {
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    f();
    ms.push_back(Ms(Clock::now() - t0));
    if (after) after();
  }
  return Median(ms);
}

PageKey ChainKey(uint32_t i) {
  PageKey key;
  key.bytes.fill(0x5A);
  std::memcpy(key.bytes.data(), &i, sizeof(i));
  return key;
}

// The request forms a worker can send: every key (answered with page headers, or compact
// arrays), or the chain (its last key and a count; compact arrays), what decode workers send.
enum class Form { kKeysSegments, kKeysCompact, kChain };

const char* FormName(Form form) {
  switch (form) {
    case Form::kKeysSegments:
      return "keys, segments";
    case Form::kKeysCompact:
      return "keys, compact";
    case Form::kChain:
      return "chain, compact";
  }
  return "?";
}

int Run() {
  std::vector<int> lengths;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_pages), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n <= 0 || n > 4096) {
      fprintf(stderr, "bench-handshake: --pages: bad length '%s' (1..4096)\n",
              std::string(s).c_str());
      return 2;
    }
    lengths.push_back(n);
  }
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const int max_pages = *std::max_element(lengths.begin(), lengths.end());

  // The chain, INT2 pages of the tests' tiny geometry (3,136 bytes each).
  std::vector<kvstore::testing::TestPage> chain;
  chain.reserve(max_pages);
  const PageKey ns = ChainKey(0xFFFFFFFF);
  for (int i = 0; i < max_pages; ++i) {
    chain.push_back(kvstore::testing::MakePage(ChainKey(i), i == 0 ? ns : ChainKey(i - 1), i,
                                               kvstore::PageForm::kInt2));
  }
  const uint64_t bytes = chain[0].bytes.size() * static_cast<uint64_t>(max_pages);
  kvstore::PageStoreOptions store_options;
  store_options.capacity_bytes = 2 * bytes + (1 << 20);
  store_options.max_lease_ttl = absl::Seconds(30);
  store_options.fast_tier = std::make_shared<kvstore::testing::HostTierMemory>(bytes + (1 << 20));
  SystemClock clock;
  kvstore::PageStore store(store_options, &clock);
  for (const kvstore::testing::TestPage& page : chain) {
    KV_CHECK(store.Put(page.meta, page.bytes).ok());
  }
  MetricsRegistry registry;
  kvstore::KvStoreServiceOptions service_options{.store_id = "bench", .max_keys_per_request = 4096};
  service_options.same_gpu_pool = {
      .socket_path = "/tmp/unused.sock", .pool_id = 1, .gpu_uuid = kGpu, .host_boot_id = kBoot};
  kvstore::KvStoreService service(&store, service_options, &registry);
  absl::StatusOr<std::unique_ptr<rpc::Server>> server =
      rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {&service}});
  KV_CHECK(server.ok()) << server.status();
  auto stub = v1::KvStore::NewStub(
      grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials()));

  auto request_for = [&](Form form, int n) {
    v1::OpenTransferRequest request;
    request.set_client_id("bench-handshake");
    request.mutable_device()->set_gpu_uuid(kGpu);
    request.mutable_device()->set_host_boot_id(kBoot);
    request.add_transports(v1::TRANSPORT_SAME_GPU_POOL);
    request.add_transports(v1::TRANSPORT_GRPC_STREAM);
    switch (form) {
      case Form::kKeysSegments:
      case Form::kKeysCompact:
        request.set_compact(form == Form::kKeysCompact);
        for (int i = 0; i < n; ++i) request.add_pages()->set_key(chain[i].meta.key.ToBytes());
        break;
      case Form::kChain: {
        request.set_compact(true);
        v1::PageChain* c = request.mutable_chain();
        c->set_last_key(chain[n - 1].meta.key.ToBytes());
        c->set_page_count(static_cast<uint32_t>(n));
        c->set_first_parent_key(ns.ToBytes());
        break;
      }
    }
    return request;
  };
  auto answered = [](const v1::OpenTransferResponse& r) {
    return r.has_placements() ? r.placements().offset_bytes_size() : r.segments_size();
  };

  printf("bench-handshake: %d pages in the store's fast tier (host memory), %d rounds, medians\n",
         max_pages, rounds);
  printf("%6s %-16s %8s | %8s %8s %9s %8s %8s %8s %8s %8s %9s | %7s %7s\n", "pages", "form",
         "rpc ms", "build", "req ser", "req parse", "handler", "walk", "pin", "place", "ans ser",
         "ans parse", "req KB", "ans KB");
  const Form forms[] = {Form::kKeysSegments, Form::kKeysCompact, Form::kChain};
  for (int n : lengths) {
    std::vector<PageKey> keys;
    std::vector<std::pair<PageKey, bool>> refs;
    for (int i = 0; i < n; ++i) {
      keys.push_back(chain[i].meta.key);
      refs.push_back({chain[i].meta.key, false});
    }
    for (Form form : forms) {
      const v1::OpenTransferRequest request = request_for(form, n);
      uint64_t lease = 0;
      auto release = [&] {
        store.Release(lease);
        lease = 0;
      };
      // A first call places the pages in the fast tier and checks the answer.
      v1::OpenTransferResponse answer;
      {
        grpc::ServerContext context;
        const grpc::Status s = service.OpenTransfer(&context, &request, &answer);
        KV_CHECK(s.ok() && answer.transport() == v1::TRANSPORT_SAME_GPU_POOL &&
                 answered(answer) == n)
            << s.error_message();
        store.Release(answer.lease_id());
      }
      const double rpc_ms = Time(
          rounds,
          [&] {
            const v1::OpenTransferRequest built = request_for(form, n);
            v1::OpenTransferResponse r;
            grpc::ClientContext context;
            context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
            KV_CHECK(stub->OpenTransfer(&context, built, &r).ok());
            lease = r.lease_id();
          },
          release);
      const double build_ms = Time(rounds, [&] { request_for(form, n); });
      std::string wire;
      const double req_ser_ms = Time(rounds, [&] { request.SerializeToString(&wire); });
      const double req_parse_ms = Time(rounds, [&] {
        v1::OpenTransferRequest parsed;
        KV_CHECK(parsed.ParseFromString(wire));
      });
      const double handler_ms = Time(
          rounds,
          [&] {
            grpc::ServerContext context;
            v1::OpenTransferResponse r;
            KV_CHECK(service.OpenTransfer(&context, &request, &r).ok());
            lease = r.lease_id();
          },
          release);
      const double walk_ms = form != Form::kChain ? 0 : Time(rounds, [&] {
        KV_CHECK(store.ChainEndingAt(chain[n - 1].meta.key, n, ns).ok());
      });
      const double pin_ms = Time(
          rounds,
          [&] {
            absl::StatusOr<kvstore::PinResult> pin = store.Pin(keys, absl::Seconds(10), 0);
            KV_CHECK(pin.ok());
            lease = pin->lease_id;
          },
          release);
      absl::StatusOr<kvstore::PinResult> held = store.Pin(keys, absl::Seconds(30), 0);
      KV_CHECK(held.ok());
      const double place_ms = Time(rounds, [&] {
        KV_CHECK(store.PlaceInFastTier(refs, held->lease_id).ok());
      });
      store.Release(held->lease_id);
      std::string answer_wire;
      const double ans_ser_ms = Time(rounds, [&] { answer.SerializeToString(&answer_wire); });
      const double ans_parse_ms = Time(rounds, [&] {
        v1::OpenTransferResponse parsed;
        KV_CHECK(parsed.ParseFromString(answer_wire));
      });
      printf(
          "%6d %-16s %8.3f | %8.3f %8.3f %9.3f %8.3f %8.3f %8.3f %8.3f %8.3f %9.3f | %7.1f %7.1f\n",
          n, FormName(form), rpc_ms, build_ms, req_ser_ms, req_parse_ms, handler_ms, walk_ms,
          pin_ms, place_ms, ans_ser_ms, ans_parse_ms, wire.size() / 1e3, answer_wire.size() / 1e3);
    }
  }
  // The Lookup a worker makes before that handshake (every key of the prompt, a lease on the
  // hits), answered with every hit's page info or with the count only (matched_count_only).
  printf("\n%6s %-16s %8s %8s\n", "pages", "lookup answer", "rpc ms", "ans KB");
  for (int n : lengths) {
    for (bool count_only : {false, true}) {
      v1::LookupRequest request;
      for (int i = 0; i < n; ++i) request.add_page_keys(chain[i].meta.key.ToBytes());
      request.set_lease_ttl_ms(10000);
      request.set_matched_count_only(count_only);
      size_t answer_bytes = 0;
      const double rpc_ms = Time(rounds, [&] {
        v1::LookupResponse response;
        grpc::ClientContext context;
        KV_CHECK(stub->Lookup(&context, request, &response).ok());
        KV_CHECK(response.matched_pages() == static_cast<uint32_t>(n));
        answer_bytes = response.ByteSizeLong();
        store.Release(response.lease_id());
      });
      printf("%6d %-16s %8.3f %8.1f\n", n, count_only ? "count only" : "page infos", rpc_ms,
             answer_bytes / 1e3);
    }
  }
  const kvstore::PageStoreStats stats = store.Stats();
  KV_CHECK(stats.active_leases == 0) << stats.active_leases << " leases left";
  return 0;
}

}  // namespace
}  // namespace kvstrata

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvstrata_bench_handshake: where the time of a same-GPU OpenTransfer handshake goes, with "
      "the kvstore's fast tier in host memory.");
  absl::ParseCommandLine(argc, argv);
  return kvstrata::Run();
}

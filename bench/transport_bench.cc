// kvstrata_bench_transport: the same-GPU transport against the gRPC byte stream, on one GPU
// (docs/benchmarks/kvstore-gpu.md "GPU: fetching a prefix from the GPU kvstore"). Starts
// kvstrata-kvstore --device cuda:0 as its own process, publishes a chain of pages of a
// Qwen3-8B-shaped INT2 page (36 layers, 8 KV heads of 128, 64 tokens: 1.47 MB), maps the store's
// HBM pool once over its pool socket, then for each prefix length times:
//   handshake  OpenTransfer: the lease, the pages moved up if needed, their pool offsets; the
//              pages named as a chain (what workers send), and for comparison by every key
//              (compact arrays, and page headers)
//   held       the chain handshake naming this process's pool holder (transport/pool_socket.h):
//              the lease a worker reading in place takes, held by its pool connection
//   in place   the digest of every page read where it lies in the store's pool (the check a
//              worker reading in place pays; the bytes themselves are not moved): a worker's
//              whole cost of a prefix read in place is `held` + `in place`
//   gather     one kernel copying every page into this process's memory, digests checked
//   grpc       Fetch of the same pages over gRPC into host memory (the fallback)
//   copy       cudaMemcpy of the same bytes device to device (the device's copy bandwidth)
// and checks: gathered bytes equal the published ones, a corrupted page fails its digest, and
// a killed store turns the next handshake into UNAVAILABLE within its deadline. Exit 1 on any
// failed check, 77 without a GPU.

#include <cuda_runtime.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <xxhash.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/page_digest.h"
#include "core/page_format.h"
#include "engine/cuda/device_page_memory.h"
#include "kernels/cuda/page_gather.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/kvstore/client.h"
#include "transport/pool_socket.h"

ABSL_FLAG(std::string, kvstore, "", "kvstrata-kvstore binary (default: beside this one)");
ABSL_FLAG(std::string, pages, "1,32,512,1600", "prefix lengths in pages");
ABSL_FLAG(int, rounds, 5, "timed rounds per length (the median is reported)");
ABSL_FLAG(int, port, 58161, "port of the kvstore started here");
ABSL_FLAG(std::string, json, "", "write the results here");
ABSL_FLAG(bool, small, false, "a 4-layer page geometry and short prefixes (a quick check)");

namespace kvstrata {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

#define CUDA_OK(x)                                                                   \
  do {                                                                               \
    if (cudaError_t e_ = (x); e_ != cudaSuccess) {                                   \
      fprintf(stderr, "bench-transport: %s: %s\n", #x, cudaGetErrorString(e_));     \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

int failures = 0;
void Check(bool ok, const std::string& what) {
  printf("check: %s: %s\n", what.c_str(), ok ? "ok" : "FAILED");
  if (!ok) ++failures;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

PageKey KeyOf(uint32_t i, uint8_t salt) {
  PageKey key;
  key.bytes.fill(salt);
  std::memcpy(key.bytes.data(), &i, sizeof(i));
  return key;
}

int Run(const std::string& self) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("bench-transport: Skipped\nno CUDA device\n");
    return 77;
  }
  std::vector<int> lengths;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_pages), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(s, &n) || n <= 0) {
      fprintf(stderr, "bench-transport: --pages: bad length '%s'\n", std::string(s).c_str());
      return 2;
    }
    lengths.push_back(n);
  }
  const bool small = absl::GetFlag(FLAGS_small);
  if (small) lengths = {1, 8, 64};
  const int max_pages = *std::max_element(lengths.begin(), lengths.end());
  const KvGeometry g{.num_layers = small ? 4 : 36, .num_kv_heads = 8, .head_dim = 128,
                     .group_size = 64, .page_tokens = 64};

  // One INT2 page encoded from random rows, then each page of the chain a copy with its own
  // header and a few body bytes of its own.
  std::vector<float> kv(size_t{2} * g.num_layers * g.num_kv_heads * g.page_tokens * g.head_dim);
  std::mt19937 rng(20261201);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : kv) x = normal(rng);
  const PageKey ns = KeyOf(0xFFFFFFFF, 0xAB);
  absl::StatusOr<std::vector<uint8_t>> tmpl =
      EncodePage({g, PageEncoding::kInt2Uniform, 0, KeyOf(0, 1), ns}, kv);
  if (!tmpl.ok()) {
    fprintf(stderr, "bench-transport: %s\n", tmpl.status().ToString().c_str());
    return 1;
  }
  const size_t page_bytes = tmpl->size();
  std::vector<std::vector<uint8_t>> pages(max_pages);
  std::vector<kvstore::PutPage> puts(max_pages);
  for (int i = 0; i < max_pages; ++i) {
    std::vector<uint8_t>& p = pages[i];
    p = *tmpl;
    auto* h = reinterpret_cast<kernels::PageHeader*>(p.data());
    const PageKey key = KeyOf(i, 1);
    const PageKey parent = i == 0 ? ns : KeyOf(i - 1, 1);
    h->page_index = static_cast<uint32_t>(i);
    std::memcpy(h->key, key.bytes.data(), 16);
    std::memcpy(h->parent_key, parent.bytes.data(), 16);
    for (size_t k = 0; k < 64; ++k) p[sizeof(kernels::PageHeader) + k * 4099 % (page_bytes - 64)] ^= i;
    puts[i] = {.key = key, .parent_key = parent, .page_index = static_cast<uint32_t>(i),
               .encoding = v1::PAGE_ENCODING_INT2,
               .bytes = std::string(reinterpret_cast<const char*>(p.data()), p.size())};
  }
  const uint64_t total = page_bytes * max_pages;
  printf("bench-transport: %d pages of %zu bytes (%s INT2, %.2f GB)\n", max_pages, page_bytes,
         small ? "4-layer" : "Qwen3-8B-shaped", total / 1e9);

  // The store, as its own process on this GPU.
  std::string kvstore_bin = absl::GetFlag(FLAGS_kvstore);
  if (kvstore_bin.empty()) {
    // Beside this binary (which may have been found on PATH).
    char exe[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    const std::string me = n > 0 ? std::string(exe, n) : self;
    kvstore_bin = me.substr(0, me.rfind('/') + 1) + "kvstrata-kvstore";
  }
  const int port = absl::GetFlag(FLAGS_port);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  const std::string socket_path = absl::StrCat("/tmp/kvstrata-bench-transport-", getpid(), ".pool");
  const uint64_t gpu_mb = total / (1 << 20) + 256;
  const pid_t store_pid = fork();
  if (store_pid == 0) {
    const std::string args[] = {kvstore_bin,
                                "--device=cuda:0",
                                absl::StrCat("--gpu_capacity_mb=", gpu_mb),
                                absl::StrCat("--capacity_mb=", gpu_mb),
                                absl::StrCat("--listen=", address),
                                "--metrics_listen=",
                                absl::StrCat("--pool_socket=", socket_path),
                                "--max_keys_per_request=4096",
                                "--insecure"};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    perror("execv kvstrata-kvstore");
    _exit(127);
  }
  kvstore::KvStoreClientOptions client_options;
  client_options.put_deadline = absl::Seconds(120);
  client_options.fetch_deadline = absl::Seconds(120);
  kvstore::KvStoreClient client(address, client_options);
  auto stub = v1::KvStore::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    v1::StatsResponse stats;
    up = stub->Stats(&context, v1::StatsRequest(), &stats).ok() && stats.gpu_bytes_capacity() > 0;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!up) {
    fprintf(stderr, "bench-transport: the kvstore on %s did not come up\n", address.c_str());
    kill(store_pid, SIGKILL);
    return 1;
  }
  const auto put_start = Clock::now();
  for (int i = 0; i < max_pages; i += 64) {
    absl::StatusOr<kvstore::PutSummary> put = client.Put(
        std::span<const kvstore::PutPage>(puts).subspan(i, std::min(64, max_pages - i)));
    if (!put.ok()) {
      fprintf(stderr, "bench-transport: put: %s\n", put.status().ToString().c_str());
      kill(store_pid, SIGKILL);
      return 1;
    }
  }
  printf("published in %.0f ms\n", Ms(Clock::now() - put_start));

  cudaDeviceProp prop{};
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  absl::StatusOr<std::pair<std::string, std::string>> gpu = engine::GpuUuidAndName(0);
  // The pages named as a chain (the last key and a count), or by every key.
  enum class Naming { kChain, kKeys };
  uint64_t holder = 0;  // this process's pool holder, once connected
  auto open = [&](int n, v1::OpenTransferResponse* response, bool compact = true,
                  Naming naming = Naming::kChain, bool held = false) {
    v1::OpenTransferRequest request;
    if (held) request.set_pool_holder(holder);
    request.set_compact(compact);
    request.set_client_id("bench-transport");
    request.mutable_device()->set_gpu_uuid(gpu.ok() ? gpu->first : "");
    request.mutable_device()->set_host_boot_id(transport::HostBootId());
    request.add_transports(v1::TRANSPORT_SAME_GPU_POOL);
    request.add_transports(v1::TRANSPORT_GRPC_STREAM);
    if (naming == Naming::kChain) {
      request.mutable_chain()->set_last_key(puts[n - 1].key.ToBytes());
      request.mutable_chain()->set_page_count(static_cast<uint32_t>(n));
      request.mutable_chain()->set_first_parent_key(puts[0].parent_key.ToBytes());
    } else {
      for (int i = 0; i < n; ++i) request.add_pages()->set_key(puts[i].key.ToBytes());
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->OpenTransfer(&context, request, response);
  };

  // Map the pool once.
  v1::OpenTransferResponse first;
  grpc::Status opened = open(1, &first);
  Check(opened.ok() && first.transport() == v1::TRANSPORT_SAME_GPU_POOL,
        absl::StrCat("the store offers the same-GPU pool (", opened.error_message(), ")"));
  if (failures > 0) {
    kill(store_pid, SIGKILL);
    return 1;
  }
  const auto map_start = Clock::now();
  auto connected = transport::ConnectPoolHolder(first.pool().socket_path());
  const double socket_ms = Ms(Clock::now() - map_start);
  Check(connected.ok() && connected->first.pool_id == first.pool().pool_id(),
        "pool handle received");
  if (!connected.ok()) {
    kill(store_pid, SIGKILL);
    return 1;
  }
  const transport::PoolHandle* handle = &connected->first;
  holder = connected->second->holder();
  Check(holder != 0, "the store holds leases by the pool connection");
  absl::StatusOr<std::unique_ptr<engine::ImportedPageMemory>> pool =
      engine::ImportedPageMemory::Import(0, handle->fd, static_cast<int64_t>(handle->pool_bytes));
  const double map_ms = Ms(Clock::now() - map_start);
  Check(pool.ok(), absl::StrCat("pool mapped (", pool.ok() ? "" : pool.status().ToString(), ")"));
  if (!pool.ok()) {
    kill(store_pid, SIGKILL);
    return 1;
  }
  printf("pool: %.2f GB, socket %.3f ms, socket + import + map %.3f ms\n",
         handle->pool_bytes / 1e9, socket_ms, map_ms);

  uint8_t* dst = nullptr;
  kernels::PageCopy* copies = nullptr;
  unsigned long long* sums = nullptr;
  uint32_t* mismatch = nullptr;
  CUDA_OK(cudaMalloc(&dst, total));
  CUDA_OK(cudaMalloc(&copies, sizeof(kernels::PageCopy) * max_pages));
  CUDA_OK(cudaMalloc(&sums, sizeof(unsigned long long) * max_pages));
  CUDA_OK(cudaMalloc(&mismatch, sizeof(uint32_t) * max_pages));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  std::vector<kernels::PageCopy> host_copies(max_pages);
  std::vector<uint32_t> host_mismatch(max_pages);

  // Page i's offset in the pool, length and digest, from a compact answer or from segments.
  auto placement = [](const v1::OpenTransferResponse& r, int i) {
    struct Placement {
      uint64_t offset, bytes, digest;
    };
    if (r.has_placements()) {
      const v1::PoolPlacements& p = r.placements();
      return Placement{p.offset_bytes(i), p.byte_length(i), p.digest64(i)};
    }
    const v1::TransferSegment& s = r.segments(i);
    return Placement{s.offset_bytes(), s.header().byte_length(), s.digest64()};
  };
  auto answered = [](const v1::OpenTransferResponse& r) {
    return r.has_placements() ? r.placements().offset_bytes_size() : r.segments_size();
  };
  // Copies `n` pages (dst null: digests only) and returns the kernel time in ms, or -1.
  auto gather = [&](const v1::OpenTransferResponse& r, int n, bool copy, uint8_t* src_override)
      -> double {
    for (int i = 0; i < n; ++i) {
      const auto p = placement(r, i);
      host_copies[i] = {.src = src_override != nullptr ? src_override + i * page_bytes
                                                        : (*pool)->data() + p.offset,
                        .dst = copy ? dst + i * page_bytes : nullptr,
                        .bytes = p.bytes,
                        .expected_digest = p.digest};
    }
    if (cudaMemcpyAsync(copies, host_copies.data(), sizeof(kernels::PageCopy) * n,
                        cudaMemcpyHostToDevice, stream) != cudaSuccess) {
      return -1;
    }
    cudaEventRecord(e0, stream);
    if (kernels::LaunchPageGather({.copies = copies, .num_pages = n, .max_page_bytes = page_bytes,
                                   .sums = sums, .mismatch = mismatch},
                                  stream) != cudaSuccess) {
      return -1;
    }
    cudaEventRecord(e1, stream);
    cudaMemcpyAsync(host_mismatch.data(), mismatch, sizeof(uint32_t) * n, cudaMemcpyDeviceToHost,
                    stream);
    if (cudaStreamSynchronize(stream) != cudaSuccess) return -1;
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    return ms;
  };
  auto mismatches = [&](int n) {
    return static_cast<int>(std::count(host_mismatch.begin(), host_mismatch.begin() + n, 1u));
  };

  nlohmann::json results = nlohmann::json::array();
  printf("\n%6s %10s %12s %10s %12s %12s %12s %10s %10s %10s %9s %9s\n", "pages", "MB",
         "handshake ms", "held ms", "(keys) ms", "(headers) ms", "in place ms", "gather ms",
         "grpc ms", "copy ms", "gather/copy", "grpc GB/s");
  int not_held = 0;
  for (int n : lengths) {
    std::vector<double> handshake, handshake_held, handshake_keys, handshake_full, in_place,
        gathered, grpc_ms, copy_ms;
    int bad = 0;
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      v1::OpenTransferResponse r;
      const auto t0 = Clock::now();
      grpc::Status s = open(n, &r);
      handshake.push_back(Ms(Clock::now() - t0));
      if (!s.ok() || r.transport() != v1::TRANSPORT_SAME_GPU_POOL || answered(r) != n) {
        Check(false, absl::StrCat("handshake for ", n, " pages: ", s.error_message()));
        break;
      }
      {
        // The lease of a worker that reads the pages in place: held by its pool connection.
        v1::OpenTransferResponse held;
        const auto h0 = Clock::now();
        grpc::Status hs = open(n, &held, /*compact=*/true, Naming::kChain, /*held=*/true);
        handshake_held.push_back(Ms(Clock::now() - h0));
        not_held += !hs.ok() || !held.lease_held();
        if (hs.ok()) client.Release(held.lease_id()).IgnoreError();
      }
      {
        // The same handshake naming every key, answered as compact arrays and as full segments
        // (headers included), for comparison.
        v1::OpenTransferResponse keys;
        const auto k0 = Clock::now();
        grpc::Status ks = open(n, &keys, /*compact=*/true, Naming::kKeys);
        handshake_keys.push_back(Ms(Clock::now() - k0));
        if (ks.ok()) client.Release(keys.lease_id()).IgnoreError();
        v1::OpenTransferResponse full;
        const auto f0 = Clock::now();
        grpc::Status fs = open(n, &full, /*compact=*/false, Naming::kKeys);
        handshake_full.push_back(Ms(Clock::now() - f0));
        if (fs.ok()) client.Release(full.lease_id()).IgnoreError();
      }
      in_place.push_back(gather(r, n, /*copy=*/false, nullptr));
      bad += mismatches(n);
      gathered.push_back(gather(r, n, /*copy=*/true, nullptr));
      bad += mismatches(n);
      client.Release(r.lease_id()).IgnoreError();
      std::vector<std::pair<PageKey, v1::PageEncoding>> refs;
      for (int i = 0; i < n; ++i) refs.emplace_back(puts[i].key, v1::PAGE_ENCODING_UNSPECIFIED);
      const auto g0 = Clock::now();
      absl::StatusOr<std::vector<kvstore::FetchedPage>> fetched = client.Fetch(refs);
      grpc_ms.push_back(Ms(Clock::now() - g0));
      if (!fetched.ok()) Check(false, absl::StrCat("grpc fetch: ", fetched.status().ToString()));
      cudaEventRecord(e0, stream);
      cudaMemcpyAsync(dst, (*pool)->data() + placement(r, 0).offset, page_bytes * n,
                      cudaMemcpyDeviceToDevice, stream);
      cudaEventRecord(e1, stream);
      cudaStreamSynchronize(stream);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      copy_ms.push_back(ms);
    }
    // The copied bytes are the published ones.
    std::vector<uint8_t> back(page_bytes);
    bool same = true;
    // The copy reference overwrote dst: gather once more and compare three pages.
    v1::OpenTransferResponse r;
    if (open(n, &r).ok()) {
      gather(r, n, true, nullptr);
      for (int i : {0, n / 2, n - 1}) {
        cudaMemcpy(back.data(), dst + i * page_bytes, page_bytes, cudaMemcpyDeviceToHost);
        same = same && back == pages[i];
      }
      client.Release(r.lease_id()).IgnoreError();
    }
    Check(bad == 0 && same, absl::StrCat(n, " pages: digests match and bytes equal the published"));
    const double mb = page_bytes * n / 1e6;
    const double g = Median(gathered), c = Median(copy_ms), p = Median(grpc_ms);
    printf("%6d %10.1f %12.3f %10.3f %12.3f %12.3f %12.3f %10.3f %10.1f %10.3f %9.2f %9.2f\n", n,
           mb, Median(handshake), Median(handshake_held), Median(handshake_keys),
           Median(handshake_full), Median(in_place), g, p, c, c / g, mb / 1e3 / (p / 1e3));
    printf(
        "       a prefix read in place costs %.3f ms (held lease + digests), copied %.3f ms "
        "(lease + gather)\n",
        Median(handshake_held) + Median(in_place), Median(handshake) + g);
    printf("       gather %.0f GB/s (read + write %.0f GB/s), in-place digest %.0f GB/s, copy "
           "%.0f GB/s\n",
           mb / 1e3 / (g / 1e3), 2 * mb / 1e3 / (g / 1e3), mb / 1e3 / (Median(in_place) / 1e3),
           mb / 1e3 / (c / 1e3));
    // handshake_ms keeps its meaning of earlier runs (every key, compact arrays).
    results.push_back({{"pages", n},
                       {"bytes", page_bytes * n},
                       {"handshake_chain_ms", Median(handshake)},
                       {"handshake_ms", Median(handshake_keys)},
                       {"handshake_with_headers_ms", Median(handshake_full)},
                       {"handshake_held_ms", Median(handshake_held)},
                       {"in_place_digest_ms", Median(in_place)},
                       {"gather_ms", g},
                       {"grpc_fetch_ms", p},
                       {"device_copy_ms", c},
                       {"rounds", handshake.size()}});
  }

  Check(not_held == 0,
        absl::StrCat("every held handshake was answered lease_held (", not_held, " were not)"));
  // A corrupted page fails its digest: gather from a copy with one byte flipped.
  {
    v1::OpenTransferResponse r;
    const int n = std::min(8, max_pages);
    if (open(n, &r).ok()) {
      gather(r, n, true, nullptr);
      // One bit of a byte inside the first page's body.
      uint8_t* where = dst + 1000;
      uint8_t byte = 0;
      cudaMemcpy(&byte, where, 1, cudaMemcpyDeviceToHost);
      byte ^= 0x10;
      cudaMemcpy(where, &byte, 1, cudaMemcpyHostToDevice);
      uint8_t* staged = nullptr;
      cudaMalloc(&staged, page_bytes * n);
      cudaMemcpy(staged, dst, page_bytes * n, cudaMemcpyDeviceToDevice);
      gather(r, n, false, staged);
      const int failed = mismatches(n);
      cudaFree(staged);
      Check(failed == 1, absl::StrCat("one flipped bit fails exactly one digest (", failed, ")"));
      client.Release(r.lease_id()).IgnoreError();
    }
  }
  // A killed store: the next handshake is UNAVAILABLE within its deadline, not a hang.
  kill(store_pid, SIGKILL);
  waitpid(store_pid, nullptr, 0);
  Check(!connected->second->open(), "the pool connection sees the killed store");
  {
    v1::OpenTransferResponse r;
    const auto t0 = Clock::now();
    grpc::Status s = open(1, &r);
    const double ms = Ms(Clock::now() - t0);
    Check(!s.ok() && ms < 6000,
          absl::StrCat("killed store: handshake fails in ", static_cast<int>(ms), " ms (",
                       s.error_message(), ")"));
  }
  nlohmann::json out = {{"device", prop.name}, {"page_bytes", page_bytes},
                        {"pool_socket_ms", socket_ms}, {"pool_map_ms", map_ms},
                        {"geometry", {{"layers", g.num_layers}, {"kv_heads", g.num_kv_heads},
                                      {"head_dim", g.head_dim}, {"group", g.group_size}}},
                        {"results", results}, {"failed_checks", failures}};
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  unlink(socket_path.c_str());
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvstrata

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "kvstrata_bench_transport: fetch times of a prefix from a GPU kvstore on this GPU, same-GPU "
      "pool (in place, gather) against gRPC. Needs kvstrata-kvstore beside it.");
  absl::ParseCommandLine(argc, argv);
  return kvstrata::Run(argv[0]);
}

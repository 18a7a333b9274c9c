// What a page MAC costs (core/page_mac.h): HMAC-SHA256 of whole pages, signed once by the
// publishing worker and checked once per fetch, beside the XXH3-64 checksum every page already
// gets. The pages are the sizes of real geometries (kernels/kv_layout.h PageBytes); the MAC
// does not depend on the bytes. One thread. docs/operations.md ("Security") records results.
//
//   build/bin/kvstrata_bench_page_mac --benchmark_min_time=0.5

#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/check.h"
#include "core/page_mac.h"
#include "kernels/kv_layout.h"

namespace kvstrata {
namespace {

struct Shape {
  const char* name;
  kernels::KvGeometry geometry;
  kernels::PageEncoding encoding;
};

// SmolLM2-135M (30 layers, 3 KV heads, head_dim 64) and an 8B-class model (32 layers, 8 KV
// heads, head_dim 128), 64-token pages, INT2 with group 64 or 128, and BF16.
const Shape kShapes[] = {
    {"smollm2_int2", {30, 3, 64, 64, 64}, kernels::PageEncoding::kInt2Uniform},
    {"smollm2_bf16", {30, 3, 64, 64, 64}, kernels::PageEncoding::kBf16},
    {"8b_int2", {32, 8, 128, 128, 64}, kernels::PageEncoding::kInt2Uniform},
    {"8b_bf16", {32, 8, 128, 128, 64}, kernels::PageEncoding::kBf16},
};

std::vector<uint8_t> RandomPage(const Shape& shape) {
  std::vector<uint8_t> page(kernels::PageBytes(shape.geometry, shape.encoding));
  std::mt19937_64 rng(42);
  for (uint8_t& b : page) b = static_cast<uint8_t>(rng());
  return page;
}

std::shared_ptr<const PageMacKeys> Keys() {
  static const std::shared_ptr<const PageMacKeys> keys = [] {
    absl::StatusOr<std::shared_ptr<const PageMacKeys>> k =
        PageMacKeys::FromHex({std::string(64, 'a')});
    KV_CHECK(k.ok());
    return *k;
  }();
  return keys;
}

void BM_MacVerify(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const std::vector<uint8_t> page = RandomPage(shape);
  PageKey key;
  const std::string mac = Keys()->Sign(key, page);
  for (auto _ : state) {
    absl::Status s = Keys()->Verify(key, page, mac);
    benchmark::DoNotOptimize(s);
  }
  state.SetLabel(shape.name);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(page.size()));
  state.counters["page_KiB"] = static_cast<double>(page.size()) / 1024;
}

void BM_Xxh3Checksum(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const std::vector<uint8_t> page = RandomPage(shape);
  for (auto _ : state) benchmark::DoNotOptimize(XXH3_64bits(page.data(), page.size()));
  state.SetLabel(shape.name);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(page.size()));
  state.counters["page_KiB"] = static_cast<double>(page.size()) / 1024;
}

BENCHMARK(BM_MacVerify)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Xxh3Checksum)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvstrata

BENCHMARK_MAIN();

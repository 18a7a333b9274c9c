#pragma once

// What the router's policy-library tests share: page keys of synthetic chains, workers with a
// given load, requests, and policies by name.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/radix_hash.h"
#include "gtest/gtest.h"
#include "services/router/policy.h"
#include "services/router/worker_table.h"

namespace kvstrata::router::test {

// Page `page` of chain `chain` (distinct chains never share keys).
inline PageKey Key(uint32_t chain, uint32_t page) {
  PageKey key;
  for (int i = 0; i < 4; ++i) {
    key.bytes[i] = static_cast<uint8_t>(chain >> (8 * i));
    key.bytes[4 + i] = static_cast<uint8_t>(page >> (8 * i));
  }
  key.bytes[15] = 0x5a;
  return key;
}

inline std::vector<PageKey> Chain(uint32_t chain, uint32_t pages) {
  std::vector<PageKey> keys;
  for (uint32_t p = 0; p < pages; ++p) keys.push_back(Key(chain, p));
  return keys;
}

// A worker with the given queue and pool, on no kvstore node's GPU.
inline WorkerInfo Worker(std::string id, int64_t running, int64_t waiting = 0,
                         int64_t free_pages = 100, int64_t total_pages = 100) {
  WorkerInfo w;
  w.id = id;
  w.address = id + ":1";
  w.load = {running, waiting, free_pages, total_pages};
  return w;
}

inline RouteRequest Request(const std::vector<PageKey>& keys, int64_t extra_tokens = 0) {
  return {keys, static_cast<int64_t>(keys.size()) * 64 + extra_tokens, /*page_tokens=*/64};
}

inline std::unique_ptr<RoutingPolicy> Make(absl::string_view name,
                                           const RoutingPolicyOptions& options = {}) {
  auto policy = MakeRoutingPolicy(name, options);
  EXPECT_TRUE(policy.ok()) << policy.status();
  return std::move(policy).value();
}

}  // namespace kvstrata::router::test

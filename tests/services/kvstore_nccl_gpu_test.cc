// The kvstore's NCCL communicator pool (services/kvstore/nccl_sender.h) on NCCL itself, as far
// as one GPU allows (NCCL refuses two ranks on one GPU, so no worker can join): a setup whose
// worker never joins is aborted at the init deadline and counted, a new setup after it is made
// and fails the same way without hanging, and a store shutting down cancels a join in progress
// at once. Skips itself without a CUDA device; needs libnccl.so.2 (LD_LIBRARY_PATH or
// KVSTRATA_NCCL_LIBRARY) on a GPU machine.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>

#include "absl/time/clock.h"
#include "services/kvstore/nccl_sender.h"
#include "transport/nccl.h"

namespace kvstrata::kvstore {
namespace {

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

template <typename F>
bool Within(absl::Duration limit, F done) {
  const absl::Time give_up = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

class KvStoreNcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<transport::NcclRuntime*> nccl = transport::SystemNccl();
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    nccl_ = *nccl;
    absl::StatusOr<std::shared_ptr<transport::DeviceRange>> pool = nccl_->Allocate(0, 64 << 20);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }
  transport::NcclRuntime* nccl_ = nullptr;
  std::shared_ptr<transport::DeviceRange> pool_;
};

TEST_F(KvStoreNcclGpuTest, ASetupWhoseWorkerNeverJoinsIsAbortedCountedAndMadeAgain) {
  NcclSenderOptions options;
  options.init_timeout = absl::Seconds(2);
  NcclSender sender(nccl_, pool_->data, pool_->bytes, options);
  for (uint64_t round = 1; round <= 2; ++round) {
    const absl::Time start = absl::Now();
    absl::StatusOr<NcclSetup> setup = sender.Setup("worker-never-joins");
    ASSERT_TRUE(setup.ok()) << setup.status();
    EXPECT_EQ(setup->unique_id.size(), transport::kNcclUniqueIdBytes);
    EXPECT_FALSE(sender.Ready(setup->communicator_id));
    ASSERT_TRUE(Within(absl::Seconds(15), [&] { return sender.Counts().init_failures == round; }))
        << "round " << round << ": the join did not give up";
    EXPECT_GE(absl::Now() - start, absl::Seconds(2));
    EXPECT_EQ(sender.Counts().aborts, round);
    EXPECT_EQ(sender.Counts().communicators_made, 0u);
    EXPECT_FALSE(sender.Ready(setup->communicator_id));
    EXPECT_TRUE(Within(absl::Seconds(5), [&] { return sender.Counts().live_communicators == 0; }));
  }
}

TEST_F(KvStoreNcclGpuTest, AStoreShuttingDownCancelsAJoinInProgress) {
  NcclSenderOptions options;
  options.init_timeout = absl::Seconds(120);
  auto sender = std::make_unique<NcclSender>(nccl_, pool_->data, pool_->bytes, options);
  ASSERT_TRUE(sender->Setup("worker-never-joins").ok());
  absl::SleepFor(absl::Milliseconds(500));  // the join is under way
  const absl::Time start = absl::Now();
  sender.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(15)) << "shutdown waited for the init deadline";
}

}  // namespace
}  // namespace kvstrata::kvstore

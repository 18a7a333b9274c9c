// NCCL itself (transport/nccl.h's SystemNccl) on what one GPU allows: NCCL refuses two ranks on
// one GPU, so a real transfer here is a 1-rank communicator sending to itself, and the two-rank
// paths tested are the ones where the peer never comes (init deadline, abort). Skips itself
// without a CUDA device or without libnccl.so.2 (set LD_LIBRARY_PATH or KVSTRATA_NCCL_LIBRARY).

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "core/page_digest.h"
#include "transport/nccl.h"

namespace kvstrata::transport {
namespace {

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<NcclRuntime*> nccl = SystemNccl();
    ASSERT_TRUE(nccl.ok()) << nccl.status();  // a GPU machine must have NCCL for this test
    nccl_ = *nccl;
  }
  std::unique_ptr<NcclCommunicator> JoinAlone() {
    absl::StatusOr<std::string> id = nccl_->NewUniqueId();
    EXPECT_TRUE(id.ok()) << id.status();
    EXPECT_EQ(id->size(), kNcclUniqueIdBytes);
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = nccl_->Join(
        *id, /*num_ranks=*/1, /*rank=*/0, /*device=*/0, absl::Now() + absl::Seconds(60));
    EXPECT_TRUE(comm.ok()) << comm.status();
    return comm.ok() ? *std::move(comm) : nullptr;
  }
  NcclRuntime* nccl_ = nullptr;
};

// Pages of INT2-like sizes (multiples of 16, not all equal) moved in one grouped self transfer
// between two registered slabs, arrive byte for byte, and their digests check on the GPU; one
// flipped byte is then found, naming its page.
TEST_F(NcclGpuTest, GroupedSelfTransferMovesPagesAndDigestsCheck) {
  std::unique_ptr<NcclCommunicator> comm = JoinAlone();
  ASSERT_NE(comm, nullptr);
  const std::vector<uint64_t> sizes = {139264, 16, 4096, 139264, 557056, 1040};
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (uint64_t s : sizes) {
    offsets.push_back(total);
    total += (s + 255) / 256 * 256;
  }
  std::vector<uint8_t> host(total);
  std::mt19937_64 rng(7);
  for (uint8_t& b : host) b = static_cast<uint8_t>(rng());
  absl::StatusOr<std::shared_ptr<DeviceRange>> src = nccl_->Allocate(0, total);
  absl::StatusOr<std::shared_ptr<DeviceRange>> dst = nccl_->Allocate(0, total);
  ASSERT_TRUE(src.ok() && dst.ok());
  ASSERT_EQ(cudaMemcpy((*src)->data, host.data(), total, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset((*dst)->data, 0, total), cudaSuccess);
  // Registration is an optimisation: an NCCL without it still transfers.
  absl::Status reg = comm->Register(**src);
  EXPECT_TRUE(reg.ok() || absl::IsUnimplemented(reg)) << reg;
  reg = comm->Register(**dst);
  EXPECT_TRUE(reg.ok() || absl::IsUnimplemented(reg)) << reg;

  std::vector<DeviceRange> sends, recvs;
  std::vector<DigestCheck> checks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    sends.push_back({(*src)->data + offsets[i], sizes[i]});
    recvs.push_back({(*dst)->data + offsets[i], sizes[i]});
    checks.push_back(
        {(*dst)->data + offsets[i], sizes[i], PageDigest64(host.data() + offsets[i], sizes[i])});
  }
  ASSERT_TRUE(comm->Transfer(/*peer=*/0, sends, recvs, absl::Now() + absl::Seconds(30)).ok());
  std::vector<uint8_t> back(total);
  ASSERT_EQ(cudaMemcpy(back.data(), (*dst)->data, total, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_EQ(0, memcmp(back.data() + offsets[i], host.data() + offsets[i], sizes[i]))
        << "page " << i;
  }
  // Sized above this transfer, as a worker's is for its slab; checked twice, so the second
  // check reuses the scratch and stream the first left behind.
  absl::StatusOr<std::unique_ptr<DigestChecker>> checker =
      nccl_->NewDigestChecker(/*device=*/0, /*max_pages=*/sizes.size() + 10);
  ASSERT_TRUE(checker.ok()) << checker.status();
  EXPECT_EQ((*checker)->max_pages(), sizes.size() + 10);
  EXPECT_TRUE((*checker)->Check(checks).ok());
  EXPECT_TRUE((*checker)->Check(checks).ok());
  std::vector<DigestCheck> too_many(sizes.size() + 11, checks[0]);
  EXPECT_TRUE(absl::IsInvalidArgument((*checker)->Check(too_many)));

  // One byte of page 3 flipped where it landed: the digest check names page 3.
  uint8_t flipped = static_cast<uint8_t>(back[offsets[3] + 100] ^ 0x40);
  ASSERT_EQ(cudaMemcpy((*dst)->data + offsets[3] + 100, &flipped, 1, cudaMemcpyHostToDevice),
            cudaSuccess);
  absl::Status bad = (*checker)->Check(checks);
  EXPECT_TRUE(absl::IsDataLoss(bad)) << bad;
  EXPECT_NE(bad.message().find("page 3 "), std::string::npos) << bad;
  EXPECT_FALSE(comm->broken());
}

// A 2-rank communicator whose other rank never joins: init gives up at its deadline, aborts,
// and returns; nothing waits past the deadline by more than the abort takes.
TEST_F(NcclGpuTest, JoinWhosePeerNeverComesTimesOut) {
  absl::StatusOr<std::string> id = nccl_->NewUniqueId();
  ASSERT_TRUE(id.ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      nccl_->Join(*id, /*num_ranks=*/2, /*rank=*/0, /*device=*/0, start + absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(comm.status())) << comm.status();
  EXPECT_GE(took, absl::Seconds(2));
  EXPECT_LT(took, absl::Seconds(12)) << "the abort took too long";
}

// A send with no receive posted never completes: the transfer's deadline aborts the
// communicator, it is broken from then on, and a new one (re-created) works.
TEST_F(NcclGpuTest, TransferDeadlineAbortsAndANewCommunicatorWorks) {
  std::unique_ptr<NcclCommunicator> comm = JoinAlone();
  ASSERT_NE(comm, nullptr);
  absl::StatusOr<std::shared_ptr<DeviceRange>> buf = nccl_->Allocate(0, 1 << 20);
  ASSERT_TRUE(buf.ok());
  const DeviceRange send{(*buf)->data, 1 << 20};
  const absl::Time start = absl::Now();
  absl::Status unmatched = comm->Transfer(0, {&send, 1}, {}, start + absl::Seconds(2));
  EXPECT_FALSE(unmatched.ok());
  // NCCL may also refuse the unmatched self send outright; either way it is an error, in time.
  EXPECT_TRUE(absl::IsDeadlineExceeded(unmatched) || absl::IsUnavailable(unmatched)) << unmatched;
  EXPECT_LT(absl::Now() - start, absl::Seconds(12));
  EXPECT_TRUE(comm->broken());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      comm->Transfer(0, {&send, 1}, {&send, 1}, absl::Now() + absl::Seconds(5))));
  comm.reset();

  std::unique_ptr<NcclCommunicator> fresh = JoinAlone();
  ASSERT_NE(fresh, nullptr);
  absl::StatusOr<std::shared_ptr<DeviceRange>> out = nccl_->Allocate(0, 1 << 20);
  ASSERT_TRUE(out.ok());
  std::vector<uint8_t> pattern(1 << 20);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 131 + 7);
  ASSERT_EQ(cudaMemcpy((*buf)->data, pattern.data(), pattern.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const DeviceRange recv{(*out)->data, 1 << 20};
  ASSERT_TRUE(fresh->Transfer(0, {&send, 1}, {&recv, 1}, absl::Now() + absl::Seconds(30)).ok());
  std::vector<uint8_t> back(pattern.size());
  ASSERT_EQ(cudaMemcpy(back.data(), (*out)->data, back.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, pattern);
}

// Abort() from another thread ends a transfer that would otherwise wait for its deadline.
TEST_F(NcclGpuTest, AbortFromAnotherThreadEndsAStuckTransfer) {
  std::unique_ptr<NcclCommunicator> comm = JoinAlone();
  ASSERT_NE(comm, nullptr);
  absl::StatusOr<std::shared_ptr<DeviceRange>> buf = nccl_->Allocate(0, 1 << 20);
  ASSERT_TRUE(buf.ok());
  const DeviceRange send{(*buf)->data, 1 << 20};
  const absl::Time start = absl::Now();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(500));
    comm->Abort();
  });
  absl::Status s = comm->Transfer(0, {&send, 1}, {}, start + absl::Seconds(60));
  aborter.join();
  EXPECT_FALSE(s.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_TRUE(comm->broken());
}

}  // namespace
}  // namespace kvstrata::transport

#include "engine/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kvstrata::engine {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsOnceOnAThreadOfTheTeam) {
  for (const int threads : {1, 2, 3}) {
    SCOPED_TRACE(threads);
    ThreadPool pool(threads);
    EXPECT_EQ(pool.threads(), threads);
    for (const int tasks : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> runs(tasks);
      std::vector<std::atomic<int>> by_thread(threads);
      pool.ParallelFor(tasks, [&](int task, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        runs[task].fetch_add(1);
        by_thread[thread].fetch_add(1);
      });
      int total = 0;
      for (int t = 0; t < tasks; ++t) EXPECT_EQ(runs[t].load(), 1) << "task " << t;
      for (int t = 0; t < threads; ++t) total += by_thread[t].load();
      EXPECT_EQ(total, tasks);
    }
  }
}

TEST(ThreadPoolTest, ManyShortLoopsInARowAllComplete) {
  ThreadPool pool(2);
  std::vector<int64_t> sums(64, 0);
  int64_t expected = 0;
  for (int loop = 0; loop < 5000; ++loop) {
    pool.ParallelFor(64, [&](int task, int) { sums[task] += loop; });
    expected += loop;
  }
  for (const int64_t s : sums) EXPECT_EQ(s, expected);
}

TEST(ThreadPoolTest, WorkersThatWentToSleepWakeForTheNextLoop) {
  ThreadPool pool(3);
  std::atomic<int> done{0};
  for (int round = 0; round < 3; ++round) {
    // Longer than the workers' spin, so they are asleep on the futex when the loop comes.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    pool.ParallelFor(30, [&](int, int) { done.fetch_add(1); });
  }
  EXPECT_EQ(done.load(), 90);
}

}  // namespace
}  // namespace kvstrata::engine

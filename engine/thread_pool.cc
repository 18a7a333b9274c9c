#include "engine/thread_pool.h"

#include <sched.h>

#include <chrono>
#include <cstdlib>

#include "core/check.h"

namespace kvstrata::engine {
namespace {

// How long a worker polls for the next loop before it sleeps. The loops of one forward pass
// follow each other within microseconds; between steps the engine thread samples and
// schedules, also in microseconds. Longer gaps mean an idle engine, where a wake-up costs a
// futex call.
constexpr auto kSpinTime = std::chrono::microseconds(200);
// Polls past this many pause rounds also yield the core: on a machine shared with other
// processes the thread being waited for may need it (a spinning waiter would otherwise hold
// the core that thread is queued for, for a whole scheduler time slice).
constexpr int kPauseRounds = 16;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

int DefaultCpuThreads() {
  if (const char* env = std::getenv("OPENBLAS_NUM_THREADS"); env != nullptr) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int threads) {
  KV_CHECK(threads >= 1) << "threads " << threads;
  for (int t = 1; t < threads; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  stop_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunTasks(int thread) {
  for (int task = next_task_.fetch_add(1, std::memory_order_relaxed); task < num_tasks_;
       task = next_task_.fetch_add(1, std::memory_order_relaxed)) {
    (*fn_)(task, thread);
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint32_t seen = 0;
  while (true) {
    uint32_t now = generation_.load(std::memory_order_acquire);
    if (now == seen) {
      const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
      for (int round = 0; (now = generation_.load(std::memory_order_acquire)) == seen; ++round) {
        if (round < kPauseRounds) {
          for (int i = 0; i < 64; ++i) CpuRelax();
        } else {
          std::this_thread::yield();
        }
        if (std::chrono::steady_clock::now() > deadline) {
          generation_.wait(seen, std::memory_order_acquire);
        }
      }
    }
    seen = now;
    if (stop_) return;
    RunTasks(thread);
    running_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::ParallelFor(int num_tasks, absl::FunctionRef<void(int task, int thread)> fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int task = 0; task < num_tasks; ++task) fn(task, 0);
    return;
  }
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  running_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();  // a syscall only when some worker sleeps
  RunTasks(0);
  for (int round = 0; running_.load(std::memory_order_acquire) != 0; ++round) {
    if (round < kPauseRounds * 64) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

}  // namespace kvstrata::engine

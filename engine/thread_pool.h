#pragma once

// The CPU backend's team of threads: one parallel loop at a time, dispatched with a few atomic
// operations so a decode step can afford a loop per matrix (a few microseconds of work each).
//
// Workers spin for a short while after a loop (the next one usually follows within
// microseconds) and then sleep on a futex, so an idle engine costs no CPU. The backend calls no
// threaded library inside these loops, so its threads never oversubscribe the cores.

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"

namespace kvstrata::engine {

// Threads the CPU backend uses by default: $OPENBLAS_NUM_THREADS when set to a positive number
// (the setting deployments already give a worker for its CPU limit), else the CPUs this process
// may run on.
int DefaultCpuThreads();

class ThreadPool {
 public:
  // `threads` >= 1 counts the calling thread: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task, thread) once for every task in [0, num_tasks) and returns when all have
  // returned. Tasks are handed out in increasing order to whichever thread is free; `thread`
  // (0 = the caller, 1..threads()-1 the workers) indexes per-thread scratch. One loop at a time:
  // call from one thread, never from inside fn.
  void ParallelFor(int num_tasks, absl::FunctionRef<void(int task, int thread)> fn);

 private:
  void WorkerLoop(int thread);
  void RunTasks(int thread);

  std::vector<std::thread> workers_;
  // Each on its own cache line: workers poll generation_ while the caller bumps next_task_.
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> next_task_{0};
  alignas(64) std::atomic<int> running_{0};  // workers still in the current loop
  alignas(64) int num_tasks_ = 0;
  const absl::FunctionRef<void(int, int)>* fn_ = nullptr;
  bool stop_ = false;
};

}  // namespace kvstrata::engine

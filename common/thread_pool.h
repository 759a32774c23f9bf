// A fork-join thread pool for kernels. The calling thread takes part in every job, so a
// pool of n threads starts n - 1 workers. Threads can be pinned to given CPUs.
//
// Wake-up cost: a decode step issues a few hundred parallel_for calls of tens of microseconds
// each, so workers spin (with a CPU pause) for a short while after each job before sleeping on
// a condition variable, and the caller spins the same way while it waits for the workers.
// A parallel_for on a warm pool costs about a microsecond; an idle pool costs no CPU.
//
// Thread-safety: parallel_for may be called from one thread at a time (the owner, e.g. the
// shard's step thread); workers never call back into the pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera {

struct ThreadPoolOptions {
  int num_threads = 0;          // 0: hardware concurrency
  std::vector<int> pin_cpus;    // optional: thread i is pinned to pin_cpus[i % size]
};

class ThreadPool {
 public:
  explicit ThreadPool(const ThreadPoolOptions& options = {});
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Runs fn(begin, end, thread_index) over [0, n) split into at most size() contiguous ranges
  // whose boundaries are multiples of `grain` (except the last). Returns when all are done.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker_loop(int index);
  void run_part(int index);

  int num_threads_ = 1;
  std::vector<std::thread> workers_;
  // The job: written by the caller before generation_ is bumped (release), read by workers
  // after they see the new generation (acquire).
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<bool> stop_{false};
  // Sleep path: workers that gave up spinning wait on cv_start_; a caller that gave up
  // spinning waits on cv_done_. The counters tell the other side whether to notify.
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  std::atomic<int> sleeping_workers_{0};
  std::atomic<bool> caller_sleeping_{false};
};

// Pins the calling thread to one CPU; returns false if the OS refused.
bool pin_current_thread(int cpu);

}  // namespace tessera

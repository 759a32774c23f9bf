#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a thread spins for the next event before it sleeps. Long enough to cover the
// serial work between two kernels of a decode step (norms, RoPE, sampling: tens of
// microseconds), short enough that an idle pool stops burning CPU at once.
constexpr auto kSpinTime = std::chrono::microseconds(300);

// Spins until pred() holds or kSpinTime passed; returns pred().
template <typename Pred>
bool spin_until(Pred pred) {
  for (int i = 0; i < 64; ++i) {
    if (pred()) return true;
    cpu_relax();
  }
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (;;) {
    for (int i = 0; i < 32; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

}  // namespace

bool pin_current_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

ThreadPool::ThreadPool(const ThreadPoolOptions& options) {
  num_threads_ = options.num_threads > 0 ? options.num_threads
                                         : std::max(1u, std::thread::hardware_concurrency());
  if (!options.pin_cpus.empty()) pin_current_thread(options.pin_cpus[0]);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i, cpus = options.pin_cpus] {
      if (!cpus.empty()) pin_current_thread(cpus[static_cast<size_t>(i) % cpus.size()]);
      worker_loop(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_part(int index) {
  const int64_t begin = static_cast<int64_t>(index) * job_chunk_;
  const int64_t end = std::min(job_n_, begin + job_chunk_);
  if (begin < end) (*job_)(begin, end, index);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen || stop_.load(); };
    if (!spin_until(fresh)) {
      std::unique_lock<std::mutex> lock(mu_);
      // seq_cst increment, then the predicate's loads: either the caller sees this worker
      // asleep and notifies, or the worker sees the new generation (see parallel_for).
      sleeping_workers_.fetch_add(1);
      cv_start_.wait(lock, [&] { return generation_.load() != seen || stop_.load(); });
      sleeping_workers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_part(index);
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  const int64_t parts = std::min<int64_t>(units, num_threads_);
  if (parts <= 1) {
    fn(0, n, 0);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = ((units + parts - 1) / parts) * grain;
  pending_.store(num_threads_ - 1);
  generation_.fetch_add(1);  // seq_cst: publishes the job (release) and orders the load below
  if (sleeping_workers_.load() > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_start_.notify_all();
  }
  run_part(0);
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lock(mu_);
    caller_sleeping_.store(true);
    cv_done_.wait(lock, done);
    caller_sleeping_.store(false);
  }
  job_ = nullptr;
}

}  // namespace tessera

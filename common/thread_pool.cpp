#include "common/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>

namespace tessera {

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
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, chunk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
    }
    const int64_t begin = static_cast<int64_t>(index) * chunk;
    const int64_t end = std::min(n, begin + chunk);
    if (begin < end) (*job)(begin, end, index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
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
  const int64_t chunk = ((units + parts - 1) / parts) * grain;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_ = num_threads_ - 1;
    ++generation_;
  }
  cv_start_.notify_all();
  fn(0, std::min(n, chunk), 0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

}  // namespace tessera

#define OMPI_SKIP_MPICXX 1
#include "comm/mpi_comm.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/env.h"

namespace tessera {
namespace {

std::string mpi_error(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(call) + " failed: " + std::string(text, static_cast<size_t>(len));
}

class MpiComm final : public DeviceComm {
 public:
  MpiComm(int rank, int size, const MpiCommOptions& o) : rank_(rank), size_(size), o_(o) {}
  ~MpiComm() override {
    // After a failed collective MPI_Finalize would wait for the peers that never came: the
    // process exits without it, and mpirun ends the job's other ranks.
    if (failed()) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "mpi"; }

  // All-gather then a rank-order sum: every rank gets bitwise the same result, and the same
  // result on every run (MPI_Allreduce's order is up to the library).
  Status all_reduce_sum(float* data, int64_t count) override {
    gather_.resize(static_cast<size_t>(count) * static_cast<size_t>(size_));
    MPI_Request req;
    int rc = MPI_Iallgather(data, static_cast<int>(count), MPI_FLOAT, gather_.data(), static_cast<int>(count),
                            MPI_FLOAT, MPI_COMM_WORLD, &req);
    TESSERA_RETURN_IF_ERROR(wait("MPI_Allgather", rc, req));
    for (int64_t i = 0; i < count; ++i) {
      float s = 0.0f;
      for (int r = 0; r < size_; ++r) s += gather_[static_cast<size_t>(r * count + i)];
      data[i] = s;
    }
    return Status::ok();
  }

  Status all_gather(const void* send, void* recv, int64_t bytes) override {
    MPI_Request req;
    const int rc = MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                                  MPI_COMM_WORLD, &req);
    return wait("MPI_Allgather", rc, req);
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    MPI_Request req;
    const int rc = MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    return wait("MPI_Bcast", rc, req);
  }

  Status barrier() override {
    MPI_Request req;
    const int rc = MPI_Ibarrier(MPI_COMM_WORLD, &req);
    return wait("MPI_Barrier", rc, req);
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!abort_.load()) abort_reason_ = reason;
    abort_.store(true);
  }
  bool failed() const override { return failed_ || abort_.load(); }

 private:
  // Polls the request: spinning first, then sleeping with backoff; fails on an MPI error, on
  // abort(), or after collective_timeout without an answer. A failed wait
  // leaves the request pending: the communicator is not used again (the shard exits).
  Status wait(const char* call, int rc, MPI_Request& req) {
    if (failed_) return Status::unavailable(std::string(call) + ": an earlier collective failed: " + first_error_);
    if (rc != MPI_SUCCESS) return fail(Status::unavailable(mpi_error(call, rc)));
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    std::chrono::microseconds nap{20};
    for (uint64_t polls = 0;; ++polls) {
      int done = 0;
      rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return fail(Status::unavailable(mpi_error(call, rc)));
      if (done) return Status::ok();
      if (abort_.load(std::memory_order_relaxed)) {
        std::lock_guard<std::mutex> lock(abort_mu_);
        return fail(Status::aborted(std::string(call) + " aborted: " + abort_reason_));
      }
      if ((polls & 63) != 0) continue;  // the clock is read every 64 polls
      const auto waited = Clock::now() - start;
      if (o_.collective_timeout.count() > 0 && waited > o_.collective_timeout)
        return fail(Status::deadline_exceeded(std::string(call) + ": no answer from every peer of the " +
                                              std::to_string(size_) + " ranks for " +
                                              std::to_string(o_.collective_timeout.count()) + " ms"));
      if (waited > o_.spin) {
        std::this_thread::sleep_for(nap);
        nap = std::min(nap * 2, o_.max_poll_sleep);
      }
    }
  }

  Status fail(Status s) {
    if (!failed_) first_error_ = s.message();
    failed_ = true;
    return s;
  }

  int rank_, size_;
  MpiCommOptions o_;
  std::vector<float> gather_;
  bool failed_ = false;  // the step thread's; failed() reads it from the same thread
  std::string first_error_;
  std::atomic<bool> abort_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
};

}  // namespace

bool launched_by_mpi() {
  return !env_string("OMPI_COMM_WORLD_SIZE", "").empty() || !env_string("PMIX_RANK", "").empty() ||
         !env_string("PMI_RANK", "").empty();
}

Result<std::unique_ptr<DeviceComm>> make_mpi_comm(const MpiCommOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS) return Status::unavailable(mpi_error("MPI_Init_thread", rc));
  }
  // Errors come back as codes, not aborts, so a failing peer gives a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<DeviceComm>(std::make_unique<MpiComm>(rank, size, options));
}

}  // namespace tessera

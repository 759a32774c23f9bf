#define OMPI_SKIP_MPICXX 1
#include "comm/mpi_comm.h"

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <string>
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
  MpiComm(int rank, int size) : rank_(rank), size_(size) {}
  ~MpiComm() override {
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
    const int rc = MPI_Allgather(data, static_cast<int>(count), MPI_FLOAT, gather_.data(), static_cast<int>(count),
                                 MPI_FLOAT, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return Status::unavailable(mpi_error("MPI_Allgather", rc));
    for (int64_t i = 0; i < count; ++i) {
      float s = 0.0f;
      for (int r = 0; r < size_; ++r) s += gather_[static_cast<size_t>(r * count + i)];
      data[i] = s;
    }
    return Status::ok();
  }

  Status all_gather(const void* send, void* recv, int64_t bytes) override {
    const int rc = MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE,
                                 MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status::ok() : Status::unavailable(mpi_error("MPI_Allgather", rc));
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    const int rc = MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status::ok() : Status::unavailable(mpi_error("MPI_Bcast", rc));
  }

  Status barrier() override {
    const int rc = MPI_Barrier(MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? Status::ok() : Status::unavailable(mpi_error("MPI_Barrier", rc));
  }

 private:
  int rank_, size_;
  std::vector<float> gather_;
};

}  // namespace

bool launched_by_mpi() {
  return !env_string("OMPI_COMM_WORLD_SIZE", "").empty() || !env_string("PMIX_RANK", "").empty() ||
         !env_string("PMI_RANK", "").empty();
}

Result<std::unique_ptr<DeviceComm>> make_mpi_comm() {
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
  return std::unique_ptr<DeviceComm>(std::make_unique<MpiComm>(rank, size));
}

}  // namespace tessera

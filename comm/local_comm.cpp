// SingleRankComm and InProcessComm.
#include <barrier>
#include <cstring>
#include <memory>
#include <mutex>

#include "comm/device_comm.h"

namespace tessera {
namespace {

class SingleRankComm final : public DeviceComm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view name() const override { return "single"; }
  Status all_reduce_sum(float*, int64_t) override { return Status::ok(); }
  Status all_gather(const void* send, void* recv, int64_t bytes) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(bytes));
    return Status::ok();
  }
  Status broadcast(void*, int64_t, int) override { return Status::ok(); }
  Status barrier() override { return Status::ok(); }
};

// Ranks exchange pointers through shared slots between two barriers: after the first barrier
// every rank's buffer is visible, each rank reads what it needs, and the second barrier keeps
// buffers alive until everyone has read them.
struct InProcessGroup {
  explicit InProcessGroup(int n) : size(n), sync(n), slots(static_cast<size_t>(n)) {}
  int size;
  std::barrier<> sync;
  std::vector<const void*> slots;
};

class InProcessComm final : public DeviceComm {
 public:
  InProcessComm(std::shared_ptr<InProcessGroup> g, int rank) : group_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::string_view name() const override { return "in-process"; }

  Status all_reduce_sum(float* data, int64_t count) override {
    scratch_.resize(static_cast<size_t>(count));
    publish(data);
    // Sum in rank order so every rank gets bitwise the same result.
    for (int64_t i = 0; i < count; ++i) {
      float s = 0.0f;
      for (int r = 0; r < group_->size; ++r) s += static_cast<const float*>(group_->slots[static_cast<size_t>(r)])[i];
      scratch_[static_cast<size_t>(i)] = s;
    }
    group_->sync.arrive_and_wait();
    std::memcpy(data, scratch_.data(), static_cast<size_t>(count) * sizeof(float));
    return Status::ok();
  }

  Status all_gather(const void* send, void* recv, int64_t bytes) override {
    publish(send);
    for (int r = 0; r < group_->size; ++r)
      std::memcpy(static_cast<uint8_t*>(recv) + r * bytes, group_->slots[static_cast<size_t>(r)], static_cast<size_t>(bytes));
    group_->sync.arrive_and_wait();
    return Status::ok();
  }

  Status broadcast(void* data, int64_t bytes, int root) override {
    publish(data);
    if (rank_ != root) std::memcpy(data, group_->slots[static_cast<size_t>(root)], static_cast<size_t>(bytes));
    group_->sync.arrive_and_wait();
    return Status::ok();
  }

  Status barrier() override {
    group_->sync.arrive_and_wait();
    return Status::ok();
  }

 private:
  void publish(const void* p) {
    group_->slots[static_cast<size_t>(rank_)] = p;
    group_->sync.arrive_and_wait();
  }
  std::shared_ptr<InProcessGroup> group_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<DeviceComm> make_single_rank_comm() { return std::make_unique<SingleRankComm>(); }

std::vector<std::unique_ptr<DeviceComm>> make_in_process_comms(int n) {
  auto group = std::make_shared<InProcessGroup>(n);
  std::vector<std::unique_ptr<DeviceComm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<InProcessComm>(group, r));
  return comms;
}

}  // namespace tessera

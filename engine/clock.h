// The time source the scheduler reads (LevelDB-style injected environment): production code
// passes SteadyClock, tests pass a ManualClock they move by hand, so no test sleeps.
//
// Thread-safety: SteadyClock is stateless. ManualClock is meant for one thread (the test's);
// now() and advance() are not synchronised.
#pragma once

#include <chrono>

namespace tessera {

class Clock {
 public:
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  // Monotonic: never goes backwards.
  virtual time_point now() const = 0;
};

class SteadyClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
  // A process-wide instance, for callers that do not need their own.
  static const SteadyClock& instance() {
    static const SteadyClock kClock;
    return kClock;
  }
};

// A clock that moves only when told to. Starts at `start` (default: one hour after the
// epoch, so that "start minus a wait" is still a valid, positive time point).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(time_point start = time_point{} + std::chrono::hours(1)) : now_(start) {}
  time_point now() const override { return now_; }
  // Precondition: d >= 0 (a clock never goes back).
  void advance(duration d) { now_ += d.count() > 0 ? d : duration::zero(); }
  void advance_ms(double ms) {
    advance(std::chrono::duration_cast<duration>(std::chrono::duration<double, std::milli>(ms)));
  }

 private:
  time_point now_;
};

}  // namespace tessera

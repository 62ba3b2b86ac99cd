// The real clock: the one place in softverbs that reads the system's clocks
// (see core/clock.hpp; tests/layout keeps it the only one).
#include "core/clock.hpp"

namespace softverbs {
namespace {

class RealClock final : public Clock {
 public:
  time_point now() const noexcept override { return std::chrono::steady_clock::now(); }
  timespec wall_now() const noexcept override {
    timespec ts{};
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts;
  }
};

}  // namespace

const Clock& real_clock() noexcept {
  // Never destroyed: the process's progress thread is detached and may still
  // read the clock while static destructors run at exit.
  static const RealClock* clock = new RealClock;
  return *clock;
}

}  // namespace softverbs

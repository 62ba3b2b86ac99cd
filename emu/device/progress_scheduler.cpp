// The progress thread (emu/device/progress.hpp) as a softverbs::Scheduler on the
// real clock: what the fault actions schedule on, and the scheduler of the
// process's fault engine (faults/process.hpp), whose timed rules run there.
//
// Both accessors live in this one file on purpose: the fault actions' use of
// progress_scheduler() is what brings this object into a static link, and with
// it the definition faults/process.cpp needs (the faults library comes after
// the emulator's on the link line).
#include "core/clock.hpp"
#include "emu/device/fault_actions.hpp"
#include "emu/device/progress.hpp"
#include "faults/process.hpp"

namespace softverbs::emu {
namespace {

class ProgressScheduler final : public Scheduler {
 public:
  const Clock& clock() const noexcept override { return real_clock(); }
  void post(Task f) override { Progress::instance().post(std::move(f)); }
  void at(Clock::time_point when, Task f) override { Progress::instance().after(when - clock().now(), std::move(f)); }
};

}  // namespace

Scheduler& progress_scheduler() {
  static ProgressScheduler scheduler;
  return scheduler;
}

}  // namespace softverbs::emu

softverbs::Scheduler& softverbs::faults::process_scheduler() { return emu::progress_scheduler(); }

// A one-shot deadline timer owned by an engine object (a QP, a CQ), built on a
// Scheduler so that real and virtual time drive it alike.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

#include "core/clock.hpp"

namespace softverbs::fabric {

// The owner may be destroyed while the timer is pending: detach() makes a later
// expiry a no-op and waits for a running callback to finish. Callbacks run on
// the scheduler's thread.
class EngineTimer : public std::enable_shared_from_this<EngineTimer> {
 public:
  EngineTimer(Scheduler& scheduler, std::function<void()> on_expiry);

  // Asks for a callback at `when` (or earlier, if already armed earlier).
  void arm_at(Clock::time_point when);
  // No callback runs after this returns. Must not be called with a lock the
  // callback takes.
  void detach();

 private:
  void expired(Clock::time_point when);
  void fire();

  Scheduler& scheduler_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::function<void()> on_expiry_;  // empty once detached
  Clock::time_point armed_for_{};
  bool armed_ = false;
};

}  // namespace softverbs::fabric

// EngineTimer over Scheduler::at. Scheduled tasks are never cancelled: a task
// whose deadline was superseded (the timer re-armed earlier, or fired and
// re-armed since) finds armed_for_ changed and does nothing.
#include "fabric/timer.hpp"

namespace softverbs::fabric {

EngineTimer::EngineTimer(Scheduler& scheduler, std::function<void()> on_expiry)
    : scheduler_(scheduler), on_expiry_(std::move(on_expiry)) {}

void EngineTimer::arm_at(Clock::time_point when) {
  {
    std::lock_guard lock(mu_);
    if (!on_expiry_) return;
    if (armed_ && armed_for_ <= when) return;  // an earlier expiry will re-check
    armed_ = true;
    armed_for_ = when;
  }
  // The task holds the timer alive; after detach() it only finds nothing to do.
  scheduler_.at(when, [self = shared_from_this(), when] { self->expired(when); });
}

void EngineTimer::expired(Clock::time_point when) {
  {
    std::lock_guard lock(mu_);
    if (!armed_ || armed_for_ != when) return;  // superseded by a later arm_at
    armed_ = false;
  }
  fire();
}

void EngineTimer::fire() {
  // run_mu_ is held across the callback so that detach() returns only once no
  // callback runs or will run; mu_ is not, so the callback may re-arm.
  std::lock_guard run(run_mu_);
  std::function<void()> f;
  {
    std::lock_guard lock(mu_);
    f = on_expiry_;
  }
  if (f) f();
}

void EngineTimer::detach() {
  std::lock_guard run(run_mu_);
  std::lock_guard lock(mu_);
  on_expiry_ = nullptr;
  armed_ = false;
}

}  // namespace softverbs::fabric

// Virtual time for unit tests: a clock that moves only when the test moves it,
// and a scheduler that queues tasks and runs them only when the test says so,
// each at its moment of that clock (core/clock.hpp). Nothing here reads the
// system clocks, so timers of minutes cost no wall time.
#pragma once

#include <chrono>
#include <map>
#include <mutex>

#include "core/clock.hpp"

namespace softverbs::fake {

class ManualClock final : public Clock {
 public:
  time_point now() const noexcept override {
    std::lock_guard lock(mu_);
    return now_;
  }
  // The same moment on a calendar that starts at the epoch.
  timespec wall_now() const noexcept override {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now().time_since_epoch()).count();
    return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  }
  void advance(duration d) { set(now() + d); }
  void set(time_point t) {
    std::lock_guard lock(mu_);
    now_ = t;
  }

 private:
  mutable std::mutex mu_;  // a scheduler may run on another thread than the test
  time_point now_{std::chrono::seconds(1000)};
};

// Tasks wait in a queue ordered by their moment (ties in the order posted).
// run_due() runs those whose moment has come; run_until() also moves the clock,
// to each task's moment in turn, so every task sees the time it asked for.
// Tasks run on the calling thread without the queue's lock: they may post more.
class ManualScheduler final : public Scheduler {
 public:
  explicit ManualScheduler(ManualClock& clock) : clock_(clock) {}
  const Clock& clock() const noexcept override { return clock_; }
  void post(Task f) override { at(clock_.now(), std::move(f)); }
  void at(Clock::time_point when, Task f) override {
    std::lock_guard lock(mu_);
    queue_.emplace(when, std::move(f));
  }

  void run_due() { run_until(clock_.now()); }
  void run_until(Clock::time_point until) {
    while (run_next(until)) {
    }
    if (clock_.now() < until) clock_.set(until);
  }
  void advance(Clock::duration d) { run_until(clock_.now() + d); }

  size_t pending() const {
    std::lock_guard lock(mu_);
    return queue_.size();
  }

 private:
  // Runs the earliest task due by `until`, first moving the clock to its moment.
  bool run_next(Clock::time_point until) {
    Task f;
    {
      std::lock_guard lock(mu_);
      if (queue_.empty() || queue_.begin()->first > until) return false;
      auto it = queue_.begin();
      if (it->first > clock_.now()) clock_.set(it->first);
      f = std::move(it->second);
      queue_.erase(it);
    }
    f();
    return true;
  }

  ManualClock& clock_;
  mutable std::mutex mu_;
  std::multimap<Clock::time_point, Task> queue_;
};

}  // namespace softverbs::fake

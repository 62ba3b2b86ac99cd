// The real-time Scheduler: the background progress thread (docs/architecture.md,
// "Progress, threads and speed").
//
// Protocol work runs inline in whichever application thread calls into the
// engine (post_send runs the requester, poll_cq drains the device's link). This
// thread covers what no application call would: packets arriving while the
// application blocks in ibv_get_cq_event or does other work, and the transport
// timers (local ACK timeout, RNR wait). It is a Boost.Asio io_context run by one
// thread, started on first use, over softverbs::real_clock().
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/clock.hpp"

namespace softverbs::fabric {

class RealTimeScheduler final : public Scheduler {
 public:
  RealTimeScheduler();
  // Stops the thread; tasks not yet run are dropped.
  ~RealTimeScheduler() override;
  // Stops the thread now (joins it): no task, timer or watch runs once this
  // returns, and later ones never do. For an owner that must destroy what the
  // watches call before the scheduler, which its destructors still use.
  void stop();
  RealTimeScheduler(const RealTimeScheduler&) = delete;
  RealTimeScheduler& operator=(const RealTimeScheduler&) = delete;

  // The process's progress engine (lives until exit: other threads may still post).
  static RealTimeScheduler& instance();

  const Clock& clock() const noexcept override { return clock_; }
  void post(Task f) override;
  void at(Clock::time_point when, Task f) override;

  // Application threads' hints (Scheduler::note_busy, idle_poll,
  // note_may_block, wait_readable): this scheduler runs no engine work in
  // them, but a link may lend its peers a wake-up lease while an application
  // thread polls (fabric/host_link.hpp), which must end when that thread goes
  // off to work (note_busy: the lease for everything but the answers to its
  // own requests) or may block (note_may_block, wait_readable: every lease),
  // after hold_leases() said some may be held.
  void note_busy() override;
  void note_may_block() override;
  void wait_readable(int fd) override;
  // Whether application threads' hints reach this scheduler: false for the
  // process's instance when the process runs on virtual time (the hints go to
  // the virtual scheduler then).
  bool hears_applications() const;
  class LeaseHolder {
   public:
    // On an application thread: end the lease (its peers wake it again), and
    // the lease for answers too if answers_too.
    virtual void end_lease(bool answers_too) = 0;

   protected:
    ~LeaseHolder() = default;
  };
  void add_lease_holder(LeaseHolder* h);
  void remove_lease_holder(LeaseHolder* h);
  // A holder took a lease: the next note_busy() ends them, the next
  // note_may_block()/wait_readable() them and their answer leases.
  void hold_leases() noexcept {
    answer_leases_held_.store(true, std::memory_order_seq_cst);
    leases_held_.store(true, std::memory_order_seq_cst);
  }

  // Calls on_ready on the engine's thread whenever fd becomes readable, for the
  // rest of this scheduler's life; on_ready drains fd (non-blocking). The wait
  // is queued again before on_ready runs, so a datagram that lands after the
  // drain's last read raises a new readiness edge. fd stays the caller's.
  void watch_readable(int fd, std::function<void()> on_ready);

 private:
  struct Engine;
  void ensure_started();

  const Clock& clock_;
  std::unique_ptr<Engine> engine_;
  std::once_flag started_;
  bool process_wide_ = false;  // instance(): never destroyed, its thread detached
  std::atomic<bool> leases_held_{false};
  std::atomic<bool> answer_leases_held_{false};
  std::mutex holders_mu_;
  std::vector<LeaseHolder*> holders_;
};

// The scheduler (and with it the clock) of the process's engine, chosen once by
// SOFTVERBS_CLOCK: RealTimeScheduler::instance() by default, or
// VirtualScheduler::instance() (fabric/virtual_time.hpp) for `virtual`. The
// links to other processes (UDP, the same-host path) watch their sockets on
// RealTimeScheduler::instance() in either case.
Scheduler& process_scheduler();
// Whether process_scheduler() is the virtual one.
bool virtual_clock();

}  // namespace softverbs::fabric

// Time, as the engine sees it: a Clock to read and a Scheduler to run work at a
// moment of that clock.
//
// Every time read in softverbs goes through a Clock, and every timer through a
// Scheduler, so that a simulated fabric can replace real time with virtual time
// (the transport's ACK and RNR timers then cost no wall time) without touching
// protocol code. core/clock.cpp holds the only reads of the system's clocks in
// the tree; tests/layout checks that it stays so.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <functional>

namespace softverbs {

class Clock {
 public:
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;

  // Monotonic time: what every timeout, retry and delay is measured against.
  virtual time_point now() const noexcept = 0;
  // Calendar time (CLOCK_REALTIME), only for timestamps a user reads against
  // other programs' clocks: packet captures and completion timestamps.
  virtual timespec wall_now() const noexcept = 0;
};

// The process's real clock (std::chrono::steady_clock and CLOCK_REALTIME).
const Clock& real_clock() noexcept;

// Nanoseconds since the epoch of a wall-clock reading.
inline uint64_t to_ns(const timespec& ts) noexcept {
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Runs engine work on the engine's own thread (real time: the progress thread;
// virtual time: the simulation loop), now or at a moment of its clock.
class Scheduler {
 public:
  using Task = std::function<void()>;

  virtual ~Scheduler() = default;

  virtual const Clock& clock() const noexcept = 0;
  // Runs f soon, on the engine's thread.
  virtual void post(Task f) = 0;
  // Runs f on the engine's thread once clock().now() has reached `when`
  // (one-shot, never cancelled: f must only touch what outlives it, or check
  // that it still exists).
  virtual void at(Clock::time_point when, Task f) = 0;
  void after(Clock::duration delay, Task f) { at(clock().now() + delay, std::move(f)); }

  // What application threads tell the engine about themselves, for a scheduler
  // that runs engine work in those threads and moves its clock on when they all
  // wait (virtual time, docs/simulation.md). A scheduler with a thread of its own
  // ignores them, so these defaults do nothing.
  //
  // The calling thread polled an empty CQ: a hint that it is idle until its next
  // note_busy(). The scheduler may run engine work here.
  virtual void idle_poll() {}
  // The calling thread does work (it posts, or a poll found completions).
  virtual void note_busy() {}
  // The calling thread armed a completion channel (ibv_req_notify_cq): it may
  // block next, maybe outside the library (a poll() of the channel's fd).
  virtual void note_may_block() {}
  // The calling thread is about to block until fd becomes readable (the read in
  // ibv_get_cq_event, ibv_get_async_event, rdma_get_cm_event): returns once it
  // is readable, having run engine work meanwhile. The default returns at once
  // and the caller's read blocks.
  virtual void wait_readable(int fd) { (void)fd; }
};

}  // namespace softverbs

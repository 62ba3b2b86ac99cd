// Virtual time (SOFTVERBS_CLOCK=virtual, docs/simulation.md): a clock that
// stands still while anything can run, and a scheduler that runs engine work in
// the application's own threads and, once every application thread waits, moves
// the clock to the next deadline and fires it. The transport then behaves as
// under real time (same statuses, same packets) without waiting, and a
// single-threaded program on the devices of one process runs the same way on
// every run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "core/clock.hpp"

namespace softverbs::fabric {

// Time as the virtual scheduler moves it: now() starts at a fixed point and
// changes only in advance_to(); wall_now() is a fixed epoch (2026-01-01 00:00:00
// UTC) plus the same elapsed time, so completion and capture timestamps repeat
// from run to run. Once follow_real_time() is called (traffic with another
// process) the clock also runs with real time from where it stood: it then
// never moves slower than real time, so no timer fires early in real terms.
class VirtualClock final : public Clock {
 public:
  static constexpr int64_t kWallEpochSec = 1767225600;
  static constexpr time_point kStart = time_point(std::chrono::seconds(1000));

  time_point now() const noexcept override { return kStart + std::chrono::nanoseconds(elapsed_ns()); }
  timespec wall_now() const noexcept override;
  // Nanoseconds since the start.
  int64_t elapsed_ns() const noexcept;
  // Moves the clock forward to t (never back).
  void advance_to(time_point t) noexcept;
  // From now on the clock runs with real time too (idempotent).
  void follow_real_time() noexcept;
  bool follows_real_time() const noexcept { return real_.load(std::memory_order_acquire); }

 private:
  std::atomic<int64_t> ns_{0};
  std::atomic<bool> real_{false};
  int64_t real_base_ns_ = 0;         // ns_ when it started following real time
  Clock::time_point real_anchor_{};  // and the real clock then
};

class VirtualScheduler final : public Scheduler {
 public:
  // `watch_silence`: how long (real time) no application thread may enter the
  // library before the watch thread takes every thread for idle (0: no watch
  // thread, for tests that drive the scheduler by hand).
  explicit VirtualScheduler(std::chrono::milliseconds watch_silence = kWatchSilence);
  // Stops the watch thread; tasks not yet run are dropped.
  ~VirtualScheduler() override;
  VirtualScheduler(const VirtualScheduler&) = delete;
  VirtualScheduler& operator=(const VirtualScheduler&) = delete;

  // The process's virtual scheduler (lives until exit).
  static VirtualScheduler& instance();

  static constexpr std::chrono::milliseconds kWatchSilence{5};

  const VirtualClock& clock() const noexcept override { return clock_; }
  void post(Task f) override;
  void at(Clock::time_point when, Task f) override;
  void idle_poll() override;
  void note_busy() override;
  void wait_readable(int fd) override;

  // A device context was opened (true) or closed (false). Once the process has
  // opened one, the watch thread takes no step while none is open: a program
  // that has closed its devices waits for nothing of theirs, and a timer still
  // pending then (a delayed packet) must not fire at a moment that depends on
  // how long the program takes to exit.
  void note_context(bool opened) noexcept;

  // Traffic with another process went out or came in (fabric/outside_link.hpp):
  // from now on the clock runs with real time and never jumps, so a peer that
  // answers in real time is never timed out early.
  void note_outside();
  bool paced() const noexcept { return clock_.follows_real_time(); }

  // One step, in the calling thread: runs the queued work and the timers that
  // are due; if none was and `may_jump`, moves the clock to the earliest
  // deadline and runs what is due then. True if anything ran. *wait_for (if
  // given) gets how long real time must pass until the next deadline when the
  // clock follows real time (zero otherwise).
  bool step(bool may_jump, Clock::duration* wait_for = nullptr);
  // Whether every application thread known to the scheduler is idle: blocked
  // in wait_readable() on an fd that is not readable, or past an empty poll
  // with no work run since (a thread last seen busy counts as idle only if
  // `busy_waits`).
  static bool all_idle(bool busy_waits = false) noexcept;
  // Whether the clock may move: every known thread idle, or the busy ones
  // silent for long (see watch_loop()).
  bool may_jump() const noexcept;
  // Whether a task or a timer waits.
  bool has_work();

 private:
  struct Entry {
    Clock::time_point when;
    uint64_t seq;  // equal deadlines run in the order they were asked for
    mutable Task task;
    bool operator>(const Entry& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  bool run_one();
  void wake();
  void watch_loop();

  VirtualClock clock_;
  std::mutex mu_;  // guards ready_, timers_, next_seq_
  std::deque<Task> ready_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> timers_;
  uint64_t next_seq_ = 0;

  // Engine work runs in one thread at a time, in queue order.
  std::mutex step_mu_;

  // Threads blocked in wait_readable() poll this eventfd too: new work wakes them.
  int wake_fd_ = -1;
  std::atomic<int> waiters_{0};

  // Library entries by application threads; the watch thread steps after a
  // whole silence without one.
  std::atomic<uint64_t> activity_{0};
  std::atomic<uint64_t> busy_activity_{0};  // posts and polls that found completions
  std::atomic<bool> stale_busy_{false};     // no busy activity for a long silence
  std::atomic<int> contexts_{0};            // device contexts open (note_context())
  std::atomic<bool> opened_{false};         // whether one ever was
  std::mutex pace_mu_;                      // note_outside(): once
  std::chrono::milliseconds silence_;
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool stopping_ = false;
  std::atomic<bool> watch_sleeping_{false};  // the watch thread waits for work
  std::once_flag watch_started_;
  std::thread watcher_;
  bool process_wide_ = false;
};

}  // namespace softverbs::fabric

// The virtual clock and scheduler (fabric/virtual_time.hpp, docs/simulation.md).
//
// Engine work (tasks and due timers) runs in the application thread that
// reaches an idle point: an empty poll of a CQ (Scheduler::idle_poll) or a
// blocking read of an event fd (Scheduler::wait_readable). One step runs every
// task and due timer in queue order until none is left; only a step that found
// nothing to run, taken while every known application thread is idle, moves the
// clock, to the earliest deadline, and runs what is due then. So a single
// application thread sees its engine work in the same order on every run.
//
// A thread is known from its first idle point on; it is idle after an empty
// poll until it posts or a poll finds completions, and for the whole of a
// blocking read. An application thread that waits where the library cannot see
// it (poll(2) on a completion channel's fd, a sleep) is covered by the watch
// thread: after kWatchSilence of real time without any library call it runs
// a step if every known thread is idle. A thread last seen busy stops holding
// the clock once no thread has posted or found a completion for
// kLongSilencePeriods watch periods.
#include "fabric/virtual_time.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/log.hpp"

namespace softverbs::fabric {
namespace {

// Silence (real time, in watch periods) after which the watch thread moves the
// clock although some thread was last seen busy: it then waits where the
// library cannot see it (poll(2) on an event fd right after posting).
constexpr int kLongSilencePeriods = 10;

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL));
}

// Steps that ran work, process-wide. An empty poll counts as idle only until
// the next such step: the work may have completed something the polling thread
// has not seen yet, and time must not move before it looks.
std::atomic<uint64_t> g_work_epoch{0};

// The application threads known to the scheduler (process-wide), each with
// what it was last seen doing.
enum : int { kBusy, kPolledEmpty, kBlocked };
struct ThreadSlot;
std::mutex g_threads_mu;
std::vector<ThreadSlot*>* g_threads = new std::vector<ThreadSlot*>;  // never destroyed: threads exit late

struct ThreadSlot {
  std::atomic<int> state{kBusy};
  std::atomic<uint64_t> polled_at{0};  // g_work_epoch at its last empty poll
  std::atomic<int> wait_fd{-1};        // kBlocked: the fd it waits for
  bool known = false;

  void join() {
    if (known) return;
    known = true;
    std::lock_guard lock(g_threads_mu);
    g_threads->push_back(this);
  }
  ~ThreadSlot() {
    if (!known) return;
    std::lock_guard lock(g_threads_mu);
    std::erase(*g_threads, this);
  }
  void polled_empty() {
    join();
    polled_at.store(g_work_epoch.load());
    state.store(kPolledEmpty);
  }
  void blocked_on(int fd) {
    join();
    wait_fd.store(fd);
    state.store(kBlocked);
  }
  void busy() {
    join();
    state.store(kBusy);
    wait_fd.store(-1);
  }
};
thread_local ThreadSlot t_slot;
// Set while the thread runs engine work: a task never waits for more of it.
thread_local bool t_in_step = false;

}  // namespace

timespec VirtualClock::wall_now() const noexcept {
  const int64_t ns = elapsed_ns();
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(kWallEpochSec + ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  return ts;
}

int64_t VirtualClock::elapsed_ns() const noexcept {
  const int64_t ns = ns_.load(std::memory_order_acquire);
  if (!follows_real_time()) return ns;
  const int64_t real =
      real_base_ns_ + std::chrono::duration_cast<std::chrono::nanoseconds>(real_clock().now() - real_anchor_).count();
  return std::max(ns, real);
}

void VirtualClock::follow_real_time() noexcept {
  if (follows_real_time()) return;
  real_base_ns_ = ns_.load();
  real_anchor_ = real_clock().now();
  real_.store(true, std::memory_order_release);
}

void VirtualClock::advance_to(time_point t) noexcept {
  const int64_t target = std::chrono::duration_cast<std::chrono::nanoseconds>(t - kStart).count();
  int64_t cur = ns_.load(std::memory_order_relaxed);
  while (target > cur && !ns_.compare_exchange_weak(cur, target, std::memory_order_acq_rel)) {
  }
}

VirtualScheduler::VirtualScheduler(std::chrono::milliseconds watch_silence) : silence_(watch_silence) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category());
}

VirtualScheduler::~VirtualScheduler() {
  {
    std::lock_guard lock(watch_mu_);
    stopping_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  ::close(wake_fd_);
}

VirtualScheduler& VirtualScheduler::instance() {
  static VirtualScheduler* s = [] {
    auto* p = new VirtualScheduler;  // lives until exit: other threads may still post
    p->process_wide_ = true;
    return p;
  }();
  return *s;
}

void VirtualScheduler::post(Task f) {
  {
    std::lock_guard lock(mu_);
    ready_.push_back(std::move(f));
  }
  wake();
}

void VirtualScheduler::at(Clock::time_point when, Task f) {
  {
    std::lock_guard lock(mu_);
    timers_.push({when, next_seq_++, std::move(f)});
  }
  wake();
}

// New work: a thread blocked in wait_readable() may run it, and the watch
// thread (started here, on the first work) watches for silence again.
void VirtualScheduler::wake() {
  if (waiters_.load() > 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }
  if (silence_.count() == 0) return;
  std::call_once(watch_started_, [this] {
    watcher_ = std::thread([this] { watch_loop(); });
    // The process's scheduler is never destroyed: its thread must not keep
    // exit waiting.
    if (process_wide_) watcher_.detach();
  });
  // The watch thread sets watch_sleeping_ before it looks at the queue, and
  // the work was queued before this load: it either saw the work or is woken.
  if (watch_sleeping_.load()) {
    std::lock_guard lock(watch_mu_);
    watch_sleeping_.store(false);
    watch_cv_.notify_one();
  }
}

bool VirtualScheduler::has_work() {
  std::lock_guard lock(mu_);
  return !ready_.empty() || !timers_.empty();
}

bool VirtualScheduler::all_idle(bool busy_waits) noexcept {
  const uint64_t epoch = g_work_epoch.load();
  std::lock_guard lock(g_threads_mu);
  for (const ThreadSlot* t : *g_threads) {
    switch (t->state.load()) {
      case kBusy:
        if (!busy_waits) return false;
        break;
      case kPolledEmpty:
        if (t->polled_at.load() != epoch) return false;  // has not looked since the last work
        break;
      case kBlocked: {
        const int fd = t->wait_fd.load();
        if (fd >= 0 && readable(fd)) return false;  // woken, not yet running
        break;
      }
    }
  }
  return true;
}

bool VirtualScheduler::run_one() {
  Task t;
  {
    std::lock_guard lock(mu_);
    if (!ready_.empty()) {
      t = std::move(ready_.front());
      ready_.pop_front();
    } else if (!timers_.empty() && timers_.top().when <= clock_.now()) {
      t = std::move(timers_.top().task);
      timers_.pop();
    } else {
      return false;
    }
  }
  t();
  return true;
}

bool VirtualScheduler::step(bool may_jump, Clock::duration* wait_for) {
  if (wait_for) *wait_for = Clock::duration::zero();
  struct InStep {
    InStep() { t_in_step = true; }
    ~InStep() { t_in_step = false; }
  } in_step;
  bool ran = false;
  while (run_one()) ran = true;
  if (ran) g_work_epoch.fetch_add(1);
  // The clock moves only when nothing could run, so whatever the work did is
  // seen by the application before time passes.
  if (ran || !may_jump) return ran;
  Clock::time_point when;
  {
    std::lock_guard lock(mu_);
    if (timers_.empty()) return false;
    when = timers_.top().when;
  }
  if (paced()) {
    // Following real time: no jumps; the deadline comes when real time does.
    const Clock::time_point now = clock_.now();
    if (when > now) {
      if (wait_for) *wait_for = when - now;
      return false;
    }
  }
  clock_.advance_to(when);
  while (run_one()) ran = true;
  if (ran) g_work_epoch.fetch_add(1);
  return ran;
}

bool VirtualScheduler::may_jump() const noexcept { return all_idle(stale_busy_.load()); }

void VirtualScheduler::note_context(bool opened) noexcept {
  if (opened) opened_.store(true);
  contexts_.fetch_add(opened ? 1 : -1);
}

void VirtualScheduler::idle_poll() {
  if (!t_in_step) t_slot.polled_empty();
  activity_.fetch_add(1, std::memory_order_relaxed);
  if (t_in_step) return;
  std::unique_lock lock(step_mu_, std::try_to_lock);
  if (!lock) return;  // another thread runs the engine's work
  step(may_jump());
}

void VirtualScheduler::note_busy() {
  if (t_in_step) return;
  if (t_slot.state.load(std::memory_order_relaxed) != kBusy || !t_slot.known) t_slot.busy();
  activity_.fetch_add(1, std::memory_order_relaxed);
  busy_activity_.fetch_add(1, std::memory_order_relaxed);
  if (stale_busy_.load(std::memory_order_relaxed)) stale_busy_.store(false);
}

void VirtualScheduler::wait_readable(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK)) {
    idle_poll();  // a read that does not block is a poll
    return;
  }
  if (t_in_step) return;
  t_slot.blocked_on(fd);
  activity_.fetch_add(1, std::memory_order_relaxed);
  while (!readable(fd)) {
    Clock::duration pause{};
    bool ran;
    {
      std::lock_guard lock(step_mu_);
      ran = step(may_jump(), &pause);
    }
    if (ran) continue;
    // Nothing to run: block until fd is readable or work is queued (or, when
    // the clock follows real time, until the next deadline). waiters_ is
    // raised before the queue is checked, so a post in between writes the
    // wake fd.
    waiters_.fetch_add(1);
    if (!has_work() || pause > Clock::duration::zero() || !may_jump()) {
      pollfd fds[2] = {{fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      int timeout = -1;
      if (pause > Clock::duration::zero())
        timeout = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(pause).count());
      if (::poll(fds, 2, timeout) > 0 && (fds[1].revents & POLLIN)) {
        uint64_t v;
        [[maybe_unused]] ssize_t n = ::read(wake_fd_, &v, sizeof v);
      }
    }
    waiters_.fetch_sub(1);
  }
  t_slot.busy();
}

void VirtualScheduler::note_outside() {
  if (paced()) return;
  // Once: the first packet across makes the clock follow real time. Two
  // threads may get here together; follow_real_time() is guarded by this mutex.
  std::lock_guard lock(pace_mu_);
  if (paced()) return;
  clock_.follow_real_time();
  SV_LOG(kInfo, "virtual clock: traffic with another process; the clock follows real time from now on");
}

// The watch thread: one step per period of silence (no library call by any
// application thread), so engine work and timers go on while the application
// waits where the library cannot see it. It also notices busy threads that
// stopped working: no post and no completion found by any thread for
// kLongSilencePeriods periods (a thread that posted and then waits on
// something of its own) no longer holds the clock.
void VirtualScheduler::watch_loop() {
  uint64_t seen = activity_.load();
  uint64_t seen_busy = busy_activity_.load();
  int busy_silent = 0;
  std::unique_lock lock(watch_mu_);
  while (!stopping_) {
    watch_sleeping_.store(true);
    if (!has_work()) watch_cv_.wait(lock, [this] { return stopping_ || !watch_sleeping_.load(); });
    watch_sleeping_.store(false);
    if (stopping_) break;
    watch_cv_.wait_for(lock, silence_);
    if (stopping_) break;
    const uint64_t busy = busy_activity_.load();
    if (busy != seen_busy) {
      seen_busy = busy;
      busy_silent = 0;
    } else if (++busy_silent >= kLongSilencePeriods) {
      stale_busy_.store(true);
    }
    const uint64_t now = activity_.load();
    if (now != seen) {
      seen = now;
      continue;
    }
    lock.unlock();
    {
      // A thread last seen busy may be computing: its work is left to it
      // until it has been silent that long, so that it meets its results in
      // the same order on every run.
      // And none once every device context has been closed (note_context()).
      std::unique_lock step_lock(step_mu_, std::try_to_lock);
      const bool all_closed = opened_.load() && contexts_.load() <= 0;
      if (step_lock && !all_closed && may_jump()) step(true);
    }
    lock.lock();
  }
}

}  // namespace softverbs::fabric

// The real-time scheduler: one Asio io_context, one thread, and a timer queue
// served by a single Asio timer (see at()).
#include "fabric/scheduler.hpp"

#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <algorithm>
#include <cstring>
#include <queue>
#include <thread>
#include <vector>

#include "core/env.hpp"
#include "core/log.hpp"
#include "fabric/thread_slice.hpp"
#include "fabric/virtual_time.hpp"
#include "faults/process.hpp"

namespace softverbs::fabric {

struct RealTimeScheduler::Engine {
  struct Entry {
    Clock::time_point when;
    uint64_t seq;  // equal deadlines run in the order they were asked for
    mutable Task task;
    bool operator>(const Entry& o) const { return when != o.when ? when > o.when : seq > o.seq; }
  };
  struct Watch {
    boost::asio::posix::stream_descriptor fd;
    std::function<void()> on_ready;
  };

  explicit Engine(const Clock& c) : clock(c) {}

  void rearm();
  void run_due();
  void arm(Watch* w);

  const Clock& clock;
  boost::asio::io_context io;
  std::thread thread;

  // The timer queue (mu guards the heap and kick_pending); `timer` and its
  // deadline are touched only on the engine's thread, as Asio timers are not
  // thread-safe.
  std::mutex mu;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  uint64_t next_seq = 0;
  bool kick_pending = false;
  boost::asio::steady_timer timer{io};

  std::vector<std::unique_ptr<Watch>> watches;  // engine's thread only; destroyed before io
};

RealTimeScheduler::RealTimeScheduler() : clock_(real_clock()), engine_(std::make_unique<Engine>(clock_)) {}

RealTimeScheduler::~RealTimeScheduler() { stop(); }

void RealTimeScheduler::stop() {
  engine_->io.stop();
  if (engine_->thread.joinable()) engine_->thread.join();
}

RealTimeScheduler& RealTimeScheduler::instance() {
  static RealTimeScheduler* s = [] {
    auto* p = new RealTimeScheduler;  // lives until exit: other threads may still post
    p->process_wide_ = true;
    return p;
  }();
  return *s;
}


void RealTimeScheduler::ensure_started() {
  std::call_once(started_, [this] {
    engine_->thread = std::thread([e = engine_.get()] {
      // The slice SOFTVERBS_PROGRESS_SLICE asks for, if any
      // (fabric/thread_slice.hpp).
      request_progress_slice();
      auto guard = boost::asio::make_work_guard(e->io);
      for (;;) {
        try {
          e->io.run();
          break;
        } catch (const std::exception& ex) {
          SV_LOG(kError, "progress thread: %s", ex.what());
        }
      }
    });
    // The process's engine is never destroyed: its thread must not keep exit
    // waiting (a scheduler that is destroyed joins it instead).
    if (process_wide_) engine_->thread.detach();
  });
}

void RealTimeScheduler::post(Task f) {
  ensure_started();
  boost::asio::post(engine_->io, std::move(f));
}

// Deadlines wait in one heap served by one Asio timer: asking for a moment costs
// a heap push, and a post only when it becomes the earliest deadline. Entries
// are never cancelled (see Scheduler::at).
void RealTimeScheduler::at(Clock::time_point when, Task f) {
  ensure_started();
  Engine& e = *engine_;
  bool kick = false;
  {
    std::lock_guard lock(e.mu);
    const uint64_t seq = e.next_seq++;
    e.heap.push({when, seq, std::move(f)});
    if (e.heap.top().seq == seq && !e.kick_pending) kick = e.kick_pending = true;
  }
  if (kick) boost::asio::post(e.io, [&e] { e.rearm(); });
}

void RealTimeScheduler::Engine::rearm() {
  Clock::time_point next;
  {
    std::lock_guard lock(mu);
    kick_pending = false;
    if (heap.empty()) return;
    next = heap.top().when;
  }
  // Setting the expiry cancels the wait in place (its handler sees an error).
  timer.expires_at(next);
  timer.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) run_due();
  });
}

void RealTimeScheduler::Engine::run_due() {
  for (;;) {
    Task f;
    {
      std::lock_guard lock(mu);
      if (heap.empty() || heap.top().when > clock.now()) break;
      f = std::move(heap.top().task);
      heap.pop();
    }
    f();
  }
  rearm();
}

void RealTimeScheduler::note_busy() {
  // One load on the posting and polling paths while nobody holds a lease.
  if (!leases_held_.load(std::memory_order_relaxed) || !leases_held_.exchange(false, std::memory_order_seq_cst)) return;
  std::lock_guard lock(holders_mu_);
  for (LeaseHolder* h : holders_) h->end_lease(false);
}

void RealTimeScheduler::note_may_block() {
  if (!answer_leases_held_.load(std::memory_order_relaxed) ||
      !answer_leases_held_.exchange(false, std::memory_order_seq_cst))
    return;
  leases_held_.store(false, std::memory_order_seq_cst);
  std::lock_guard lock(holders_mu_);
  for (LeaseHolder* h : holders_) h->end_lease(true);
}

// About to block on an event fd: whatever the thread polled, it polls no more.
void RealTimeScheduler::wait_readable(int /*fd*/) { note_may_block(); }

bool RealTimeScheduler::hears_applications() const { return !process_wide_ || &process_scheduler() == this; }

void RealTimeScheduler::add_lease_holder(LeaseHolder* h) {
  std::lock_guard lock(holders_mu_);
  holders_.push_back(h);
}

void RealTimeScheduler::remove_lease_holder(LeaseHolder* h) {
  std::lock_guard lock(holders_mu_);
  std::erase(holders_, h);
}

void RealTimeScheduler::watch_readable(int fd, std::function<void()> on_ready) {
  post([e = engine_.get(), fd, on_ready = std::move(on_ready)]() mutable {
    // Wrap a duplicate so Asio owns (and may close) its own descriptor.
    int own = ::dup(fd);
    if (own < 0) return;
    e->watches.push_back(std::make_unique<Engine::Watch>(Engine::Watch{boost::asio::posix::stream_descriptor(e->io, own), std::move(on_ready)}));
    e->arm(e->watches.back().get());
  });
}

void RealTimeScheduler::Engine::arm(Watch* w) {
  // Queued before the drain, so a datagram that lands after the drain's last
  // read raises a new readiness edge for this wait.
  w->fd.async_wait(boost::asio::posix::stream_descriptor::wait_read, [this, w](const boost::system::error_code& ec) {
    if (ec) return;
    arm(w);
    w->on_ready();
  });
}

}  // namespace softverbs::fabric

namespace softverbs::fabric {

bool virtual_clock() {
  static const bool on = [] {
    const char* v = env::clock();
    if (!v || !*v || std::strcmp(v, "real") == 0) return false;
    if (std::strcmp(v, "virtual") == 0) {
      // A real device has real time: with only the hw backend there is nothing
      // to simulate, and the fault engine's timed rules keep the real clock.
      const char* backend = env::backend();
      if (backend && std::strcmp(backend, "hw") == 0) {
        SV_LOG(kWarn, "SOFTVERBS_CLOCK=virtual: SOFTVERBS_BACKEND=hw has no emulated devices; using real");
        return false;
      }
      return true;
    }
    SV_LOG(kError, "SOFTVERBS_CLOCK=%s: expected real or virtual; using real", v);
    return false;
  }();
  return on;
}

Scheduler& process_scheduler() {
  if (virtual_clock()) return VirtualScheduler::instance();
  return RealTimeScheduler::instance();
}

}  // namespace softverbs::fabric

// The scheduler the process's fault engine runs its timed rules on
// (faults/process.hpp): the process's. Defined in this object on purpose: the
// emulated devices' use of process_scheduler() is what brings this object into
// a static link, and with it this definition, which faults/process.cpp needs
// although the faults library comes after this one on the link line.
softverbs::Scheduler& softverbs::faults::process_scheduler() { return fabric::process_scheduler(); }

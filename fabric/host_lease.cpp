// HostLink's wake-up leases (see host_link.hpp): an application thread that
// polls the rings lends their senders a lease, so that they leave out the
// wake-up of a progress thread that would only find its poller's packets
// taken; its end (note_busy; note_may_block, wait_readable, which end the
// lease for answers too) and its running out (a timer);
// and the time an application thread's poll reads for it.
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "fabric/host_link.hpp"

namespace softverbs::fabric {
namespace {

// A lease's length: a thread that stops polling without posting, finding a
// completion or blocking (an answer: without blocking) leaves a packet that
// came meanwhile waiting at most this long; while it polls, the progress
// thread wakes once per lease to renew its timer.
constexpr auto kLease = std::chrono::milliseconds(1);
// A sender leaves a wake-up out only if the lease lasts this much longer than
// its own clock says, so that the receiver's timer, which looks at the rings
// once the lease is over, finds what it put.
constexpr auto kLeaseMargin = std::chrono::microseconds(5);
// How many times a thread ending its lease reads the rings itself (each look
// takes up to kPerRing records of every ring).
constexpr int kEndLooks = 2;

// While a lease lasts, an application thread reads the clock for
// poll_shared() once every this many polls and reuses the time it read in
// between: a clock read (a vDSO
// call) per ibv_poll_cq was a tenth of a streaming client's CPU. The reused
// time is never later than the true one, so a lease built from it ends no
// later than one built from the true time (a sender then wakes sooner, never
// later), a renewal it misses only lets the lease run out (the senders wake
// the progress thread again), and app_poll_ only looks older (serve() then
// spins for kSpin, which costs time, not packets).
constexpr uint32_t kPollsPerClockRead = 8;
struct PollClock {
  const Clock* clock = nullptr;  // whose time `now` is (read anew for another)
  Clock::time_point now{};
  uint32_t reused = kPollsPerClockRead;  // read at the first poll
};
thread_local PollClock poll_clock;

uint64_t to_ns(Clock::time_point t) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

}  // namespace

Clock::time_point HostLink::poll_time() {
  PollClock& pc = poll_clock;
  const Clock& clock = scheduler_.clock();
  // A new lease starts from the true time: reused only while one lasts
  // (so the time reused is at most about a lease old).
  const bool fresh = !leases_ || lease_until_.load(std::memory_order_relaxed) == 0;
  if (fresh || pc.reused >= kPollsPerClockRead || pc.clock != &clock) {
    pc.clock = &clock;
    pc.now = clock.now();
    pc.reused = 0;
    app_poll_.store(pc.now.time_since_epoch().count(), std::memory_order_relaxed);
  } else {
    ++pc.reused;
  }
  return pc.now;
}

uint64_t HostLink::lease_horizon_ns() const { return to_ns(scheduler_.clock().now() + kLeaseMargin); }

void HostLink::renew_lease_locked(Clock::time_point now) {
  const Clock::duration::rep until = lease_until_.load(std::memory_order_relaxed);
  if (until != 0 && Clock::time_point(Clock::duration(until)) - now > kLease / 2) return;
  const Clock::time_point next = now + kLease;
  answers_until_.store(next.time_since_epoch().count(), std::memory_order_relaxed);
  lease_until_.store(next.time_since_epoch().count(), std::memory_order_relaxed);
  // Before the rings say so: the next note_busy() must end it.
  scheduler_.hold_leases();
  for (Conn& c : connections_)
    if (c.ring) c.ring->lease(to_ns(next));
  if (!lease_timer_.exchange(true))
    scheduler_.at(next, [this, alive = std::weak_ptr<char>(alive_)] {
      if (auto still = alive.lock()) check_lease();
    });
}

// On an application thread that goes off to work (answers_too false: its
// answer lease stays) or may block.
void HostLink::end_lease(bool answers_too) {
  const bool had = lease_until_.exchange(0, std::memory_order_relaxed) != 0;
  const bool had_answers = answers_too && answers_until_.exchange(0, std::memory_order_relaxed) != 0;
  if (!had && !had_answers) return;
  bool arrived = false;
  {
    std::lock_guard lock(rx_mu_);
    for (Conn& c : connections_)
      if (c.ring) arrived |= c.ring->end_lease(answers_too);
  }
  // Records that came under the lease may have come without a wake-up. This
  // thread (an application's, in a post, a poll that found completions or
  // before it blocks) takes them itself, as its next poll would have: a
  // serve() of the progress thread would preempt it on its CPU once per
  // completion (the wake-ups a streaming ib_write_bw client paid). It looks
  // through the device (Receiver::try_poll), whose receive lock keeps the
  // packets in their order against the progress thread's and other
  // application threads' drains, and only if that lock is free: a thread
  // that holds it reads what waits. A few looks at most, so a post is not
  // held up by a stream; what is left then goes to the progress thread as
  // before. A record put after end_lease() found the lease gone (or, for an
  // answer, found the answer lease, which check_lease() serves when it runs
  // out, or the thread's next poll reads) and woke the receiver itself.
  ending_lease(true);
  for (int look = 0; arrived && look < kEndLooks; ++look) {
    if (!up_->try_poll()) break;
    arrived = rings_pending();
  }
  ending_lease(false);
  if (arrived && !serve_posted_.exchange(true))
    scheduler_.post([this] {
      serve_posted_.store(false);
      serve();
    });
}

void HostLink::check_lease() {
  lease_timer_.store(false);
  // The answer lease is never shorter than the lease: it decides.
  const Clock::duration::rep until = answers_until_.load(std::memory_order_relaxed);
  if (until == 0) return;  // ended by its thread, which served what came
  const Clock::time_point end{Clock::duration(until)};
  if (scheduler_.clock().now() < end) {
    // Renewed: look again when the new one is over.
    if (!lease_timer_.exchange(true))
      scheduler_.at(end, [this, alive = std::weak_ptr<char>(alive_)] {
        if (auto still = alive.lock()) check_lease();
      });
    return;
  }
  // Over, and its thread polls no more: what senders left without a wake-up
  // is served now (the rings keep the old leases, which have passed).
  Clock::duration::rep expected = until;
  if (answers_until_.compare_exchange_strong(expected, 0)) {
    expected = until;
    lease_until_.compare_exchange_strong(expected, 0);
  }
  serve();
}

size_t HostLink::armed_rings() {
  std::lock_guard lock(rx_mu_);
  size_t n = 0;
  for (const Conn& c : connections_) n += c.ring && c.ring->armed();
  return n;
}

}  // namespace softverbs::fabric

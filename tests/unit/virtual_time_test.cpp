// The virtual clock and scheduler (fabric/virtual_time.hpp) on their own: the
// clock moves only when nothing can run, to the earliest deadline; queued work
// runs first and in order; wall time is the fixed epoch plus virtual time; a
// blocking wait runs the engine's work until its fd is readable; traffic with
// another process paces the clock by real time. A scheduler without a watch
// thread, driven by hand, so every step is the test's.
#include "fabric/virtual_time.hpp"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace softverbs::fabric {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(VirtualTime, ClockStandsStillUntilAJump) {
  VirtualScheduler s(milliseconds(0));
  const auto t0 = s.clock().now();
  EXPECT_EQ(s.clock().elapsed_ns(), 0);
  EXPECT_FALSE(s.step(true));  // nothing to run, nothing to jump to
  EXPECT_EQ(s.clock().now(), t0);
  const timespec w = s.clock().wall_now();
  EXPECT_EQ(w.tv_sec, VirtualClock::kWallEpochSec);
  EXPECT_EQ(w.tv_nsec, 0);
}

TEST(VirtualTime, QueuedWorkRunsBeforeTimeMoves) {
  VirtualScheduler s(milliseconds(0));
  std::vector<std::string> order;
  const auto t0 = s.clock().now();
  s.after(milliseconds(5), [&] { order.push_back("t5"); });
  s.after(microseconds(10), [&] { order.push_back("t0.01"); });
  s.post([&] {
    order.push_back("a");
    s.post([&] { order.push_back("b"); });
  });
  // The first step runs the queue to the end and does not move the clock.
  EXPECT_TRUE(s.step(true));
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(s.clock().now(), t0);
  // Each later step jumps to the earliest deadline.
  EXPECT_TRUE(s.step(true));
  EXPECT_EQ(s.clock().now() - t0, microseconds(10));
  EXPECT_TRUE(s.step(true));
  EXPECT_EQ(s.clock().now() - t0, milliseconds(5));
  EXPECT_EQ(order, (std::vector<std::string>{"a", "b", "t0.01", "t5"}));
  EXPECT_FALSE(s.step(true));
  const timespec w = s.clock().wall_now();
  EXPECT_EQ(w.tv_sec, VirtualClock::kWallEpochSec);
  EXPECT_EQ(w.tv_nsec, 5000000);
}

TEST(VirtualTime, NoJumpUnlessAllowed) {
  VirtualScheduler s(milliseconds(0));
  bool fired = false;
  const auto t0 = s.clock().now();
  s.after(milliseconds(1), [&] { fired = true; });
  EXPECT_FALSE(s.step(false));  // a thread is busy: the clock waits
  EXPECT_FALSE(fired);
  EXPECT_EQ(s.clock().now(), t0);
  EXPECT_TRUE(s.step(true));
  EXPECT_TRUE(fired);
}

TEST(VirtualTime, EqualDeadlinesRunInTheOrderAsked) {
  VirtualScheduler s(milliseconds(0));
  std::string order;
  const auto when = s.clock().now() + milliseconds(3);
  for (char c : std::string("abcde")) s.at(when, [&order, c] { order += c; });
  EXPECT_TRUE(s.step(true));
  EXPECT_EQ(order, "abcde");
}

TEST(VirtualTime, TimersArmedByATimerAtTheSameMomentRunInTheSameStep) {
  VirtualScheduler s(milliseconds(0));
  int runs = 0;
  s.after(milliseconds(2), [&] {
    ++runs;
    s.post([&] { ++runs; });
    s.at(s.clock().now(), [&] { ++runs; });
  });
  EXPECT_TRUE(s.step(true));
  EXPECT_EQ(runs, 3);
}

// The wait a blocking ibv_get_cq_event makes: the timer that produces the event
// is fired from inside the wait, by the waiting thread itself.
TEST(VirtualTime, BlockingWaitRunsTimersUntilItsFdIsReadable) {
  VirtualScheduler s(milliseconds(0));
  const int fd = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  int fired = 0;
  const auto t0 = s.clock().now();
  s.after(milliseconds(1), [&] { ++fired; });
  s.after(milliseconds(7), [&] {
    ++fired;
    const uint64_t one = 1;
    ASSERT_EQ(::write(fd, &one, sizeof one), static_cast<ssize_t>(sizeof one));
  });
  s.after(milliseconds(9), [&] { ++fired; });
  s.wait_readable(fd);
  EXPECT_EQ(fired, 2);
  EXPECT_EQ(s.clock().now() - t0, milliseconds(7));
  ::close(fd);
}

// Work posted from another thread wakes a thread blocked in the wait, which
// runs it.
TEST(VirtualTime, WorkPostedFromAnotherThreadWakesTheWait) {
  VirtualScheduler s(milliseconds(0));
  const int fd = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::thread other([&] {
    s.post([fd] {
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
    });
  });
  s.wait_readable(fd);  // bounded by the post above; ctest's timeout otherwise
  other.join();
  uint64_t v = 0;
  EXPECT_EQ(::read(fd, &v, sizeof v), static_cast<ssize_t>(sizeof v));
  ::close(fd);
}

// Once another process takes part, the clock follows real time: no jumps (a
// deadline an hour away stays an hour of real time away), and time passes
// with real time.
TEST(VirtualTime, TrafficWithAnotherProcessMakesTheClockFollowRealTime) {
  VirtualScheduler s(milliseconds(0));
  s.note_outside();
  EXPECT_TRUE(s.paced());
  const auto t0 = s.clock().now();
  while (s.clock().now() == t0) std::this_thread::yield();  // real time moves it (bounded by ctest)
  bool fired = false;
  s.after(std::chrono::hours(1), [&] { fired = true; });
  Clock::duration wait{};
  EXPECT_FALSE(s.step(true, &wait));
  EXPECT_FALSE(fired);
  EXPECT_GT(wait, std::chrono::minutes(59));
  // A deadline already passed in real time is jumped to.
  bool near = false;
  s.after(Clock::duration::zero(), [&] { near = true; });
  EXPECT_TRUE(s.step(true));
  EXPECT_TRUE(near);
}

// Time moves only once every known application thread is idle: a thread that
// posted holds the clock until it polls an empty CQ itself.
TEST(VirtualTime, ABusyThreadHoldsTheClock) {
  VirtualScheduler s(milliseconds(0));
  std::atomic<bool> fired{false};
  s.after(milliseconds(1), [&] { fired = true; });
  std::atomic<int> stage{0};
  std::thread worker([&] {
    s.note_busy();  // posted
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    s.idle_poll();  // its CQ is empty: now every thread is idle
  });
  while (stage.load() != 1) std::this_thread::yield();
  s.idle_poll();
  EXPECT_FALSE(fired);  // the worker is busy
  stage = 2;
  worker.join();
  EXPECT_TRUE(fired);  // the worker's empty poll moved the clock
}

// A thread that posted and then waits on something of its own (no post, no
// completion found by anyone for a long silence) stops holding the clock: the
// watch thread notices it, and a polling thread's step moves time on.
TEST(VirtualTime, ABusyThreadThatWaitsElsewhereStopsHoldingTheClock) {
  VirtualScheduler s(milliseconds(1));
  std::atomic<bool> fired{false};
  s.after(milliseconds(40), [&] { fired = true; });
  std::atomic<bool> done{false};
  std::thread worker([&] {
    s.note_busy();
    while (!done.load()) std::this_thread::yield();  // waits outside the library
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fired && std::chrono::steady_clock::now() < deadline) {
    s.idle_poll();
    std::this_thread::yield();
  }
  done = true;
  worker.join();
  EXPECT_TRUE(fired);
}

// Once every device context is closed, the watch thread takes no step: a
// delayed packet still pending at the program's exit stays pending, whatever
// the exit's real duration. It steps again once a context is open.
TEST(VirtualTime, NoWatchStepsOnceEveryContextIsClosed) {
  VirtualScheduler s(milliseconds(1));
  s.idle_poll();  // this thread: idle, and up to date with the work run so far
  s.note_context(true);
  s.note_context(false);
  std::atomic<bool> fired{false};
  s.after(milliseconds(3), [&] { fired = true; });
  // Fifty silences of the watch thread: none of them moves the clock.
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(fired);
  EXPECT_EQ(s.clock().elapsed_ns(), 0);
  s.note_context(true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!fired && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_TRUE(fired);
  s.note_context(false);
}

}  // namespace
}  // namespace softverbs::fabric

// The background progress thread (design.md §3).
//
// Protocol work runs inline in whichever application thread calls into the
// engine (post_send runs the requester, poll_cq drains the device's endpoint).
// This thread covers what no application call would: packets arriving while the
// application blocks in ibv_get_cq_event or does other work, and the transport
// timers (local ACK timeout, RNR wait). It is a Boost.Asio io_context run by one
// thread, started on first use.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace softverbs::emu {

class Device;

class Progress {
 public:
  static Progress& instance();

  boost::asio::io_context& io() { return io_; }

  // Starts watching the device's UDP endpoint (idempotent).
  void watch(Device& dev);

  template <class F>
  void post(F&& f) {
    ensure_started();
    boost::asio::post(io_, std::forward<F>(f));
  }

  // Runs f on the progress thread once `delay` has passed (one-shot, never
  // cancelled: f must only touch what outlives it, or check that it still exists).
  template <class F>
  void after(std::chrono::steady_clock::duration delay, F&& f) {
    auto timer = std::make_shared<boost::asio::steady_timer>(io_);
    post([timer, delay, f = std::forward<F>(f)]() mutable {
      timer->expires_after(delay);
      timer->async_wait([timer, f = std::move(f)](const boost::system::error_code&) mutable { f(); });
    });
  }

 private:
  Progress() = default;
  void ensure_started();
  void arm(Device& dev);

  boost::asio::io_context io_;
  std::once_flag started_;
  std::thread thread_;
};

// A one-shot deadline timer owned by an engine object (a QP). The owner may be
// destroyed while the timer is pending: detach() makes a later expiry a no-op and
// waits for a running callback to finish.
class EngineTimer : public std::enable_shared_from_this<EngineTimer> {
 public:
  using Clock = std::chrono::steady_clock;
  explicit EngineTimer(std::function<void()> on_expiry);

  // Asks for a callback at `when` (or earlier, if already armed earlier).
  void arm_at(Clock::time_point when);
  // No callback runs after this returns. Must not be called with a lock the
  // callback takes.
  void detach();

 private:
  void fire();

  std::mutex run_mu_;
  std::mutex mu_;
  std::function<void()> on_expiry_;  // empty once detached
  boost::asio::steady_timer timer_;
  Clock::time_point armed_for_{};
  bool armed_ = false;
};

}  // namespace softverbs::emu

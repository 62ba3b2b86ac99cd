#include "emu/device/progress.hpp"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/udp.hpp>

#include <unordered_map>

#include "emu/objects/objects.hpp"
#include "core/log.hpp"

namespace softverbs::emu {
namespace {

// The Asio socket objects wrapping each device's endpoint, used only on the
// progress thread to wait for readability. Application threads read the same
// descriptor directly (non-blocking) under the device's receive lock.
struct Watched {
  std::unique_ptr<boost::asio::ip::udp::socket> socket;
};

std::unordered_map<Device*, Watched>& watched() {
  static auto* m = new std::unordered_map<Device*, Watched>;  // touched only on the progress thread
  return *m;
}

}  // namespace

Progress& Progress::instance() {
  static Progress* p = new Progress;  // lives until exit: other threads may still post
  return *p;
}

void Progress::ensure_started() {
  std::call_once(started_, [this] {
    thread_ = std::thread([this] {
      auto guard = boost::asio::make_work_guard(io_);
      for (;;) {
        try {
          io_.run();
          break;
        } catch (const std::exception& e) {
          SV_LOG(kError, "progress thread: %s", e.what());
        }
      }
    });
    thread_.detach();
  });
}

void Progress::watch(Device& dev) {
  post([this, &dev] {
    auto& w = watched()[&dev];
    if (w.socket) return;
    // Wrap a duplicate so Asio owns (and may close) its own descriptor.
    int fd = ::dup(dev.udp_fd());
    if (fd < 0) return;
    w.socket = std::make_unique<boost::asio::ip::udp::socket>(io_, boost::asio::ip::udp::v4(), fd);
    w.socket->non_blocking(true);
    arm(dev);
  });
}

void Progress::arm(Device& dev) {
  auto& w = watched()[&dev];
  // The wait is queued before the drain, so a datagram that lands after the
  // drain's last read raises a new readiness edge for this wait.
  w.socket->async_wait(boost::asio::ip::udp::socket::wait_read, [this, &dev](const boost::system::error_code& ec) {
    if (ec) return;
    arm(dev);
    dev.progress(true);
  });
}

// ---------------------------------------------------------------------------

EngineTimer::EngineTimer(std::function<void()> on_expiry)
    : on_expiry_(std::move(on_expiry)), timer_(Progress::instance().io()) {}

void EngineTimer::arm_at(Clock::time_point when) {
  std::lock_guard lock(mu_);
  if (!on_expiry_) return;
  if (armed_ && armed_for_ <= when) return;  // an earlier expiry will re-check
  armed_ = true;
  armed_for_ = when;
  // Asio timers are not thread-safe: every operation on timer_ runs on the
  // progress thread.
  Progress::instance().post([self = shared_from_this(), when] {
    self->timer_.expires_at(when);
    self->timer_.async_wait([self, when](const boost::system::error_code& ec) {
      if (ec) return;  // superseded by a later arm_at
      {
        std::lock_guard lock(self->mu_);
        if (!self->armed_ || self->armed_for_ != when) return;
        self->armed_ = false;
      }
      self->fire();
    });
  });
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

}  // namespace softverbs::emu

// rsockets' keepalive (SO_KEEPALIVE, TCP_KEEPIDLE), as rdma-core 44 does it:
// every keepalive_time seconds a connected socket with the option posts a
// zero-length RDMA WRITE (no immediate: the peer's application sees nothing)
// whose wr_id is CTRL|KEEPALIVE, on one of the control slots. If the peer is
// gone the write fails after the QP's retries and the socket turns to error
// (EIO) at the application's next call, as a TCP keepalive failure does.
//
// One service thread for the process, started by the first socket that turns
// the option on; it ticks once a second on a timerfd (no clock is read) and
// counts each socket's seconds down. Lock order: a socket's mutex, then the
// service's (rsetsockopt); the thread never holds both.
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "abi/rdmacm/rsocket.hpp"

namespace softverbs::abi::rs {
namespace {

struct Entry {
  std::weak_ptr<Rsocket> rs;
  unsigned left;    // seconds to the next keepalive
  unsigned period;  // TCP_KEEPIDLE
};

std::mutex g_mu;
std::vector<Entry>& entries() {
  static auto* e = new std::vector<Entry>;  // never destroyed: the thread outlives main
  return *e;
}
bool g_started = false;

void send_keepalive(Rsocket& rs) {
  std::lock_guard lk(rs.mu);
  if (!(rs.state & kConnected) || !rs.cq || rs.ctrl_seqno == rs.ctrl_max_seqno) return;
  rs.ctrl_seqno++;
  ibv_send_wr wr{};
  wr.wr_id = msg_set(kOpCtrl, kCtrlKeepalive);
  wr.opcode = IBV_WR_RDMA_WRITE;
  post_send(rs, wr);
}

void run(int timer) {
  for (;;) {
    uint64_t ticks = 0;
    if (::read(timer, &ticks, sizeof ticks) != sizeof ticks) continue;
    std::vector<RsPtr> due;
    {
      std::lock_guard lock(g_mu);
      auto& list = entries();
      std::erase_if(list, [](const Entry& e) { return e.rs.expired(); });
      for (Entry& e : list) {
        RsPtr rs = e.rs.lock();
        if (!rs) continue;
        e.left = e.left > ticks ? e.left - static_cast<unsigned>(ticks) : 0;
        if (e.left == 0) {
          due.push_back(rs);
          e.left = std::max(1u, e.period);
        }
      }
    }
    for (const RsPtr& rs : due) send_keepalive(*rs);
  }
}

}  // namespace

int keepalive(const RsPtr& rs, bool on, unsigned seconds) {
  std::lock_guard lock(g_mu);
  auto& list = entries();
  auto it = std::find_if(list.begin(), list.end(), [&](const Entry& e) { return e.rs.lock() == rs; });
  if (!on) {
    if (it != list.end()) list.erase(it);
    return 0;
  }
  if (it != list.end()) {
    it->left = it->period = seconds;
    return 0;
  }
  if (!g_started) {
    const int timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    if (timer < 0) return -1;
    itimerspec its{};
    its.it_value.tv_sec = 1;
    its.it_interval.tv_sec = 1;
    if (timerfd_settime(timer, 0, &its, nullptr) != 0) {
      ::close(timer);
      return -1;
    }
    std::thread(run, timer).detach();
    g_started = true;
  }
  list.push_back({rs, seconds, seconds});
  return 0;
}

}  // namespace softverbs::abi::rs

// rsockets: waiting (a datagram rsocket's fds: rs_dgram.cpp). A stream
// rsocket has two real descriptors to wait on:
// its CM event channel (connection setup, DISCONNECTED) and its CQ's
// completion channel (the peer's messages and our completions). Blocking
// calls and rpoll arm the CQ, check again (a completion may have come in
// between) and then poll(2) those fds with the socket's lock released.
// rpoll's timeout runs on a timerfd, so no clock is read here.
#include <fcntl.h>
#include <poll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "abi/rdmacm/rs_dgram.hpp"
#include "abi/rdmacm/rsocket.hpp"

namespace softverbs::abi::rs {

bool nonblocking(const Rsocket& rs, int flags) { return (rs.fd_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }

void drain_cq_events(Rsocket& rs) {
  if (!rs.cq_ch) return;
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  while (ibv_get_cq_event(rs.cq_ch, &cq, &ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    rs.cq_armed = false;
  }
}

namespace {

// The fds a sleeping caller waits on for this socket.
void wait_fds(const Rsocket& rs, std::vector<pollfd>& out) {
  if (rs.dg) return dgram_wait_fds(rs, out);
  if (rs.ch) out.push_back({rs.ch->fd, POLLIN, 0});
  if (rs.cq_ch) out.push_back({rs.cq_ch->fd, POLLIN, 0});
}

}  // namespace

int get_comp(Rsocket& rs, std::unique_lock<std::mutex>& lk, bool nonblock, Test test) {
  for (;;) {
    update_credits(rs);
    const int ret = poll_cq(rs);
    if (test(rs)) {
      update_credits(rs);
      return 0;
    }
    if (ret) return ret;
    if (nonblock) {
      update_credits(rs);
      errno = EWOULDBLOCK;
      return -1;
    }
    if (!rs.cq_armed && rs.cq) {
      ibv_req_notify_cq(rs.cq, 0);
      rs.cq_armed = true;
      continue;  // poll once more: a completion may predate the arming
    }
    std::vector<pollfd> fds;
    wait_fds(rs, fds);
    if (fds.empty()) {
      errno = ENOTCONN;
      return -1;
    }
    lk.unlock();
    const int n = ::poll(fds.data(), fds.size(), -1);
    lk.lock();
    if (n < 0 && errno != EINTR) return -1;
    drain_cq_events(rs);
    process_cm(rs);
    if (!rs.cq) {
      errno = ENOTCONN;
      return -1;
    }
  }
}

namespace {

// What poll reports for one rsocket now (rdma-core's rs_poll_rs), after
// taking what its channels hold. With `arm`, the CQ is armed when nothing is
// ready, so a later completion wakes the caller.
short poll_rs(Rsocket& rs, short events, bool arm) {
  std::unique_lock lk(rs.mu);
  if (rs.dg) return rs.dg->udp < 0 ? static_cast<short>(POLLNVAL) : dgram_poll(rs, events, arm);
  if (rs.state == kListening) {
    take_requests(rs);
    return (events & POLLIN) && !rs.pending.empty() ? POLLIN : 0;
  }
  if (rs.state & kOpening) {
    if (do_connect(rs, lk, false) != 0 && errno == EINPROGRESS) return 0;
  }
  if (rs.state == kConnectError) return static_cast<short>((events & (POLLIN | POLLOUT)) | POLLERR);
  if (!((rs.state & kConnected) || rs.state == kDisconnected || (rs.state & kError)) || !rs.cq) return 0;
  process_cm(rs);
  for (int pass = 0;; ++pass) {
    drain_cq_events(rs);
    update_credits(rs);
    poll_cq(rs);
    update_credits(rs);
    short revents = 0;
    if ((events & POLLIN) && (have_rdata(rs) || !(rs.state & kReadable))) revents |= POLLIN;
    if ((events & POLLOUT) && can_send(rs)) revents |= POLLOUT;
    // The peer's hang-up shows once its data is read (as TCP's FIN shows as
    // end of file): rdma-core reports POLLHUP at once, which makes a reader
    // that stops at POLLHUP (rstream -T a) lose the stream's tail.
    if (rs.state == kDisconnected && !have_rdata(rs)) revents |= POLLHUP;
    if (!(rs.state & kConnected) && rs.state != kDisconnected) revents |= POLLERR;
    if (revents || !arm || pass == 1) return revents;
    ibv_req_notify_cq(rs.cq, 0);
    rs.cq_armed = true;
  }
}

// A timerfd that becomes readable after timeout_ms (-1: none).
int make_timer(int timeout_ms) {
  if (timeout_ms <= 0) return -1;
  const int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  if (fd < 0) return -1;
  itimerspec its{};
  its.it_value.tv_sec = timeout_ms / 1000;
  its.it_value.tv_nsec = static_cast<long>(timeout_ms % 1000) * 1000000L;
  if (timerfd_settime(fd, 0, &its, nullptr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

// rpoll: rsockets and ordinary fds together. Each round evaluates every
// rsocket (driving its connection, completions and credits) and polls the
// ordinary fds without waiting; if nothing is ready it sleeps on all the
// real fds behind them until one fires or the timeout passes.
int poll(pollfd* fds, nfds_t nfds, int timeout) {
  std::vector<RsPtr> socks(nfds);
  for (nfds_t i = 0; i < nfds; ++i) socks[i] = fds[i].fd >= 0 ? lookup(fds[i].fd) : nullptr;
  const int timer = make_timer(timeout);
  if (timeout > 0 && timer < 0) return -1;
  bool expired = false;
  int result = -1;
  for (;;) {
    int count = 0;
    std::vector<pollfd> plain;
    std::vector<nfds_t> plain_at;
    for (nfds_t i = 0; i < nfds; ++i) {
      fds[i].revents = 0;
      if (socks[i]) {
        fds[i].revents = poll_rs(*socks[i], fds[i].events, timeout != 0 && !expired);
      } else {
        plain.push_back({fds[i].fd, fds[i].events, 0});
        plain_at.push_back(i);
      }
    }
    if (!plain.empty() && ::poll(plain.data(), plain.size(), 0) < 0) break;
    for (size_t k = 0; k < plain.size(); ++k) fds[plain_at[k]].revents = plain[k].revents;
    for (nfds_t i = 0; i < nfds; ++i) count += fds[i].revents != 0;
    if (count || timeout == 0 || expired) {
      result = count;
      break;
    }
    std::vector<pollfd> wait;
    for (nfds_t i = 0; i < nfds; ++i) {
      if (socks[i]) {
        std::lock_guard lk(socks[i]->mu);
        wait_fds(*socks[i], wait);
      } else {
        wait.push_back({fds[i].fd, fds[i].events, 0});
      }
    }
    if (timer >= 0) wait.push_back({timer, POLLIN, 0});
    const int n = ::poll(wait.data(), wait.size(), -1);
    if (n < 0) break;
    if (timer >= 0 && (wait.back().revents & POLLIN)) expired = true;
  }
  if (timer >= 0) ::close(timer);
  return result;
}

// rselect over rpoll, as rdma-core does: read is POLLIN (or HUP), write
// POLLOUT, except anything else.
int select(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* tv) {
  if (nfds < 0 || nfds > FD_SETSIZE) {
    errno = EINVAL;
    return -1;
  }
  std::vector<pollfd> fds;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    bool want = false;
    if (readfds && FD_ISSET(fd, readfds)) ev |= POLLIN, want = true;
    if (writefds && FD_ISSET(fd, writefds)) ev |= POLLOUT, want = true;
    if (exceptfds && FD_ISSET(fd, exceptfds)) want = true;
    if (want) fds.push_back({fd, ev, 0});
  }
  const int timeout = tv ? static_cast<int>(tv->tv_sec * 1000 + tv->tv_usec / 1000) : -1;
  int ret = rs::poll(fds.data(), fds.size(), timeout);
  if (readfds) FD_ZERO(readfds);
  if (writefds) FD_ZERO(writefds);
  if (exceptfds) FD_ZERO(exceptfds);
  if (ret <= 0) return ret;
  ret = 0;
  for (const pollfd& p : fds) {
    if (readfds && (p.revents & (POLLIN | POLLHUP))) FD_SET(p.fd, readfds), ++ret;
    if (writefds && (p.revents & POLLOUT)) FD_SET(p.fd, writefds), ++ret;
    if (exceptfds && (p.revents & ~(POLLIN | POLLOUT))) FD_SET(p.fd, exceptfds), ++ret;
  }
  return ret;
}

}  // namespace softverbs::abi::rs

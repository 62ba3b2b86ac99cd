// rsockets: the socket calls of a datagram rsocket (rs_dgram.hpp describes
// the protocol; rs_dgram_path.cpp holds the QPs, destinations and the UDP
// path). What fails, and where it differs from rdma-core (which does not
// check these): a payload beyond 2048 bytes less the header (2040 over IPv4,
// 2024 over IPv6): EMSGSIZE; rsend without rconnect and rsendto without an
// address: EDESTADDRREQ; rrecv before the socket is bound, connected or has
// sent: EINVAL (rdma-core's).
#include "abi/rdmacm/rs_dgram.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace softverbs::abi::rs {
namespace {

int fail(int err) {
  errno = err;
  return -1;
}

int ensure_ep(Rsocket& rs) { return rs.state == kInit ? dgram_init_ep(rs) : 0; }

bool have_free_slot(const Rsocket& rs) { return !rs.dg->free_slots.empty(); }
bool have_msg(const Rsocket& rs) { return !rs.dg->rmsgs.empty(); }

// Makes progress until test(rs) holds; EWOULDBLOCK when `nonblock`. A sleep
// arms every CQ, looks once more (a completion may predate the arming), and
// polls the UDP socket and the completion channels with rs.mu released.
int wait_for(Rsocket& rs, std::unique_lock<std::mutex>& lk, bool nonblock, bool (*test)(const Rsocket&)) {
  for (bool armed = false;;) {
    dgram_progress(rs);
    if (test(rs)) return 0;
    if (nonblock) {
      // A caller that spins on EWOULDBLOCK (udpong's default) would take the
      // CPU from the progress thread that delivers its datagrams.
      sched_yield();
      return fail(EWOULDBLOCK);
    }
    if (!armed) {
      dgram_arm(rs);
      armed = true;
      continue;
    }
    std::vector<pollfd> fds;
    dgram_wait_fds(rs, fds);
    lk.unlock();
    const int n = ::poll(fds.data(), fds.size(), -1);
    lk.lock();
    if (n < 0 && errno != EINTR) return -1;
    if (!rs.dg || rs.dg->udp < 0) return fail(EBADF);  // closed meanwhile
    dgram_drain_events(rs);
    armed = false;
  }
}

size_t iov_total(const iovec* iov, int iovcnt) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  return total;
}

// rdma-core's dsend: over UDP until the peer's QPN is known, else a UD SEND
// of the QP's header and the payload from a free send slot.
ssize_t send_to(Rsocket& rs, std::unique_lock<std::mutex>& lk, DsDest& d, const iovec* iov, int iovcnt, int flags) {
  const size_t len = iov_total(iov, iovcnt);
  if (len > dgram_max_payload(*d.qp)) return fail(EMSGSIZE);
  const bool nonblock = nonblocking(rs, flags);
  if (!d.ah) return dgram_send_udp(rs, d, iov, iovcnt, nonblock ? MSG_DONTWAIT : 0, kOpData);
  if (!have_free_slot(rs) && wait_for(rs, lk, nonblock, have_free_slot) != 0) return -1;
  Dgram& dg = *rs.dg;
  // The wait released the lock: the entry may have lost its handle.
  if (!d.ah) return dgram_send_udp(rs, d, iov, iovcnt, nonblock ? MSG_DONTWAIT : 0, kOpData);
  const uint32_t slot = dg.free_slots.back();
  uint8_t* msg = dg.sbuf + slot;
  std::memcpy(msg, &d.qp->hdr, d.qp->hdr.length);
  size_t off = d.qp->hdr.length;
  for (int i = 0; i < iovcnt; ++i) {
    if (iov[i].iov_len) std::memcpy(msg + off, iov[i].iov_base, iov[i].iov_len);
    off += iov[i].iov_len;
  }
  ibv_sge sge{reinterpret_cast<uintptr_t>(msg), static_cast<uint32_t>(off), d.qp->smr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = sge.length <= rs.sq_inline ? IBV_SEND_INLINE : 0;
  wr.wr.ud.ah = d.ah;
  wr.wr.ud.remote_qpn = d.qpn;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  if (int e = ibv_post_send(d.qp->id->qp, &wr, &bad)) return fail(e);
  dg.free_slots.pop_back();
  return static_cast<ssize_t>(len);
}

// rdma-core's ds_set_src: the sender's address from the datagram's header.
void set_src(const DsHeader& h, sockaddr* addr, socklen_t* addrlen) {
  sockaddr_storage sa{};
  socklen_t size;
  if (h.version == 4) {
    auto& s = reinterpret_cast<sockaddr_in&>(sa);
    s.sin_family = AF_INET;
    s.sin_port = h.port;
    s.sin_addr.s_addr = h.addr.ipv4;
    size = sizeof s;
  } else {
    auto& s6 = reinterpret_cast<sockaddr_in6&>(sa);
    s6.sin6_family = AF_INET6;
    s6.sin6_port = h.port;
    s6.sin6_flowinfo = h.addr.ipv6.flowinfo;
    std::memcpy(&s6.sin6_addr, h.addr.ipv6.addr, 16);
    size = sizeof s6;
  }
  *addrlen = std::min(*addrlen, size);
  std::memcpy(addr, &sa, *addrlen);
}

}  // namespace

int dgram_create(int domain) {
  // rdma-core's rsocket() starts librdmacm (ucma_init: the devices are
  // opened) whatever the type; the devices then answer address resolution
  // before the first datagram makes a QP.
  int ndev = 0;
  if (ibv_context** devs = rdma_get_devices(&ndev)) rdma_free_devices(devs);
  auto rs = std::make_shared<Rsocket>();
  rs->domain = domain;
  rs->dg = std::make_shared<Dgram>();
  rs->dg->udp = socket(domain, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (rs->dg->udp < 0) return -1;
  rs->index = rs->dg->udp;
  insert(rs);
  return rs->index;
}

int dgram_bind(Rsocket& rs, const sockaddr* addr, socklen_t len) {
  if (ensure_ep(rs) != 0) return -1;
  return ::bind(rs.dg->udp, addr, len);
}

int dgram_connect(Rsocket& rs, const sockaddr* addr, socklen_t len) {
  sockaddr_storage dst{};
  if (!dgram_norm_addr(addr, len, &dst)) return fail(addr ? EINVAL : EFAULT);
  if (ensure_ep(rs) != 0) return -1;
  dgram_pick_source(*rs.dg, rs.domain, addr);
  if (::connect(rs.dg->udp, addr, len) != 0) return -1;
  DsDest* d = dgram_get_dest(rs, dst);
  if (!d) return -1;
  rs.dg->conn_dest = d;
  return 0;
}

ssize_t dgram_sendto(Rsocket& rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags,
                     const sockaddr* dest, socklen_t destlen) {
  if (!(rs.state & kWritable) && rs.state != kInit) return fail(EPIPE);
  if (ensure_ep(rs) != 0) return -1;
  DsDest* d = rs.dg->conn_dest;
  if (dest) {
    sockaddr_storage dst{};
    if (!dgram_norm_addr(dest, destlen, &dst)) return fail(EINVAL);
    if (!d || std::memcmp(&d->addr, &dst, sizeof dst) != 0) {
      dgram_pick_source(*rs.dg, rs.domain, dest);
      if (!(d = dgram_get_dest(rs, dst))) return -1;
    }
  }
  if (!d) return fail(EDESTADDRREQ);
  return send_to(rs, lk, *d, iov, iovcnt, flags);
}

// rdma-core's ds_recvfrom: one datagram, cut to the buffer, its sender from
// its header.
ssize_t dgram_recvfrom(Rsocket& rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags,
                       sockaddr* src, socklen_t* srclen) {
  if (!(rs.state & kReadable)) return fail(EINVAL);
  if (!have_msg(rs) && wait_for(rs, lk, nonblocking(rs, flags), have_msg) != 0) return -1;
  Dgram& dg = *rs.dg;
  DsMsg& m = dg.rmsgs.front();
  const uint8_t* data = m.qp ? m.qp->rbuf + m.offset : m.local.data();
  DsHeader h{};
  std::memcpy(&h, data, std::min<size_t>(m.length, sizeof h));
  size_t left = m.length - h.length, copied = 0;
  for (int i = 0; i < iovcnt && left; ++i) {
    const size_t n = std::min(left, iov[i].iov_len);
    if (n) std::memcpy(iov[i].iov_base, data + h.length + copied, n);
    copied += n;
    left -= n;
  }
  if (src && srclen) set_src(h, src, srclen);
  if (!(flags & MSG_PEEK)) {
    if (m.qp) dgram_post_recv(*m.qp, m.offset);
    dg.rmsgs.pop_front();
  }
  return static_cast<ssize_t>(copied);
}

short dgram_poll(Rsocket& rs, short events, bool arm) {
  for (int pass = 0;; ++pass) {
    dgram_drain_events(rs);
    dgram_progress(rs);
    short revents = 0;
    if ((events & POLLIN) && have_msg(rs)) revents |= POLLIN;
    if ((events & POLLOUT) && have_free_slot(rs)) revents |= POLLOUT;
    if (revents || !arm || pass == 1) return revents;
    dgram_arm(rs);
  }
}

void dgram_wait_fds(const Rsocket& rs, std::vector<pollfd>& out) {
  if (!rs.dg || rs.dg->udp < 0) return;
  out.push_back({rs.dg->udp, POLLIN, 0});
  for (auto& qp : rs.dg->qps) out.push_back({qp->ch->fd, POLLIN, 0});
}

// rdma-core's ds_shutdown waits for every send to complete; the wait here
// is bounded (UD sends complete locally, so this is quick), then everything
// is freed.
int dgram_close(Rsocket& rs, std::unique_lock<std::mutex>& lk) {
  Dgram& dg = *rs.dg;
  for (int round = 0; round < 50 && dg.sbuf && dg.free_slots.size() < rs.sq_size; ++round) {
    dgram_progress(rs);
    if (dg.free_slots.size() == rs.sq_size) break;
    dgram_arm(rs);
    std::vector<pollfd> fds;
    for (auto& qp : dg.qps) fds.push_back({qp->ch->fd, POLLIN, 0});
    lk.unlock();
    ::poll(fds.data(), fds.size(), 100);
    lk.lock();
    dgram_drain_events(rs);
  }
  rs.state = kError;
  dgram_free(rs);
  return 0;
}

}  // namespace softverbs::abi::rs

// The rsocket exports of librdmacm.so.1 (rdma/rsocket.h, node RDMACM_1.0):
// stream and datagram rsockets (SOCK_STREAM, SOCK_DGRAM over
// AF_INET/AF_INET6) speaking rdma-core 44's rsockets protocols over the
// public rdma_cm and verbs API (rsocket.hpp, rs_conn.cpp, rs_data.cpp,
// rs_poll.cpp, rs_iomap.cpp, rs_keepalive.cpp; datagrams: rs_dgram.hpp,
// rs_dgram.cpp, rs_dgram_path.cpp). The answers for what is not offered are
// rdma-core's:
//  * rsocket(): ENOTSUP for another family, type or protocol.
//  * a datagram rsocket: the socket options of levels other than SOL_RDMA
//    go to its UDP socket first (whose error is the answer); rlisten,
//    raccept, riomap and riowrite: EOPNOTSUPP (rdma-core has no check).
//  * a descriptor that is not an rsocket: EBADF.
//  * an option rdma-core does not know: ENOTSUP; SOL_RDMA options once the
//    socket is connecting: EINVAL; rfcntl commands other than F_GETFL/F_SETFL:
//    ENOTSUP; ancillary data in rsendmsg/rrecvmsg: ENOTSUP.
//  * riomap with protections other than PROT_WRITE/PROT_NONE, or before the
//    connection exists: EINVAL; with every peer slot taken: ENOMEM.
#include "abi/rdmacm/rsocket.hpp"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <rdma/rsocket.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>

#include "abi/common/export.hpp"
#include "abi/rdmacm/rs_dgram.hpp"

namespace rs = softverbs::abi::rs;
using softverbs::abi::guarded;

namespace {

int fail(int err) {
  errno = err;
  return -1;
}

// The socket behind a descriptor, or the export fails with EBADF.
#define SV_RS_OR_EBADF(sock, ret) \
  rs::RsPtr s = rs::lookup(sock); \
  if (!s) {                       \
    errno = EBADF;                \
    return ret;                   \
  }

unsigned default_keepalive_time() {
  unsigned t = 7200;  // rdma-core's fallback: the kernel's default
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_keepalive_time", "r")) {
    if (std::fscanf(f, "%u", &t) != 1) t = 7200;
    std::fclose(f);
  }
  return t;
}

int get_int(const void* optval, socklen_t optlen, int* out) {
  if (!optval || optlen < sizeof(int)) return fail(EINVAL);
  std::memcpy(out, optval, sizeof(int));
  return 0;
}

void put_int(void* optval, socklen_t* optlen, int v) {
  std::memcpy(optval, &v, sizeof v);
  *optlen = sizeof v;
}

// rdma-core's rsetsockopt, option by option (the option bits kept in
// so_opts/tcp_opts/ipv6_opts answer rgetsockopt).
int setsockopt_locked(const rs::RsPtr& sp, int level, int optname, const void* optval, socklen_t optlen) {
  rs::Rsocket& r = *sp;
  uint64_t* opts = nullptr;
  bool on = false;
  int v = 0;
  const bool dgram = r.dg != nullptr;
  if (dgram && level != SOL_RDMA && ::setsockopt(r.dg->udp, level, optname, optval, optlen) != 0) return -1;
  int ret = fail(ENOTSUP);
  switch (level) {
    case SOL_SOCKET:
      opts = &r.so_opts;
      switch (optname) {
        case SO_REUSEADDR:
          if (get_int(optval, optlen, &v)) return -1;
          ret = dgram ? 0 : rdma_set_option(r.id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &v, sizeof v);
          if (ret && errno == ENOSYS) ret = 0;
          on = v;
          break;
        case SO_RCVBUF:
          if (get_int(optval, optlen, &v)) return -1;
          if (dgram ? r.dg->qps.empty() : !r.rbuf) r.rbuf_size = static_cast<uint32_t>(v) << 1;
          ret = 0;
          break;
        case SO_SNDBUF:
          if (get_int(optval, optlen, &v)) return -1;
          if (dgram ? !r.dg->sbuf : !r.sbuf) r.sbuf_size = static_cast<uint32_t>(v) << 1;
          if (r.sbuf_size < rs::kSndLowat) r.sbuf_size = rs::kSndLowat << 1;
          ret = 0;
          break;
        case SO_LINGER:
          if (!optval || optlen < sizeof(linger)) return fail(EINVAL);
          // Inverted, as rdma-core keeps it: the default (bit clear) is on.
          on = !static_cast<const linger*>(optval)->l_onoff;
          ret = 0;
          break;
        case SO_KEEPALIVE:
          if (get_int(optval, optlen, &v)) return -1;
          if (v && !r.keepalive_time) r.keepalive_time = default_keepalive_time();
          ret = dgram ? 0 : rs::keepalive(sp, v != 0, r.keepalive_time);  // no keepalives without a connection
          on = v;
          break;
        case SO_OOBINLINE:
          if (get_int(optval, optlen, &v)) return -1;
          on = v;
          ret = 0;
          break;
        default:
          break;
      }
      break;
    case IPPROTO_TCP:
      opts = &r.tcp_opts;
      switch (optname) {
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
        case TCP_MAXSEG:
          ret = 0;  // nothing to set over a reliable connection
          break;
        case TCP_KEEPIDLE:
          if (get_int(optval, optlen, &v)) return -1;
          if (v <= 0) return fail(EINVAL);
          r.keepalive_time = static_cast<unsigned>(v);
          ret = !dgram && (r.so_opts >> SO_KEEPALIVE) & 1 ? rs::keepalive(sp, true, r.keepalive_time) : 0;
          break;
        case TCP_NODELAY:
          if (get_int(optval, optlen, &v)) return -1;
          on = v;
          ret = 0;
          break;
        default:
          break;
      }
      break;
    case IPPROTO_IPV6:
      opts = &r.ipv6_opts;
      if (optname == IPV6_V6ONLY) {
        if (get_int(optval, optlen, &v)) return -1;
        ret = dgram ? 0 : rdma_set_option(r.id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &v, sizeof v);
        on = v;
      }
      break;
    case SOL_RDMA:
      if (r.state >= rs::kOpening) return fail(EINVAL);
      switch (optname) {
        case RDMA_SQSIZE:
        case RDMA_RQSIZE:
        case RDMA_INLINE: {
          if (get_int(optval, optlen, &v)) return -1;
          const uint16_t val = static_cast<uint16_t>(std::min<uint32_t>(static_cast<uint32_t>(v), rs::kQpMaxSize));
          (optname == RDMA_SQSIZE ? r.sq_size : optname == RDMA_RQSIZE ? r.rq_size : r.sq_inline) = val;
          ret = 0;
          break;
        }
        case RDMA_IOMAPSIZE:
          if (get_int(optval, optlen, &v)) return -1;
          // rdma-core rounds to what the 8-bit scale of the connection data can say.
          v = static_cast<uint8_t>(v <= 128 ? v : 128 | (v >> 8));
          r.target_iomap_size = static_cast<uint16_t>(v <= 128 ? v : (v & ~128) << 8);
          ret = 0;
          break;
        case RDMA_ROUTE:
          if (!optval || !optlen) return fail(EINVAL);
          r.route.assign(static_cast<const uint8_t*>(optval), static_cast<const uint8_t*>(optval) + optlen);
          ret = 0;
          break;
        default:
          break;
      }
      break;
    default:
      break;
  }
  if (ret == 0 && opts && optname < 64) {
    if (on)
      *opts |= uint64_t{1} << optname;
    else
      *opts &= ~(uint64_t{1} << optname);
  }
  return ret;
}

// rdma-core's rgetsockopt.
int getsockopt_locked(rs::Rsocket& r, int level, int optname, void* optval, socklen_t* optlen) {
  if (!optval || !optlen) return fail(EFAULT);
  auto bit = [](uint64_t opts, int name) { return static_cast<int>(name < 64 && (opts >> name) & 1); };
  switch (level) {
    case SOL_SOCKET:
      switch (optname) {
        case SO_REUSEADDR:
        case SO_KEEPALIVE:
        case SO_OOBINLINE:
          put_int(optval, optlen, bit(r.so_opts, optname));
          return 0;
        case SO_RCVBUF:
          put_int(optval, optlen, static_cast<int>(r.rbuf_size));
          return 0;
        case SO_SNDBUF:
          put_int(optval, optlen, static_cast<int>(r.sbuf_size));
          return 0;
        case SO_LINGER: {
          if (*optlen < sizeof(linger)) return fail(EINVAL);
          linger l{!bit(r.so_opts, optname), 0};
          std::memcpy(optval, &l, sizeof l);
          *optlen = sizeof l;
          return 0;
        }
        case SO_ERROR:
          put_int(optval, optlen, r.err);
          r.err = 0;
          return 0;
        default:
          return fail(ENOTSUP);
      }
    case IPPROTO_TCP:
      switch (optname) {
        case TCP_KEEPCNT:
        case TCP_KEEPINTVL:
          put_int(optval, optlen, 1);
          return 0;
        case TCP_KEEPIDLE:
          put_int(optval, optlen, static_cast<int>(r.keepalive_time));
          return 0;
        case TCP_NODELAY:
          put_int(optval, optlen, bit(r.tcp_opts, optname));
          return 0;
        case TCP_MAXSEG:
          // The path MTU once routed (IBTA MTU code: 256 << (code - 1)), else 2048.
          put_int(optval, optlen,
                  r.id && r.id->route.num_paths && r.id->route.path_rec ? 1 << (7 + r.id->route.path_rec->mtu) : 2048);
          return 0;
        default:
          return fail(ENOTSUP);
      }
    case IPPROTO_IPV6:
      if (optname != IPV6_V6ONLY) return fail(ENOTSUP);
      put_int(optval, optlen, bit(r.ipv6_opts, optname));
      return 0;
    case SOL_RDMA:
      switch (optname) {
        case RDMA_SQSIZE:
          put_int(optval, optlen, r.sq_size);
          return 0;
        case RDMA_RQSIZE:
          put_int(optval, optlen, r.rq_size);
          return 0;
        case RDMA_INLINE:
          put_int(optval, optlen, r.sq_inline);
          return 0;
        case RDMA_IOMAPSIZE:
          put_int(optval, optlen, r.target_iomap_size);
          return 0;
        case RDMA_ROUTE: {
          // The route given with rsetsockopt, else the id's paths as ibv_path_data.
          if (!r.route.empty()) {
            if (*optlen < r.route.size()) return fail(EINVAL);
            std::memcpy(optval, r.route.data(), r.route.size());
            *optlen = static_cast<socklen_t>(r.route.size());
            return 0;
          }
          if (*optlen < sizeof(ibv_path_data)) return fail(EINVAL);
          socklen_t len = 0;
          auto* out = static_cast<uint8_t*>(optval);
          for (int i = 0; r.id && i < r.id->route.num_paths && len + sizeof(ibv_path_data) <= *optlen; ++i) {
            const ibv_sa_path_rec& sa = r.id->route.path_rec[i];
            ibv_path_data pd{};
            pd.path.dgid = sa.dgid;
            pd.path.sgid = sa.sgid;
            pd.path.dlid = sa.dlid;
            pd.path.slid = sa.slid;
            pd.path.flowlabel_hoplimit = htobe32((be32toh(sa.flow_label) << 8) | sa.hop_limit);
            pd.path.tclass = sa.traffic_class;
            pd.path.reversible_numpath = static_cast<uint8_t>(sa.reversible << 7 | 1);
            pd.path.pkey = sa.pkey;
            pd.path.qosclass_sl = htobe16(sa.sl);
            pd.path.mtu = static_cast<uint8_t>(sa.mtu | 2 << 6);  // selector "exactly"
            pd.path.rate = static_cast<uint8_t>(sa.rate | 2 << 6);
            pd.path.packetlifetime = static_cast<uint8_t>(sa.packet_life_time | 2 << 6);
            pd.flags = sa.preference;
            std::memcpy(out + len, &pd, sizeof pd);
            len += sizeof pd;
          }
          *optlen = len;
          return 0;
        }
        default:
          return fail(ENOTSUP);
      }
    default:
      return fail(ENOTSUP);
  }
}

void copy_addr(const sockaddr* src, sockaddr* dst, socklen_t* len) {
  const socklen_t size = src->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  std::memcpy(dst, src, std::min(*len, size));
  *len = size;
}

ssize_t do_recv(int socket, void* buf, size_t len, int flags) {
  return guarded(ssize_t{-1}, [&]() -> ssize_t {
    SV_RS_OR_EBADF(socket, -1);
    std::unique_lock lk(s->mu);
    if (s->dg) {
      iovec iov{buf, len};
      return rs::dgram_recvfrom(*s, lk, &iov, 1, flags, nullptr, nullptr);
    }
    return rs::recv(*s, lk, buf, len, flags);
  });
}

// The destination counts for a datagram rsocket only (a stream ignores it,
// as send(2) on a connected TCP socket does).
ssize_t do_sendv(int socket, const iovec* iov, int iovcnt, int flags, const sockaddr* dest = nullptr,
                 socklen_t destlen = 0) {
  return guarded(ssize_t{-1}, [&]() -> ssize_t {
    SV_RS_OR_EBADF(socket, -1);
    if (iovcnt < 0 || (iovcnt && !iov)) return fail(EINVAL);
    std::unique_lock lk(s->mu);
    if (s->dg) return rs::dgram_sendto(*s, lk, iov, iovcnt, flags, dest, destlen);
    if (!iovcnt) return 0;
    return rs::sendv(*s, lk, iov, iovcnt, flags);
  });
}

// Fills the vector in order: the first with the call's blocking rules, the
// rest with what is already there.
ssize_t do_recvv(int socket, const iovec* iov, int iovcnt, int flags, sockaddr* src = nullptr,
                 socklen_t* srclen = nullptr) {
  if (iovcnt < 0 || (iovcnt && !iov)) return fail(EINVAL);
  if (rs::RsPtr s = rs::lookup(socket); s && s->dg) {
    // One datagram across the vector.
    return guarded(ssize_t{-1}, [&]() -> ssize_t {
      std::unique_lock lk(s->mu);
      return rs::dgram_recvfrom(*s, lk, iov, iovcnt, flags, src, srclen);
    });
  }
  ssize_t total = 0;
  for (int i = 0; i < iovcnt; ++i) {
    if (!iov[i].iov_len) continue;
    const ssize_t n = do_recv(socket, iov[i].iov_base, iov[i].iov_len, total ? flags | MSG_DONTWAIT : flags);
    if (n < 0) return total ? total : n;
    total += n;
    if (static_cast<size_t>(n) < iov[i].iov_len) break;
  }
  return total;
}

}  // namespace

SV_EXPORT int rsocket(int domain, int type, int protocol) {
  return guarded(-1, [&] { return rs::create(domain, type, protocol); });
}

SV_EXPORT int rbind(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    std::lock_guard lk(s->mu);
    if (s->dg) return rs::dgram_bind(*s, addr, addrlen);
    return rs::bind(*s, addr);
  });
}

SV_EXPORT int rlisten(int socket, int backlog) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    if (s->dg) return fail(EOPNOTSUPP);
    std::lock_guard lk(s->mu);
    return rs::listen(*s, backlog);
  });
}

SV_EXPORT int raccept(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    if (s->dg) return fail(EOPNOTSUPP);
    return rs::accept(s, addr, addrlen);
  });
}

SV_EXPORT int rconnect(int socket, const struct sockaddr* addr, socklen_t addrlen) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    if (s->dg) {
      std::lock_guard lk(s->mu);
      return rs::dgram_connect(*s, addr, addrlen);
    }
    return rs::connect(*s, addr, addrlen);
  });
}

SV_EXPORT int rshutdown(int socket, int how) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    std::unique_lock lk(s->mu);
    if (s->dg) {
      // rdma-core's ds_shutdown: the directions are closed, nothing is sent.
      if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return fail(EINVAL);
      if (how != SHUT_WR) s->state &= ~rs::kReadable;
      if (how != SHUT_RD) s->state &= ~rs::kWritable;
      return 0;
    }
    return rs::shutdown(*s, lk, how);
  });
}

SV_EXPORT int rclose(int socket) {
  return guarded(-1, [&] { return rs::close(socket); });
}

SV_EXPORT ssize_t rrecv(int socket, void* buf, size_t len, int flags) { return do_recv(socket, buf, len, flags); }

SV_EXPORT ssize_t rrecvfrom(int socket, void* buf, size_t len, int flags, struct sockaddr* src_addr,
                            socklen_t* addrlen) {
  if (rs::RsPtr s = rs::lookup(socket); s && s->dg) {
    iovec iov{buf, len};
    return do_recvv(socket, &iov, 1, flags, src_addr, addrlen);
  }
  const ssize_t n = do_recv(socket, buf, len, flags);
  if (n > 0 && src_addr && addrlen) rgetpeername(socket, src_addr, addrlen);
  return n;
}

SV_EXPORT ssize_t rrecvmsg(int socket, struct msghdr* msg, int flags) {
  if (!msg) return fail(EINVAL);
  if (msg->msg_control && msg->msg_controllen) return fail(ENOTSUP);
  return do_recvv(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags, static_cast<sockaddr*>(msg->msg_name),
                  msg->msg_name ? &msg->msg_namelen : nullptr);
}

SV_EXPORT ssize_t rsend(int socket, const void* buf, size_t len, int flags) {
  iovec iov{const_cast<void*>(buf), len};
  return do_sendv(socket, &iov, 1, flags);
}

SV_EXPORT ssize_t rsendto(int socket, const void* buf, size_t len, int flags, const struct sockaddr* dest,
                          socklen_t addrlen) {
  iovec iov{const_cast<void*>(buf), len};
  return do_sendv(socket, &iov, 1, flags, dest, addrlen);
}

SV_EXPORT ssize_t rsendmsg(int socket, const struct msghdr* msg, int flags) {
  if (!msg) return fail(EINVAL);
  if (msg->msg_control && msg->msg_controllen) return fail(ENOTSUP);
  return do_sendv(socket, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags,
                  static_cast<const sockaddr*>(msg->msg_name), msg->msg_namelen);
}

SV_EXPORT ssize_t rread(int socket, void* buf, size_t count) { return do_recv(socket, buf, count, 0); }
SV_EXPORT ssize_t rreadv(int socket, const struct iovec* iov, int iovcnt) { return do_recvv(socket, iov, iovcnt, 0); }
SV_EXPORT ssize_t rwrite(int socket, const void* buf, size_t count) { return rsend(socket, buf, count, 0); }
SV_EXPORT ssize_t rwritev(int socket, const struct iovec* iov, int iovcnt) { return do_sendv(socket, iov, iovcnt, 0); }

SV_EXPORT int rpoll(struct pollfd* fds, nfds_t nfds, int timeout) {
  return guarded(-1, [&]() -> int {
    if (nfds && !fds) return fail(EFAULT);
    return rs::poll(fds, nfds, timeout);
  });
}

SV_EXPORT int rselect(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, struct timeval* timeout) {
  return guarded(-1, [&] { return rs::select(nfds, readfds, writefds, exceptfds, timeout); });
}

SV_EXPORT int rgetpeername(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    if (!addr || !addrlen) return fail(EFAULT);
    std::lock_guard lk(s->mu);
    if (s->dg) return ::getpeername(s->dg->udp, addr, addrlen);
    copy_addr(rdma_get_peer_addr(s->id), addr, addrlen);
    return 0;
  });
}

SV_EXPORT int rgetsockname(int socket, struct sockaddr* addr, socklen_t* addrlen) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    if (!addr || !addrlen) return fail(EFAULT);
    std::lock_guard lk(s->mu);
    if (s->dg) return ::getsockname(s->dg->udp, addr, addrlen);
    copy_addr(rdma_get_local_addr(s->id), addr, addrlen);
    return 0;
  });
}

SV_EXPORT int rsetsockopt(int socket, int level, int optname, const void* optval, socklen_t optlen) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    std::lock_guard lk(s->mu);
    return setsockopt_locked(s, level, optname, optval, optlen);
  });
}

SV_EXPORT int rgetsockopt(int socket, int level, int optname, void* optval, socklen_t* optlen) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    std::lock_guard lk(s->mu);
    return getsockopt_locked(*s, level, optname, optval, optlen);
  });
}

SV_EXPORT int rfcntl(int socket, int cmd, ...) {
  va_list args;
  va_start(args, cmd);
  const int param = cmd == F_SETFL ? va_arg(args, int) : 0;
  va_end(args);
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    std::lock_guard lk(s->mu);
    switch (cmd) {
      case F_GETFL:
        return s->fd_flags;
      case F_SETFL:
        s->fd_flags = param;
        return 0;
      default:
        return fail(ENOTSUP);
    }
  });
}

SV_EXPORT off_t riomap(int socket, void* buf, size_t len, int prot, int /*flags*/, off_t offset) {
  return guarded(off_t{-1}, [&]() -> off_t {
    SV_RS_OR_EBADF(socket, -1);
    if (s->dg) return fail(EOPNOTSUPP);
    std::lock_guard lk(s->mu);
    return rs::iomap(*s, buf, len, prot, offset);
  });
}

SV_EXPORT int riounmap(int socket, void* buf, size_t len) {
  return guarded(-1, [&]() -> int {
    SV_RS_OR_EBADF(socket, -1);
    std::lock_guard lk(s->mu);
    return rs::iounmap(*s, buf, len);
  });
}

// -1 as a size_t on failure, as rdma-core returns it.
SV_EXPORT size_t riowrite(int socket, const void* buf, size_t count, off_t offset, int flags) {
  return static_cast<size_t>(guarded(ssize_t{-1}, [&]() -> ssize_t {
    SV_RS_OR_EBADF(socket, -1);
    if (s->dg) return fail(EOPNOTSUPP);
    std::unique_lock lk(s->mu);
    return rs::iowrite(*s, lk, buf, count, offset, flags);
  }));
}

// librspreload.so: TCP and UDP sockets over rsockets for unmodified
// programs, by LD_PRELOAD (rdma-core's librspreload, same idea, our own code):
//  * socket(AF_INET/AF_INET6, SOCK_STREAM, 0 or IPPROTO_TCP) makes a real
//    socket, whose number the program sees, and an rsocket behind it; every
//    socket call on that number goes to the rsocket (rbind, rconnect, rsend,
//    rpoll, ...). If no rsocket can be made, the real socket is the program's
//    (no RDMA device: plain TCP).
//  * socket(AF_INET/AF_INET6, SOCK_DGRAM, 0 or IPPROTO_UDP) the same way,
//    with a datagram rsocket, when the process has an RDMA device (rdma-core
//    maps UDP sockets too). The UDP sockets our own libraries make (the
//    emulated devices', a datagram rsocket's own) are never mapped: the
//    caller's address says whose call it is.
//  * accept() on such a socket maps the accepted rsocket to a new real socket
//    number the same way.
//  * every other descriptor goes to libc unchanged, including the ones our
//    own libraries poll and close inside the rsockets (their numbers are not
//    the program's, so they are never mapped).
// Not covered: dup/dup2 of a mapped socket, fork with open rsockets,
// sendfile, epoll, and descriptors passed between processes.
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

#define SV_PRELOAD extern "C" __attribute__((visibility("default")))

namespace {

// The program's descriptor -> rsocket + 1 (0: not an rsocket).
constexpr int kMaxFd = 1 << 16;
std::atomic<int> g_map[kMaxFd];

int rs_of(int fd) { return fd >= 0 && fd < kMaxFd ? g_map[fd].load(std::memory_order_acquire) - 1 : -1; }

// libc's own function of the same name.
template <class F>
F real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}
#define SV_REAL(name) static const auto real_##name = real<decltype(&::name)>(#name)

// Whether the code at `ret` (a caller's return address) is in our own
// libibverbs.so.1 or librdmacm.so.1.
bool in_our_libraries(void* ret) {
  Dl_info info{};
  if (!ret || !dladdr(ret, &info) || !info.dli_fname) return false;
  const char* slash = std::strrchr(info.dli_fname, '/');
  const char* base = slash ? slash + 1 : info.dli_fname;
  return std::strncmp(base, "libibverbs.so", 13) == 0 || std::strncmp(base, "librdmacm.so", 12) == 0;
}

bool have_rdma_device() {
  int n = 0;
  if (ibv_context** devs = rdma_get_devices(&n)) rdma_free_devices(devs);
  return n > 0;
}

// Maps a fresh real socket number to rsocket `r`; -1 (r closed) when none can be had.
int map_new(int domain, int r) {
  SV_REAL(socket);
  const int fd = real_socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || fd >= kMaxFd) {
    if (fd >= 0) close(fd);
    rclose(r);
    errno = EMFILE;
    return -1;
  }
  g_map[fd].store(r + 1, std::memory_order_release);
  return fd;
}

}  // namespace

SV_PRELOAD int socket(int domain, int type, int protocol) {
  SV_REAL(socket);
  const int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  const bool inet = domain == AF_INET || domain == AF_INET6;
  const bool tcp = inet && base == SOCK_STREAM && (protocol == 0 || protocol == IPPROTO_TCP);
  const bool udp = inet && base == SOCK_DGRAM && (protocol == 0 || protocol == IPPROTO_UDP) &&
                   !in_our_libraries(__builtin_return_address(0));
  const int fd = real_socket(domain, type, protocol);
  if (!(tcp || udp) || fd < 0 || fd >= kMaxFd) return fd;
  const int saved = errno;
  // A datagram rsocket is made without a device (its QPs come later), so
  // that one is asked first.
  const int r = udp && !have_rdma_device() ? -1 : rsocket(domain, base, 0);
  errno = saved;
  if (r < 0) return fd;  // no rsockets here: the program keeps its TCP socket
  if (type & SOCK_NONBLOCK) rfcntl(r, F_SETFL, O_NONBLOCK);
  g_map[fd].store(r + 1, std::memory_order_release);
  return fd;
}

SV_PRELOAD int bind(int fd, const sockaddr* addr, socklen_t len) {
  SV_REAL(bind);
  const int r = rs_of(fd);
  return r >= 0 ? rbind(r, addr, len) : real_bind(fd, addr, len);
}

SV_PRELOAD int listen(int fd, int backlog) {
  SV_REAL(listen);
  const int r = rs_of(fd);
  return r >= 0 ? rlisten(r, backlog) : real_listen(fd, backlog);
}

SV_PRELOAD int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  SV_REAL(accept4);
  const int r = rs_of(fd);
  if (r < 0) return real_accept4(fd, addr, len, flags);
  const int nr = raccept(r, addr, len);
  if (nr < 0) return -1;
  if (flags & SOCK_NONBLOCK) rfcntl(nr, F_SETFL, O_NONBLOCK);
  sockaddr_storage self{};
  socklen_t slen = sizeof self;
  rgetsockname(nr, reinterpret_cast<sockaddr*>(&self), &slen);
  return map_new(self.ss_family == AF_INET6 ? AF_INET6 : AF_INET, nr);
}

SV_PRELOAD int accept(int fd, sockaddr* addr, socklen_t* len) {
  SV_REAL(accept);
  return rs_of(fd) >= 0 ? accept4(fd, addr, len, 0) : real_accept(fd, addr, len);
}

SV_PRELOAD int connect(int fd, const sockaddr* addr, socklen_t len) {
  SV_REAL(connect);
  const int r = rs_of(fd);
  return r >= 0 ? rconnect(r, addr, len) : real_connect(fd, addr, len);
}

SV_PRELOAD ssize_t recv(int fd, void* buf, size_t len, int flags) {
  SV_REAL(recv);
  const int r = rs_of(fd);
  return r >= 0 ? rrecv(r, buf, len, flags) : real_recv(fd, buf, len, flags);
}

SV_PRELOAD ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* src, socklen_t* slen) {
  SV_REAL(recvfrom);
  const int r = rs_of(fd);
  return r >= 0 ? rrecvfrom(r, buf, len, flags, src, slen) : real_recvfrom(fd, buf, len, flags, src, slen);
}

SV_PRELOAD ssize_t recvmsg(int fd, msghdr* msg, int flags) {
  SV_REAL(recvmsg);
  const int r = rs_of(fd);
  return r >= 0 ? rrecvmsg(r, msg, flags) : real_recvmsg(fd, msg, flags);
}

SV_PRELOAD ssize_t read(int fd, void* buf, size_t count) {
  SV_REAL(read);
  const int r = rs_of(fd);
  return r >= 0 ? rread(r, buf, count) : real_read(fd, buf, count);
}

SV_PRELOAD ssize_t readv(int fd, const iovec* iov, int iovcnt) {
  SV_REAL(readv);
  const int r = rs_of(fd);
  return r >= 0 ? rreadv(r, iov, iovcnt) : real_readv(fd, iov, iovcnt);
}

SV_PRELOAD ssize_t send(int fd, const void* buf, size_t len, int flags) {
  SV_REAL(send);
  const int r = rs_of(fd);
  return r >= 0 ? rsend(r, buf, len, flags) : real_send(fd, buf, len, flags);
}

SV_PRELOAD ssize_t sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* dst, socklen_t dlen) {
  SV_REAL(sendto);
  const int r = rs_of(fd);
  return r >= 0 ? rsendto(r, buf, len, flags, dst, dlen) : real_sendto(fd, buf, len, flags, dst, dlen);
}

SV_PRELOAD ssize_t sendmsg(int fd, const msghdr* msg, int flags) {
  SV_REAL(sendmsg);
  const int r = rs_of(fd);
  return r >= 0 ? rsendmsg(r, msg, flags) : real_sendmsg(fd, msg, flags);
}

SV_PRELOAD ssize_t write(int fd, const void* buf, size_t count) {
  SV_REAL(write);
  const int r = rs_of(fd);
  return r >= 0 ? rwrite(r, buf, count) : real_write(fd, buf, count);
}

SV_PRELOAD ssize_t writev(int fd, const iovec* iov, int iovcnt) {
  SV_REAL(writev);
  const int r = rs_of(fd);
  return r >= 0 ? rwritev(r, iov, iovcnt) : real_writev(fd, iov, iovcnt);
}

SV_PRELOAD int shutdown(int fd, int how) {
  SV_REAL(shutdown);
  const int r = rs_of(fd);
  return r >= 0 ? rshutdown(r, how) : real_shutdown(fd, how);
}

SV_PRELOAD int close(int fd) {
  SV_REAL(close);
  const int r = rs_of(fd);
  if (r >= 0) {
    g_map[fd].store(0, std::memory_order_release);
    rclose(r);
  }
  return real_close(fd);
}

SV_PRELOAD int getpeername(int fd, sockaddr* addr, socklen_t* len) {
  SV_REAL(getpeername);
  const int r = rs_of(fd);
  return r >= 0 ? rgetpeername(r, addr, len) : real_getpeername(fd, addr, len);
}

SV_PRELOAD int getsockname(int fd, sockaddr* addr, socklen_t* len) {
  SV_REAL(getsockname);
  const int r = rs_of(fd);
  return r >= 0 ? rgetsockname(r, addr, len) : real_getsockname(fd, addr, len);
}

SV_PRELOAD int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  SV_REAL(setsockopt);
  const int r = rs_of(fd);
  return r >= 0 ? rsetsockopt(r, level, name, val, len) : real_setsockopt(fd, level, name, val, len);
}

SV_PRELOAD int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  SV_REAL(getsockopt);
  const int r = rs_of(fd);
  return r >= 0 ? rgetsockopt(r, level, name, val, len) : real_getsockopt(fd, level, name, val, len);
}

// F_GETFL/F_SETFL reach the rsocket; the rest (F_GETFD, F_SETFD, ...) the
// real socket behind the number.
SV_PRELOAD int fcntl(int fd, int cmd, ...) {
  SV_REAL(fcntl);
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  const int r = rs_of(fd);
  if (r >= 0 && cmd == F_GETFL) return rfcntl(r, F_GETFL) | O_RDWR;
  if (r >= 0 && cmd == F_SETFL) return rfcntl(r, F_SETFL, static_cast<int>(reinterpret_cast<intptr_t>(arg)));
  return real_fcntl(fd, cmd, arg);
}

// The rsockets among the fds are polled by rpoll under their rsocket numbers.
SV_PRELOAD int poll(pollfd* fds, nfds_t nfds, int timeout) {
  SV_REAL(poll);
  bool any = false;
  for (nfds_t i = 0; i < nfds && !any; ++i) any = rs_of(fds[i].fd) >= 0;
  if (!any) return real_poll(fds, nfds, timeout);
  auto* copy = static_cast<pollfd*>(std::malloc(sizeof(pollfd) * nfds));
  if (!copy) {
    errno = ENOMEM;
    return -1;
  }
  for (nfds_t i = 0; i < nfds; ++i) {
    copy[i] = fds[i];
    const int r = rs_of(fds[i].fd);
    if (r >= 0) copy[i].fd = r;
  }
  const int n = rpoll(copy, nfds, timeout);
  for (nfds_t i = 0; i < nfds; ++i) fds[i].revents = copy[i].revents;
  std::free(copy);
  return n;
}

// select as poll, with the answers put back under the program's numbers.
SV_PRELOAD int select(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, timeval* tv) {
  SV_REAL(select);
  bool any = false;
  for (int fd = 0; fd < nfds && !any; ++fd)
    any = rs_of(fd) >= 0 && ((rd && FD_ISSET(fd, rd)) || (wr && FD_ISSET(fd, wr)) || (ex && FD_ISSET(fd, ex)));
  if (!any) return real_select(nfds, rd, wr, ex, tv);
  pollfd fds[FD_SETSIZE];
  nfds_t n = 0;
  for (int fd = 0; fd < nfds && fd < FD_SETSIZE; ++fd) {
    short ev = 0;
    const bool want = (rd && FD_ISSET(fd, rd)) || (wr && FD_ISSET(fd, wr)) || (ex && FD_ISSET(fd, ex));
    if (rd && FD_ISSET(fd, rd)) ev |= POLLIN;
    if (wr && FD_ISSET(fd, wr)) ev |= POLLOUT;
    if (want) fds[n++] = {fd, ev, 0};
  }
  const int timeout = tv ? static_cast<int>(tv->tv_sec * 1000 + tv->tv_usec / 1000) : -1;
  int ret = poll(fds, n, timeout);
  if (rd) FD_ZERO(rd);
  if (wr) FD_ZERO(wr);
  if (ex) FD_ZERO(ex);
  if (ret <= 0) return ret;
  ret = 0;
  for (nfds_t i = 0; i < n; ++i) {
    if (rd && (fds[i].revents & (POLLIN | POLLHUP))) FD_SET(fds[i].fd, rd), ++ret;
    if (wr && (fds[i].revents & POLLOUT)) FD_SET(fds[i].fd, wr), ++ret;
    if (ex && (fds[i].revents & ~(POLLIN | POLLOUT | POLLHUP))) FD_SET(fds[i].fd, ex), ++ret;
  }
  return ret;
}

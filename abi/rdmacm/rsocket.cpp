// The rsocket exports of librdmacm.so.1 (rdma/rsocket.h, node RDMACM_1.0).
// rsockets are not offered yet (docs/compatibility.md): the symbols exist, so
// programs linked against rdma-core's librdmacm load, and every call fails the
// way the socket call it mirrors fails when the socket cannot exist.
//  * rsocket(): -1 with EAFNOSUPPORT, socket(2)'s answer for a family the
//    system does not support.
//  * every call on a descriptor, rpoll and rselect included: -1 with EBADF,
//    rdma-core's own answer for a descriptor that is not an rsocket (its
//    descriptor table has no entry for it). Since rsocket() never succeeds, no
//    descriptor is one. riomap's -1 is an off_t, riowrite's a size_t, as there.
// Nothing succeeds silently: a program that falls back to plain sockets on
// failure (as librspreload's callers do) does so.
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>

#include <cerrno>

#include "abi/common/export.hpp"

namespace {

int no_rsocket() {
  errno = EBADF;
  return -1;
}

}  // namespace

SV_EXPORT int rsocket(int /*domain*/, int /*type*/, int /*protocol*/) {
  errno = EAFNOSUPPORT;
  return -1;
}

SV_EXPORT int rbind(int, const struct sockaddr*, socklen_t) { return no_rsocket(); }
SV_EXPORT int rlisten(int, int) { return no_rsocket(); }
SV_EXPORT int raccept(int, struct sockaddr*, socklen_t*) { return no_rsocket(); }
SV_EXPORT int rconnect(int, const struct sockaddr*, socklen_t) { return no_rsocket(); }
SV_EXPORT int rshutdown(int, int) { return no_rsocket(); }
SV_EXPORT int rclose(int) { return no_rsocket(); }

SV_EXPORT ssize_t rrecv(int, void*, size_t, int) { return no_rsocket(); }
SV_EXPORT ssize_t rrecvfrom(int, void*, size_t, int, struct sockaddr*, socklen_t*) { return no_rsocket(); }
SV_EXPORT ssize_t rrecvmsg(int, struct msghdr*, int) { return no_rsocket(); }
SV_EXPORT ssize_t rsend(int, const void*, size_t, int) { return no_rsocket(); }
SV_EXPORT ssize_t rsendto(int, const void*, size_t, int, const struct sockaddr*, socklen_t) { return no_rsocket(); }
SV_EXPORT ssize_t rsendmsg(int, const struct msghdr*, int) { return no_rsocket(); }
SV_EXPORT ssize_t rread(int, void*, size_t) { return no_rsocket(); }
SV_EXPORT ssize_t rreadv(int, const struct iovec*, int) { return no_rsocket(); }
SV_EXPORT ssize_t rwrite(int, const void*, size_t) { return no_rsocket(); }
SV_EXPORT ssize_t rwritev(int, const struct iovec*, int) { return no_rsocket(); }

SV_EXPORT int rpoll(struct pollfd*, nfds_t, int) { return no_rsocket(); }
SV_EXPORT int rselect(int, fd_set*, fd_set*, fd_set*, struct timeval*) { return no_rsocket(); }

SV_EXPORT int rgetpeername(int, struct sockaddr*, socklen_t*) { return no_rsocket(); }
SV_EXPORT int rgetsockname(int, struct sockaddr*, socklen_t*) { return no_rsocket(); }
SV_EXPORT int rsetsockopt(int, int, int, const void*, socklen_t) { return no_rsocket(); }
SV_EXPORT int rgetsockopt(int, int, int, void*, socklen_t*) { return no_rsocket(); }
SV_EXPORT int rfcntl(int, int, ...) { return no_rsocket(); }

SV_EXPORT off_t riomap(int, void*, size_t, int, int, off_t) { return no_rsocket(); }
SV_EXPORT int riounmap(int, void*, size_t) { return no_rsocket(); }
SV_EXPORT size_t riowrite(int, const void*, size_t, off_t, int) { return static_cast<size_t>(no_rsocket()); }

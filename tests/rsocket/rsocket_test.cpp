// Stream rsockets over the emulated CM, in one process (tests/rsocket/CMakeLists.txt
// pins two devices, 127.0.0.54 and 127.0.0.55): the calls' errors as rdma-core
// gives them, connection setup blocking and non-blocking, data in both
// directions beyond the buffer sizes, rpoll/rselect, shutdown and options.
// Every wait is bounded: blocking calls only once the peer is known to be
// there, rpoll with a timeout otherwise.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <future>
#include <numeric>
#include <thread>
#include <vector>

namespace {

constexpr int kWaitMs = 20000;

sockaddr_in addr(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

// A listener on 127.0.0.54:port.
int listener(uint16_t port) {
  int l = rsocket(AF_INET, SOCK_STREAM, 0);
  if (l < 0) return -1;
  int one = 1;
  rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = addr("127.0.0.54", port);
  if (rbind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) || rlisten(l, 4)) {
    rclose(l);
    return -1;
  }
  return l;
}

// Waits (bounded) for events on one rsocket.
short wait_for(int fd, short events) {
  pollfd p{fd, events, 0};
  return rpoll(&p, 1, kWaitMs) == 1 ? p.revents : 0;
}

// Connected pair: {client, server}.
std::pair<int, int> connected_pair(uint16_t port) {
  int l = listener(port);
  EXPECT_GE(l, 0) << strerror(errno);
  auto server = std::async(std::launch::async, [l] {
    if (!(wait_for(l, POLLIN) & POLLIN)) return -1;
    return raccept(l, nullptr, nullptr);
  });
  int c = rsocket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = addr("127.0.0.54", port);
  EXPECT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  int s = server.get();
  EXPECT_GE(s, 0) << strerror(errno);
  rclose(l);
  return {c, s};
}

// Sends all of buf (blocking).
bool send_all(int fd, const uint8_t* buf, size_t len) {
  while (len) {
    ssize_t n = rsend(fd, buf, len, 0);
    if (n <= 0) return false;
    buf += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool recv_all(int fd, uint8_t* buf, size_t len) {
  while (len) {
    ssize_t n = rrecv(fd, buf, len, 0);
    if (n <= 0) return false;
    buf += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

TEST(Rsocket, ErrorsAreRdmaCores) {
  errno = 0;
  EXPECT_EQ(rsocket(AF_UNIX, SOCK_STREAM, 0), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rsocket(AF_INET, SOCK_SEQPACKET, 0), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rsocket(AF_INET, SOCK_STREAM, IPPROTO_UDP), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rsocket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), -1);
  EXPECT_EQ(errno, ENOTSUP);

  char b[8];
  EXPECT_EQ(rsend(0, b, sizeof b, 0), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rclose(0), -1);
  EXPECT_EQ(errno, EBADF);

  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0) << strerror(errno);
  EXPECT_EQ(raccept(fd, nullptr, nullptr), -1);  // not listening
  EXPECT_EQ(errno, EBADF);
  int v = 0;
  socklen_t len = sizeof v;
  EXPECT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_BROADCAST, &v, &len), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_BROADCAST, &v, sizeof v), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rfcntl(fd, F_GETFD), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(riomap(fd, b, sizeof b, PROT_WRITE, 0, -1), -1);  // not connected
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(riounmap(fd, b, sizeof b), -1);
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in nowhere = addr("10.255.255.1", 1);
  EXPECT_EQ(rbind(fd, reinterpret_cast<sockaddr*>(&nowhere), sizeof nowhere), -1);
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  EXPECT_EQ(rclose(fd), 0);
}

TEST(Rsocket, OptionsBeforeAndAfterConnecting) {
  int fd = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  int v = 1000;
  socklen_t len = sizeof v;
  ASSERT_EQ(rsetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v), 0);
  ASSERT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &len), 0);
  EXPECT_EQ(v, 2000);  // doubled, as the kernel and rdma-core do
  v = 1;
  ASSERT_EQ(rsetsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v), 0);
  v = 0;
  ASSERT_EQ(rgetsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0);
  EXPECT_EQ(v, 1);
  v = 100;
  ASSERT_EQ(rsetsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), 0);
  ASSERT_EQ(rgetsockopt(fd, SOL_RDMA, RDMA_SQSIZE, &v, &len), 0);
  EXPECT_EQ(v, 100);
  linger lg{};
  socklen_t llen = sizeof lg;
  ASSERT_EQ(rgetsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &llen), 0);
  EXPECT_EQ(lg.l_onoff, 1);  // rdma-core: on by default
  ASSERT_EQ(rgetsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &v, &len), 0);
  EXPECT_EQ(v, 2048);
  EXPECT_EQ(rclose(fd), 0);

  auto [c, s] = connected_pair(7601);
  v = 64;
  EXPECT_EQ(rsetsockopt(c, SOL_RDMA, RDMA_INLINE, &v, sizeof v), -1);  // too late
  EXPECT_EQ(errno, EINVAL);
  v = -1;
  ASSERT_EQ(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &v, &len), 0);
  EXPECT_EQ(v, 0);
  rclose(c);
  rclose(s);
}

TEST(Rsocket, BlockingTransferBothWaysAndOrderlyClose) {
  auto [c, s] = connected_pair(7602);
  ASSERT_GE(c, 0);
  ASSERT_GE(s, 0);

  sockaddr_in peer{}, self{};
  socklen_t plen = sizeof peer, slen = sizeof self;
  ASSERT_EQ(rgetpeername(c, reinterpret_cast<sockaddr*>(&peer), &plen), 0);
  ASSERT_EQ(rgetsockname(s, reinterpret_cast<sockaddr*>(&self), &slen), 0);
  EXPECT_EQ(plen, sizeof(sockaddr_in));
  EXPECT_EQ(ntohs(peer.sin_port), 7602);
  EXPECT_EQ(peer.sin_addr.s_addr, self.sin_addr.s_addr);

  // 3 MiB: many times the 256 KiB buffers, so credits and buffer
  // advertisements go round many times.
  std::vector<uint8_t> out(3 << 20), in(out.size());
  std::iota(out.begin(), out.end(), uint8_t{7});
  auto sender = std::async(std::launch::async, [&] { return send_all(c, out.data(), out.size()); });
  ASSERT_TRUE(recv_all(s, in.data(), in.size()));
  ASSERT_TRUE(sender.get());
  EXPECT_EQ(in, out);

  // The other way, through rwritev/rreadv.
  const char msg[] = "the other way";
  iovec wv[2] = {{const_cast<char*>(msg), 4}, {const_cast<char*>(msg) + 4, sizeof msg - 4}};
  ASSERT_EQ(rwritev(s, wv, 2), static_cast<ssize_t>(sizeof msg));
  char got[sizeof msg] = {};
  ASSERT_TRUE(wait_for(c, POLLIN) & POLLIN);
  char peek[4];
  ASSERT_EQ(rrecv(c, peek, sizeof peek, MSG_PEEK), 4);
  EXPECT_EQ(std::memcmp(peek, msg, 4), 0);
  iovec rv[2] = {{got, 4}, {got + 4, sizeof got - 4}};
  ssize_t n = rreadv(c, rv, 2);
  while (n >= 0 && n < static_cast<ssize_t>(sizeof got)) {
    ssize_t m = rread(c, got + n, sizeof got - static_cast<size_t>(n));
    if (m <= 0) break;
    n += m;
  }
  ASSERT_EQ(n, static_cast<ssize_t>(sizeof msg));
  EXPECT_STREQ(got, msg);

  // The client shuts down: the server reads the end of the stream.
  ASSERT_EQ(rshutdown(c, SHUT_RDWR), 0);
  short ev = wait_for(s, POLLIN);
  EXPECT_TRUE(ev & (POLLIN | POLLHUP));
  EXPECT_EQ(rrecv(s, got, sizeof got, 0), 0);
  EXPECT_EQ(rclose(c), 0);
  EXPECT_EQ(rclose(s), 0);
}

TEST(Rsocket, NonBlockingConnectAndPoll) {
  int l = listener(7603);
  ASSERT_GE(l, 0);
  ASSERT_EQ(rfcntl(l, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(rfcntl(l, F_GETFL), O_NONBLOCK);
  EXPECT_EQ(raccept(l, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd lp{l, POLLIN, 0};
  EXPECT_EQ(rpoll(&lp, 1, 0), 0);

  int c = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(rfcntl(c, F_SETFL, O_NONBLOCK), 0);
  sockaddr_in src = addr("127.0.0.55", 0);
  ASSERT_EQ(rbind(c, reinterpret_cast<sockaddr*>(&src), sizeof src), 0);
  sockaddr_in a = addr("127.0.0.54", 7603);
  ASSERT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  ASSERT_EQ(errno, EINPROGRESS);

  // Both sides progress only through rpoll, on one thread.
  int s = -1;
  bool connected = false;
  for (int round = 0; round < 1000 && (s < 0 || !connected); ++round) {
    pollfd p[2] = {{l, POLLIN, 0}, {c, POLLOUT, 0}};
    ASSERT_GE(rpoll(p, 2, kWaitMs), 1);
    if (s < 0 && (p[0].revents & POLLIN)) s = raccept(l, nullptr, nullptr);
    if (p[1].revents & POLLOUT) connected = true;
    ASSERT_FALSE(p[1].revents & POLLERR);
  }
  ASSERT_GE(s, 0);
  ASSERT_TRUE(connected);
  int err = -1;
  socklen_t len = sizeof err;
  ASSERT_EQ(rgetsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  EXPECT_EQ(err, 0);

  // Nothing to read: EAGAIN, and a short rpoll times out.
  char b[16];
  EXPECT_EQ(rrecv(c, b, sizeof b, 0), -1);
  EXPECT_EQ(errno, EAGAIN);
  pollfd p{c, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 50), 0);

  // rselect sees the data once sent.
  ASSERT_EQ(rsend(s, "ping", 4, 0), 4);
  fd_set rd;
  FD_ZERO(&rd);
  FD_SET(c, &rd);
  timeval tv{20, 0};
  ASSERT_EQ(rselect(c + 1, &rd, nullptr, nullptr, &tv), 1);
  EXPECT_TRUE(FD_ISSET(c, &rd));
  EXPECT_EQ(rrecv(c, b, sizeof b, 0), 4);
  rclose(c);
  rclose(s);
  rclose(l);
}

TEST(Rsocket, RiowriteLandsInTheMappedBuffer) {
  // Both sides get one iomap slot; the listener's accepted socket inherits it.
  int l = listener(7604);
  ASSERT_GE(l, 0);
  int one = 1;
  ASSERT_EQ(rsetsockopt(l, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof one), 0);
  auto server = std::async(std::launch::async, [l] {
    if (!(wait_for(l, POLLIN) & POLLIN)) return -1;
    return raccept(l, nullptr, nullptr);
  });
  int c = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(rsetsockopt(c, SOL_RDMA, RDMA_IOMAPSIZE, &one, sizeof one), 0);
  sockaddr_in a = addr("127.0.0.54", 7604);
  ASSERT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  int s = server.get();
  ASSERT_GE(s, 0);

  std::vector<uint8_t> target(200000, 0), other(64);
  ASSERT_EQ(riomap(s, target.data(), target.size(), PROT_WRITE, 0, 4096), 4096);
  EXPECT_EQ(riomap(s, other.data(), other.size(), PROT_WRITE, 0, 0), -1);  // the peer has one slot
  EXPECT_EQ(errno, ENOMEM);
  EXPECT_EQ(riomap(s, other.data(), other.size(), PROT_EXEC, 0, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  // The mapping is advertised ahead of the next data.
  ASSERT_EQ(rsend(s, "go", 2, 0), 2);
  char go[2];
  ASSERT_EQ(rrecv(c, go, sizeof go, MSG_WAITALL), 2);

  std::vector<uint8_t> data(target.size() - 100);
  std::iota(data.begin(), data.end(), uint8_t{3});
  ASSERT_EQ(riowrite(c, data.data(), data.size(), 4096 + 100, 0), data.size());
  // The writes are done once a later message arrives (RC keeps the order).
  ASSERT_EQ(rsend(c, "ok", 2, 0), 2);
  ASSERT_EQ(rrecv(s, go, sizeof go, MSG_WAITALL), 2);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), target.begin() + 100));
  EXPECT_EQ(target[99], 0);
  // Past the mapping: nothing is written, a short count.
  EXPECT_EQ(riowrite(c, data.data(), 200, 4096 + target.size() - 50, 0), 50u);
  EXPECT_EQ(riounmap(s, target.data(), target.size()), 0);
  EXPECT_EQ(riounmap(s, target.data(), target.size()), -1);
  EXPECT_EQ(errno, EINVAL);
  rclose(c);
  rclose(s);
  rclose(l);
}

// Keepalives every second (zero-length RDMA WRITEs on the control slots)
// leave the connection and its data alone.
TEST(Rsocket, KeepaliveProbesKeepTheConnection) {
  auto [c, s] = connected_pair(7605);
  ASSERT_GE(c, 0);
  ASSERT_GE(s, 0);
  int one = 1, v = 0;
  socklen_t len = sizeof v;
  ASSERT_EQ(rsetsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &one, sizeof one), 0);
  ASSERT_EQ(rsetsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one), 0);
  ASSERT_EQ(rgetsockopt(c, SOL_SOCKET, SO_KEEPALIVE, &v, &len), 0);
  EXPECT_EQ(v, 1);
  ASSERT_EQ(rgetsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &v, &len), 0);
  EXPECT_EQ(v, 1);
  int zero = 0;
  EXPECT_EQ(rsetsockopt(c, IPPROTO_TCP, TCP_KEEPIDLE, &zero, sizeof zero), -1);
  EXPECT_EQ(errno, EINVAL);
  // More than 2 probes' time with nothing to read on either side: no event.
  pollfd p[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
  EXPECT_EQ(rpoll(p, 2, 2500), 0);
  ASSERT_EQ(rsend(c, "after", 5, 0), 5);
  char b[5];
  ASSERT_EQ(rrecv(s, b, sizeof b, MSG_WAITALL), 5);
  EXPECT_EQ(std::memcmp(b, "after", 5), 0);
  ASSERT_EQ(rsend(s, "back", 4, 0), 4);
  ASSERT_EQ(rrecv(c, b, 4, MSG_WAITALL), 4);
  rclose(c);
  rclose(s);
}

// SHUT_WR: the peer reads the end of the stream and may still answer.
TEST(Rsocket, HalfCloseLetsThePeerAnswer) {
  auto [c, s] = connected_pair(7606);
  ASSERT_GE(c, 0);
  ASSERT_GE(s, 0);
  ASSERT_EQ(rsend(c, "question", 8, 0), 8);
  ASSERT_EQ(rshutdown(c, SHUT_WR), 0);
  char b[16];
  ASSERT_EQ(rrecv(s, b, 8, MSG_WAITALL), 8);
  EXPECT_EQ(rrecv(s, b, sizeof b, 0), 0);  // end of stream
  ASSERT_EQ(rsend(s, "answer", 6, 0), 6);
  ASSERT_EQ(rrecv(c, b, 6, MSG_WAITALL), 6);
  EXPECT_EQ(std::memcmp(b, "answer", 6), 0);
  EXPECT_EQ(rsend(c, "more", 4, 0), -1);  // our side is shut for writing
  EXPECT_EQ(errno, ECONNRESET);
  rclose(c);
  rclose(s);
}

// rpoll takes ordinary descriptors beside rsockets.
TEST(Rsocket, PollMixesRsocketsAndPipes) {
  auto [c, s] = connected_pair(7607);
  ASSERT_GE(c, 0);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  pollfd fds[2] = {{c, POLLIN, 0}, {p[0], POLLIN, 0}};
  EXPECT_EQ(rpoll(fds, 2, 0), 0);
  ASSERT_EQ(write(p[1], "x", 1), 1);
  ASSERT_EQ(rpoll(fds, 2, kWaitMs), 1);
  EXPECT_EQ(fds[0].revents, 0);
  EXPECT_EQ(fds[1].revents, POLLIN);
  char x;
  ASSERT_EQ(read(p[0], &x, 1), 1);
  auto later = std::async(std::launch::async, [s = s] { return rsend(s, "y", 1, 0); });
  ASSERT_EQ(rpoll(fds, 2, kWaitMs), 1);
  EXPECT_EQ(fds[0].revents, POLLIN);
  EXPECT_EQ(later.get(), 1);
  close(p[0]);
  close(p[1]);
  rclose(c);
  rclose(s);
}

TEST(Rsocket, ConnectWithoutListenerIsRefused) {
  int c = rsocket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = addr("127.0.0.54", 7699);
  EXPECT_EQ(rconnect(c, reinterpret_cast<sockaddr*>(&a), sizeof a), -1);
  EXPECT_EQ(errno, ECONNREFUSED);
  char b[4];
  EXPECT_EQ(rsend(c, b, sizeof b, 0), -1);
  EXPECT_EQ(errno, ECONNRESET);  // rdma-core's answer after a failed connect
  rclose(c);
}

}  // namespace

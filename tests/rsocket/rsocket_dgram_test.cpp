// Datagram rsockets (SOCK_DGRAM) over the emulated CM, in one process (the
// devices 127.0.0.54 and 127.0.0.55 of tests/rsocket/CMakeLists.txt): the
// first datagram over UDP, the rest as UD SENDs once each side knows the
// other's QPN; senders' addresses, rconnect/rsend/rrecv, rpoll/rselect,
// options, and bad input (oversized, no destination, a closed socket, UDP
// datagrams that are not an rsocket's) failing with errno, never crashing.
// Every wait is bounded: rpoll with a timeout before each receive.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kWaitMs = 20000;

sockaddr_in addr4(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

int bound(const char* ip, uint16_t port) {
  int fd = rsocket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a = addr4(ip, port);
  if (rbind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    rclose(fd);
    return -1;
  }
  return fd;
}

bool readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return rpoll(&p, 1, kWaitMs) == 1 && (p.revents & POLLIN);
}

// One datagram, waited for (bounded); its sender in `from`.
std::string recv_one(int fd, sockaddr_in* from = nullptr) {
  if (!readable(fd)) return "<timeout>";
  char buf[4096];
  sockaddr_in src{};
  socklen_t len = sizeof src;
  ssize_t n = rrecvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&src), &len);
  if (n < 0) return std::string("<error ") + strerror(errno) + ">";
  if (from) *from = src;
  return std::string(buf, static_cast<size_t>(n));
}

ssize_t send_str(int fd, const std::string& s, const sockaddr_in& to) {
  return rsendto(fd, s.data(), s.size(), 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
}

TEST(RsocketDgram, PairExchangesDatagramsBothWays) {
  int a = bound("127.0.0.54", 7301), b = bound("127.0.0.55", 7302);
  ASSERT_GE(a, 0) << strerror(errno);
  ASSERT_GE(b, 0) << strerror(errno);
  const sockaddr_in to_b = addr4("127.0.0.55", 7302);

  // The first goes over UDP; the answer comes once b knows a's QPN.
  ASSERT_EQ(send_str(a, "hello", to_b), 5) << strerror(errno);
  sockaddr_in from{};
  EXPECT_EQ(recv_one(b, &from), "hello");
  EXPECT_EQ(from.sin_family, AF_INET);
  EXPECT_EQ(ntohs(from.sin_port), 7301);
  char ip[INET_ADDRSTRLEN];
  EXPECT_STREQ(inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip), "127.0.0.54");
  ASSERT_EQ(send_str(b, "world", from), 5) << strerror(errno);
  EXPECT_EQ(recv_one(a), "world");

  // Lockstep echo of every size up to the largest payload (2048 - 8).
  for (size_t size : {size_t{0}, size_t{1}, size_t{64}, size_t{1000}, size_t{2039}, size_t{2040}}) {
    std::string msg(size, '\0');
    for (size_t i = 0; i < size; ++i) msg[i] = static_cast<char>('a' + (i * 7 + size) % 26);
    for (int round = 0; round < 20; ++round) {
      ASSERT_EQ(send_str(a, msg, to_b), static_cast<ssize_t>(size)) << strerror(errno);
      sockaddr_in src{};
      ASSERT_EQ(recv_one(b, &src), msg) << "size " << size;
      ASSERT_EQ(send_str(b, msg, src), static_cast<ssize_t>(size));
      ASSERT_EQ(recv_one(a), msg) << "size " << size;
    }
  }
  EXPECT_EQ(rclose(a), 0);
  EXPECT_EQ(rclose(b), 0);
}

// udpong's client: an unbound socket, rconnect, rsend/rrecv; the socket takes
// the address of the device the CM sends from.
TEST(RsocketDgram, ConnectedSocketSendsAndReceives) {
  int srv = bound("127.0.0.54", 7303);
  ASSERT_GE(srv, 0);
  int cli = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(cli, 0);
  sockaddr_in to = addr4("127.0.0.54", 7303);
  ASSERT_EQ(rconnect(cli, reinterpret_cast<sockaddr*>(&to), sizeof to), 0) << strerror(errno);
  sockaddr_in peer{}, self{};
  socklen_t len = sizeof peer;
  ASSERT_EQ(rgetpeername(cli, reinterpret_cast<sockaddr*>(&peer), &len), 0);
  EXPECT_EQ(ntohs(peer.sin_port), 7303);
  len = sizeof self;
  ASSERT_EQ(rgetsockname(cli, reinterpret_cast<sockaddr*>(&self), &len), 0);
  EXPECT_NE(self.sin_port, 0);

  for (int i = 0; i < 50; ++i) {
    const std::string msg = "ping " + std::to_string(i);
    ASSERT_EQ(rsend(cli, msg.data(), msg.size(), 0), static_cast<ssize_t>(msg.size())) << strerror(errno);
    sockaddr_in from{};
    ASSERT_EQ(recv_one(srv, &from), msg);
    EXPECT_EQ(from.sin_port, self.sin_port);
    EXPECT_EQ(from.sin_addr.s_addr, self.sin_addr.s_addr);
    ASSERT_EQ(send_str(srv, "pong", from), 4);
    ASSERT_TRUE(readable(cli));
    char buf[16];
    ASSERT_EQ(rrecv(cli, buf, sizeof buf, 0), 4);
  }
  // rwrite/rread are rsend/rrecv; a short buffer cuts the datagram.
  ASSERT_EQ(rwrite(cli, "abcdef", 6), 6);
  ASSERT_TRUE(readable(srv));
  char buf[4];
  sockaddr_in from{};
  len = sizeof from;
  ASSERT_EQ(rrecvfrom(srv, buf, 2, MSG_PEEK, reinterpret_cast<sockaddr*>(&from), &len), 2);
  EXPECT_EQ(std::string(buf, 2), "ab");
  ASSERT_EQ(rrecvfrom(srv, buf, 3, 0, nullptr, nullptr), 3);
  EXPECT_EQ(std::string(buf, 3), "abc");
  ASSERT_EQ(send_str(srv, "xy", from), 2);
  ASSERT_TRUE(readable(cli));
  ASSERT_EQ(rread(cli, buf, sizeof buf), 2);
  EXPECT_EQ(rclose(cli), 0);
  EXPECT_EQ(rclose(srv), 0);
}

// AF_INET6 sockets on v4-mapped addresses: the 24-byte headers (so at most
// 2024 bytes of payload) and senders reported as AF_INET6.
TEST(RsocketDgram, Ipv6SocketsOnMappedAddresses) {
  auto mapped = [](const char* ip, uint16_t port) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(port);
    inet_pton(AF_INET6, (std::string("::ffff:") + ip).c_str(), &a.sin6_addr);
    return a;
  };
  int a = rsocket(AF_INET6, SOCK_DGRAM, 0), b = rsocket(AF_INET6, SOCK_DGRAM, 0);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  sockaddr_in6 sa = mapped("127.0.0.54", 7307), sb = mapped("127.0.0.55", 7308);
  ASSERT_EQ(rbind(a, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0) << strerror(errno);
  ASSERT_EQ(rbind(b, reinterpret_cast<sockaddr*>(&sb), sizeof sb), 0) << strerror(errno);
  std::string big(2024, 'q');
  EXPECT_EQ(rsendto(a, big.data(), 2025, 0, reinterpret_cast<sockaddr*>(&sb), sizeof sb), -1);
  EXPECT_EQ(errno, EMSGSIZE);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(rsendto(a, big.data(), big.size(), 0, reinterpret_cast<sockaddr*>(&sb), sizeof sb), 2024)
        << strerror(errno);
    ASSERT_TRUE(readable(b));
    char buf[4096];
    sockaddr_in6 from{};
    socklen_t len = sizeof from;
    ASSERT_EQ(rrecvfrom(b, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &len), 2024);
    EXPECT_EQ(len, sizeof from);
    EXPECT_EQ(from.sin6_family, AF_INET6);
    EXPECT_EQ(ntohs(from.sin6_port), 7307);
    EXPECT_EQ(std::memcmp(&from.sin6_addr, &sa.sin6_addr, 16), 0);
    ASSERT_EQ(rsendto(b, "ok", 2, 0, reinterpret_cast<sockaddr*>(&from), len), 2);
    ASSERT_TRUE(readable(a));
    ASSERT_EQ(rrecv(a, buf, sizeof buf, 0), 2);
  }
  EXPECT_EQ(rclose(a), 0);
  EXPECT_EQ(rclose(b), 0);
}

// The UDP path, bytes on the wire, against a plain UDP socket playing
// rdma-core's side (librdmacm/rsocket.c, struct ds_udp_header): its DATA is
// delivered with its address as the sender, and answered with a CTRL carrying
// the rsocket's QPN; the rsocket's own first datagram has the same layout.
TEST(RsocketDgram, UdpPathHeadersAreRdmaCores) {
  int r = bound("127.0.0.54", 7309);
  ASSERT_GE(r, 0);
  int udp = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(udp, 0);
  sockaddr_in peer = addr4("127.0.0.55", 7310), rs_addr = addr4("127.0.0.54", 7309);
  ASSERT_EQ(::bind(udp, reinterpret_cast<sockaddr*>(&peer), sizeof peer), 0) << strerror(errno);
  // tag 0x55555555, version 4, op DATA (0), length 16, reserved, QPN (24 bits), IPv4 address.
  uint8_t data[16 + 5] = {0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0, 0x00, 0x12, 0x34, 0x56, 127, 0, 0, 55};
  std::memcpy(data + 16, "hello", 5);
  ASSERT_EQ(sendto(udp, data, sizeof data, 0, reinterpret_cast<sockaddr*>(&rs_addr), sizeof rs_addr),
            static_cast<ssize_t>(sizeof data));
  sockaddr_in from{};
  EXPECT_EQ(recv_one(r, &from), "hello");
  EXPECT_EQ(from.sin_addr.s_addr, peer.sin_addr.s_addr);
  EXPECT_EQ(from.sin_port, peer.sin_port);

  pollfd p{udp, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, kWaitMs), 1);
  uint8_t ctrl[64];
  ASSERT_EQ(recv(udp, ctrl, sizeof ctrl, 0), 16);
  const uint8_t head[] = {0x55, 0x55, 0x55, 0x55, 4, 7, 16, 0};
  EXPECT_EQ(std::memcmp(ctrl, head, sizeof head), 0);
  EXPECT_EQ(ctrl[8], 0);  // the QPN's top byte
  EXPECT_NE(ctrl[9] | ctrl[10] | ctrl[11], 0);
  const uint8_t ip[] = {127, 0, 0, 54};
  EXPECT_EQ(std::memcmp(ctrl + 12, ip, 4), 0);

  // A fresh rsocket's first datagram to the plain socket: DATA, its QPN and address, the payload.
  int s = bound("127.0.0.54", 7311);
  ASSERT_GE(s, 0);
  ASSERT_EQ(send_str(s, "abc", peer), 3);
  ASSERT_EQ(poll(&p, 1, kWaitMs), 1);
  uint8_t first[64];
  ASSERT_EQ(recv(udp, first, sizeof first, 0), 16 + 3);
  const uint8_t data_head[] = {0x55, 0x55, 0x55, 0x55, 4, 0, 16, 0};
  EXPECT_EQ(std::memcmp(first, data_head, sizeof data_head), 0);
  EXPECT_EQ(std::memcmp(first + 12, ip, 4), 0);
  EXPECT_EQ(std::memcmp(first + 16, "abc", 3), 0);
  ::close(udp);
  EXPECT_EQ(rclose(s), 0);
  EXPECT_EQ(rclose(r), 0);
}

TEST(RsocketDgram, BadInputFailsWithErrno) {
  errno = 0;
  EXPECT_EQ(rsocket(AF_INET, SOCK_DGRAM, IPPROTO_TCP), -1);
  EXPECT_EQ(errno, ENOTSUP);
  int fd = rsocket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
  ASSERT_GE(fd, 0) << strerror(errno);
  char buf[4096] = {};
  // Neither bound, connected nor sent: not readable (rdma-core's EINVAL).
  EXPECT_EQ(rrecv(fd, buf, 8, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rsend(fd, buf, 8, 0), -1);  // no destination
  EXPECT_EQ(errno, EDESTADDRREQ);
  EXPECT_EQ(rlisten(fd, 1), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(raccept(fd, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(riomap(fd, buf, sizeof buf, PROT_WRITE, 0, -1), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  sockaddr_in self = addr4("127.0.0.55", 7304);
  ASSERT_EQ(rbind(fd, reinterpret_cast<sockaddr*>(&self), sizeof self), 0) << strerror(errno);
  sockaddr_in nobody = addr4("127.0.0.54", 7399);
  // Too short an address, too large a payload (2048 less the 8-byte header).
  EXPECT_EQ(rsendto(fd, buf, 8, 0, reinterpret_cast<sockaddr*>(&nobody), 4), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rsendto(fd, buf, 2041, 0, reinterpret_cast<sockaddr*>(&nobody), sizeof nobody), -1);
  EXPECT_EQ(errno, EMSGSIZE);
  // Nobody there: the datagram goes over UDP and is lost, as UDP loses it.
  EXPECT_EQ(rsendto(fd, buf, 8, 0, reinterpret_cast<sockaddr*>(&nobody), sizeof nobody), 8);
  // Nothing waiting: EWOULDBLOCK, by flag or by O_NONBLOCK.
  EXPECT_EQ(rrecv(fd, buf, 8, MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EWOULDBLOCK);
  ASSERT_EQ(rfcntl(fd, F_SETFL, O_NONBLOCK), 0);
  EXPECT_EQ(rfcntl(fd, F_GETFL), O_NONBLOCK);
  EXPECT_EQ(rrecvfrom(fd, buf, 8, 0, nullptr, nullptr), -1);
  EXPECT_EQ(errno, EWOULDBLOCK);

  // Plain UDP datagrams to the socket's port that are not an rsocket's are dropped.
  int udp = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(udp, 0);
  std::vector<std::vector<uint8_t>> junk = {
      {}, {1, 2, 3}, std::vector<uint8_t>(16, 0x55), std::vector<uint8_t>(3000, 0)};
  junk[2][4] = 4;  // a valid tag and version, a wrong length
  junk[2][6] = 99;
  for (auto& j : junk) sendto(udp, j.data(), j.size(), 0, reinterpret_cast<sockaddr*>(&self), sizeof self);
  ::close(udp);
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(rpoll(&p, 1, 50), 0);

  EXPECT_EQ(rclose(fd), 0);
  EXPECT_EQ(rsend(fd, buf, 8, 0), -1);  // closed
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rsendto(fd, buf, 8, 0, reinterpret_cast<sockaddr*>(&nobody), sizeof nobody), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_EQ(rclose(fd), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(RsocketDgram, PollSelectAndOptions) {
  int a = rsocket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(a, 0);
  // udpong's options: buffers before binding (the value doubled, as rdma-core keeps it).
  int v = 1 << 19;
  socklen_t len = sizeof v;
  ASSERT_EQ(rsetsockopt(a, SOL_SOCKET, SO_SNDBUF, &v, sizeof v), 0);
  ASSERT_EQ(rsetsockopt(a, SOL_SOCKET, SO_RCVBUF, &v, sizeof v), 0);
  ASSERT_EQ(rgetsockopt(a, SOL_SOCKET, SO_RCVBUF, &v, &len), 0);
  EXPECT_EQ(v, 1 << 20);
  v = 1;
  EXPECT_EQ(rsetsockopt(a, SOL_SOCKET, SO_REUSEADDR, &v, sizeof v), 0);
  EXPECT_EQ(rsetsockopt(a, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v), -1);  // the UDP socket refuses it
  v = 16;
  EXPECT_EQ(rsetsockopt(a, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), 0);
  sockaddr_in self = addr4("127.0.0.54", 7305);
  ASSERT_EQ(rbind(a, reinterpret_cast<sockaddr*>(&self), sizeof self), 0);
  EXPECT_EQ(rsetsockopt(a, SOL_RDMA, RDMA_SQSIZE, &v, sizeof v), -1);  // too late
  EXPECT_EQ(errno, EINVAL);
  sockaddr_in name{};
  len = sizeof name;
  ASSERT_EQ(rgetsockname(a, reinterpret_cast<sockaddr*>(&name), &len), 0);
  EXPECT_EQ(ntohs(name.sin_port), 7305);

  int b = bound("127.0.0.55", 7306);
  ASSERT_GE(b, 0);
  pollfd p[2] = {{a, POLLIN | POLLOUT, 0}, {b, POLLIN, 0}};
  ASSERT_EQ(rpoll(p, 2, kWaitMs), 1);  // a can send, nothing to read
  EXPECT_EQ(p[0].revents, POLLOUT);
  sockaddr_in to_b = addr4("127.0.0.55", 7306);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(send_str(a, "x" + std::to_string(i), to_b), 2);
    sockaddr_in from{};
    ASSERT_EQ(recv_one(b, &from), "x" + std::to_string(i));
    ASSERT_EQ(send_str(b, "y", from), 1);
    fd_set rd;
    FD_ZERO(&rd);
    FD_SET(a, &rd);
    timeval tv{20, 0};
    ASSERT_EQ(rselect(a + 1, &rd, nullptr, nullptr, &tv), 1);
    EXPECT_TRUE(FD_ISSET(a, &rd));
    char c;
    ASSERT_EQ(rrecv(a, &c, 1, 0), 1);
  }
  // A full send queue of 16 slots still takes datagrams as they complete.
  for (int i = 0; i < 200; ++i) ASSERT_EQ(send_str(a, "burst", to_b), 5) << i << " " << strerror(errno);
  EXPECT_EQ(rshutdown(a, SHUT_RDWR), 0);
  char c;
  EXPECT_EQ(rrecv(a, &c, 1, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rclose(a), 0);
  EXPECT_EQ(rclose(b), 0);
}

}  // namespace

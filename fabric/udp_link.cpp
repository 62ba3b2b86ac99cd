// UdpLink: the RoCEv2 endpoint's socket (sendto, recvmmsg batches) and the
// progress thread's wait for its readability.
#include "fabric/udp_link.hpp"

#include <arpa/inet.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/log.hpp"
#include "wire/headers.hpp"

namespace softverbs::fabric {
namespace {

constexpr uint16_t kRoceV2Port = wire::kRoceV2UdpPort;
constexpr int kSocketBuffer = 8 << 20;
constexpr int kRxBatch = 32;
constexpr size_t kMaxDatagram = 65536;

}  // namespace

int UdpLink::bind(in_addr addr) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  // DF set and a fixed IP ID, as the Linux software RoCE driver sends: the ICRC
  // covers the IP header, so captures only verify with a stable ID.
  int pmtu = IP_PMTUDISC_DO;
  ::setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  // Each datagram's TOS and TTL come with it: a UD receive shows them in its
  // GRH area (the traffic class and hop limit of RoCEv2's IP header).
  int on = 1;
  ::setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_IP, IP_RECVTTL, &on, sizeof on);
  // Deep socket buffers absorb bursts from many QPs; a datagram the buffer
  // cannot take is lost and recovered by the transport. The forced variant needs
  // CAP_NET_ADMIN; without it the kernel caps the size at net.core.[rw]mem_max.
  int size = kSocketBuffer;
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) < 0)
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) < 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(kRoceV2Port);
  sa.sin_addr = addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) < 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

UdpLink::UdpLink(RealTimeScheduler& scheduler, int fd, std::string name)
    : scheduler_(scheduler), fd_(fd), name_(std::move(name)) {}

UdpLink::~UdpLink() {
  if (fd_ >= 0) ::close(fd_);
}

void UdpLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool /*icrc: always set here, see Link::needs_icrc*/) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(kRoceV2Port);
  sa.sin_addr = dst;
  iovec iov{const_cast<uint8_t*>(packet.data()), packet.size()};
  msghdr msg{};
  msg.msg_name = &sa;
  msg.msg_namelen = sizeof sa;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // The traffic class is the datagram's IPv4 TOS byte (RoCEv2): per datagram,
  // as the socket is shared by every QP of the device.
  alignas(cmsghdr) uint8_t control[CMSG_SPACE(sizeof(int))] = {};
  if (tos) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = IPPROTO_IP;
    c->cmsg_type = IP_TOS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    const int value = tos;
    std::memcpy(CMSG_DATA(c), &value, sizeof value);
  }
  for (;;) {
    ssize_t n = ::sendmsg(fd_, &msg, 0);
    if (n >= 0) return;
    if (errno == EINTR) continue;
    // A full socket buffer or an unreachable peer loses the packet, as a
    // congested link would: the reliable transport recovers it.
    SV_LOG(kDebug, "%s: send to %s failed: %s", name_.c_str(), inet_ntoa(dst), std::strerror(errno));
    return;
  }
}

bool UdpLink::drain() {
  // One buffer set per thread: drains of different devices may run at once.
  static thread_local std::vector<uint8_t> bufs(static_cast<size_t>(kRxBatch) * kMaxDatagram);
  mmsghdr msgs[kRxBatch];
  iovec iov[kRxBatch];
  sockaddr_in from[kRxBatch];
  // IP_TOS (one byte) and IP_TTL (an int) control messages.
  struct alignas(cmsghdr) Control {
    uint8_t bytes[CMSG_SPACE(sizeof(int)) * 2];
  };
  Control control[kRxBatch];
  for (int i = 0; i < kRxBatch; ++i) {
    iov[i] = {bufs.data() + static_cast<size_t>(i) * kMaxDatagram, kMaxDatagram};
    msgs[i] = {};
    msgs[i].msg_hdr.msg_iov = &iov[i];
    msgs[i].msg_hdr.msg_iovlen = 1;
    msgs[i].msg_hdr.msg_name = &from[i];
    msgs[i].msg_hdr.msg_namelen = sizeof from[i];
    msgs[i].msg_hdr.msg_control = control[i].bytes;
    msgs[i].msg_hdr.msg_controllen = sizeof control[i].bytes;
  }
  int n = ::recvmmsg(fd_, msgs, kRxBatch, MSG_DONTWAIT, nullptr);
  for (int i = 0; i < n; ++i) {
    wire::IpFields ip;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msgs[i].msg_hdr); c; c = CMSG_NXTHDR(&msgs[i].msg_hdr, c)) {
      if (c->cmsg_level != IPPROTO_IP) continue;
      if (c->cmsg_type == IP_TOS && c->cmsg_len >= CMSG_LEN(1)) {
        ip.tos = *CMSG_DATA(c);
      } else if (c->cmsg_type == IP_TTL && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        int ttl = 0;
        std::memcpy(&ttl, CMSG_DATA(c), sizeof ttl);
        ip.ttl = static_cast<uint8_t>(ttl);
      }
    }
    up_->receive(from[i].sin_addr, ntohs(from[i].sin_port),
                 std::span<const uint8_t>(static_cast<uint8_t*>(iov[i].iov_base), msgs[i].msg_len), ip);
  }
  return n > 0;
}

void UdpLink::watch() {
  std::call_once(watched_, [this] { scheduler_.watch_readable(fd_, [this] { up_->ready(); }); });
}

std::string UdpLink::rx_state() {
  int pending = 0;
  ::ioctl(fd_, FIONREAD, &pending);
  return "socket " + std::to_string(pending) + " bytes";
}

}  // namespace softverbs::fabric

// HostLink: the abstract AF_UNIX path between devices of one host: the
// listening socket and its connections, the per-destination connections, the
// bounded wait for a full receiver, and the option that turns it off
// (SOFTVERBS_HOST_LINK).
#include "fabric/host_link.hpp"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "core/env.hpp"
#include "core/log.hpp"
#include "wire/headers.hpp"

namespace softverbs::fabric {
namespace {

// "SV", format 1, the TOS byte the packet was sent with (its traffic class;
// senders before it wrote 0 there), then the sender's IPv4 address (network order).
constexpr uint8_t kMagic[3] = {'S', 'V', 1};
constexpr size_t kTosAt = 3;
constexpr size_t kPrefix = 8;
// Packets read from one connection per look, so one busy peer cannot starve
// the others (the drain loop comes back for the rest).
constexpr int kPerConnection = 32;
constexpr size_t kMaxDatagram = kPrefix + 65536;
constexpr int kListenBacklog = 128;
// A sender's socket holds what it sent until the receiver takes it (AF_UNIX
// charges packets to the sender): its buffer bounds what may be in flight.
// Without CAP_NET_ADMIN the kernel caps it at net.core.wmem_max; that costs
// waits, not packets.
constexpr int kSendBuffer = 8 << 20;
// While a sender waits, the packets it takes off its own sockets wait here;
// beyond this many it stops taking them (its peers then wait in turn).
constexpr size_t kStashLimit = 4096;
// How long a destination without an abstract name is sent UDP before the name
// is looked for again (a process may claim the address later).
constexpr auto kReprobe = std::chrono::seconds(1);

sockaddr_un abstract_addr(in_addr addr, socklen_t* len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::string name = HostLink::name_of(addr);
  std::memcpy(sa.sun_path, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  return sa;
}

std::string addr_str(in_addr a) {
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

}  // namespace

std::optional<HostLinkOptions> parse_host_link(const char* text, std::string* error) {
  HostLinkOptions o;
  if (!text || !*text) return o;
  std::string v(text);
  if (v == "udp") {
    o.enabled = false;
    return o;
  }
  if (v == "unix") return o;
  if (v.rfind("unix:", 0) == 0 && v.size() > 5 && v.size() <= 5 + 6 &&
      v.find_first_not_of("0123456789", 5) == std::string::npos) {
    o.wait = std::chrono::milliseconds(std::stoul(v.substr(5)));
    return o;
  }
  if (error) *error = "SOFTVERBS_HOST_LINK=" + v + ": expected unix, unix:MILLISECONDS (0-999999) or udp";
  return std::nullopt;
}

const HostLinkOptions& host_link_options() {
  static const HostLinkOptions options = [] {
    std::string error;
    auto o = parse_host_link(env::host_link(), &error);
    if (o) return *o;
    SV_LOG(kError, "%s; using unix", error.c_str());
    return HostLinkOptions{};
  }();
  return options;
}

std::string HostLink::name_of(in_addr addr) { return std::string(1, '\0') + "softverbs/roce/" + addr_str(addr); }

int HostLink::bind(in_addr addr) {
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  socklen_t len = 0;
  sockaddr_un sa = abstract_addr(addr, &len);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) < 0 || ::listen(fd, kListenBacklog) < 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

HostLink::HostLink(Link& inner, RealTimeScheduler& scheduler, int fd, in_addr self, LinkCounters& counters,
                   HostLinkOptions options, std::string name)
    : LinkDecorator(inner),
      scheduler_(scheduler),
      fd_(fd),
      self_(self),
      counters_(counters),
      options_(options),
      name_(std::move(name)) {
  std::memcpy(prefix_, kMagic, sizeof kMagic);
  prefix_[kTosAt] = 0;
  std::memcpy(prefix_ + 4, &self_.s_addr, 4);
  if (fd_ < 0) return;
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd_;
  if (epoll_ < 0 || ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd_, &ev) < 0) {
    SV_LOG(kWarn, "%s: no lossless same-host path (epoll: %s); UDP only", name_.c_str(), std::strerror(errno));
    if (epoll_ >= 0) ::close(epoll_);
    ::close(fd_);
    epoll_ = fd_ = -1;
  }
}

HostLink::~HostLink() {
  if (fd_ < 0) return;
  std::lock_guard lock(rx_mu_);
  for (int c : connections_) ::close(c);
  ::close(epoll_);
  ::close(fd_);
}

HostLink::Peer::~Peer() { ::close(fd); }

// The peer of a destination: a socket connected to its abstract name, made at
// the first packet and kept; no name means UDP for kReprobe.
std::shared_ptr<HostLink::Peer> HostLink::peer_for(in_addr dst) {
  std::lock_guard lock(peers_mu_);
  Entry& e = peers_[dst.s_addr];
  if (e.peer) return e.peer;
  const Clock::time_point now = scheduler_.clock().now();
  if (now < e.retry_at) return nullptr;
  e.retry_at = now + kReprobe;
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  int size = kSendBuffer;
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) < 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  socklen_t len = 0;
  sockaddr_un sa = abstract_addr(dst, &len);
  // No such name: ECONNREFUSED, not a device of this host. A listener whose
  // backlog is full (EAGAIN) is sent UDP for now, which it also receives.
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), len) < 0) {
    ::close(fd);
    return nullptr;
  }
  SV_LOG(kDebug, "%s: %s is a device of this host: lossless path", name_.c_str(), addr_str(dst).c_str());
  e.peer = std::make_shared<Peer>(fd);
  return e.peer;
}

void HostLink::forget(in_addr dst, const std::shared_ptr<Peer>& peer) {
  std::lock_guard lock(peers_mu_);
  Entry& e = peers_[dst.s_addr];
  if (e.peer == peer) e = Entry{};
}

void HostLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool /*icrc: always set here, see Link::needs_icrc*/) {
  if (fd_ >= 0) {
    // A peer that went away (its process exited) may have been replaced by a
    // new owner of the address: look once more before falling back to UDP.
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::shared_ptr<Peer> peer = peer_for(dst);
      if (!peer) break;
      if (send_to(peer, dst, packet, tos) >= 0) return;
      forget(dst, peer);
    }
  }
  inner_.send(dst, packet, tos);
}

int HostLink::send_to(const std::shared_ptr<Peer>& peer, in_addr dst, std::span<const uint8_t> packet, uint8_t tos) {
  // Senders on several threads: each its own copy of the prefix.
  uint8_t prefix[kPrefix];
  std::memcpy(prefix, prefix_, kPrefix);
  prefix[kTosAt] = tos;
  iovec iov[2] = {{prefix, kPrefix}, {const_cast<uint8_t*>(packet.data()), packet.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  std::optional<Clock::time_point> deadline;
  for (;;) {
    if (::sendmsg(peer->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) {
      peer->stalled.store(false, std::memory_order_relaxed);
      return 1;
    }
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ECONNREFUSED) return -1;  // the receiver is gone
    if (err == EAGAIN && !peer->stalled.load(std::memory_order_relaxed) && options_.wait.count() > 0) {
      if (!deadline) {
        deadline = scheduler_.clock().now() + options_.wait;
        waits_.fetch_add(1, std::memory_order_relaxed);
      }
      if (wait_for_room(peer->fd, *deadline)) continue;
      peer->stalled.store(true, std::memory_order_relaxed);
      SV_LOG(kWarn, "%s: %s took nothing for %lld ms; dropping packets for it until it reads again", name_.c_str(),
             addr_str(dst).c_str(), static_cast<long long>(options_.wait.count()));
    } else if (err != EAGAIN) {
      SV_LOG(kDebug, "%s: send to %s failed: %s", name_.c_str(), addr_str(dst).c_str(), std::strerror(err));
    }
    counters_.host_drops.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
}

// poll() on the connection reports room in our send buffer, which holds what
// the receiver has not taken yet. Our own sockets are watched too: the thread waiting here may be the
// one that drains this device, and a peer waiting for us must not wait for it.
bool HostLink::wait_for_room(int peer_fd, Clock::time_point deadline) {
  for (;;) {
    const Clock::time_point now = scheduler_.clock().now();
    if (now >= deadline) return false;
    bool stash_full = false;
    {
      std::lock_guard lock(rx_mu_);
      stash_full = stash_.size() >= kStashLimit;
    }
    pollfd fds[2] = {{peer_fd, POLLOUT, 0}, {epoll_, static_cast<short>(stash_full ? 0 : POLLIN), 0}};
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
    int n = ::ppoll(fds, 2, &ts, nullptr);
    if (n < 0 && errno != EINTR) return false;
    if (n <= 0) continue;
    if (fds[0].revents) return true;  // room, or an error the next send reports
    if (fds[1].revents & POLLIN) pull_into_stash();
  }
}

void HostLink::pull_into_stash() {
  {
    std::lock_guard lock(rx_mu_);
    const size_t before = stash_.size();
    collect_locked(stash_);
    if (stash_.size() == before) return;
  }
  // The sockets' readiness may be gone with what was taken: tell the receiver.
  if (!stash_pending_.exchange(true)) scheduler_.post([this] { up_->ready(); });
}

bool HostLink::collect_locked(std::deque<Datagram>& out) {
  epoll_event evs[16];
  const int n = ::epoll_wait(epoll_, evs, 16, 0);
  bool any = false;
  for (int i = 0; i < n; ++i) {
    const int fd = evs[i].data.fd;
    if (fd != fd_) {
      any |= read_connection_locked(fd, out);
      continue;
    }
    for (;;) {
      const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (conn < 0) break;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = conn;
      if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, conn, &ev) < 0) {
        ::close(conn);
        continue;
      }
      connections_.push_back(conn);
      any = true;
    }
  }
  return any;
}

bool HostLink::read_connection_locked(int conn, std::deque<Datagram>& out) {
  static thread_local std::vector<uint8_t> buf(kMaxDatagram);
  bool any = false;
  for (int i = 0; i < kPerConnection; ++i) {
    const ssize_t n = ::recv(conn, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    if (n <= 0) {
      // The sender's process closed it (its end, or an error): gone for good.
      ::epoll_ctl(epoll_, EPOLL_CTL_DEL, conn, nullptr);
      ::close(conn);
      std::erase(connections_, conn);
      return true;
    }
    any = true;
    if (static_cast<size_t>(n) < kPrefix || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0) continue;  // not a softverbs sender
    in_addr src{};
    std::memcpy(&src.s_addr, buf.data() + 4, 4);
    out.push_back(Datagram{src, buf[kTosAt], std::vector<uint8_t>(buf.data() + kPrefix, buf.data() + n)});
  }
  return any;
}

bool HostLink::drain() {
  bool any = inner_.drain();
  if (fd_ < 0) return any;
  std::deque<Datagram> batch;
  {
    std::lock_guard lock(rx_mu_);
    if (stash_pending_.load(std::memory_order_acquire)) {
      batch.swap(stash_);
      stash_pending_.store(false, std::memory_order_release);
    }
    any |= collect_locked(batch);
  }
  // Delivery may send, and a send may wait and pull into the stash: no lock
  // is held from here on.
  // The TTL is the one a socket sends with: the host's loopback does not decrement it.
  for (const Datagram& d : batch) up_->receive(d.src, wire::kRoceV2UdpPort, d.bytes, wire::IpFields{d.tos, wire::kDefaultTtl});
  return any || !batch.empty();
}

void HostLink::watch() {
  std::call_once(watched_, [this] {
    inner_.watch();
    if (epoll_ >= 0) scheduler_.watch_readable(epoll_, [this] { up_->ready(); });
  });
}

std::string HostLink::rx_state() {
  std::string s = inner_.rx_state();
  if (fd_ < 0) return s;
  pollfd p{epoll_, POLLIN, 0};
  const bool readable = ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
  size_t stashed = 0, connections = 0;
  {
    std::lock_guard lock(rx_mu_);
    stashed = stash_.size();
    connections = connections_.size();
  }
  return s + ", host " + std::to_string(connections) + " connections " + (readable ? "readable" : "empty") + " + " +
         std::to_string(stashed) + " stashed";
}

}  // namespace softverbs::fabric

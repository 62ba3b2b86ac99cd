// HostLink: the abstract AF_UNIX path between devices of one host: the
// listening socket and its connections, the per-destination connections, the
// bounded wait for a full receiver, and the shared-memory rings over those
// connections (their wake-up leases are in fabric/host_lease.cpp; the option
// that turns it off, SOFTVERBS_HOST_LINK, is parsed in host_link_options.cpp).
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
#include <thread>

#include "core/log.hpp"
#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"

namespace softverbs::fabric {
namespace {

// "SV", format 1, the TOS byte the packet was sent with (its traffic class;
// senders before it wrote 0 there), then the sender's IPv4 address (network order).
constexpr uint8_t kMagic[3] = {'S', 'V', 1};
// The other messages on a connection: its ring's file (SCM_RIGHTS), first, and
// the wake-ups for a ring's sleeping receiver. Senders before rings never sent
// them; receivers before rings skip them (not format 1).
constexpr uint8_t kRingMagic[3] = {'S', 'V', 2};
constexpr uint8_t kWakeMagic[3] = {'S', 'V', 3};
// A packet as format 1, whose ICRC field was not computed (it holds 0): only
// in a ring whose receiver published kRingTakesNoIcrc, which hands it up
// marked so (wire::IpFields::icrc_skipped) and does not check it.
constexpr uint8_t kNoIcrcMagic[3] = {'S', 'V', 4};
// The features a receiver publishes in the rings it takes up (HostRing::attach).
constexpr uint32_t kRingTakesNoIcrc = 1;
constexpr size_t kTosAt = 3;
constexpr size_t kPrefix = HostLink::kPrefixBytes;
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
// How long the progress thread keeps reading the rings after the last record
// before it sleeps: a few round trips of the path, so that the next packet of
// a burst or an exchange (an ACK, the next WRITE of a latency test) finds it
// awake. And the longest it keeps at it while records keep coming, so that
// the timers on the same thread run.
constexpr auto kSpin = std::chrono::microseconds(30);
constexpr auto kMaxServe = std::chrono::microseconds(500);
// A full ring is looked at again this often while its sender waits.
constexpr long kRingWaitNs = 20000;
// A sender looks at its connection for the end of the receiver every this many
// packets it puts into the ring (a poll(): the ring itself costs none).
constexpr uint32_t kLivenessEvery = 256;
// Records read from one ring per look (as kPerConnection).
constexpr int kPerRing = 64;

// An application thread polled this device this recently: it is likely to
// poll again soon, on the CPU the progress thread would spin on, so the
// progress thread sleeps at once instead.
constexpr auto kAppPolling = std::chrono::microseconds(200);
// What this thread's polls are: an application's (they lend leases), the
// progress thread's serve() or an application thread's end_lease() (they do
// not).
enum class RxRole : uint8_t { app, serve, end_lease };
thread_local RxRole rx_role = RxRole::app;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

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
    return;
  }
  // Under virtual time the application threads' hints go to the virtual
  // scheduler: nothing would end a lease but its timer.
  leases_ = options_.ring && scheduler_.hears_applications();
  if (leases_) scheduler_.add_lease_holder(this);
}

HostLink::~HostLink() {
  if (fd_ < 0) return;
  if (leases_) scheduler_.remove_lease_holder(this);
  std::lock_guard lock(rx_mu_);
  for (Conn& c : connections_) {
    if (c.ring) c.ring->close();  // its sender stops writing into it
    ::close(c.fd);
  }
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
  e.peer = std::make_shared<Peer>(fd);
  const bool ring = options_.ring && offer_ring(*e.peer);
  if (ring) {
    // The end of the receiver's process shows on this connection only (the
    // ring says nothing when a process dies): the progress thread watches it.
    epoll_event ev{};
    ev.events = EPOLLRDHUP;
    ev.data.fd = fd;
    std::lock_guard rx(rx_mu_);
    outgoing_[fd] = e.peer;
    ::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
  }
  SV_LOG(kDebug, "%s: %s is a device of this host: lossless path (%s)", name_.c_str(), addr_str(dst).c_str(),
         ring ? "shared-memory ring" : "socket");
  return e.peer;
}

void HostLink::forget(in_addr dst, const std::shared_ptr<Peer>& peer) {
  {
    std::lock_guard lock(peers_mu_);
    Entry& e = peers_[dst.s_addr];
    if (e.peer == peer) e = Entry{};
  }
  // Its descriptor number may come back as another connection.
  std::lock_guard rx(rx_mu_);
  if (auto it = outgoing_.find(peer->fd); it != outgoing_.end() && it->second.lock() == peer) {
    ::epoll_ctl(epoll_, EPOLL_CTL_DEL, peer->fd, nullptr);
    outgoing_.erase(it);
  }
}

bool HostLink::takes_no_icrc(const Peer& peer) {
  return peer.ring && (peer.ring->features() & kRingTakesNoIcrc) && !peer.dead.load(std::memory_order_relaxed);
}

void HostLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  // A packet that left its ICRC uncomputed for a ring whose receiver takes
  // that, but goes another way now (the receiver went away or was replaced),
  // gets it here: with the flow the sending device computes it for
  // (emu::Device::flow).
  static thread_local std::vector<uint8_t> completed;
  auto complete_icrc = [&] {
    if (icrc) return;
    completed.assign(packet.begin(), packet.end());
    wire::Ipv4Flow flow;
    std::memcpy(flow.saddr.data(), &self_.s_addr, 4);
    std::memcpy(flow.daddr.data(), &dst.s_addr, 4);
    flow.sport = wire::kRoceV2UdpPort;
    flow.dport = wire::kRoceV2UdpPort;
    wire::write_icrc(wire::IcrcFlow{flow}, completed);
    packet = completed;
    icrc = true;
  };
  if (fd_ >= 0) {
    // A peer that went away (its process exited) may have been replaced by a
    // new owner of the address: look once more before falling back to UDP.
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::shared_ptr<Peer> peer = peer_for(dst);
      if (!peer) break;
      if (!takes_no_icrc(*peer)) complete_icrc();
      if (send_to(peer, dst, packet, tos, icrc) >= 0) return;
      forget(dst, peer);
    }
  }
  complete_icrc();
  inner_.send(dst, packet, tos);
}

int HostLink::send_to(const std::shared_ptr<Peer>& peer, in_addr dst, std::span<const uint8_t> packet, uint8_t tos,
                      bool icrc) {
  // Senders on several threads: each its own copy of the prefix.
  uint8_t prefix[kPrefix];
  prefix_for(tos, icrc, prefix);  // icrc false only for a ring that takes it (send())
  if (peer->ring) {
    const std::span<const uint8_t> parts[2] = {prefix, packet};
    return send_ring(*peer, dst, parts, kPrefix + packet.size());
  }
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

void HostLink::prefix_for(uint8_t tos, bool icrc, uint8_t* out) const {
  std::memcpy(out, prefix_, kPrefix);
  out[kTosAt] = tos;
  if (!icrc) std::memcpy(out, kNoIcrcMagic, sizeof kNoIcrcMagic);
}

bool HostLink::offer_ring(Peer& peer) {
  int memfd = -1;
  std::unique_ptr<HostRing> ring = HostRing::create(&memfd);
  if (!ring) {
    SV_LOG(kDebug, "%s: no shared-memory ring (%s): packets on the connection", name_.c_str(), std::strerror(errno));
    return false;
  }
  uint8_t msg[kPrefix] = {};
  std::memcpy(msg, kRingMagic, sizeof kRingMagic);
  std::memcpy(msg + 4, &self_.s_addr, 4);
  iovec iov{msg, sizeof msg};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &memfd, sizeof memfd);
  // A new connection's buffer is empty: this first message cannot find it full.
  const bool sent = ::sendmsg(peer.fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof msg);
  ::close(memfd);
  if (sent) peer.ring = std::move(ring);
  return sent;
}

// The ring's counterpart of the socket path below: the same bounded wait, the
// same counted drop, the same stall after a wait that ran out.
int HostLink::send_ring(Peer& peer, in_addr dst, std::span<const std::span<const uint8_t>> parts, size_t len) {
  std::lock_guard lock(peer.ring_mu);
  HostRing& ring = *peer.ring;
  if (ring.closed() || peer.dead.load(std::memory_order_relaxed)) return -1;  // its receiver went away
  std::optional<Clock::time_point> deadline;
  while (!ring.put(parts)) {
    if (len > HostRing::kMaxRecord) {
      counters_.host_drops.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    if (peer.stalled.load(std::memory_order_relaxed) || options_.wait.count() <= 0) {
      counters_.host_drops.fetch_add(1, std::memory_order_relaxed);
      return 0;
    }
    if (!deadline) {
      deadline = scheduler_.clock().now() + options_.wait;
      waits_.fetch_add(1, std::memory_order_relaxed);
    }
    bool gone = false;
    if (wait_for_ring(peer, *deadline, &gone)) continue;
    if (gone) return -1;
    peer.stalled.store(true, std::memory_order_relaxed);
    SV_LOG(kWarn, "%s: %s took nothing for %lld ms; dropping packets for it until it reads again", name_.c_str(),
           addr_str(dst).c_str(), static_cast<long long>(options_.wait.count()));
    counters_.host_drops.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  peer.stalled.store(false, std::memory_order_relaxed);
  // A receiver that ends without closing its ring (it never took the ring
  // up, or its process died) says so only on the connection: look there
  // until it took the ring, then every kLivenessEvery packets.
  if (!ring.attached() || ++peer.since_check >= kLivenessEvery) {
    peer.since_check = 0;
    pollfd p{peer.fd, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))) return -1;
  }
  // A receiver whose application polls its rings is not woken (its leases).
  // The packet's first piece after the prefix starts with its BTH: looked at
  // only for a receiver that asked for a wake-up.
  if (ring.armed() &&
      ring.take_wake(lease_horizon_ns(),
                     parts.size() > 1 && !parts[1].empty() && wire::answers_requester(parts[1][0]))) {
    wakeups_.fetch_add(1, std::memory_order_relaxed);
    uint8_t msg[kPrefix] = {};
    std::memcpy(msg, kWakeMagic, sizeof kWakeMagic);
    // EAGAIN: the connection is full of wake-ups the receiver has yet to read,
    // so it is awake or about to be.
    if (::send(peer.fd, msg, sizeof msg, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN && errno != EINTR)
      return -1;  // its process is gone; the packet goes again by the next way
  }
  return 1;
}

// One look of a sender waiting for room in a ring (the caller tries its put
// again after each): true unless the time ran out or the receiver is gone.
bool HostLink::wait_for_ring(Peer& peer, Clock::time_point deadline, bool* gone) {
  // The receiver may be asleep with a full ring: make sure it is told.
  if (peer.ring->take_wake()) {
    uint8_t msg[kPrefix] = {};
    std::memcpy(msg, kWakeMagic, sizeof kWakeMagic);
    (void)::send(peer.fd, msg, sizeof msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  if (peer.ring->closed()) {
    *gone = true;
    return false;
  }
  const Clock::time_point now = scheduler_.clock().now();
  if (now >= deadline) return false;
  bool stash_full = false;
  {
    std::lock_guard lock(rx_mu_);
    stash_full = stash_.packets.size() >= kStashLimit;
  }
  // The connection says when the receiver's process ends (POLLHUP); the
  // ring's room is looked at again after kRingWaitNs; our own sockets are
  // watched meanwhile, as in wait_for_room.
  pollfd fds[2] = {{peer.fd, POLLRDHUP, 0}, {epoll_, static_cast<short>(stash_full ? 0 : POLLIN), 0}};
  const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
  timespec ts{0, left < kRingWaitNs ? static_cast<long>(left) : kRingWaitNs};
  const int n = ::ppoll(fds, 2, &ts, nullptr);
  if (n < 0 && errno != EINTR) return false;
  if (n > 0 && (fds[0].revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))) {
    *gone = true;
    return false;
  }
  if (n > 0 && (fds[1].revents & POLLIN)) pull_into_stash();
  // Our own rings too: a peer waiting on us may have filled one, and no
  // socket says so.
  bool post = false;
  {
    std::lock_guard lock(rx_mu_);
    const size_t before = stash_.packets.size();
    if (before < kStashLimit) read_rings_locked(stash_);
    post = stash_.packets.size() > before && !stash_pending_.exchange(true);
  }
  if (post) scheduler_.post([this] { up_->ready(); });
  return true;
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
      stash_full = stash_.packets.size() >= kStashLimit;
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
  bool was_pending = false;
  {
    std::lock_guard lock(rx_mu_);
    const size_t before = stash_.packets.size();
    collect_locked(stash_);
    if (stash_.packets.size() == before) return;
    // Set under the lock: a drain or poll that comes next must take the stash
    // before anything newer from the sockets or rings.
    was_pending = stash_pending_.exchange(true);
  }
  // The sockets' readiness may be gone with what was taken: tell the receiver.
  if (!was_pending) scheduler_.post([this] { up_->ready(); });
}

bool HostLink::collect_locked(Batch& out) {
  bool any = read_rings_locked(out);
  epoll_event evs[16];
  const int n = ::epoll_wait(epoll_, evs, 16, 0);
  for (int i = 0; i < n; ++i) {
    const int fd = evs[i].data.fd;
    if (fd != fd_) {
      if (auto it = outgoing_.find(fd); it != outgoing_.end()) {
        // A connection of ours whose receiver ended: its next send finds another way.
        if (auto peer = it->second.lock(); peer && peer->fd == fd) peer->dead.store(true, std::memory_order_relaxed);
        ::epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
        outgoing_.erase(it);
        continue;
      }
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
      outgoing_.erase(conn);  // a number that was one of ours before
      connections_.push_back(Conn{conn, nullptr});
      any = true;
    }
  }
  return any;
}

bool HostLink::read_rings_locked(Batch& out) {
  if (!any_ring_.load(std::memory_order_relaxed)) return false;
  bool any = false;
  for (size_t i = 0; i < connections_.size(); ++i) {
    Conn& c = connections_[i];
    if (!c.ring || !c.ring->pending()) continue;
    if (read_ring_locked(c, out)) {
      any = true;
      continue;
    }
    // Garbled: the sender broke the ring's rules. Nothing more is read from
    // it; closing its connection and ring sends that sender back to peer_for().
    SV_LOG(kWarn, "%s: garbled shared-memory ring from a peer; dropping its connection", name_.c_str());
    close_connection_locked(i);
    return true;
  }
  return any;
}

// True if records were taken; false when the ring is garbled.
//
// In place (the drains and polls), a packet is handed up where it lies in the
// ring: its prefix is read once into the Datagram here, the packet's headers
// once by the parser (wire::parse), and the payload is copied once, by the
// QP into its memory. The producer cannot move the bytes (their span was
// fixed when the length was read) and gets their room back only when the
// batch has been delivered (HostRing::hold); whatever it writes into them
// meanwhile is what it could have sent. For the stash (a sender waiting for
// room, whose batch may wait long) records are copied out and their room
// given back at once. A delivery that sends into a full ring of its peer
// keeps its batch's room until that send is done: two processes whose
// deliveries wait for each other's full rings are freed by the bounded wait
// (a counted drop, as when the stash is full).
bool HostLink::read_ring_locked(Conn& c, Batch& out) {
  HostRing& ring = *c.ring;
  ring.hold();
  size_t taken = 0;
  int r = 1;
  for (int i = 0; i < kPerRing; ++i) {
    std::span<const uint8_t> rec;
    r = ring.next(&rec);
    if (r <= 0) break;
    uint8_t prefix[kPrefix];
    if (rec.size() < kPrefix) continue;
    std::memcpy(prefix, rec.data(), kPrefix);  // read once: the peer may change it
    const bool no_icrc = std::memcmp(prefix, kNoIcrcMagic, sizeof kNoIcrcMagic) == 0;
    if (!no_icrc && std::memcmp(prefix, kMagic, sizeof kMagic) != 0) continue;
    in_addr src{};
    std::memcpy(&src.s_addr, prefix + 4, 4);
    Datagram d{src, prefix[kTosAt], {}, nullptr, 0, no_icrc};
    const std::span<const uint8_t> packet = rec.subspan(kPrefix);
    if (out.in_place) {
      d.in_ring = packet.data();
      d.len = packet.size();
    } else {
      d.owned.assign(packet.begin(), packet.end());
    }
    out.packets.push_back(std::move(d));
    ++taken;
  }
  if (out.in_place && taken > 0) {
    out.held.push_back(c.ring);  // unheld after delivery (deliver)
  } else {
    ring.unhold();  // copied (or nothing): the room goes back now
  }
  return r >= 0;
}

void HostLink::close_connection_locked(size_t i) {
  Conn& c = connections_[i];
  if (c.ring) c.ring->close();
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  connections_.erase(connections_.begin() + static_cast<std::ptrdiff_t>(i));
}

bool HostLink::read_connection_locked(int conn, Batch& out) {
  static thread_local std::vector<uint8_t> buf(kMaxDatagram);
  size_t at = 0;
  while (at < connections_.size() && connections_[at].fd != conn) ++at;
  if (at == connections_.size()) return false;
  bool any = false;
  for (int i = 0; i < kPerConnection; ++i) {
    iovec iov{buf.data(), buf.size()};
    // Room for a few descriptors: a peer may pass more than the one a ring
    // message has, and those (and any beyond, which the kernel closes with
    // MSG_CTRUNC) must not leak.
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(conn, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
    std::vector<int> fds;
    for (cmsghdr* cm = n > 0 ? CMSG_FIRSTHDR(&mh) : nullptr; cm; cm = CMSG_NXTHDR(&mh, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len < CMSG_LEN(0)) continue;
      const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t k = 0; k < count; ++k) {
        int f = -1;
        std::memcpy(&f, CMSG_DATA(cm) + k * sizeof(int), sizeof f);
        fds.push_back(f);
      }
    }
    if (n <= 0) {
      // The sender's process closed it (its end, or an error): gone for good,
      // after what it left in its ring.
      Conn& c = connections_[at];
      if (c.ring) (void)read_ring_locked(c, out);
      close_connection_locked(at);
      return true;
    }
    any = true;
    Conn& c = connections_[at];
    if (static_cast<size_t>(n) >= kPrefix && std::memcmp(buf.data(), kRingMagic, sizeof kRingMagic) == 0 &&
        fds.size() == 1 && !c.ring) {
      std::string why;
      c.ring = HostRing::attach(fds[0], &why, HostRing::kDataBytes, kRingTakesNoIcrc);
      if (c.ring) {
        any_ring_.store(true, std::memory_order_relaxed);
      } else {
        SV_LOG(kWarn, "%s: refused a peer's shared-memory ring: %s", name_.c_str(), why.c_str());
      }
    }
    for (int f : fds) ::close(f);
    if (static_cast<size_t>(n) >= kPrefix && std::memcmp(buf.data(), kWakeMagic, sizeof kWakeMagic) == 0 &&
        rx_role != RxRole::serve) {
      // A wake-up meant for the progress thread, read by another: the ring
      // it announced stays unarmed (no further wake-up comes) until the
      // progress thread has looked at it, so it must run (from watch() if
      // it does not watch yet).
      if (!watching_.load(std::memory_order_seq_cst)) {
        unserved_wake_.store(true, std::memory_order_seq_cst);
        // watch() may have looked at the flag in between: then this thread posts.
        if (watching_.load(std::memory_order_seq_cst) && unserved_wake_.exchange(false))
          scheduler_.post([this] { serve(); });
      } else if (!serve_posted_.exchange(true)) {
        scheduler_.post([this] {
          serve_posted_.store(false);
          serve();
        });
      }
    }
    if (static_cast<size_t>(n) < kPrefix || std::memcmp(buf.data(), kMagic, sizeof kMagic) != 0) continue;  // not a packet
    in_addr src{};
    std::memcpy(&src.s_addr, buf.data() + 4, 4);
    out.packets.push_back(
        Datagram{src, buf[kTosAt], std::vector<uint8_t>(buf.data() + kPrefix, buf.data() + n), nullptr, 0, false});
  }
  return any;
}

void HostLink::deliver(Batch& batch) {
  // Delivery may send, and a send may wait and pull into the stash: no lock
  // is held here.
  // The TTL is the one a socket sends with: the host's loopback does not decrement it.
  for (const Datagram& d : batch.packets)
    up_->receive(d.src, wire::kRoceV2UdpPort, d.bytes(), wire::IpFields{d.tos, wire::kDefaultTtl, d.icrc_skipped});
  if (batch.held.empty()) return;
  std::lock_guard lock(rx_mu_);
  for (const auto& ring : batch.held) ring->unhold();
  batch.held.clear();
}

bool HostLink::drain() {
  bool any = inner_.drain();
  if (fd_ < 0) return any;
  Batch batch(true);
  {
    std::lock_guard lock(rx_mu_);
    if (stash_pending_.load(std::memory_order_acquire)) {
      batch.packets.swap(stash_.packets);
      stash_pending_.store(false, std::memory_order_release);
    }
    any |= collect_locked(batch);
  }
  const bool got = !batch.packets.empty();
  deliver(batch);
  return any || got;
}

bool HostLink::poll_shared() {
  if (fd_ < 0 || !any_ring_.load(std::memory_order_relaxed)) return false;
  const bool app = rx_role == RxRole::app;
  const Clock::time_point now = app ? poll_time() : Clock::time_point{};
  Batch batch(true);
  {
    std::lock_guard lock(rx_mu_);
    if (app && leases_) renew_lease_locked(now);
    // Packets a waiting sender took aside are older than the rings' own.
    if (stash_pending_.load(std::memory_order_acquire)) return false;
    if (!read_rings_locked(batch)) return false;
  }
  const bool got = !batch.packets.empty();
  deliver(batch);
  return got;
}

void HostLink::ending_lease(bool on) { rx_role = on ? RxRole::end_lease : RxRole::app; }

bool HostLink::rings_pending() {
  std::lock_guard lock(rx_mu_);
  for (const Conn& c : connections_)
    if (c.ring && c.ring->pending()) return true;
  return false;
}

// Runs on the progress thread when the connections' epoll set is readable (a
// wake-up, a new connection, a packet on a connection) and whenever it
// reschedules itself.
void HostLink::serve() {
  rx_role = RxRole::serve;
  up_->ready();
  if (!any_ring_.load(std::memory_order_relaxed)) {
    rx_role = RxRole::app;
    return;
  }
  const Clock& clock = scheduler_.clock();
  const Clock::time_point start = clock.now();
  const Clock::time_point polled{Clock::duration(app_poll_.load(std::memory_order_relaxed))};
  Clock::time_point idle_until = start - polled < kAppPolling ? start : start + kSpin;
  for (;;) {
    if (rings_pending()) {
      up_->ready();
      const Clock::time_point now = clock.now();
      if (now - start > kMaxServe) {
        // Still busy: come back after the other work of this thread.
        scheduler_.post([this] { serve(); });
        rx_role = RxRole::app;
        return;
      }
      idle_until = now + kSpin;
      continue;
    }
    if (clock.now() >= idle_until) break;
    for (int i = 0; i < 64; ++i) cpu_relax();
  }
  rx_role = RxRole::app;
  bool arrived = false;
  {
    std::lock_guard lock(rx_mu_);
    for (Conn& c : connections_)
      if (c.ring) arrived |= c.ring->arm();
  }
  // Records that came between the last look and the arming raised no wake-up.
  if (arrived) scheduler_.post([this] { serve(); });
}

void HostLink::watch() {
  std::call_once(watched_, [this] {
    inner_.watch();
    if (epoll_ < 0) return;
    scheduler_.watch_readable(epoll_, [this] { serve(); });
    watching_.store(true, std::memory_order_seq_cst);
    // A wake-up an application thread read before this (its rings then stay
    // unarmed: no further wake-up comes) is served now. Only then: a serve()
    // drains the device on this thread, which a process on virtual time
    // (docs/simulation.md) must not see without a packet from outside.
    if (unserved_wake_.exchange(false)) scheduler_.post([this] { serve(); });
  });
}

std::string HostLink::rx_state() {
  std::string s = inner_.rx_state();
  if (fd_ < 0) return s;
  pollfd p{epoll_, POLLIN, 0};
  const bool readable = ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN);
  size_t stashed = 0, connections = 0, rings = 0, pending = 0;
  {
    std::lock_guard lock(rx_mu_);
    stashed = stash_.packets.size();
    connections = connections_.size();
    for (const Conn& c : connections_) {
      rings += c.ring != nullptr;
      pending += c.ring && c.ring->pending();
    }
  }
  return s + ", host " + std::to_string(connections) + " connections (" + std::to_string(rings) + " rings, " +
         std::to_string(pending) + " with records) " + (readable ? "readable" : "empty") + " + " +
         std::to_string(stashed) + " stashed";
}

}  // namespace softverbs::fabric

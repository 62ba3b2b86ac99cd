// LocalLink: the in-process queue between devices of one process.
#include "fabric/local_link.hpp"

#include <arpa/inet.h>

#include <algorithm>

#include "fabric/mcast_directory.hpp"
#include "wire/headers.hpp"

namespace softverbs::fabric {
namespace {

// At most this many polls in a row leave an empty outside link unread: about a
// microsecond of polling, the delay it may add to a datagram the poller would
// otherwise have read before the progress thread.
constexpr uint32_t kMaxSocketSkip = 7;
// Delivered packet buffers kept per device for reuse: the burst the requester's
// window allows (64 packets) at most, a few hundred KiB at the largest MTU.
constexpr size_t kSpareBuffers = 64;

}  // namespace

LocalLink::LocalLink(LocalHub& hub, in_addr addr, Scheduler& scheduler, Link* outside, bool direct)
    : hub_(hub), addr_(addr), scheduler_(scheduler), outside_(outside), direct_(direct) {}

void LocalLink::attach(Receiver& receiver) {
  up_ = &receiver;
  if (outside_) outside_->attach(*this);
  hub_.add(addr_, this);
}

void LocalLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  if (IN_MULTICAST(ntohl(dst.s_addr))) {
    // A multicast packet is replicated here, below the fault layer and the
    // capture (which see the one packet the sender put on its wire): one copy
    // to each member device of the host, this one included (docs/wire.md §1.6).
    for (in_addr member : mcast_members(mcast_gid_of(dst))) send_unicast(member, packet, tos, true);
    return;
  }
  send_unicast(dst, packet, tos, icrc);
}

void LocalLink::send_unicast(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  if (LocalLink* peer = hub_.find(dst)) {
    peer->enqueue(addr_, packet, tos, icrc);
    return;
  }
  // With icrc false only where the outside link's needs_icrc() said so.
  if (outside_) outside_->send(dst, packet, tos, icrc);
}

bool LocalLink::direct_ok(in_addr dst) {
  if (!direct_ || IN_MULTICAST(ntohl(dst.s_addr))) return false;
  const LocalLink* peer = hub_.find(dst);
  return peer && peer != this;
}

bool LocalLink::send_direct(in_addr dst, const wire::PacketView& view) {
  LocalLink* peer = direct_ && !IN_MULTICAST(ntohl(dst.s_addr)) ? hub_.find(dst) : nullptr;
  return peer && peer != this && peer->receive_direct_from(addr_, view);
}

bool LocalLink::receive_direct_from(in_addr src, const wire::PacketView& view) {
  // Nothing queued and no batch being delivered: a batch is delivered under
  // the receiver's receive lock, but a packet for the QP whose receive path
  // this thread runs (the receiver's inbox, emu/qp/direct.cpp) does not try
  // that lock, so the batch says so itself. Packets queued after the check come
  // from other senders, whose order against this one's nothing promises.
  if (pending_.load(std::memory_order_acquire) || delivering_.load(std::memory_order_acquire)) return false;
  return up_->receive_direct(src, view);
}

void LocalLink::enqueue(in_addr src, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  {
    std::lock_guard lock(mu_);
    std::vector<uint8_t> bytes;
    if (!spare_.empty()) {
      bytes = std::move(spare_.back());
      spare_.pop_back();
    }
    bytes.assign(packet.begin(), packet.end());
    queue_.push_back(Queued{src, tos, icrc, std::move(bytes)});
  }
  if (!pending_.exchange(true)) {
    watch();
    scheduler_.post([this] { up_->ready(); });
  }
}

bool LocalLink::drain() {
  const bool any = outside_ && outside_->drain();
  return drain_local() || any;
}

bool LocalLink::poll() {
  bool any = false;
  if (outside_) {
    // Shared memory costs no system call: read on every poll.
    any = outside_->poll_shared();
    const bool ready = outside_ready_.exchange(false, std::memory_order_acq_rel);
    if (!ready && socket_skip_ > 0 && watching_.load(std::memory_order_acquire)) {
      --socket_skip_;
    } else if (outside_->drain()) {  // all of it: the same-host sockets and the UDP socket
      any = true;
      socket_backoff_ = 0;
    } else {
      socket_skip_ = socket_backoff_;
      socket_backoff_ = std::min(socket_backoff_ * 2 + 1, kMaxSocketSkip);
    }
  }
  return drain_local() || any;
}

bool LocalLink::drain_local() {
  if (!pending_.load(std::memory_order_acquire)) return false;
  // Set before the queue looks empty, cleared once the batch is delivered: a
  // packet without bytes must not overtake one of the batch (receive_direct_from).
  delivering_.store(true, std::memory_order_release);
  {
    std::lock_guard lock(mu_);
    batch_.swap(queue_);
    pending_.store(false, std::memory_order_release);
  }
  if (batch_.empty()) {
    delivering_.store(false, std::memory_order_release);
    return false;
  }
  for (const Queued& q : batch_)
    up_->receive(q.src, wire::kRoceV2UdpPort, q.bytes, wire::IpFields{q.tos, wire::kDefaultTtl, !q.icrc});
  delivering_.store(false, std::memory_order_release);
  {
    std::lock_guard lock(mu_);
    for (auto& entry : batch_) {
      if (spare_.size() >= kSpareBuffers) break;
      spare_.push_back(std::move(entry.bytes));
    }
  }
  batch_.clear();
  return true;
}

void LocalLink::watch() {
  std::call_once(watched_, [this] {
    if (outside_) outside_->watch();
    watching_.store(true, std::memory_order_release);
  });
}

std::string LocalLink::rx_state() {
  size_t local = 0;
  {
    std::lock_guard lock(mu_);
    local = queue_.size();
  }
  return (outside_ ? outside_->rx_state() + ", " : std::string()) + "local " + std::to_string(local);
}

}  // namespace softverbs::fabric

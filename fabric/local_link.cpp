// LocalLink: the in-process queue between devices of one process.
#include "fabric/local_link.hpp"

#include <arpa/inet.h>

#include "fabric/mcast_directory.hpp"
#include "wire/headers.hpp"

namespace softverbs::fabric {

LocalLink::LocalLink(LocalHub& hub, in_addr addr, Scheduler& scheduler, Link* outside)
    : hub_(hub), addr_(addr), scheduler_(scheduler), outside_(outside) {}

void LocalLink::attach(Receiver& receiver) {
  up_ = &receiver;
  if (outside_) outside_->attach(*this);
  hub_.add(addr_, this);
}

void LocalLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos) {
  if (IN_MULTICAST(ntohl(dst.s_addr))) {
    // A multicast packet is replicated here, below the fault layer and the
    // capture (which see the one packet the sender put on its wire): one copy
    // to each member device of the host, this one included (docs/wire.md §1.6).
    for (in_addr member : mcast_members(mcast_gid_of(dst))) send_unicast(member, packet, tos);
    return;
  }
  send_unicast(dst, packet, tos);
}

void LocalLink::send_unicast(in_addr dst, std::span<const uint8_t> packet, uint8_t tos) {
  if (LocalLink* peer = hub_.find(dst)) {
    peer->enqueue(addr_, packet, tos);
    return;
  }
  if (outside_) outside_->send(dst, packet, tos);
}

void LocalLink::enqueue(in_addr src, std::span<const uint8_t> packet, uint8_t tos) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(Queued{src, tos, std::vector<uint8_t>(packet.begin(), packet.end())});
  }
  if (!pending_.exchange(true)) {
    watch();
    scheduler_.post([this] { up_->ready(); });
  }
}

bool LocalLink::drain() {
  bool any = outside_ && outside_->drain();
  if (pending_.load(std::memory_order_acquire)) {
    std::deque<Queued> batch;
    {
      std::lock_guard lock(mu_);
      batch.swap(queue_);
      pending_.store(false, std::memory_order_release);
    }
    for (const Queued& q : batch) {
      any = true;
      up_->receive(q.src, wire::kRoceV2UdpPort, q.bytes, wire::IpFields{q.tos, wire::kDefaultTtl});
    }
  }
  return any;
}

void LocalLink::watch() {
  std::call_once(watched_, [this] {
    if (outside_) outside_->watch();
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

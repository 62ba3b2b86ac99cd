// HostLink's packets without their ICRC (docs/wire.md §1.1.1): which
// destinations take them (a ring whose receiver published that it does), and
// packets sent in pieces into those rings (Link::send_gathered), the payload
// copied once, straight from the sender's memory into the ring's record.
#include <array>
#include <memory>
#include <mutex>

#include "fabric/host_link.hpp"

namespace softverbs::fabric {
namespace {

// A record of a gathered packet: the prefix, the headers, the payload's
// pieces and the tail. A payload in more pieces (a send list of many SGEs) is
// built whole first, by the caller.
constexpr size_t kMaxParts = 16;

}  // namespace

std::shared_ptr<HostLink::Peer> HostLink::known_peer(in_addr dst) {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(dst.s_addr);
  return it != peers_.end() ? it->second.peer : nullptr;
}

bool HostLink::needs_icrc(in_addr dst) {
  if (fd_ < 0 || !options_.ring) return true;
  std::shared_ptr<Peer> peer = known_peer(dst);
  // No connection yet (the first packet makes it): with an ICRC, as UDP needs.
  return !peer || !takes_no_icrc(*peer);
}

bool HostLink::send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) {
  if (fd_ < 0 || !options_.ring || packet.payload.size() > kMaxParts - 3) return false;
  // Only where needs_icrc() says none is needed: the bytes then go nowhere
  // else, and the record is send()'s for the built packet, prefix 'S' 'V' 4.
  // A destination without a connection gets its first packet whole (send()
  // makes the connection).
  std::shared_ptr<Peer> peer = known_peer(dst);
  if (!peer || !takes_no_icrc(*peer)) return false;
  uint8_t prefix[kPrefixBytes];
  prefix_for(tos, false, prefix);
  std::array<std::span<const uint8_t>, kMaxParts> parts;
  size_t n = 0;
  parts[n++] = prefix;
  parts[n++] = packet.headers;
  for (const auto& piece : packet.payload) parts[n++] = piece;
  parts[n++] = packet.tail;
  // Sent, or dropped and counted after the bounded wait, as send() would.
  if (send_ring(*peer, dst, std::span(parts.data(), n), kPrefixBytes + packet.size) >= 0) return true;
  // The receiver went away: the caller builds the packet, and send() finds it
  // another way (a new owner of the address, or UDP, with its ICRC).
  forget(dst, peer);
  return false;
}

}  // namespace softverbs::fabric

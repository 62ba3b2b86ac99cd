// TopologyLink: a packet's way across one directed link of the simulated fabric.
#include "fabric/topology_link.hpp"

#include <arpa/inet.h>

#include <memory>
#include <vector>

#include "wire/packet.hpp"

namespace softverbs::fabric {
void TopologyLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  const std::optional<size_t> to = IN_MULTICAST(ntohl(dst.s_addr)) ? std::nullopt : fabric_.node_at(dst);
  if (!to || *to == node_ || fabric_.topology().link(node_, *to).ideal()) {
    inner_.send(dst, packet, tos, icrc);
    return;
  }
  // The MTU limits the payload, as the IB MTU does (IBTA 9.7.7): headers,
  // pad and ICRC do not count. A packet that does not parse has no payload
  // to limit.
  wire::PacketView view;
  const uint64_t payload = wire::parse(packet, view) == wire::ParseError::ok ? view.payload.size() : 0;
  Clock::time_point arrival;
  switch (fabric_.cross(node_, *to, kIpUdpHeaderBytes + packet.size(), payload, scheduler_.clock().now(), &arrival)) {
    case LinkVerdict::kTooBig:
      counters_.topology_mtu_drops.fetch_add(1, std::memory_order_relaxed);
      return;
    case LinkVerdict::kLost:
      counters_.topology_loss_drops.fetch_add(1, std::memory_order_relaxed);
      return;
    case LinkVerdict::kPass:
      break;
  }
  // Arrival times on one link never decrease (one latency, departures in
  // order), and timers with equal deadlines run in the order they were set,
  // so the link keeps its packets in order.
  auto bytes = std::make_shared<std::vector<uint8_t>>(packet.begin(), packet.end());
  scheduler_.at(arrival, [this, dst, bytes, tos, icrc] { inner_.send(dst, *bytes, tos, icrc); });
}

}  // namespace softverbs::fabric

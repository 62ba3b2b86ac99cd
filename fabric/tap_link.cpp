// TapLink: transmit counter and packet capture.
#include "fabric/tap_link.hpp"

#include "core/trace.hpp"
#include "fabric/trace_packet.hpp"
#include "wire/headers.hpp"

namespace softverbs::fabric {

void TapLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos) {
  counters_.tx_packets.fetch_add(1, std::memory_order_relaxed);
  const uint64_t frame = pcap_ ? pcap_->write(clock_, self_, dst, wire::kRoceV2UdpPort, packet, tos) : 0;
  // The trace's record of the packet, with the device and fault decision the
  // fault layer above left (core/trace.hpp), before it can reach its receiver.
  if (trace::on()) {
    const trace::Pending p = trace::take_pending();
    if (p.dev) trace_packet(clock_, *p.dev, "tx", packet, p.fault, frame);
  }
  inner_.send(dst, packet, tos);
}

void TapLink::receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet) {
  const uint64_t frame = pcap_ && !(hub_ && hub_->find(src)) ? pcap_->write(clock_, src, self_, sport, packet) : 0;
  if (trace::on()) trace::set_pending({nullptr, "none", frame});  // for the fault layer's "rx" record
  up_->receive(src, sport, packet);
}

}  // namespace softverbs::fabric

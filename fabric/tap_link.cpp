// TapLink: transmit counter and packet capture.
#include "fabric/tap_link.hpp"

#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "core/trace.hpp"
#include "fabric/trace_packet.hpp"
#include "wire/headers.hpp"
#include "wire/icrc.hpp"

namespace softverbs::fabric {

void TapLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  count_tx(counters_, 1, packet.size());
  if (IN_MULTICAST(ntohl(dst.s_addr))) counters_.tx_multicast.fetch_add(1, std::memory_order_relaxed);
  const uint64_t frame = pcap_ ? pcap_->write(clock_, self_, dst, wire::kRoceV2UdpPort, packet, tos) : 0;
  // The trace's record of the packet, with the device and fault decision the
  // fault layer above left (core/trace.hpp), before it can reach its receiver.
  if (trace::on()) {
    const trace::Pending p = trace::take_pending();
    if (p.dev) trace_packet(clock_, *p.dev, "tx", packet, p.fault, frame);
  }
  inner_.send(dst, packet, tos, icrc);
}

bool TapLink::direct_ok(in_addr dst) { return !pcap_ && !trace::on() && inner_.direct_ok(dst); }

bool TapLink::send_direct(in_addr dst, const wire::PacketView& view) {
  // What direct_ok refuses, refused here too: callers may skip asking it.
  if (pcap_ || trace::on()) return false;
  // Counted before the receiver can complete anything, as send() does; taken
  // back if the packet then goes the usual way (and is counted there).
  const uint64_t bytes = wire::packet_size(view.bth.opcode, view.payload.size());
  count_tx(counters_, 1, bytes);
  if (inner_.send_direct(dst, view)) return true;
  uncount_tx(counters_, 1, bytes);
  return false;
}

bool TapLink::send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) {
  // A capture and the trace need the whole packet's bytes; a multicast one is
  // replicated below from its bytes.
  if (pcap_ || trace::on() || IN_MULTICAST(ntohl(dst.s_addr))) return false;
  // Counted before the receiver can answer, as send() does; taken back if
  // the packet then goes the usual way (and is counted there).
  count_tx(counters_, 1, packet.size);
  if (inner_.send_gathered(dst, packet, tos)) return true;
  uncount_tx(counters_, 1, packet.size);
  return false;
}

void TapLink::receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip) {
  uint64_t frame = 0;
  if (pcap_ && !(hub_ && hub_->find(src))) {
    if (ip.icrc_skipped) {
      // From a process of this host whose ring carried it without its ICRC
      // (fabric/host_link.hpp): the capture shows the ICRC it stands for, as
      // a capture on the sender's side would have.
      std::vector<uint8_t> bytes(packet.begin(), packet.end());
      wire::Ipv4Flow flow;
      std::memcpy(flow.saddr.data(), &src.s_addr, 4);
      std::memcpy(flow.daddr.data(), &self_.s_addr, 4);
      flow.sport = sport;
      flow.dport = wire::kRoceV2UdpPort;
      wire::write_icrc(wire::IcrcFlow{flow}, bytes);
      frame = pcap_->write(clock_, src, self_, sport, bytes, ip.tos);
    } else {
      frame = pcap_->write(clock_, src, self_, sport, packet, ip.tos);
    }
  }
  if (trace::on()) trace::set_pending({nullptr, "none", frame});  // for the fault layer's "rx" record
  up_->receive(src, sport, packet, ip);
}

}  // namespace softverbs::fabric

// The tap between the fault layer and the wire: counts the packets that really
// go out and captures them (SOFTVERBS_PCAP).
//
// A decorator rather than code in the device because what it must see is
// exactly what crosses the wire: below the fault layer (a duplicated packet
// counts and shows twice, a dropped one not at all) and above the split between
// in-process and socket delivery (both are captured once, when sent). Received
// datagrams are captured only when they come from another process: those of
// this process were captured when sent.
#pragma once

#include <netinet/in.h>

#include "core/clock.hpp"
#include "fabric/link.hpp"
#include "fabric/local_link.hpp"
#include "wire/pcap.hpp"

namespace softverbs::fabric {

class TapLink final : public LinkDecorator {
 public:
  // pcap may be null (no capture); hub names the devices of this process.
  TapLink(Link& inner, in_addr self, LinkCounters& counters, const Clock& clock, wire::PcapWriter* pcap,
          const LocalHub* hub)
      : LinkDecorator(inner), self_(self), counters_(counters), clock_(clock), pcap_(pcap), hub_(hub) {}

  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override;
  // A capture shows the packets' bytes (tshark checks their ICRC): with one
  // on, every packet carries its ICRC.
  bool needs_icrc(in_addr dst) override { return pcap_ || inner_.needs_icrc(dst); }
  // No packet without bytes while a capture or the trace records them.
  bool direct_ok(in_addr dst) override;
  // Counted as the packet it stands for would be.
  bool send_direct(in_addr dst, const wire::PacketView& view) override;
  // The same rules: no packet in pieces while a capture or the trace shows the
  // bytes; counted as the packet would be.
  bool send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) override;

 private:
  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip = {}) override;
  // From a device of this process: never captured on the way in (see receive).
  bool receive_direct(in_addr src, const wire::PacketView& view) override { return up_->receive_direct(src, view); }

  in_addr self_;
  LinkCounters& counters_;
  const Clock& clock_;
  wire::PcapWriter* pcap_;
  const LocalHub* hub_;
};

}  // namespace softverbs::fabric

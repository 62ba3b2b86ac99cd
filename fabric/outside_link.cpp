// OutsideLink: real time at the edge of the process (see the header).
#include "fabric/outside_link.hpp"

namespace softverbs::fabric {

void OutsideLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  scheduler_.note_outside();
  inner_.send(dst, packet, tos, icrc);
}

void OutsideLink::receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip) {
  scheduler_.note_outside();
  up_->receive(src, sport, packet, ip);
}

void OutsideLink::ready() {
  // Called on the socket watch's thread (the real-time progress thread), which
  // drains the device at once, as on real time: once other processes take
  // part the run is real-time anyway, and a peer must not wait for an
  // application thread to come by.
  scheduler_.note_outside();
  up_->ready();
}

}  // namespace softverbs::fabric

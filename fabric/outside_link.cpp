// OutsideLink: pacing and hand-over at the edge of the process (see the header).
#include "fabric/outside_link.hpp"

namespace softverbs::fabric {

void OutsideLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos) {
  scheduler_.note_outside();
  inner_.send(dst, packet, tos);
}

void OutsideLink::receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet) {
  scheduler_.note_outside();
  up_->receive(src, sport, packet);
}

void OutsideLink::ready() {
  // Called on the socket watch's thread: the drain runs where the rest of the
  // engine's work does.
  scheduler_.note_outside();
  scheduler_.post([up = up_] { up->ready(); });
}

}  // namespace softverbs::fabric

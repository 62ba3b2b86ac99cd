// Under virtual time, the boundary between the devices of this process and
// everything outside it (docs/simulation.md, "Virtual time"): traffic with
// another process cannot be simulated, so the first packet that crosses this
// link in either direction makes the virtual clock follow real time, and
// arrivals the socket watch reports are drained on the real-time progress
// thread at once, as on real time.
#pragma once

#include "fabric/link.hpp"
#include "fabric/virtual_time.hpp"

namespace softverbs::fabric {

class OutsideLink final : public LinkDecorator {
 public:
  OutsideLink(Link& inner, VirtualScheduler& scheduler) : LinkDecorator(inner), scheduler_(scheduler) {}

  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override;

 protected:
  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip = {}) override;
  void ready() override;

 private:
  VirtualScheduler& scheduler_;
};

}  // namespace softverbs::fabric

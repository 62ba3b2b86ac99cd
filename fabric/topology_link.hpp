// A device's side of the simulated fabric (SOFTVERBS_TOPOLOGY, fabric/topology.hpp):
// a link decorator below the tap (counters, capture) and above the in-process
// queue. A packet to another node of the topology crosses that directed link:
// dropped if its payload exceeds the link's MTU, lost by the link's seeded
// draw, and otherwise handed to the in-process queue when it arrives, after
// waiting for the packets before it to leave (bandwidth) and the link's latency,
// on the device's Scheduler. Everything else (multicast, the device itself,
// devices of other processes) passes through unchanged.
//
// Below the fault layer and the tap, so both see each packet as today, when it
// is sent; the receiver sees it when it arrives.
#pragma once

#include <netinet/in.h>

#include "core/clock.hpp"
#include "fabric/link.hpp"
#include "fabric/topology.hpp"

namespace softverbs::fabric {

class TopologyLink final : public LinkDecorator {
 public:
  // `node` is this device's index in the fabric's topology.
  TopologyLink(Link& inner, SimFabric& fabric, size_t node, Scheduler& scheduler, LinkCounters& counters)
      : LinkDecorator(inner), fabric_(fabric), node_(node), scheduler_(scheduler), counters_(counters) {}

  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override;

 private:
  SimFabric& fabric_;
  size_t node_;
  Scheduler& scheduler_;
  LinkCounters& counters_;
};

}  // namespace softverbs::fabric

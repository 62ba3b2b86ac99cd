// The device's general services interface (QP1): where the management
// datagrams a device receives go. The connection manager (emu/cm/) registers
// itself as each device's agent; a device without one drops them, counted as
// packets for an unknown QP.
#pragma once

#include <netinet/in.h>

#include "wire/packet.hpp"

namespace softverbs::emu {

class Device;

class GsiAgent {
 public:
  virtual ~GsiAgent() = default;
  // A packet whose BTH names QP1, after the device's checks and the fault
  // layer. Called on the device's receive path (never concurrently for one device).
  virtual void receive_gsi(Device& device, in_addr src, const wire::PacketView& packet) = 0;
  // The fault layer's "reject" (docs/faults.md): answers a connection request
  // or reply with a rejection instead of taking it. False if it is not one.
  virtual bool reject_gsi(Device& device, in_addr src, const wire::PacketView& packet, uint16_t reason) = 0;
  // The device's link failed over to another port of its bond (the fault
  // layer's "failover"): its address and GIDs stay.
  virtual void link_failed_over(Device& device) = 0;
  // The device failed (softverbs_device_fatal): what the agent hung on it goes.
  virtual void device_failed(Device& device) = 0;
};

}  // namespace softverbs::emu

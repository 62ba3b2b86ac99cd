// The link over a UDP socket bound to the device's address on port 4791: how
// devices of different processes reach each other.
#pragma once

#include <netinet/in.h>

#include <mutex>
#include <string>

#include "fabric/link.hpp"
#include "fabric/scheduler.hpp"

namespace softverbs::fabric {

class UdpLink final : public Link {
 public:
  // Binds addr:4791 (non-blocking, close-on-exec) and returns the socket, or
  // -errno. Binding is what claims the address: a second process cannot take it.
  static int bind(in_addr addr);

  // Takes ownership of a socket from bind(); `name` labels log lines.
  UdpLink(RealTimeScheduler& scheduler, int fd, std::string name);
  ~UdpLink() override;
  UdpLink(const UdpLink&) = delete;
  UdpLink& operator=(const UdpLink&) = delete;

  void attach(Receiver& receiver) override { up_ = &receiver; }
  // A non-zero tos goes with the datagram as an IP_TOS control message.
  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override;
  // One recvmmsg batch, each datagram with the TOS and TTL it arrived with
  // (IP_RECVTOS, IP_RECVTTL).
  bool drain() override;
  void watch() override;
  void inject(in_addr src, uint16_t sport, std::span<const uint8_t> packet) override {
    up_->receive(src, sport, packet);
  }
  std::string rx_state() override;

 private:
  RealTimeScheduler& scheduler_;
  int fd_;
  std::string name_;
  Receiver* up_ = nullptr;
  std::once_flag watched_;
};

}  // namespace softverbs::fabric

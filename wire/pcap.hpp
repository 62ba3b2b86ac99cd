// A capture of the RoCEv2 packets a process sends and receives, as a pcap file
// with Ethernet/IPv4/UDP framing, so tshark and Wireshark decode it as RoCEv2.
// Enabled by SOFTVERBS_PCAP=FILE ("%p" in FILE becomes the process id).
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>

#include "core/clock.hpp"

namespace softverbs::wire {

class PcapWriter {
 public:
  // The process-wide capture, or null when SOFTVERBS_PCAP is not set.
  static PcapWriter* instance();

  explicit PcapWriter(const std::string& path);
  ~PcapWriter();
  bool ok() const { return file_ != nullptr; }

  // Writes one RoCEv2 packet (BTH..ICRC) sent from src to dst, both on UDP port
  // 4791, with the IPv4 header the sender's kernel writes (DF, ID 0, TTL 64),
  // stamped with the clock's calendar time.
  // tos: the IPv4 TOS byte the packet was sent with (its traffic class).
  // Returns the packet's frame number in the file (1-based, as tshark counts).
  uint64_t write(const Clock& clock, in_addr src, in_addr dst, uint16_t sport, std::span<const uint8_t> packet,
             uint8_t tos = 0);

 private:
  std::mutex mu_;
  std::FILE* file_ = nullptr;
  uint64_t frames_ = 0;
};

}  // namespace softverbs::wire

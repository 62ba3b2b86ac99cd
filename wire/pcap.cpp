#include "wire/pcap.hpp"

#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>

#include "core/log.hpp"
#include "core/env.hpp"
#include "wire/headers.hpp"
#include "wire/icrc.hpp"

namespace softverbs::wire {
namespace {

constexpr uint32_t kPcapMagic = 0xa1b2c3d4;  // microsecond timestamps
constexpr uint32_t kLinkTypeEthernet = 1;
constexpr size_t kEthLen = 14, kIpLen = 20, kUdpLen = 8;

void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}

// The locally administered MAC an emulated device derives from its address.
void mac_of(in_addr a, uint8_t* mac) {
  mac[0] = 0x02;
  mac[1] = 0x00;
  std::memcpy(mac + 2, &a.s_addr, 4);
}

}  // namespace

PcapWriter* PcapWriter::instance() {
  static PcapWriter* writer = []() -> PcapWriter* {
    const char* env = env::pcap();
    if (!env || !*env) return nullptr;
    std::string path(env);
    for (size_t at; (at = path.find("%p")) != std::string::npos;) path.replace(at, 2, std::to_string(::getpid()));
    auto* w = new PcapWriter(path);  // lives until exit: packets may be written until then
    if (!w->ok()) {
      SV_LOG(kError, "SOFTVERBS_PCAP: cannot write %s: %s", path.c_str(), std::strerror(errno));
      delete w;
      return nullptr;
    }
    return w;
  }();
  return writer;
}

PcapWriter::PcapWriter(const std::string& path) {
  file_ = std::fopen(path.c_str(), "wbe");
  if (!file_) return;
  uint32_t hdr[6] = {kPcapMagic, 2u | (4u << 16), 0, 0, 65535 + kEthLen + kIpLen + kUdpLen, kLinkTypeEthernet};
  std::fwrite(hdr, sizeof hdr, 1, file_);
  std::fflush(file_);
}

PcapWriter::~PcapWriter() {
  if (file_) std::fclose(file_);
}

uint64_t PcapWriter::write(const Clock& clock, in_addr src, in_addr dst, uint16_t sport, std::span<const uint8_t> packet,
                       uint8_t tos) {
  uint8_t head[kEthLen + kIpLen + kUdpLen] = {};
  uint8_t* eth = head;
  mac_of(dst, eth);
  mac_of(src, eth + 6);
  put16(eth + 12, 0x0800);
  uint8_t* ip = head + kEthLen;
  // DF, ID 0: what an unconnected socket with IP_PMTUDISC_DO sends.
  std::array<uint8_t, 4> s{}, d{};
  std::memcpy(s.data(), &src.s_addr, 4);
  std::memcpy(d.data(), &dst.s_addr, 4);
  write_ipv4_header(ip, s, d, packet.size(), tos);
  uint8_t* udp = ip + kIpLen;
  put16(udp, sport);
  put16(udp + 2, kRoceV2UdpPort);
  put16(udp + 4, static_cast<uint16_t>(kUdpLen + packet.size()));
  // UDP checksum 0, as RoCEv2 senders use.

  const timespec ts = clock.wall_now();
  const uint32_t len = static_cast<uint32_t>(sizeof head + packet.size());
  uint32_t rec[4] = {static_cast<uint32_t>(ts.tv_sec), static_cast<uint32_t>(ts.tv_nsec / 1000), len, len};
  std::lock_guard lock(mu_);
  std::fwrite(rec, sizeof rec, 1, file_);
  std::fwrite(head, sizeof head, 1, file_);
  std::fwrite(packet.data(), packet.size(), 1, file_);
  std::fflush(file_);  // a process killed mid-run still leaves a readable capture
  return ++frames_;
}

}  // namespace softverbs::wire

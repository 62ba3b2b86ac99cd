// RoCEv2 Invariant CRC (docs/wire.md §2.1; IBTA Vol1 "Invariant CRC" as
// adapted to IP/UDP by Annex A17).
//
// The ICRC is CRC-32 (the Ethernet/zlib polynomial, reflected) over
//   8 bytes of 0xFF (the masked LRH of the IB original)
//   | the IP header with its variant fields set to all ones
//   | the UDP header with the checksum set to all ones
//   | the BTH with byte 4 (FECN, BECN, resv6) set to all ones
//   | the extension headers, payload and pad bytes,
// and is carried after the pad as the CRC value in little-endian byte order.
//
// A sender on an ordinary UDP socket never sees the IP and UDP headers the
// kernel writes, so the ICRC is computed from the fields that survive the
// masking, described by an Ipv4Flow or Ipv6Flow. The IP total/payload length
// and the UDP length are derived from the packet length. What the kernel
// writes must match: for IPv4 the Identification field is inside the ICRC, and
// only an unconnected socket with IP_PMTUDISC_DO sends ID 0 with DF set, the
// Ipv4Flow defaults (docs/wire.md §2.2).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <variant>

#include "wire/headers.hpp"

namespace softverbs::wire {

inline constexpr std::uint16_t kIpv4FlagDf = 0x4000;  // "don't fragment" in the flags/offset word
inline constexpr std::uint8_t kIpProtoUdp = 17;

// The IPv4 and UDP header fields that enter the ICRC. The header is assumed to
// be 20 bytes (IHL 5, no options) carrying UDP, as every RoCEv2 sender emits.
// TOS, TTL and the checksums are masked and so not needed.
struct Ipv4Flow {
  std::array<std::uint8_t, 4> saddr{};  // network byte order, as in the header
  std::array<std::uint8_t, 4> daddr{};
  std::uint16_t id = 0;                  // Identification
  std::uint16_t frag_off = kIpv4FlagDf;  // flags + fragment offset word, host order
  std::uint16_t sport = 0xC000;          // UDP source port (flow entropy)
  std::uint16_t dport = kRoceV2UdpPort;
};

// The IPv6 and UDP header fields that enter the ICRC. The header is assumed to
// be the 40-byte fixed header with Next Header = UDP (no extension headers).
// Traffic class, flow label and hop limit are masked.
struct Ipv6Flow {
  std::array<std::uint8_t, 16> saddr{};
  std::array<std::uint8_t, 16> daddr{};
  std::uint16_t sport = 0xC000;
  std::uint16_t dport = kRoceV2UdpPort;
};

using IcrcFlow = std::variant<Ipv4Flow, Ipv6Flow>;

// ICRC of a packet whose BTH-to-pad bytes are `bth_to_pad` (the UDP payload
// without the trailing 4 ICRC bytes). Returns the CRC value, which goes on the
// wire little-endian (store_icrc/load_icrc), or 0 if `bth_to_pad` is shorter
// than a BTH.
std::uint32_t icrc_ipv4(const Ipv4Flow& flow, std::span<const std::uint8_t> bth_to_pad) noexcept;
std::uint32_t icrc_ipv6(const Ipv6Flow& flow, std::span<const std::uint8_t> bth_to_pad) noexcept;
std::uint32_t icrc(const IcrcFlow& flow, std::span<const std::uint8_t> bth_to_pad) noexcept;

// The IPv4 Identification under which a received packet's ICRC holds, when the
// sender's kernel chose one (the Linux kernel's rdma_rxe numbers its packets) and
// a UDP socket cannot see it. The ICRC is linear in the ID's 16 bits: the
// difference `received` ^ icrc(flow with ID 0) is solved for them. Returns the
// ID, or nothing if no ID makes the ICRC hold (a corrupted packet). A packet
// checked this way is protected by 16 bits of its ICRC fewer.
std::optional<std::uint16_t> solve_ipv4_id(const Ipv4Flow& flow, std::span<const std::uint8_t> bth_to_pad,
                                           std::uint32_t received) noexcept;

// The IPv4 TTL softverbs' sockets send with (Linux's default, net.ipv4.ip_default_ttl).
inline constexpr std::uint8_t kDefaultTtl = 64;

// Writes the 20-byte IPv4 header of a RoCEv2 packet from src to dst whose UDP
// payload (BTH .. ICRC) is udp_payload_len bytes, as softverbs' sockets send it:
// DF set, ID 0, header checksum filled in. Addresses in network order.
// tos is the TOS byte (DSCP and ECN): a RoCEv2 packet's GRH traffic class;
// ttl its hop limit.
void write_ipv4_header(std::uint8_t* out, const std::array<std::uint8_t, 4>& saddr,
                       const std::array<std::uint8_t, 4>& daddr, std::size_t udp_payload_len,
                       std::uint8_t tos = 0, std::uint8_t ttl = kDefaultTtl) noexcept;

// Recomputes and writes the ICRC into the last 4 bytes of a whole UDP payload
// (BTH .. ICRC). No-op if the packet is shorter than BTH + ICRC.
void write_icrc(const IcrcFlow& flow, std::span<std::uint8_t> udp_payload) noexcept;

// The 4 ICRC bytes hold the CRC value little-endian.
constexpr void store_icrc(std::uint8_t* p, std::uint32_t crc) noexcept {
  p[0] = static_cast<std::uint8_t>(crc);
  p[1] = static_cast<std::uint8_t>(crc >> 8);
  p[2] = static_cast<std::uint8_t>(crc >> 16);
  p[3] = static_cast<std::uint8_t>(crc >> 24);
}
constexpr std::uint32_t load_icrc(const std::uint8_t* p) noexcept {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) | (std::uint32_t{p[3]} << 24);
}

}  // namespace softverbs::wire

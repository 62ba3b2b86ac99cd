#include "transport/icrc.hpp"

#include <isa-l.h>

#include <algorithm>
#include <cstddef>

namespace softverbs::transport {
namespace {

constexpr std::size_t kIpv4HeaderBytes = 20;
constexpr std::size_t kIpv6HeaderBytes = 40;
constexpr std::size_t kUdpHeaderBytes = 8;

// CRC-32 state (zlib convention, i.e. as crc32_gzip_refl returns it) after the
// 8 bytes of 0xFF that stand for the masked LRH. The raw shift register is
// 0xdebb20e3, the seed rxe_icrc.c starts from; zlib keeps it inverted.
constexpr std::uint32_t kCrcAfterMaskedLrh = 0x2144DF1C;

// The UDP header with the checksum masked (IBTA A17: the UDP checksum is a
// variant field), then the BTH with byte 4 masked (FECN, BECN and resv6 are
// not invariant).
std::uint8_t* put_udp_and_bth(std::uint8_t* p, std::uint16_t sport, std::uint16_t dport,
                              std::uint16_t udp_len, const std::uint8_t* bth) noexcept {
  store_be16(p + 0, sport);
  store_be16(p + 2, dport);
  store_be16(p + 4, udp_len);
  store_be16(p + 6, 0xFFFF);
  p += kUdpHeaderBytes;
  std::copy_n(bth, Bth::kSize, p);
  p[4] = 0xFF;
  return p + Bth::kSize;
}

std::uint32_t finish(std::span<const std::uint8_t> masked,
                     std::span<const std::uint8_t> bth_to_pad) noexcept {
  std::uint32_t crc = crc32_gzip_refl(kCrcAfterMaskedLrh, masked.data(), masked.size());
  const auto rest = bth_to_pad.subspan(Bth::kSize);
  return crc32_gzip_refl(crc, rest.data(), rest.size());
}

}  // namespace

std::uint32_t icrc_ipv4(const Ipv4Flow& flow, std::span<const std::uint8_t> bth_to_pad) noexcept {
  if (bth_to_pad.size() < Bth::kSize) return 0;
  const std::size_t udp_len = kUdpHeaderBytes + bth_to_pad.size() + kIcrcBytes;
  const std::size_t ip_len = kIpv4HeaderBytes + udp_len;

  std::array<std::uint8_t, kIpv4HeaderBytes + kUdpHeaderBytes + Bth::kSize> m;
  std::uint8_t* p = m.data();
  p[0] = 0x45;  // version 4, IHL 5
  p[1] = 0xFF;  // TOS (DSCP+ECN) masked
  store_be16(p + 2, static_cast<std::uint16_t>(ip_len));
  store_be16(p + 4, flow.id);
  store_be16(p + 6, flow.frag_off);
  p[8] = 0xFF;  // TTL masked
  p[9] = kIpProtoUdp;
  store_be16(p + 10, 0xFFFF);  // header checksum masked
  std::copy(flow.saddr.begin(), flow.saddr.end(), p + 12);
  std::copy(flow.daddr.begin(), flow.daddr.end(), p + 16);
  put_udp_and_bth(p + kIpv4HeaderBytes, flow.sport, flow.dport, static_cast<std::uint16_t>(udp_len),
                  bth_to_pad.data());
  return finish(m, bth_to_pad);
}

std::uint32_t icrc_ipv6(const Ipv6Flow& flow, std::span<const std::uint8_t> bth_to_pad) noexcept {
  if (bth_to_pad.size() < Bth::kSize) return 0;
  const std::size_t udp_len = kUdpHeaderBytes + bth_to_pad.size() + kIcrcBytes;

  std::array<std::uint8_t, kIpv6HeaderBytes + kUdpHeaderBytes + Bth::kSize> m;
  std::uint8_t* p = m.data();
  // Version 6, then traffic class and flow label masked to all ones.
  p[0] = 0x6F;
  p[1] = 0xFF;
  p[2] = 0xFF;
  p[3] = 0xFF;
  store_be16(p + 4, static_cast<std::uint16_t>(udp_len));  // payload length
  p[6] = kIpProtoUdp;                                      // next header
  p[7] = 0xFF;                                             // hop limit masked
  std::copy(flow.saddr.begin(), flow.saddr.end(), p + 8);
  std::copy(flow.daddr.begin(), flow.daddr.end(), p + 24);
  put_udp_and_bth(p + kIpv6HeaderBytes, flow.sport, flow.dport, static_cast<std::uint16_t>(udp_len),
                  bth_to_pad.data());
  return finish(m, bth_to_pad);
}

std::uint32_t icrc(const IcrcFlow& flow, std::span<const std::uint8_t> bth_to_pad) noexcept {
  if (const auto* v4 = std::get_if<Ipv4Flow>(&flow)) return icrc_ipv4(*v4, bth_to_pad);
  if (const auto* v6 = std::get_if<Ipv6Flow>(&flow)) return icrc_ipv6(*v6, bth_to_pad);
  return 0;  // valueless variant; cannot happen with these trivially copyable types
}

void write_icrc(const IcrcFlow& flow, std::span<std::uint8_t> udp_payload) noexcept {
  if (udp_payload.size() < Bth::kSize + kIcrcBytes) return;
  const std::size_t n = udp_payload.size() - kIcrcBytes;
  store_icrc(udp_payload.data() + n, icrc(flow, udp_payload.first(n)));
}

}  // namespace softverbs::transport

#include "wire/icrc.hpp"

#include <isa-l.h>

#include <algorithm>
#include <cstddef>

namespace softverbs::wire {
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
std::uint8_t* put_udp_and_bth(std::uint8_t* p, std::uint16_t sport, std::uint16_t dport, std::uint16_t udp_len,
                              const std::uint8_t* bth) noexcept {
  store_be16(p + 0, sport);
  store_be16(p + 2, dport);
  store_be16(p + 4, udp_len);
  store_be16(p + 6, 0xFFFF);
  p += kUdpHeaderBytes;
  std::copy_n(bth, Bth::kSize, p);
  p[4] = 0xFF;
  return p + Bth::kSize;
}

std::uint32_t finish(std::span<const std::uint8_t> masked, std::span<const std::uint8_t> bth_to_pad) noexcept {
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
  put_udp_and_bth(p + kIpv4HeaderBytes, flow.sport, flow.dport, static_cast<std::uint16_t>(udp_len), bth_to_pad.data());
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
  put_udp_and_bth(p + kIpv6HeaderBytes, flow.sport, flow.dport, static_cast<std::uint16_t>(udp_len), bth_to_pad.data());
  return finish(m, bth_to_pad);
}

std::uint32_t icrc(const IcrcFlow& flow, std::span<const std::uint8_t> bth_to_pad) noexcept {
  if (const auto* v4 = std::get_if<Ipv4Flow>(&flow)) return icrc_ipv4(*v4, bth_to_pad);
  if (const auto* v6 = std::get_if<Ipv6Flow>(&flow)) return icrc_ipv6(*v6, bth_to_pad);
  return 0;  // valueless variant; cannot happen with these trivially copyable types
}

namespace {

// Polynomial arithmetic modulo the CRC-32 polynomial in the CRC register's bit
// order (reflected: bit 31 is x^0, bit 0 is x^31).
constexpr std::uint32_t kCrc32PolyReflected = 0xEDB88320;

std::uint32_t mulmod(std::uint32_t a, std::uint32_t b) noexcept {
  std::uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & (0x80000000u >> i)) product ^= b;               // a's x^i term times b
    b = (b & 1) ? (b >> 1) ^ kCrc32PolyReflected : b >> 1;  // b *= x
  }
  return product;
}

// x^(8n) mod P: what n zero bytes appended do to a CRC register difference.
std::uint32_t x_pow_8n(std::uint64_t n) noexcept {
  std::uint32_t result = 0x80000000u;  // 1
  std::uint32_t square = 0x00800000u;  // x^8
  for (; n; n >>= 1) {
    if (n & 1) result = mulmod(result, square);
    square = mulmod(square, square);
  }
  return result;
}

}  // namespace

std::optional<std::uint16_t> solve_ipv4_id(const Ipv4Flow& flow, std::span<const std::uint8_t> bth_to_pad,
                                           std::uint32_t received) noexcept {
  if (bth_to_pad.size() < Bth::kSize) return std::nullopt;
  Ipv4Flow zero = flow;
  zero.id = 0;
  std::uint32_t syndrome = icrc_ipv4(zero, bth_to_pad) ^ received;
  if (syndrome == 0) return 0;
  // Bit k of the ID changes the ICRC by a fixed value: that bit's change to the
  // CRC register over the 2 ID bytes, carried through every byte after them.
  const std::uint64_t after_id = (kIpv4HeaderBytes - 6) + kUdpHeaderBytes + bth_to_pad.size();
  const std::uint32_t carry = x_pow_8n(after_id);
  const std::uint8_t zeros[2] = {0, 0};
  const std::uint32_t crc_zeros = crc32_gzip_refl(0, zeros, 2);
  // Gaussian elimination over GF(2): a basis of the 16 columns, each row keyed
  // by its highest set bit, with the ID bits that make it up.
  std::uint32_t basis[32] = {};
  std::uint16_t makeup[32] = {};
  for (int k = 0; k < 16; ++k) {
    std::uint8_t id_bytes[2];
    store_be16(id_bytes, static_cast<std::uint16_t>(1u << k));
    std::uint32_t v = mulmod(crc32_gzip_refl(0, id_bytes, 2) ^ crc_zeros, carry);
    std::uint16_t m = static_cast<std::uint16_t>(1u << k);
    for (int bit = 31; bit >= 0 && v; --bit) {
      if (!(v >> bit & 1)) continue;
      if (!basis[bit]) {
        basis[bit] = v;
        makeup[bit] = m;
        break;
      }
      v ^= basis[bit];
      m ^= makeup[bit];
    }
  }
  std::uint16_t id = 0;
  for (int bit = 31; bit >= 0 && syndrome; --bit) {
    if (!(syndrome >> bit & 1)) continue;
    if (!basis[bit]) return std::nullopt;  // not a change any ID could make
    syndrome ^= basis[bit];
    id ^= makeup[bit];
  }
  return id;
}

void write_ipv4_header(std::uint8_t* out, const std::array<std::uint8_t, 4>& saddr,
                       const std::array<std::uint8_t, 4>& daddr, std::size_t udp_payload_len,
                       std::uint8_t tos, std::uint8_t ttl) noexcept {
  std::fill_n(out, kIpv4HeaderBytes, 0);
  out[0] = 0x45;  // version 4, IHL 5
  out[1] = tos;
  store_be16(out + 2, static_cast<std::uint16_t>(kIpv4HeaderBytes + kUdpHeaderBytes + udp_payload_len));
  store_be16(out + 6, kIpv4FlagDf);
  out[8] = ttl;
  out[9] = kIpProtoUdp;
  std::copy(saddr.begin(), saddr.end(), out + 12);
  std::copy(daddr.begin(), daddr.end(), out + 16);
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i < kIpv4HeaderBytes; i += 2) sum += (std::uint32_t{out[i]} << 8) | out[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  store_be16(out + 10, static_cast<std::uint16_t>(~sum));
}

void write_icrc(const IcrcFlow& flow, std::span<std::uint8_t> udp_payload) noexcept {
  if (udp_payload.size() < Bth::kSize + kIcrcBytes) return;
  const std::size_t n = udp_payload.size() - kIcrcBytes;
  store_icrc(udp_payload.data() + n, icrc(flow, udp_payload.first(n)));
}

}  // namespace softverbs::wire

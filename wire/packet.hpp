// Parsing and building whole RoCEv2 transport packets: the UDP payload, from
// the BTH to the ICRC (docs/wire.md §1.1):
//
//   BTH(12) | extension headers | payload | pad (0..3) | ICRC(4)
//
// parse() is total: any byte sequence gives either a decoded view or an error
// code, with no read outside the input. build() writes into a caller buffer
// and gathers the payload from caller spans (e.g. straight from registered
// memory), so a packet costs one copy of its payload; gather() encodes only
// the headers and leaves the payload where it is, for a link that copies it
// straight to its destination.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"

namespace softverbs::wire {

// ---------------------------------------------------------------------------
// Interface
// ---------------------------------------------------------------------------

// All transport headers a packet may carry; an opcode uses only those in its
// OpcodeInfo::headers, the others are ignored by build() and left
// value-initialised by parse().
struct PacketHeaders {
  Bth bth;
  Deth deth;
  Xrceth xrceth;
  Reth reth;
  Aeth aeth;
  AtomicEth atomic_eth;
  AtomicAckEth atomic_ack_eth;
  Imm imm;
  Ieth ieth;
  friend bool operator==(const PacketHeaders&, const PacketHeaders&) = default;
};

// The fields of the IPv4 header a packet arrived with that its UDP payload does
// not hold and a receiver shows: RoCEv2's IP header stands for the GRH, so the
// TOS byte is the traffic class and the TTL the hop limit (a UD receive's GRH
// area). The link reports them; parse() leaves the defaults, which are what
// softverbs' sockets send with for traffic class 0.
struct IpFields {
  std::uint8_t tos = 0;
  std::uint8_t ttl = kDefaultTtl;
  // Not an IP field: the packet came through the in-process queue with its
  // ICRC not computed (fabric::Link::needs_icrc), so the receiver skips the check.
  bool icrc_skipped = false;
  friend bool operator==(const IpFields&, const IpFields&) = default;
};

// A parsed packet. Spans point into the parsed buffer.
struct PacketView : PacketHeaders {
  IpFields ip;                                // from the link, not from the bytes (see IpFields)
  const OpcodeInfo* op = &opcode_info(0xFF);  // never null; 0xFF is an invalid entry
  std::span<const std::uint8_t> payload;      // without the pad bytes
  std::uint32_t icrc = 0;                     // CRC value read from the wire (little-endian bytes)

  bool has(std::uint16_t ext_bits) const noexcept { return op->has(ext_bits); }
};

enum class ParseError : std::uint8_t {
  ok,
  too_short,            // shorter than BTH + ICRC
  icrc_mismatch,        // only when asked to verify; checked before anything else
  bad_tver,             // BTH TVer != 0
  unknown_opcode,       // not in the opcode table (incl. RD and reserved codes)
  unsupported_opcode,   // in the table but not implemented (FLUSH, ATOMIC_WRITE, CNP)
  truncated_headers,    // shorter than the opcode's headers + ICRC
  unexpected_payload,   // bytes after the headers of an opcode that carries no payload
  pad_exceeds_payload,  // PadCnt larger than the bytes between headers and ICRC
};

std::string_view to_string(ParseError e) noexcept;

// Decodes `udp_payload` (BTH .. ICRC) into `out`, which is reset first. On
// error, `out.bth` and `out.op` are still filled unless the error is
// too_short, so the caller can count or answer the packet.
// The ICRC is read but not checked; receivers that cannot know the sender's
// IP header (a plain UDP socket does not show the IPv4 ID) use this.
ParseError parse(std::span<const std::uint8_t> udp_payload, PacketView& out) noexcept;

// As above, and first checks the ICRC against the given flow. A corrupted
// packet is reported only as icrc_mismatch, never with a header error that
// the corruption may have caused (rxe drops such packets silently).
ParseError parse(std::span<const std::uint8_t> udp_payload, PacketView& out,
                 const IcrcFlow& verify) noexcept;

// Largest UDP payload that fits an IPv4 datagram (65535 - 20 - 8).
inline constexpr std::size_t kMaxUdpPayload = 65507;

// Size of the packet build() writes for `opcode` and `payload_len` payload
// bytes: headers + payload + pad + ICRC. 0 if build() would refuse it. Inline:
// the in-process fast path counts every packet by it.
constexpr std::size_t packet_size(std::uint8_t opcode, std::size_t payload_len) noexcept {
  const OpcodeInfo& op = opcode_info(opcode);
  if (!op.supported) return 0;
  if (!op.has_payload && payload_len != 0) return 0;
  if (payload_len > kMaxUdpPayload) return 0;  // also keeps the sum below from overflowing
  const std::size_t pad = (4 - payload_len % 4) % 4;
  const std::size_t size = op.header_len + payload_len + pad + kIcrcBytes;
  return size <= kMaxUdpPayload ? size : 0;
}

// Writes BTH, the extension headers of h.bth.opcode, the payload gathered from
// `payload` in order, the pad and the ICRC into `out`, and returns the packet
// length. h.bth.pad_cnt is ignored and computed from the payload length
// (pad = -len mod 4). If `flow` is null the ICRC bytes are written as 0, for
// paths that never check them. Returns 0, leaving `out` in an unspecified
// state, if the opcode is invalid or unsupported, if payload is given for an
// opcode without payload, if the packet would exceed kMaxUdpPayload, or if
// `out` is too small.
std::size_t build(const PacketHeaders& h, std::span<const std::span<const std::uint8_t>> payload,
                  std::span<std::uint8_t> out, const IcrcFlow* flow) noexcept;

// What parse() gives for the packet build(h, payload) would write, without
// writing it: the headers of h.bth.opcode as their encoding keeps them (field
// widths, pad count; the opcode's other headers value-initialised), the payload
// span as given, ip and icrc left default. The in-process fast path hands this
// to a receiver instead of the bytes (fabric::Link::send_direct). False if
// build() would refuse the packet.
// (Inline: the fast path makes one per packet, into a view it reuses.)
inline bool as_received(const PacketHeaders& h, std::span<const std::uint8_t> payload, PacketView& out) noexcept;

// The BTH and AETH as parse(build()) gives them back (their encodings keep
// 24-bit QPNs, PSNs and MSNs and a 4-bit TVer; the pad count follows the
// payload length): the pieces of as_received that one header needs, for a
// caller that updates a view it already holds (emu/qp/direct.cpp folds a
// plain ACK into the previous one this way).
constexpr Bth as_received(const Bth& b, std::size_t payload_len) noexcept {
  Bth out = b;
  out.pad_cnt = static_cast<std::uint8_t>((4 - payload_len % 4) % 4);
  out.tver &= 0xF;
  out.dest_qp &= 0xFFFFFF;
  out.psn &= 0xFFFFFF;
  return out;
}
constexpr Aeth as_received(const Aeth& a) noexcept { return Aeth{a.syndrome, a.msn & 0xFFFFFF}; }

// Single-span payload convenience.
std::size_t build(const PacketHeaders& h, std::span<const std::uint8_t> payload,
                  std::span<std::uint8_t> out, const IcrcFlow* flow) noexcept;

// The most header bytes any opcode carries (BTH and every extension header):
// the room gather() needs for them.
inline constexpr std::size_t kMaxHeaderBytes = Bth::kSize + Deth::kSize + Xrceth::kSize + Reth::kSize +
                                               Aeth::kSize + AtomicEth::kSize + AtomicAckEth::kSize +
                                               Imm::kSize + Ieth::kSize;

// The packet build(h, payload, out, nullptr) writes (ICRC not computed), in
// pieces, so that a link copies each once to where the packet goes, the
// payload straight from the sender's memory (fabric::Link::send_gathered):
// the headers as build() encodes them, the payload spans as given, then
// `tail`, the pad bytes and the ICRC field (all 0). Its bytes, in this order,
// are exactly build()'s; the spans point into the caller's memory.
struct GatheredPacket {
  std::span<const std::uint8_t> headers;
  std::span<const std::span<const std::uint8_t>> payload;
  std::span<const std::uint8_t> tail;
  std::size_t size = 0;  // of the whole packet, BTH .. ICRC
};

// Encodes h's headers into `header_room` and describes the packet in `out`;
// false if build() would refuse it (the same rules).
bool gather(const PacketHeaders& h, std::span<const std::span<const std::uint8_t>> payload,
            std::span<std::uint8_t, kMaxHeaderBytes> header_room, GatheredPacket& out) noexcept;

// Decodes a gathered packet's headers into `out` (reset first), as parse()
// would: the payload is set only when it is one piece, else left empty. False
// for headers gather() would not have encoded.
bool parse_gathered(const GatheredPacket& packet, PacketView& out) noexcept;

// ---------------------------------------------------------------------------
// Inline definitions
// ---------------------------------------------------------------------------

inline bool as_received(const PacketHeaders& h, std::span<const std::uint8_t> payload, PacketView& out) noexcept {
  if (packet_size(h.bth.opcode, payload.size()) == 0) return false;
  const OpcodeInfo& op = opcode_info(h.bth.opcode);
  // Field by field what each header's encoding keeps (headers.hpp): the
  // 24-bit fields and the 4-bit TVer masked, the pad count computed as build()
  // does; headers the opcode does not carry are value-initialised, as parse()
  // leaves them. Each header is written once (no reset of the whole view
  // first). as_received_test checks this against parse(build()).
  out.bth = as_received(h.bth, payload.size());
  out.deth = op.has(ext::deth) ? Deth{h.deth.qkey, h.deth.src_qp & 0xFFFFFF} : Deth{};
  out.xrceth = op.has(ext::xrceth) ? Xrceth{h.xrceth.srqn & 0xFFFFFF} : Xrceth{};
  out.reth = op.has(ext::reth) ? h.reth : Reth{};
  out.atomic_eth = op.has(ext::atomic_eth) ? h.atomic_eth : AtomicEth{};
  out.aeth = op.has(ext::aeth) ? as_received(h.aeth) : Aeth{};
  out.atomic_ack_eth = op.has(ext::atomic_ack_eth) ? h.atomic_ack_eth : AtomicAckEth{};
  out.imm = op.has(ext::imm) ? h.imm : Imm{};
  out.ieth = op.has(ext::ieth) ? h.ieth : Ieth{};
  out.ip = IpFields{};
  out.op = &op;
  out.payload = payload;
  out.icrc = 0;
  return true;
}

}  // namespace softverbs::wire

// BTH opcode metadata: one table, indexed by the opcode byte, that says what
// every RoCEv2 opcode carries and means (docs/wire.md §1.4; IBTA Vol1 ch.9
// "OpCode field" table). Parsing, building and the protocol roles all read it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "wire/headers.hpp"

namespace softverbs::wire {

// ---------------------------------------------------------------------------
// Interface
// ---------------------------------------------------------------------------

// Transport service, from opcode bits 7..5 (RD and vendor opcodes are not
// listed and decode as invalid).
enum class Transport : std::uint8_t { none, rc, uc, ud, cnp, xrc };

enum class OpClass : std::uint8_t {
  none,
  send,
  rdma_write,
  rdma_read_request,
  rdma_read_response,
  ack,
  atomic,  // COMPARE_SWAP, FETCH_ADD
  atomic_ack,
  flush,         // not supported
  atomic_write,  // not supported
  cnp,           // RoCEv2 congestion notification
};

// Place of the packet in its message.
enum class Position : std::uint8_t { none, first, middle, last, only };

// Extension headers after the BTH. Bit order is wire order: when an opcode
// carries several, they appear in increasing bit order (e.g. RETH then ImmDt,
// DETH then ImmDt, AETH then AtomicAckETH, FETH then RETH).
namespace ext {
inline constexpr std::uint16_t deth = 1u << 0;
// IBTA 9.5: the XRCETH follows the BTH of every XRC request, before the RETH,
// AtomicETH or ImmDt.
inline constexpr std::uint16_t xrceth = 1u << 1;
inline constexpr std::uint16_t feth = 1u << 2;
inline constexpr std::uint16_t reth = 1u << 3;
inline constexpr std::uint16_t atomic_eth = 1u << 4;
inline constexpr std::uint16_t aeth = 1u << 5;
inline constexpr std::uint16_t atomic_ack_eth = 1u << 6;
inline constexpr std::uint16_t imm = 1u << 7;
inline constexpr std::uint16_t ieth = 1u << 8;
inline constexpr std::uint16_t cnp_reserved = 1u << 9;  // 16 reserved bytes of a CNP
inline constexpr unsigned kCount = 10;
}  // namespace ext

// Wire size of one extension header bit (0 if not exactly one known bit).
constexpr std::size_t ext_header_size(std::uint16_t bit) noexcept;

struct OpcodeInfo {
  std::string_view name;  // e.g. "RC_SEND_FIRST" (ib_pack.h spelling); "INVALID" if !valid
  std::uint8_t opcode = 0;
  bool valid = false;      // listed in the table
  bool supported = false;  // valid and implemented (FLUSH, ATOMIC_WRITE, CNP: decode only)
  Transport transport = Transport::none;
  OpClass op_class = OpClass::none;
  Position position = Position::none;
  std::uint16_t headers = 0;    // ext:: bits
  std::uint8_t header_len = 0;  // BTH + extension headers, in bytes
  bool has_payload = false;     // may carry payload (it may still be 0 bytes long)
  bool is_request = false;      // sent by a requester; false for responses, ACKs and CNPs
  // The responder needs a receive WQE to process this packet: every SEND packet
  // (the WQE is taken at FIRST/ONLY and kept until LAST) and the RDMA WRITE
  // packets with immediate data, whose immediate is delivered in a receive
  // completion.
  bool needs_recv_wqe = false;

  constexpr bool has(std::uint16_t ext_bits) const noexcept { return (headers & ext_bits) != 0; }
  constexpr bool has_imm() const noexcept { return has(ext::imm); }
  constexpr bool has_ieth() const noexcept { return has(ext::ieth); }
  constexpr bool starts_message() const noexcept {
    return position == Position::first || position == Position::only;
  }
  constexpr bool ends_message() const noexcept {
    return position == Position::last || position == Position::only;
  }
};

// Metadata for any opcode byte; unlisted opcodes give an entry with valid == false.
constexpr const OpcodeInfo& opcode_info(std::uint8_t opcode) noexcept;

// Whether the opcode answers a requester (an ACK or NAK, an RDMA READ response,
// an atomic ACK), as opposed to a request or a CNP.
constexpr bool answers_requester(std::uint8_t opcode) noexcept;

// Byte offset from the start of the BTH of extension header `bit`, which the
// opcode must carry.
constexpr std::size_t header_offset(const OpcodeInfo& info, std::uint16_t bit) noexcept;

// The request opcode of a transport service, class and position whose optional
// headers include exactly `extra` of ext::imm and ext::ieth (e.g. RC, send, last,
// ext::imm: RC_SEND_LAST_WITH_IMMEDIATE). 0xFF (invalid) when there is none.
constexpr std::uint8_t request_opcode(Transport transport, OpClass op_class, Position position,
                                      std::uint16_t extra) noexcept;

// Use as `prev` for the first request on a QP, or after a message was dropped.
inline constexpr std::uint8_t kNoPrevOpcode = 0xFF;

// Request opcode sequence rule for the responder of an RC or UC QP (IBTA
// Vol1 ch.9 responder OpCode sequence check): the packets of a message are
// FIRST, MIDDLE..., LAST or a single ONLY, and messages never interleave. So
// after SEND_FIRST/MIDDLE only SEND_MIDDLE/LAST* may follow, after
// RDMA_WRITE_FIRST/MIDDLE only RDMA_WRITE_MIDDLE/LAST*, and otherwise only a
// FIRST or ONLY opcode. `prev` is the opcode of the previous in-sequence
// request packet (or kNoPrevOpcode), `cur` the new one. Responses and ACKs are
// not part of a request stream and give false, as does a change of transport.
// Every UD request is an ONLY packet and is always valid after another.
// What to do on a violation differs (RC: NAK invalid request; UC: drop the
// message and resynchronise at the next FIRST/ONLY) and is up to the caller.
constexpr bool next_opcode_valid(std::uint8_t prev, std::uint8_t cur) noexcept;

std::string_view to_string(Transport t) noexcept;
std::string_view to_string(OpClass c) noexcept;
std::string_view to_string(Position p) noexcept;

// Opcode byte values (IBTA names; transport base RC 0x00, UC 0x20, UD 0x60).
namespace opcode {
inline constexpr std::uint8_t rc_send_first = 0x00;
inline constexpr std::uint8_t rc_send_middle = 0x01;
inline constexpr std::uint8_t rc_send_last = 0x02;
inline constexpr std::uint8_t rc_send_last_with_immediate = 0x03;
inline constexpr std::uint8_t rc_send_only = 0x04;
inline constexpr std::uint8_t rc_send_only_with_immediate = 0x05;
inline constexpr std::uint8_t rc_rdma_write_first = 0x06;
inline constexpr std::uint8_t rc_rdma_write_middle = 0x07;
inline constexpr std::uint8_t rc_rdma_write_last = 0x08;
inline constexpr std::uint8_t rc_rdma_write_last_with_immediate = 0x09;
inline constexpr std::uint8_t rc_rdma_write_only = 0x0A;
inline constexpr std::uint8_t rc_rdma_write_only_with_immediate = 0x0B;
inline constexpr std::uint8_t rc_rdma_read_request = 0x0C;
inline constexpr std::uint8_t rc_rdma_read_response_first = 0x0D;
inline constexpr std::uint8_t rc_rdma_read_response_middle = 0x0E;
inline constexpr std::uint8_t rc_rdma_read_response_last = 0x0F;
inline constexpr std::uint8_t rc_rdma_read_response_only = 0x10;
inline constexpr std::uint8_t rc_acknowledge = 0x11;
inline constexpr std::uint8_t rc_atomic_acknowledge = 0x12;
inline constexpr std::uint8_t rc_compare_swap = 0x13;
inline constexpr std::uint8_t rc_fetch_add = 0x14;
inline constexpr std::uint8_t rc_send_last_with_invalidate = 0x16;
inline constexpr std::uint8_t rc_send_only_with_invalidate = 0x17;
inline constexpr std::uint8_t rc_flush = 0x1C;
inline constexpr std::uint8_t rc_atomic_write = 0x1D;
inline constexpr std::uint8_t uc_send_first = 0x20;
inline constexpr std::uint8_t uc_send_middle = 0x21;
inline constexpr std::uint8_t uc_send_last = 0x22;
inline constexpr std::uint8_t uc_send_last_with_immediate = 0x23;
inline constexpr std::uint8_t uc_send_only = 0x24;
inline constexpr std::uint8_t uc_send_only_with_immediate = 0x25;
inline constexpr std::uint8_t uc_rdma_write_first = 0x26;
inline constexpr std::uint8_t uc_rdma_write_middle = 0x27;
inline constexpr std::uint8_t uc_rdma_write_last = 0x28;
inline constexpr std::uint8_t uc_rdma_write_last_with_immediate = 0x29;
inline constexpr std::uint8_t uc_rdma_write_only = 0x2A;
inline constexpr std::uint8_t uc_rdma_write_only_with_immediate = 0x2B;
inline constexpr std::uint8_t ud_send_only = 0x64;
inline constexpr std::uint8_t ud_send_only_with_immediate = 0x65;
inline constexpr std::uint8_t cnp = 0x81;
inline constexpr std::uint8_t xrc_send_only = 0xA4;
inline constexpr std::uint8_t xrc_rdma_write_only = 0xAA;
inline constexpr std::uint8_t xrc_acknowledge = 0xB1;
}  // namespace opcode

// ---------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------

constexpr std::size_t ext_header_size(std::uint16_t bit) noexcept {
  switch (bit) {
    case ext::deth: return Deth::kSize;
    case ext::xrceth: return Xrceth::kSize;
    case ext::feth: return kFethBytes;
    case ext::reth: return Reth::kSize;
    case ext::atomic_eth: return AtomicEth::kSize;
    case ext::aeth: return Aeth::kSize;
    case ext::atomic_ack_eth: return AtomicAckEth::kSize;
    case ext::imm: return Imm::kSize;
    case ext::ieth: return Ieth::kSize;
    case ext::cnp_reserved: return kCnpReservedBytes;
    default: return 0;
  }
}

namespace detail {

struct OpcodeRow {
  std::uint8_t opcode;
  std::string_view name;
  OpClass op_class;
  Position position;
  std::uint16_t headers;
  bool has_payload;
  bool supported = true;
};

using C = OpClass;
using P = Position;

// The table. Headers per opcode as the Linux soft-RoCE driver builds them
// (rxe_opcode.c), which docs/wire.md §1.4 takes as ground truth.
inline constexpr OpcodeRow kOpcodeRows[] = {
    // RC
    {0x00, "RC_SEND_FIRST", C::send, P::first, 0, true},
    {0x01, "RC_SEND_MIDDLE", C::send, P::middle, 0, true},
    {0x02, "RC_SEND_LAST", C::send, P::last, 0, true},
    {0x03, "RC_SEND_LAST_WITH_IMMEDIATE", C::send, P::last, ext::imm, true},
    {0x04, "RC_SEND_ONLY", C::send, P::only, 0, true},
    {0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", C::send, P::only, ext::imm, true},
    {0x06, "RC_RDMA_WRITE_FIRST", C::rdma_write, P::first, ext::reth, true},
    {0x07, "RC_RDMA_WRITE_MIDDLE", C::rdma_write, P::middle, 0, true},
    {0x08, "RC_RDMA_WRITE_LAST", C::rdma_write, P::last, 0, true},
    {0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", C::rdma_write, P::last, ext::imm, true},
    {0x0A, "RC_RDMA_WRITE_ONLY", C::rdma_write, P::only, ext::reth, true},
    {0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", C::rdma_write, P::only, ext::reth | ext::imm, true},
    {0x0C, "RC_RDMA_READ_REQUEST", C::rdma_read_request, P::only, ext::reth, false},
    {0x0D, "RC_RDMA_READ_RESPONSE_FIRST", C::rdma_read_response, P::first, ext::aeth, true},
    // MIDDLE carries no AETH (IBTA; rxe_opcode.c).
    {0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", C::rdma_read_response, P::middle, 0, true},
    {0x0F, "RC_RDMA_READ_RESPONSE_LAST", C::rdma_read_response, P::last, ext::aeth, true},
    {0x10, "RC_RDMA_READ_RESPONSE_ONLY", C::rdma_read_response, P::only, ext::aeth, true},
    {0x11, "RC_ACKNOWLEDGE", C::ack, P::only, ext::aeth, false},
    {0x12, "RC_ATOMIC_ACKNOWLEDGE", C::atomic_ack, P::only, ext::aeth | ext::atomic_ack_eth, false},
    {0x13, "RC_COMPARE_SWAP", C::atomic, P::only, ext::atomic_eth, false},
    {0x14, "RC_FETCH_ADD", C::atomic, P::only, ext::atomic_eth, false},
    {0x16, "RC_SEND_LAST_WITH_INVALIDATE", C::send, P::last, ext::ieth, true},
    {0x17, "RC_SEND_ONLY_WITH_INVALIDATE", C::send, P::only, ext::ieth, true},
    // IBTA A19 (Linux >= 6.2); listed for decoding, not implemented.
    {0x1C, "RC_FLUSH", C::flush, P::only, ext::feth | ext::reth, false, false},
    {0x1D, "RC_ATOMIC_WRITE", C::atomic_write, P::only, ext::reth, true, false},
    // UC: no READ, ATOMIC or INVALIDATE.
    {0x20, "UC_SEND_FIRST", C::send, P::first, 0, true},
    {0x21, "UC_SEND_MIDDLE", C::send, P::middle, 0, true},
    {0x22, "UC_SEND_LAST", C::send, P::last, 0, true},
    {0x23, "UC_SEND_LAST_WITH_IMMEDIATE", C::send, P::last, ext::imm, true},
    {0x24, "UC_SEND_ONLY", C::send, P::only, 0, true},
    {0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", C::send, P::only, ext::imm, true},
    {0x26, "UC_RDMA_WRITE_FIRST", C::rdma_write, P::first, ext::reth, true},
    {0x27, "UC_RDMA_WRITE_MIDDLE", C::rdma_write, P::middle, 0, true},
    {0x28, "UC_RDMA_WRITE_LAST", C::rdma_write, P::last, 0, true},
    {0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", C::rdma_write, P::last, ext::imm, true},
    {0x2A, "UC_RDMA_WRITE_ONLY", C::rdma_write, P::only, ext::reth, true},
    {0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", C::rdma_write, P::only, ext::reth | ext::imm, true},
    // UD: only SEND ONLY, always with a DETH.
    {0x64, "UD_SEND_ONLY", C::send, P::only, ext::deth, true},
    {0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", C::send, P::only, ext::deth | ext::imm, true},
    // XRC (IBTA 9.5, opcodes 0xA0-0xB7): the RC operations, each request with
    // an XRCETH naming the target's SRQ; the responses carry none.
    {0xA0, "XRC_SEND_FIRST", C::send, P::first, ext::xrceth, true},
    {0xA1, "XRC_SEND_MIDDLE", C::send, P::middle, ext::xrceth, true},
    {0xA2, "XRC_SEND_LAST", C::send, P::last, ext::xrceth, true},
    {0xA3, "XRC_SEND_LAST_WITH_IMMEDIATE", C::send, P::last, ext::xrceth | ext::imm, true},
    {0xA4, "XRC_SEND_ONLY", C::send, P::only, ext::xrceth, true},
    {0xA5, "XRC_SEND_ONLY_WITH_IMMEDIATE", C::send, P::only, ext::xrceth | ext::imm, true},
    {0xA6, "XRC_RDMA_WRITE_FIRST", C::rdma_write, P::first, ext::xrceth | ext::reth, true},
    {0xA7, "XRC_RDMA_WRITE_MIDDLE", C::rdma_write, P::middle, ext::xrceth, true},
    {0xA8, "XRC_RDMA_WRITE_LAST", C::rdma_write, P::last, ext::xrceth, true},
    {0xA9, "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE", C::rdma_write, P::last, ext::xrceth | ext::imm, true},
    {0xAA, "XRC_RDMA_WRITE_ONLY", C::rdma_write, P::only, ext::xrceth | ext::reth, true},
    {0xAB, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", C::rdma_write, P::only, ext::xrceth | ext::reth | ext::imm, true},
    {0xAC, "XRC_RDMA_READ_REQUEST", C::rdma_read_request, P::only, ext::xrceth | ext::reth, false},
    {0xAD, "XRC_RDMA_READ_RESPONSE_FIRST", C::rdma_read_response, P::first, ext::aeth, true},
    {0xAE, "XRC_RDMA_READ_RESPONSE_MIDDLE", C::rdma_read_response, P::middle, 0, true},
    {0xAF, "XRC_RDMA_READ_RESPONSE_LAST", C::rdma_read_response, P::last, ext::aeth, true},
    {0xB0, "XRC_RDMA_READ_RESPONSE_ONLY", C::rdma_read_response, P::only, ext::aeth, true},
    {0xB1, "XRC_ACKNOWLEDGE", C::ack, P::only, ext::aeth, false},
    {0xB2, "XRC_ATOMIC_ACKNOWLEDGE", C::atomic_ack, P::only, ext::aeth | ext::atomic_ack_eth, false},
    {0xB3, "XRC_COMPARE_SWAP", C::atomic, P::only, ext::xrceth | ext::atomic_eth, false},
    {0xB4, "XRC_FETCH_ADD", C::atomic, P::only, ext::xrceth | ext::atomic_eth, false},
    {0xB6, "XRC_SEND_LAST_WITH_INVALIDATE", C::send, P::last, ext::xrceth | ext::ieth, true},
    {0xB7, "XRC_SEND_ONLY_WITH_INVALIDATE", C::send, P::only, ext::xrceth | ext::ieth, true},
    // RoCEv2 CNP (IBTA A17.9.3): BTH (BECN set) + 16 reserved bytes; decode only.
    {0x81, "CNP", C::cnp, P::only, ext::cnp_reserved, false, false},
};

constexpr Transport transport_of(std::uint8_t opcode) noexcept {
  switch (opcode >> 5) {
    case 0: return Transport::rc;
    case 1: return Transport::uc;
    case 3: return Transport::ud;
    case 4: return Transport::cnp;
    case 5: return Transport::xrc;
    default: return Transport::none;
  }
}

constexpr std::size_t ext_headers_len(std::uint16_t headers) noexcept {
  std::size_t len = 0;
  for (unsigned i = 0; i < ext::kCount; ++i) {
    const auto bit = static_cast<std::uint16_t>(1u << i);
    if (headers & bit) len += ext_header_size(bit);
  }
  return len;
}

constexpr std::array<OpcodeInfo, 256> make_opcode_table() noexcept {
  std::array<OpcodeInfo, 256> t{};
  for (std::size_t i = 0; i < t.size(); ++i) {
    t[i].name = "INVALID";
    t[i].opcode = static_cast<std::uint8_t>(i);
  }
  for (const OpcodeRow& r : kOpcodeRows) {
    OpcodeInfo& e = t[r.opcode];
    e.name = r.name;
    e.valid = true;
    e.supported = r.supported;
    e.transport = transport_of(r.opcode);
    e.op_class = r.op_class;
    e.position = r.position;
    e.headers = r.headers;
    e.header_len = static_cast<std::uint8_t>(Bth::kSize + ext_headers_len(r.headers));
    e.has_payload = r.has_payload;
    e.is_request = r.op_class == C::send || r.op_class == C::rdma_write ||
                   r.op_class == C::rdma_read_request || r.op_class == C::atomic ||
                   r.op_class == C::flush || r.op_class == C::atomic_write;
    e.needs_recv_wqe =
        r.op_class == C::send || (r.op_class == C::rdma_write && (r.headers & ext::imm) != 0);
  }
  return t;
}

inline constexpr std::array<OpcodeInfo, 256> kOpcodeTable = make_opcode_table();

// request_opcode's answers by transport, class, position and optional headers
// (none, ImmDt, IETH), built from the rows once: a requester asks for every
// packet it sends, and a walk over the rows cost a few percent of one.
inline constexpr std::size_t kTransports = 6, kOpClasses = 11, kPositions = 5, kExtras = 3;
constexpr int extra_index(std::uint16_t extra) noexcept {
  return extra == 0 ? 0 : extra == ext::imm ? 1 : extra == ext::ieth ? 2 : -1;
}
struct RequestOpcodes {
  std::uint8_t v[kTransports][kOpClasses][kPositions][kExtras];
};
constexpr RequestOpcodes make_request_opcodes() noexcept {
  RequestOpcodes t{};
  for (auto& a : t.v)
    for (auto& b : a)
      for (auto& c : b)
        for (auto& d : c) d = 0xFF;
  for (const OpcodeRow& r : kOpcodeRows) {
    const int x = extra_index(static_cast<std::uint16_t>(r.headers & (ext::imm | ext::ieth)));
    std::uint8_t& e = t.v[static_cast<std::size_t>(transport_of(r.opcode))][static_cast<std::size_t>(r.op_class)]
                         [static_cast<std::size_t>(r.position)][static_cast<std::size_t>(x)];
    if (e == 0xFF) e = r.opcode;  // the first row that matches, as a walk over the rows finds it
  }
  return t;
}
inline constexpr RequestOpcodes kRequestOpcodes = make_request_opcodes();

}  // namespace detail

constexpr const OpcodeInfo& opcode_info(std::uint8_t opcode) noexcept {
  return detail::kOpcodeTable[opcode];
}

constexpr bool answers_requester(std::uint8_t opcode) noexcept {
  const OpClass c = opcode_info(opcode).op_class;
  return c == OpClass::ack || c == OpClass::rdma_read_response || c == OpClass::atomic_ack;
}

constexpr std::size_t header_offset(const OpcodeInfo& info, std::uint16_t bit) noexcept {
  // Headers below `bit` come first on the wire.
  return Bth::kSize + detail::ext_headers_len(info.headers & static_cast<std::uint16_t>(bit - 1));
}

constexpr std::uint8_t request_opcode(Transport transport, OpClass op_class, Position position,
                                      std::uint16_t extra) noexcept {
  const int x = detail::extra_index(extra);
  const auto t = static_cast<std::size_t>(transport), c = static_cast<std::size_t>(op_class),
             p = static_cast<std::size_t>(position);
  if (x < 0 || t >= detail::kTransports || c >= detail::kOpClasses || p >= detail::kPositions) return 0xFF;
  return detail::kRequestOpcodes.v[t][c][p][static_cast<std::size_t>(x)];
}

constexpr bool next_opcode_valid(std::uint8_t prev, std::uint8_t cur) noexcept {
  const OpcodeInfo& c = opcode_info(cur);
  if (!c.valid || !c.is_request) return false;
  const OpcodeInfo& p = opcode_info(prev);
  if (p.valid && p.transport != c.transport) return false;
  const bool in_message =
      p.valid && p.is_request && (p.position == Position::first || p.position == Position::middle);
  const bool continues = c.position == Position::middle || c.position == Position::last;
  if (in_message) return continues && c.op_class == p.op_class;
  return !continues;
}

}  // namespace softverbs::wire

// RoCEv2 transport headers: the BTH and the extension transport headers of
// IBTA Vol1 ch.9 (layouts in docs/wire.md §1.2-1.3).
//
// Every header is a plain struct with host-order fields, plus encode/decode
// functions that read and write the big-endian wire bytes one by one (no
// reliance on struct layout, packing or aliasing). The byte spans have a fixed
// extent equal to the header size, so a caller cannot pass a short buffer.
//
// Encoders mask fields that are narrower on the wire (24-bit QPNs and PSNs,
// 2-bit pad count, 4-bit TVer) and write reserved bits as 0. Decoders ignore
// reserved bits, as IBTA asks of receivers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace softverbs::wire {

// ---------------------------------------------------------------------------
// Interface
// ---------------------------------------------------------------------------

inline constexpr std::uint16_t kRoceV2UdpPort = 4791;  // IANA, ROCE_V2_UDP_DPORT
inline constexpr std::uint16_t kDefaultPkey = 0xFFFF;  // full-member default partition
inline constexpr std::uint32_t kQpnMask = 0x00FF'FFFFu;
inline constexpr std::uint32_t kMulticastQpn = 0x00FF'FFFFu;
inline constexpr std::size_t kIcrcBytes = 4;

// Base Transport Header, 12 bytes.
struct Bth {
  static constexpr std::size_t kSize = 12;
  std::uint8_t opcode = 0;
  bool se = false;           // solicited event
  bool migreq = false;       // path migration state
  std::uint8_t pad_cnt = 0;  // 0..3 pad bytes after the payload
  std::uint8_t tver = 0;     // transport header version, always 0
  std::uint16_t pkey = kDefaultPkey;
  bool fecn = false;  // RoCEv2 reuses two bits of IB resv8a for ECN
  bool becn = false;
  std::uint32_t dest_qp = 0;  // 24 bits
  bool ack_req = false;
  std::uint32_t psn = 0;  // 24 bits
  friend bool operator==(const Bth&, const Bth&) = default;
};

// Datagram Extended Transport Header (UD), 8 bytes.
struct Deth {
  static constexpr std::size_t kSize = 8;
  std::uint32_t qkey = 0;
  std::uint32_t src_qp = 0;  // 24 bits
  friend bool operator==(const Deth&, const Deth&) = default;
};

// XRC Extended Transport Header (IBTA 9.5), 4 bytes: the SRQ at the target
// that an XRC request is for.
struct Xrceth {
  static constexpr std::size_t kSize = 4;
  std::uint32_t srqn = 0;  // 24 bits
  friend bool operator==(const Xrceth&, const Xrceth&) = default;
};

// RDMA Extended Transport Header, 16 bytes. On WRITE FIRST/ONLY dma_len is the
// length of the whole message, not of this packet.
struct Reth {
  static constexpr std::size_t kSize = 16;
  std::uint64_t va = 0;
  std::uint32_t rkey = 0;
  std::uint32_t dma_len = 0;
  friend bool operator==(const Reth&, const Reth&) = default;
};

// NAK syndromes (AETH syndrome with type bits 11, IBTA Vol1 ch.9 AETH table).
enum class NakCode : std::uint8_t {
  psn_sequence_error = 0x60,
  invalid_request = 0x61,
  remote_access_error = 0x62,
  remote_operational_error = 0x63,
  invalid_rd_request = 0x64,
};

// ACK Extended Transport Header, 4 bytes. The syndrome is bit7 reserved,
// bits 6..5 type (00 ACK, 01 RNR NAK, 10 reserved, 11 NAK), bits 4..0 a credit
// count code (ACK), an RNR timer code (RNR NAK) or a NAK code (NAK).
struct Aeth {
  static constexpr std::size_t kSize = 4;
  static constexpr std::uint8_t kCreditInvalid = 0x1F;  // "no end-to-end credit"
  std::uint8_t syndrome = kCreditInvalid;
  std::uint32_t msn = 0;  // 24 bits

  static constexpr Aeth ack(std::uint32_t msn, std::uint8_t credit_code = kCreditInvalid) noexcept {
    return {static_cast<std::uint8_t>(credit_code & 0x1F), msn};
  }
  static constexpr Aeth rnr_nak(std::uint32_t msn, std::uint8_t timer_code) noexcept {
    return {static_cast<std::uint8_t>(0x20 | (timer_code & 0x1F)), msn};
  }
  static constexpr Aeth nak(std::uint32_t msn, NakCode code) noexcept {
    return {static_cast<std::uint8_t>(code), msn};
  }

  constexpr std::uint8_t type() const noexcept { return (syndrome >> 5) & 0x3; }
  constexpr bool is_ack() const noexcept { return type() == 0; }
  constexpr bool is_rnr_nak() const noexcept { return type() == 1; }
  constexpr bool is_nak() const noexcept { return type() == 3; }
  // Meaningful only for is_nak(); codes above 0x64 are reserved.
  constexpr NakCode nak_code() const noexcept { return static_cast<NakCode>(syndrome & 0x7F); }
  // Meaningful only for is_rnr_nak(): the 5-bit RNR NAK timer code.
  constexpr std::uint8_t rnr_timer() const noexcept { return syndrome & 0x1F; }
  // Meaningful only for is_ack(): the 5-bit credit count code.
  constexpr std::uint8_t credit_code() const noexcept { return syndrome & 0x1F; }
  friend bool operator==(const Aeth&, const Aeth&) = default;
};

// IBTA "Encoding for RNR NAK Timer Field": the minimum wait for a timer code,
// in microseconds (code 0 is the longest, 655.36 ms).
constexpr std::uint32_t rnr_timer_us(std::uint8_t timer_code) noexcept;

// IBTA AETH credit count encoding; code 0x1F (invalid) returns UINT32_MAX.
constexpr std::uint32_t credit_count(std::uint8_t credit_code) noexcept;

// Atomic Extended Transport Header, 28 bytes, not 8-aligned on the wire.
// FETCH_ADD carries the add operand in swap_add and ignores compare.
struct AtomicEth {
  static constexpr std::size_t kSize = 28;
  std::uint64_t va = 0;
  std::uint32_t rkey = 0;
  std::uint64_t swap_add = 0;
  std::uint64_t compare = 0;
  friend bool operator==(const AtomicEth&, const AtomicEth&) = default;
};

// Atomic Acknowledge Extended Transport Header, 8 bytes.
struct AtomicAckEth {
  static constexpr std::size_t kSize = 8;
  std::uint64_t orig = 0;  // remote data before the atomic
  friend bool operator==(const AtomicAckEth&, const AtomicAckEth&) = default;
};

// Immediate data, 4 bytes. The value is opaque to the transport and is kept
// exactly as it appears on the wire: its in-memory bytes are the wire bytes.
// That is the convention of the verbs API, whose ibv_send_wr::imm_data and
// ibv_wc::imm_data are already big-endian (__be32), so they are copied to and
// from `data` without any byte swap.
struct Imm {
  static constexpr std::size_t kSize = 4;
  std::uint32_t data = 0;  // network byte order in memory
  friend bool operator==(const Imm&, const Imm&) = default;
};

// Invalidate Extended Transport Header, 4 bytes.
struct Ieth {
  static constexpr std::size_t kSize = 4;
  std::uint32_t rkey = 0;  // host order, like ibv_wc::invalidated_rkey
  friend bool operator==(const Ieth&, const Ieth&) = default;
};

// FLUSH and CNP headers are only sized, never decoded (see opcode.hpp).
inline constexpr std::size_t kFethBytes = 4;
inline constexpr std::size_t kCnpReservedBytes = 16;

template <class H>
using HeaderBytes = std::span<std::uint8_t, H::kSize>;
template <class H>
using ConstHeaderBytes = std::span<const std::uint8_t, H::kSize>;

inline void encode(const Bth& h, HeaderBytes<Bth> out) noexcept;
inline void encode(const Deth& h, HeaderBytes<Deth> out) noexcept;
inline void encode(const Reth& h, HeaderBytes<Reth> out) noexcept;
inline void encode(const Aeth& h, HeaderBytes<Aeth> out) noexcept;
inline void encode(const AtomicEth& h, HeaderBytes<AtomicEth> out) noexcept;
inline void encode(const AtomicAckEth& h, HeaderBytes<AtomicAckEth> out) noexcept;
inline void encode(const Imm& h, HeaderBytes<Imm> out) noexcept;
inline void encode(const Ieth& h, HeaderBytes<Ieth> out) noexcept;

inline Bth decode_bth(ConstHeaderBytes<Bth> in) noexcept;
inline Deth decode_deth(ConstHeaderBytes<Deth> in) noexcept;
inline Reth decode_reth(ConstHeaderBytes<Reth> in) noexcept;
inline Aeth decode_aeth(ConstHeaderBytes<Aeth> in) noexcept;
inline AtomicEth decode_atomic_eth(ConstHeaderBytes<AtomicEth> in) noexcept;
inline AtomicAckEth decode_atomic_ack_eth(ConstHeaderBytes<AtomicAckEth> in) noexcept;
inline Imm decode_imm(ConstHeaderBytes<Imm> in) noexcept;
inline Ieth decode_ieth(ConstHeaderBytes<Ieth> in) noexcept;

// Big-endian field access on raw bytes; the caller guarantees the size.
constexpr std::uint16_t load_be16(const std::uint8_t* p) noexcept;
constexpr std::uint32_t load_be24(const std::uint8_t* p) noexcept;
constexpr std::uint32_t load_be32(const std::uint8_t* p) noexcept;
constexpr std::uint64_t load_be64(const std::uint8_t* p) noexcept;
constexpr void store_be16(std::uint8_t* p, std::uint16_t v) noexcept;
constexpr void store_be24(std::uint8_t* p, std::uint32_t v) noexcept;
constexpr void store_be32(std::uint8_t* p, std::uint32_t v) noexcept;
constexpr void store_be64(std::uint8_t* p, std::uint64_t v) noexcept;

// ---------------------------------------------------------------------------
// Implementation
// ---------------------------------------------------------------------------

constexpr std::uint32_t rnr_timer_us(std::uint8_t timer_code) noexcept {
  constexpr std::array<std::uint32_t, 32> kTable = {
      655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
      480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return kTable[timer_code & 0x1F];
}

constexpr std::uint32_t credit_count(std::uint8_t credit_code) noexcept {
  constexpr std::array<std::uint32_t, 32> kTable = {
      0,    1,    2,    3,    4,    6,     8,     12,    16,    24,          32,
      48,   64,   96,   128,  192,  256,   384,   512,   768,   1024,        1536,
      2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 0xFFFF'FFFFu};
  return kTable[credit_code & 0x1F];
}

constexpr std::uint16_t load_be16(const std::uint8_t* p) noexcept {
  return static_cast<std::uint16_t>((p[0] << 8) | p[1]);
}
constexpr std::uint32_t load_be24(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 16) | (std::uint32_t{p[1]} << 8) | p[2];
}
constexpr std::uint32_t load_be32(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         p[3];
}
constexpr std::uint64_t load_be64(const std::uint8_t* p) noexcept {
  return (std::uint64_t{load_be32(p)} << 32) | load_be32(p + 4);
}
constexpr void store_be16(std::uint8_t* p, std::uint16_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v >> 8);
  p[1] = static_cast<std::uint8_t>(v);
}
constexpr void store_be24(std::uint8_t* p, std::uint32_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v >> 16);
  p[1] = static_cast<std::uint8_t>(v >> 8);
  p[2] = static_cast<std::uint8_t>(v);
}
constexpr void store_be32(std::uint8_t* p, std::uint32_t v) noexcept {
  p[0] = static_cast<std::uint8_t>(v >> 24);
  p[1] = static_cast<std::uint8_t>(v >> 16);
  p[2] = static_cast<std::uint8_t>(v >> 8);
  p[3] = static_cast<std::uint8_t>(v);
}
constexpr void store_be64(std::uint8_t* p, std::uint64_t v) noexcept {
  store_be32(p, static_cast<std::uint32_t>(v >> 32));
  store_be32(p + 4, static_cast<std::uint32_t>(v));
}

// Bytes 0-11: OpCode | SE M PadCnt(2) TVer(4) | P_Key(16) | FECN BECN resv6 |
// DestQP(24) | AckReq resv7 | PSN(24).
inline void encode(const Bth& h, HeaderBytes<Bth> out) noexcept {
  std::uint8_t* p = out.data();
  p[0] = h.opcode;
  p[1] = static_cast<std::uint8_t>((h.se ? 0x80 : 0) | (h.migreq ? 0x40 : 0) |
                                   ((h.pad_cnt & 0x3) << 4) | (h.tver & 0xF));
  store_be16(p + 2, h.pkey);
  p[4] = static_cast<std::uint8_t>((h.fecn ? 0x80 : 0) | (h.becn ? 0x40 : 0));
  store_be24(p + 5, h.dest_qp);
  p[8] = h.ack_req ? 0x80 : 0;
  store_be24(p + 9, h.psn);
}

inline Bth decode_bth(ConstHeaderBytes<Bth> in) noexcept {
  const std::uint8_t* p = in.data();
  Bth h;
  h.opcode = p[0];
  h.se = (p[1] & 0x80) != 0;
  h.migreq = (p[1] & 0x40) != 0;
  h.pad_cnt = (p[1] >> 4) & 0x3;
  h.tver = p[1] & 0xF;
  h.pkey = load_be16(p + 2);
  h.fecn = (p[4] & 0x80) != 0;
  h.becn = (p[4] & 0x40) != 0;
  h.dest_qp = load_be24(p + 5);
  h.ack_req = (p[8] & 0x80) != 0;
  h.psn = load_be24(p + 9);
  return h;
}

// Q_Key(32) | resv8 | SrcQP(24).
inline void encode(const Deth& h, HeaderBytes<Deth> out) noexcept {
  store_be32(out.data(), h.qkey);
  out[4] = 0;
  store_be24(out.data() + 5, h.src_qp);
}
inline Deth decode_deth(ConstHeaderBytes<Deth> in) noexcept {
  return {load_be32(in.data()), load_be24(in.data() + 5)};
}

// resv8 | XRCSRQ(24).
inline void encode(const Xrceth& h, HeaderBytes<Xrceth> out) noexcept {
  out[0] = 0;
  store_be24(out.data() + 1, h.srqn);
}
inline Xrceth decode_xrceth(ConstHeaderBytes<Xrceth> in) noexcept { return {load_be24(in.data() + 1)}; }

// VA(64) | R_Key(32) | DMA Length(32).
inline void encode(const Reth& h, HeaderBytes<Reth> out) noexcept {
  store_be64(out.data(), h.va);
  store_be32(out.data() + 8, h.rkey);
  store_be32(out.data() + 12, h.dma_len);
}
inline Reth decode_reth(ConstHeaderBytes<Reth> in) noexcept {
  return {load_be64(in.data()), load_be32(in.data() + 8), load_be32(in.data() + 12)};
}

// Syndrome(8) | MSN(24).
inline void encode(const Aeth& h, HeaderBytes<Aeth> out) noexcept {
  out[0] = h.syndrome;
  store_be24(out.data() + 1, h.msn);
}
inline Aeth decode_aeth(ConstHeaderBytes<Aeth> in) noexcept {
  return {in[0], load_be24(in.data() + 1)};
}

// VA(64) | R_Key(32) | Swap-or-Add(64) | Compare(64).
inline void encode(const AtomicEth& h, HeaderBytes<AtomicEth> out) noexcept {
  store_be64(out.data(), h.va);
  store_be32(out.data() + 8, h.rkey);
  store_be64(out.data() + 12, h.swap_add);
  store_be64(out.data() + 20, h.compare);
}
inline AtomicEth decode_atomic_eth(ConstHeaderBytes<AtomicEth> in) noexcept {
  return {load_be64(in.data()), load_be32(in.data() + 8), load_be64(in.data() + 12),
          load_be64(in.data() + 20)};
}

inline void encode(const AtomicAckEth& h, HeaderBytes<AtomicAckEth> out) noexcept {
  store_be64(out.data(), h.orig);
}
inline AtomicAckEth decode_atomic_ack_eth(ConstHeaderBytes<AtomicAckEth> in) noexcept {
  return {load_be64(in.data())};
}

// Opaque: copy the bytes, never swap them.
inline void encode(const Imm& h, HeaderBytes<Imm> out) noexcept {
  std::memcpy(out.data(), &h.data, Imm::kSize);
}
inline Imm decode_imm(ConstHeaderBytes<Imm> in) noexcept {
  Imm h;
  std::memcpy(&h.data, in.data(), Imm::kSize);
  return h;
}

inline void encode(const Ieth& h, HeaderBytes<Ieth> out) noexcept {
  store_be32(out.data(), h.rkey);
}
inline Ieth decode_ieth(ConstHeaderBytes<Ieth> in) noexcept { return {load_be32(in.data())}; }

}  // namespace softverbs::wire

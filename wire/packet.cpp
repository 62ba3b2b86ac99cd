#include "wire/packet.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace softverbs::wire {
namespace {

template <class H>
ConstHeaderBytes<H> at(std::span<const std::uint8_t> pkt, const OpcodeInfo& op, std::uint16_t bit) noexcept {
  return pkt.subspan(header_offset(op, bit)).first<H::kSize>();
}

template <class H>
HeaderBytes<H> at(std::span<std::uint8_t> pkt, const OpcodeInfo& op, std::uint16_t bit) noexcept {
  return pkt.subspan(header_offset(op, bit)).first<H::kSize>();
}

void decode_extensions(std::span<const std::uint8_t> pkt, const OpcodeInfo& op, PacketView& v) noexcept;

// Body of parse() after the optional ICRC check. `pkt` is at least BTH + ICRC.
ParseError parse_headers(std::span<const std::uint8_t> pkt, PacketView& v) noexcept {
  const OpcodeInfo& op = *v.op;
  if (v.bth.tver != 0) return ParseError::bad_tver;
  if (!op.valid) return ParseError::unknown_opcode;
  if (!op.supported) return ParseError::unsupported_opcode;
  if (pkt.size() < op.header_len + kIcrcBytes) return ParseError::truncated_headers;

  // Payload + pad; the ICRC is the last 4 bytes.
  const std::size_t body = pkt.size() - op.header_len - kIcrcBytes;
  if (!op.has_payload && body != 0) return ParseError::unexpected_payload;
  if (v.bth.pad_cnt > body) return ParseError::pad_exceeds_payload;

  decode_extensions(pkt, op, v);
  v.payload = pkt.subspan(op.header_len, body - v.bth.pad_cnt);
  return ParseError::ok;
}

// The extension headers op carries, from `pkt`, which starts at the BTH and
// holds at least op.header_len bytes.
void decode_extensions(std::span<const std::uint8_t> pkt, const OpcodeInfo& op, PacketView& v) noexcept {
  if (op.has(ext::deth)) v.deth = decode_deth(at<Deth>(pkt, op, ext::deth));
  if (op.has(ext::xrceth)) v.xrceth = decode_xrceth(at<Xrceth>(pkt, op, ext::xrceth));
  if (op.has(ext::reth)) v.reth = decode_reth(at<Reth>(pkt, op, ext::reth));
  if (op.has(ext::atomic_eth)) {
    v.atomic_eth = decode_atomic_eth(at<AtomicEth>(pkt, op, ext::atomic_eth));
  }
  if (op.has(ext::aeth)) v.aeth = decode_aeth(at<Aeth>(pkt, op, ext::aeth));
  if (op.has(ext::atomic_ack_eth)) {
    v.atomic_ack_eth = decode_atomic_ack_eth(at<AtomicAckEth>(pkt, op, ext::atomic_ack_eth));
  }
  if (op.has(ext::imm)) v.imm = decode_imm(at<Imm>(pkt, op, ext::imm));
  if (op.has(ext::ieth)) v.ieth = decode_ieth(at<Ieth>(pkt, op, ext::ieth));
}

ParseError parse_impl(std::span<const std::uint8_t> pkt, PacketView& v, const IcrcFlow* verify) noexcept {
  v = PacketView{};
  if (pkt.size() < Bth::kSize + kIcrcBytes) return ParseError::too_short;
  v.bth = decode_bth(pkt.first<Bth::kSize>());
  v.op = &opcode_info(v.bth.opcode);
  const std::size_t icrc_at = pkt.size() - kIcrcBytes;
  v.icrc = load_icrc(pkt.data() + icrc_at);
  // Verify first: header errors in a corrupted packet are not the sender's.
  if (verify != nullptr && icrc(*verify, pkt.first(icrc_at)) != v.icrc) {
    // A sender whose kernel numbers its IPv4 packets (rxe does) computed the ICRC
    // over an ID this receiver cannot see: accept the packet if some ID makes
    // its ICRC hold.
    const auto* v4 = std::get_if<Ipv4Flow>(verify);
    if (v4 == nullptr || v4->id != 0 || !solve_ipv4_id(*v4, pkt.first(icrc_at), v.icrc))
      return ParseError::icrc_mismatch;
  }
  return parse_headers(pkt, v);
}

}  // namespace

std::string_view to_string(ParseError e) noexcept {
  switch (e) {
    case ParseError::ok:
      return "ok";
    case ParseError::too_short:
      return "too_short";
    case ParseError::icrc_mismatch:
      return "icrc_mismatch";
    case ParseError::bad_tver:
      return "bad_tver";
    case ParseError::unknown_opcode:
      return "unknown_opcode";
    case ParseError::unsupported_opcode:
      return "unsupported_opcode";
    case ParseError::truncated_headers:
      return "truncated_headers";
    case ParseError::unexpected_payload:
      return "unexpected_payload";
    case ParseError::pad_exceeds_payload:
      return "pad_exceeds_payload";
  }
  return "?";
}

ParseError parse(std::span<const std::uint8_t> udp_payload, PacketView& out) noexcept {
  return parse_impl(udp_payload, out, nullptr);
}

ParseError parse(std::span<const std::uint8_t> udp_payload, PacketView& out, const IcrcFlow& verify) noexcept {
  return parse_impl(udp_payload, out, &verify);
}

namespace {

// The payload's length, or SIZE_MAX past what any packet carries.
std::size_t payload_length(std::span<const std::span<const std::uint8_t>> payload) noexcept {
  std::size_t len = 0;
  for (const auto& s : payload) {
    if (s.size() > kMaxUdpPayload - len) return SIZE_MAX;
    len += s.size();
  }
  return len;
}

// BTH and the extension headers of h's opcode into `hdr` (op.header_len
// bytes), with the pad count of a payload_len-byte payload.
void encode_headers(const PacketHeaders& h, const OpcodeInfo& op, std::size_t payload_len,
                    std::span<std::uint8_t> hdr) noexcept {
  // IBTA: PadCnt pads the payload to a multiple of 4 bytes.
  Bth bth = h.bth;
  bth.pad_cnt = static_cast<std::uint8_t>((4 - payload_len % 4) % 4);
  encode(bth, hdr.first<Bth::kSize>());
  if (op.has(ext::deth)) encode(h.deth, at<Deth>(hdr, op, ext::deth));
  if (op.has(ext::xrceth)) encode(h.xrceth, at<Xrceth>(hdr, op, ext::xrceth));
  if (op.has(ext::reth)) encode(h.reth, at<Reth>(hdr, op, ext::reth));
  if (op.has(ext::atomic_eth)) encode(h.atomic_eth, at<AtomicEth>(hdr, op, ext::atomic_eth));
  if (op.has(ext::aeth)) encode(h.aeth, at<Aeth>(hdr, op, ext::aeth));
  if (op.has(ext::atomic_ack_eth)) {
    encode(h.atomic_ack_eth, at<AtomicAckEth>(hdr, op, ext::atomic_ack_eth));
  }
  if (op.has(ext::imm)) encode(h.imm, at<Imm>(hdr, op, ext::imm));
  if (op.has(ext::ieth)) encode(h.ieth, at<Ieth>(hdr, op, ext::ieth));
}

// What follows the payload of a packet without its ICRC: up to 3 pad bytes
// and the 4-byte ICRC field, all 0.
constexpr std::uint8_t kZeroTail[3 + kIcrcBytes] = {};

}  // namespace

std::size_t build(const PacketHeaders& h, std::span<const std::span<const std::uint8_t>> payload,
                  std::span<std::uint8_t> out, const IcrcFlow* flow) noexcept {
  const std::size_t payload_len = payload_length(payload);
  if (payload_len == SIZE_MAX) return 0;
  const std::size_t size = packet_size(h.bth.opcode, payload_len);
  if (size == 0 || out.size() < size) return 0;
  const OpcodeInfo& op = opcode_info(h.bth.opcode);
  const auto pkt = out.first(size);
  encode_headers(h, op, payload_len, pkt);
  const std::uint8_t pad_cnt = static_cast<std::uint8_t>((4 - payload_len % 4) % 4);

  std::uint8_t* p = pkt.data() + op.header_len;
  for (const auto& s : payload) {
    if (!s.empty()) std::memcpy(p, s.data(), s.size());  // memcpy(null, ..., 0) is UB
    p += s.size();
  }
  std::fill_n(p, pad_cnt, std::uint8_t{0});  // pad bytes are 0 and covered by the ICRC
  p += pad_cnt;

  const std::size_t icrc_at = size - kIcrcBytes;
  store_icrc(p, flow != nullptr ? icrc(*flow, pkt.first(icrc_at)) : 0);
  return size;
}

bool gather(const PacketHeaders& h, std::span<const std::span<const std::uint8_t>> payload,
            std::span<std::uint8_t, kMaxHeaderBytes> header_room, GatheredPacket& out) noexcept {
  const std::size_t payload_len = payload_length(payload);
  if (payload_len == SIZE_MAX) return false;
  const std::size_t size = packet_size(h.bth.opcode, payload_len);
  if (size == 0) return false;
  const OpcodeInfo& op = opcode_info(h.bth.opcode);
  const auto hdr = std::span<std::uint8_t>(header_room).first(op.header_len);
  encode_headers(h, op, payload_len, hdr);
  out.headers = hdr;
  out.payload = payload;
  out.tail = std::span<const std::uint8_t>(kZeroTail).first(size - op.header_len - payload_len);
  out.size = size;
  return true;
}

bool parse_gathered(const GatheredPacket& packet, PacketView& out) noexcept {
  out = PacketView{};
  if (packet.headers.size() < Bth::kSize) return false;
  out.bth = decode_bth(packet.headers.first<Bth::kSize>());
  out.op = &opcode_info(out.bth.opcode);
  if (!out.op->supported || packet.headers.size() != out.op->header_len) return false;
  decode_extensions(packet.headers, *out.op, out);
  if (packet.payload.size() == 1) out.payload = packet.payload[0];
  return true;
}

std::size_t build(const PacketHeaders& h, std::span<const std::uint8_t> payload, std::span<std::uint8_t> out,
                  const IcrcFlow* flow) noexcept {
  const std::span<const std::uint8_t> one[1] = {payload};
  return build(h, std::span<const std::span<const std::uint8_t>>(one), out, flow);
}

}  // namespace softverbs::wire

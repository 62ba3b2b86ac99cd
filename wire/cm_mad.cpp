// The IB CM MAD codec (wire/cm_mad.hpp; layouts in docs/wire.md §4). Every
// message is written and read field by field at the byte and bit positions of
// IBTA Vol1 ch.12: Table 106 (REQ), 107 (MRA), 108 (REJ), 110 (REP), 111 (RTU),
// 112 (DREQ), 113 (DREP) and the SIDR_REQ/SIDR_REP tables. "Byte N, top k bits"
// follows the tables' Byte[Bit] notation, bit 7 being the most significant.
// Offsets below are from the start of the 232-byte MAD data area.
#include "wire/cm_mad.hpp"

#include <algorithm>
#include <type_traits>
#include <variant>

#include "wire/headers.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::wire::cm {
namespace {

// Narrow-field masks and the bit positions inside their byte.
constexpr std::uint8_t top(std::uint8_t v, int bits) noexcept {
  return static_cast<std::uint8_t>((v & ((1u << bits) - 1)) << (8 - bits));
}
constexpr std::uint8_t get_top(std::uint8_t byte, int bits) noexcept {
  return static_cast<std::uint8_t>(byte >> (8 - bits));
}

template <std::size_t N>
void put_bytes(std::uint8_t* d, const std::array<std::uint8_t, N>& a) noexcept {
  std::copy(a.begin(), a.end(), d);
}
template <std::size_t N>
void get_bytes(const std::uint8_t* d, std::array<std::uint8_t, N>& a) noexcept {
  std::copy(d, d + N, a.begin());
}

// ---- REQ (Table 106) -------------------------------------------------------

constexpr std::size_t kReqPrimary = 52;
constexpr std::size_t kReqAlternate = 96;
constexpr std::size_t kReqPrivateAt = 140;

// A path: local/remote LID (0-3), local/remote GID (4-35), FlowLabel in the top
// 20 bits of 36-39 with PacketRate in the low 6 bits of byte 39, TrafficClass
// 40, HopLimit 41, SL top 4 of 42 + SubnetLocal bit 3, LocalAckTimeout top 5
// of 43. The alternate path's bit 2 of byte 43 (SAP supported) is written 0.
void encode_path(const ReqPath& p, std::uint8_t* d) noexcept {
  store_be16(d + 0, p.local_lid);
  store_be16(d + 2, p.remote_lid);
  put_bytes(d + 4, p.local_gid);
  put_bytes(d + 20, p.remote_gid);
  store_be32(d + 36, ((p.flow_label & 0xFFFFFu) << 12) | (p.packet_rate & 0x3Fu));
  d[40] = p.traffic_class;
  d[41] = p.hop_limit;
  d[42] = static_cast<std::uint8_t>(top(p.sl, 4) | (p.subnet_local ? 0x08 : 0));
  d[43] = top(p.local_ack_timeout, 5);
}

ReqPath decode_path(const std::uint8_t* d) noexcept {
  ReqPath p;
  p.local_lid = load_be16(d + 0);
  p.remote_lid = load_be16(d + 2);
  get_bytes(d + 4, p.local_gid);
  get_bytes(d + 20, p.remote_gid);
  const std::uint32_t w = load_be32(d + 36);
  p.flow_label = w >> 12;
  p.packet_rate = static_cast<std::uint8_t>(w & 0x3F);
  p.traffic_class = d[40];
  p.hop_limit = d[41];
  p.sl = get_top(d[42], 4);
  p.subnet_local = (d[42] & 0x08) != 0;
  p.local_ack_timeout = get_top(d[43], 5);
  return p;
}

void encode_req(const Req& m, std::uint8_t* d) noexcept {
  store_be32(d + 0, m.local_comm_id);
  store_be24(d + 5, m.vendor_id);  // byte 4 reserved
  store_be64(d + 8, m.service_id);
  store_be64(d + 16, m.local_ca_guid);
  store_be32(d + 28, m.local_qkey);  // 24-27 reserved
  store_be24(d + 32, m.local_qpn);
  d[35] = m.responder_resources;
  store_be24(d + 36, m.local_eecn);
  d[39] = m.initiator_depth;
  store_be24(d + 40, m.remote_eecn);
  d[43] = static_cast<std::uint8_t>(top(m.remote_cm_response_timeout, 5) |
                                    ((static_cast<unsigned>(m.transport) & 0x3) << 1) |
                                    (m.end_to_end_flow_control ? 0x01 : 0));
  store_be24(d + 44, m.starting_psn);
  d[47] = static_cast<std::uint8_t>(top(m.local_cm_response_timeout, 5) | (m.retry_count & 0x7));
  store_be16(d + 48, m.pkey);
  d[50] = static_cast<std::uint8_t>(top(m.path_mtu, 4) | (m.rdc_exists ? 0x08 : 0) | (m.rnr_retry_count & 0x7));
  d[51] = static_cast<std::uint8_t>(top(m.max_cm_retries, 4) | (m.srq ? 0x08 : 0) | (m.extended_transport & 0x7));
  encode_path(m.primary, d + kReqPrimary);
  encode_path(m.alternate, d + kReqAlternate);
  put_bytes(d + kReqPrivateAt, m.private_data);
}

Req decode_req(const std::uint8_t* d) noexcept {
  Req m;
  m.local_comm_id = load_be32(d + 0);
  m.vendor_id = load_be24(d + 5);
  m.service_id = load_be64(d + 8);
  m.local_ca_guid = load_be64(d + 16);
  m.local_qkey = load_be32(d + 28);
  m.local_qpn = load_be24(d + 32);
  m.responder_resources = d[35];
  m.local_eecn = load_be24(d + 36);
  m.initiator_depth = d[39];
  m.remote_eecn = load_be24(d + 40);
  m.remote_cm_response_timeout = get_top(d[43], 5);
  m.transport = static_cast<Transport>((d[43] >> 1) & 0x3);
  m.end_to_end_flow_control = (d[43] & 0x01) != 0;
  m.starting_psn = load_be24(d + 44);
  m.local_cm_response_timeout = get_top(d[47], 5);
  m.retry_count = d[47] & 0x7;
  m.pkey = load_be16(d + 48);
  m.path_mtu = get_top(d[50], 4);
  m.rdc_exists = (d[50] & 0x08) != 0;
  m.rnr_retry_count = d[50] & 0x7;
  m.max_cm_retries = get_top(d[51], 4);
  m.srq = (d[51] & 0x08) != 0;
  m.extended_transport = d[51] & 0x7;
  m.primary = decode_path(d + kReqPrimary);
  m.alternate = decode_path(d + kReqAlternate);
  get_bytes(d + kReqPrivateAt, m.private_data);
  return m;
}

// ---- MRA (Table 107) and REJ (Table 108) -------------------------------------

void encode_mra(const Mra& m, std::uint8_t* d) noexcept {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  d[8] = top(static_cast<std::uint8_t>(m.message_mraed), 2);
  d[9] = top(m.service_timeout, 5);
  put_bytes(d + 10, m.private_data);
}

Mra decode_mra(const std::uint8_t* d) noexcept {
  Mra m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.message_mraed = static_cast<MsgKind>(get_top(d[8], 2));
  m.service_timeout = get_top(d[9], 5);
  get_bytes(d + 10, m.private_data);
  return m;
}

void encode_rej(const Rej& m, std::uint8_t* d) noexcept {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  d[8] = top(static_cast<std::uint8_t>(m.message_rejected), 2);
  d[9] = top(m.rejected_info_length, 7);
  store_be16(d + 10, static_cast<std::uint16_t>(m.reason));
  put_bytes(d + 12, m.ari);
  put_bytes(d + 84, m.private_data);
}

Rej decode_rej(const std::uint8_t* d) noexcept {
  Rej m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.message_rejected = static_cast<MsgKind>(get_top(d[8], 2));
  m.rejected_info_length = get_top(d[9], 7);
  m.reason = static_cast<RejReason>(load_be16(d + 10));
  get_bytes(d + 12, m.ari);
  get_bytes(d + 84, m.private_data);
  return m;
}

// ---- REP (Table 110) ---------------------------------------------------------

// The 24-bit VendorID sits in the low bytes of the three words whose top 24
// bits are LocalQPN, LocalEECN and StartingPSN: bits 23-16 at 15, 15-8 at 19,
// 7-0 at 23.
void encode_rep(const Rep& m, std::uint8_t* d) noexcept {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
  store_be32(d + 8, m.local_qkey);
  store_be24(d + 12, m.local_qpn);
  d[15] = static_cast<std::uint8_t>(m.vendor_id >> 16);
  store_be24(d + 16, m.local_eecn);
  d[19] = static_cast<std::uint8_t>(m.vendor_id >> 8);
  store_be24(d + 20, m.starting_psn);
  d[23] = static_cast<std::uint8_t>(m.vendor_id);
  d[24] = m.responder_resources;
  d[25] = m.initiator_depth;
  d[26] = static_cast<std::uint8_t>(top(m.target_ack_delay, 5) | ((m.failover_accepted & 0x3) << 1) |
                                    (m.end_to_end_flow_control ? 0x01 : 0));
  d[27] = static_cast<std::uint8_t>(top(m.rnr_retry_count, 3) | (m.srq ? 0x10 : 0));
  store_be64(d + 28, m.local_ca_guid);
  put_bytes(d + 36, m.private_data);
}

Rep decode_rep(const std::uint8_t* d) noexcept {
  Rep m;
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
  m.local_qkey = load_be32(d + 8);
  m.local_qpn = load_be24(d + 12);
  m.vendor_id = (std::uint32_t{d[15]} << 16) | (std::uint32_t{d[19]} << 8) | d[23];
  m.local_eecn = load_be24(d + 16);
  m.starting_psn = load_be24(d + 20);
  m.responder_resources = d[24];
  m.initiator_depth = d[25];
  m.target_ack_delay = get_top(d[26], 5);
  m.failover_accepted = (d[26] >> 1) & 0x3;
  m.end_to_end_flow_control = (d[26] & 0x01) != 0;
  m.rnr_retry_count = get_top(d[27], 3);
  m.srq = (d[27] & 0x10) != 0;
  m.local_ca_guid = load_be64(d + 28);
  get_bytes(d + 36, m.private_data);
  return m;
}

// ---- RTU, DREQ, DREP (Tables 111-113) ---------------------------------------

template <class M>
void encode_ids(const M& m, std::uint8_t* d) noexcept {
  store_be32(d + 0, m.local_comm_id);
  store_be32(d + 4, m.remote_comm_id);
}
template <class M>
void decode_ids(const std::uint8_t* d, M& m) noexcept {
  m.local_comm_id = load_be32(d + 0);
  m.remote_comm_id = load_be32(d + 4);
}

// ---- SIDR_REQ, SIDR_REP --------------------------------------------------------

void encode_sidr_req(const SidrReq& m, std::uint8_t* d) noexcept {
  store_be32(d + 0, m.request_id);
  store_be16(d + 4, m.pkey);  // 6-7 reserved
  store_be64(d + 8, m.service_id);
  put_bytes(d + 16, m.private_data);
}

SidrReq decode_sidr_req(const std::uint8_t* d) noexcept {
  SidrReq m;
  m.request_id = load_be32(d + 0);
  m.pkey = load_be16(d + 4);
  m.service_id = load_be64(d + 8);
  get_bytes(d + 16, m.private_data);
  return m;
}

void encode_sidr_rep(const SidrRep& m, std::uint8_t* d) noexcept {
  store_be32(d + 0, m.request_id);
  d[4] = static_cast<std::uint8_t>(m.status);
  d[5] = m.additional_info_length;  // 6-7 reserved
  store_be24(d + 8, m.qpn);         // 11 reserved
  store_be64(d + 12, m.service_id);
  store_be32(d + 20, m.qkey);
  put_bytes(d + 24, m.class_port_info);
  put_bytes(d + 96, m.private_data);
}

SidrRep decode_sidr_rep(const std::uint8_t* d) noexcept {
  SidrRep m;
  m.request_id = load_be32(d + 0);
  m.status = static_cast<SidrStatus>(d[4]);
  m.additional_info_length = d[5];
  m.qpn = load_be24(d + 8);
  m.service_id = load_be64(d + 12);
  m.qkey = load_be32(d + 20);
  get_bytes(d + 24, m.class_port_info);
  get_bytes(d + 96, m.private_data);
  return m;
}

// The message of an attribute, decoded from the data area; false for the
// attributes the codec does not carry.
bool decode_data(Attr a, const std::uint8_t* d, Message& msg) noexcept {
  switch (a) {
    case Attr::kReq:
      msg = decode_req(d);
      return true;
    case Attr::kMra:
      msg = decode_mra(d);
      return true;
    case Attr::kRej:
      msg = decode_rej(d);
      return true;
    case Attr::kRep:
      msg = decode_rep(d);
      return true;
    case Attr::kRtu: {
      Rtu m;
      decode_ids(d, m);
      get_bytes(d + 8, m.private_data);
      msg = m;
      return true;
    }
    case Attr::kDreq: {
      Dreq m;
      decode_ids(d, m);
      m.remote_qpn = load_be24(d + 8);
      get_bytes(d + 12, m.private_data);
      msg = m;
      return true;
    }
    case Attr::kDrep: {
      Drep m;
      decode_ids(d, m);
      get_bytes(d + 8, m.private_data);
      msg = m;
      return true;
    }
    case Attr::kSidrReq:
      msg = decode_sidr_req(d);
      return true;
    case Attr::kSidrRep:
      msg = decode_sidr_rep(d);
      return true;
    default:
      return false;
  }
}

// Overload set for std::visit in encode().
template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

}  // namespace

std::string_view to_string(Attr a) noexcept {
  switch (a) {
    case Attr::kClassPortInfo:
      return "ClassPortInfo";
    case Attr::kReq:
      return "REQ";
    case Attr::kMra:
      return "MRA";
    case Attr::kRej:
      return "REJ";
    case Attr::kRep:
      return "REP";
    case Attr::kRtu:
      return "RTU";
    case Attr::kDreq:
      return "DREQ";
    case Attr::kDrep:
      return "DREP";
    case Attr::kSidrReq:
      return "SIDR_REQ";
    case Attr::kSidrRep:
      return "SIDR_REP";
    case Attr::kLap:
      return "LAP";
    case Attr::kApr:
      return "APR";
  }
  return "?";
}

std::string_view to_string(MadError e) noexcept {
  switch (e) {
    case MadError::ok:
      return "ok";
    case MadError::too_short:
      return "too_short";
    case MadError::bad_base_version:
      return "bad_base_version";
    case MadError::not_cm_class:
      return "not_cm_class";
    case MadError::bad_class_version:
      return "bad_class_version";
    case MadError::bad_method:
      return "bad_method";
    case MadError::unknown_attribute:
      return "unknown_attribute";
  }
  return "?";
}

Attr attr_of(const Message& m) noexcept {
  // The variant's alternatives are in the order of their AttributeIDs 0x10-0x18.
  static_assert(std::variant_size_v<Message> == 9);
  static_assert(std::is_same_v<std::variant_alternative_t<0, Message>, Req> &&
                std::is_same_v<std::variant_alternative_t<3, Message>, Rep> &&
                std::is_same_v<std::variant_alternative_t<8, Message>, SidrRep>);
  return static_cast<Attr>(static_cast<std::uint16_t>(Attr::kReq) + m.index());
}

// MAD header (IBTA 13.4.3): BaseVersion 0, MgmtClass 1, ClassVersion 2,
// R|Method 3, Status 4-5, ClassSpecific 6-7, TransactionID 8-15,
// AttributeID 16-17, reserved 18-19, AttributeModifier 20-23.
void encode(const MadHeader& hdr, const Message& msg, std::span<std::uint8_t, kMadSize> out) noexcept {
  std::uint8_t* p = out.data();
  std::fill(out.begin(), out.end(), std::uint8_t{0});
  p[0] = hdr.base_version;
  p[1] = hdr.mgmt_class;
  p[2] = hdr.class_version;
  p[3] = hdr.method;
  store_be16(p + 4, hdr.status);
  store_be16(p + 6, hdr.class_specific);
  store_be64(p + 8, hdr.tid);
  store_be16(p + 16, static_cast<std::uint16_t>(attr_of(msg)));
  store_be32(p + 20, hdr.attr_mod);
  std::uint8_t* d = p + kMadHeaderSize;
  std::visit(Overloaded{
                 [d](const Req& m) { encode_req(m, d); },
                 [d](const Mra& m) { encode_mra(m, d); },
                 [d](const Rej& m) { encode_rej(m, d); },
                 [d](const Rep& m) { encode_rep(m, d); },
                 [d](const Rtu& m) {
                   encode_ids(m, d);
                   put_bytes(d + 8, m.private_data);
                 },
                 [d](const Dreq& m) {
                   encode_ids(m, d);
                   store_be24(d + 8, m.remote_qpn);
                   put_bytes(d + 12, m.private_data);
                 },
                 [d](const Drep& m) {
                   encode_ids(m, d);
                   put_bytes(d + 8, m.private_data);
                 },
                 [d](const SidrReq& m) { encode_sidr_req(m, d); },
                 [d](const SidrRep& m) { encode_sidr_rep(m, d); },
             },
             msg);
}

MadError decode(std::span<const std::uint8_t> mad, MadHeader& hdr, Message& msg) noexcept {
  if (mad.size() < kMadSize) return MadError::too_short;
  const std::uint8_t* p = mad.data();
  hdr.base_version = p[0];
  hdr.mgmt_class = p[1];
  hdr.class_version = p[2];
  hdr.method = p[3];
  hdr.status = load_be16(p + 4);
  hdr.class_specific = load_be16(p + 6);
  hdr.tid = load_be64(p + 8);
  hdr.attr_id = static_cast<Attr>(load_be16(p + 16));
  hdr.attr_mod = load_be32(p + 20);
  if (hdr.base_version != kBaseVersion) return MadError::bad_base_version;
  if (hdr.mgmt_class != kMgmtClassCm) return MadError::not_cm_class;
  if (hdr.class_version != kClassVersion) return MadError::bad_class_version;
  // The R bit (bit 7 of byte 3) marks a response; CM messages are all Sends.
  if (hdr.method != kMethodSend) return MadError::bad_method;
  if (!decode_data(hdr.attr_id, p + kMadHeaderSize, msg)) return MadError::unknown_attribute;
  return MadError::ok;
}

// rdma_cm's header (Annex A11 "IP Addressing CM Private Data Format"; rdma-core
// librdmacm/cma.h struct ib_connect_hdr): version 0, IP version in the top
// nibble of byte 1, source port 2-3, source address 4-19, destination 20-35.
void encode(const CmaHeader& h, std::span<std::uint8_t, CmaHeader::kSize> out) noexcept {
  std::uint8_t* p = out.data();
  p[0] = h.cma_version;
  p[1] = top(h.ip_version, 4);
  store_be16(p + 2, h.src_port);
  put_bytes(p + 4, h.src_addr);
  put_bytes(p + 20, h.dst_addr);
}

bool decode(std::span<const std::uint8_t> in, CmaHeader& h) noexcept {
  if (in.size() < CmaHeader::kSize) return false;
  const std::uint8_t* p = in.data();
  h.cma_version = p[0];
  h.ip_version = get_top(p[1], 4);
  h.src_port = load_be16(p + 2);
  get_bytes(p + 4, h.src_addr);
  get_bytes(p + 20, h.dst_addr);
  return true;
}

// A GMP (IBTA 13.5.1; docs/wire.md §4): UD SEND ONLY from QP1 to QP1 with the
// GSI Q_Key, the full-member default P_Key, and the MAD as the whole payload
// (256 bytes, so no pad).
std::size_t build_gmp(std::span<const std::uint8_t, kMadSize> mad, std::uint32_t psn, std::span<std::uint8_t> out,
                      const IcrcFlow* flow) noexcept {
  if (out.size() < kGmpPacketSize) return 0;
  PacketHeaders h;
  h.bth.opcode = opcode::ud_send_only;
  h.bth.pkey = kDefaultPkey;
  h.bth.dest_qp = kGsiQpn;
  h.bth.psn = psn & 0xFFFFFFu;
  h.deth.qkey = kGsiQkey;
  h.deth.src_qp = kGsiQpn;
  const std::size_t n = build(h, std::span<const std::uint8_t>(mad), out, flow);
  return n == kGmpPacketSize ? n : 0;
}

std::optional<Attr> cm_attribute(const PacketView& p) noexcept {
  if (p.bth.opcode != opcode::ud_send_only || p.bth.dest_qp != kGsiQpn) return std::nullopt;
  if (p.payload.size() < kMadHeaderSize || p.payload[1] != kMgmtClassCm) return std::nullopt;
  return static_cast<Attr>(load_be16(p.payload.data() + 16));
}

}  // namespace softverbs::wire::cm

// The IB connection-manager MADs on RoCEv2 (IBTA Vol1 ch.12 and ch.13; layouts in
// docs/wire.md §4): the 24-byte common MAD header, the CM messages REQ, MRA, REJ,
// REP, RTU, DREQ, DREP, SIDR_REQ and SIDR_REP, the rdma_cm private-data header
// of the "RDMA IP CM Service" (IBTA Annex A11), and the UD SEND ONLY packet to
// QP1 that carries a MAD (a GMP).
//
// Like wire/headers.hpp: plain structs with host-order fields; encoders write
// the big-endian wire bytes one by one, mask narrow fields and write reserved
// bits as 0; decoders are total (any bytes give a message or an error, never a
// read outside the input) and ignore reserved bits.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <variant>

#include "wire/icrc.hpp"
#include "wire/packet.hpp"

namespace softverbs::wire::cm {

// ---------------------------------------------------------------------------
// Constants
// ---------------------------------------------------------------------------

inline constexpr std::size_t kMadSize = 256;
inline constexpr std::size_t kMadHeaderSize = 24;
inline constexpr std::size_t kMadDataSize = kMadSize - kMadHeaderSize;  // 232

inline constexpr std::uint8_t kBaseVersion = 1;
inline constexpr std::uint8_t kMgmtClassCm = 0x07;
inline constexpr std::uint8_t kClassVersion = 2;  // IB_CM_CLASS_VERSION
inline constexpr std::uint8_t kMethodSend = 0x03;

inline constexpr std::uint32_t kGsiQpn = 1;
inline constexpr std::uint32_t kGsiQkey = 0x80010000u;  // IB_QP1_QKEY
inline constexpr std::uint16_t kPermissiveLid = 0xFFFF;

// AttributeIDs of the CM class.
enum class Attr : std::uint16_t {
  kClassPortInfo = 0x0001,
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
  kLap = 0x0019,
  kApr = 0x001A,
};
std::string_view to_string(Attr a) noexcept;  // "REQ", "MRA", ...; "?" for others

// Private-data sizes of each message (the rest of its 232 bytes).
inline constexpr std::size_t kReqPrivate = 92;
inline constexpr std::size_t kMraPrivate = 222;
inline constexpr std::size_t kRejPrivate = 148;
inline constexpr std::size_t kRepPrivate = 196;
inline constexpr std::size_t kRtuPrivate = 224;
inline constexpr std::size_t kDreqPrivate = 220;
inline constexpr std::size_t kDrepPrivate = 224;
inline constexpr std::size_t kSidrReqPrivate = 216;
inline constexpr std::size_t kSidrRepPrivate = 136;
inline constexpr std::size_t kRejAriSize = 72;

// REQ/REP transport service types (REQ byte 43 bits 2-1).
enum class Transport : std::uint8_t { kRc = 0, kUc = 1, kRd = 2, kXrc = 3 };

// REJ reasons (IBTA Table 109; the ones the CM sends or receives).
enum class RejReason : std::uint16_t {
  kNoQp = 1,
  kNoEec = 2,
  kNoResources = 3,
  kTimeout = 4,
  kUnsupported = 5,
  kInvalidCommId = 6,
  kInvalidCommInstance = 7,
  kInvalidServiceId = 8,
  kInvalidTransportType = 9,
  kStaleConn = 10,
  kRdcNotExist = 11,
  kInvalidGid = 12,
  kInvalidLid = 13,
  kInvalidSl = 14,
  kInvalidTrafficClass = 15,
  kInvalidHopLimit = 16,
  kInvalidPacketRate = 17,
  kPortCmRedirect = 24,
  kPortRedirect = 25,
  kInvalidMtu = 26,
  kInsufficientRespResources = 27,
  kConsumerDefined = 28,
  kInvalidRnrRetry = 29,
  kDuplicateLocalCommId = 30,
  kInvalidClassVersion = 31,
  kInvalidFlowLabel = 32,
  kInvalidAltFlowLabel = 33,
};

// REJ "MessageRejected" and MRA "MessageMRAed" (byte 8, top 2 bits).
enum class MsgKind : std::uint8_t { kReq = 0, kRep = 1, kOther = 2 };

// SIDR_REP status (the Status field of IBTA Table 120).
enum class SidrStatus : std::uint8_t {
  kValid = 0,
  kServiceIdNotSupported = 1,
  kRejected = 2,
  kNoQp = 3,
  kRedirect = 4,
  kClassVersionNotSupported = 5,
};

// ---------------------------------------------------------------------------
// The common MAD header
// ---------------------------------------------------------------------------

struct MadHeader {
  std::uint8_t base_version = kBaseVersion;
  std::uint8_t mgmt_class = kMgmtClassCm;
  std::uint8_t class_version = kClassVersion;
  std::uint8_t method = kMethodSend;
  std::uint16_t status = 0;
  std::uint16_t class_specific = 0;
  std::uint64_t tid = 0;
  Attr attr_id = Attr::kReq;
  std::uint32_t attr_mod = 0;
  friend bool operator==(const MadHeader&, const MadHeader&) = default;
};

// ---------------------------------------------------------------------------
// The messages. Field names follow IBTA's tables; offsets are in docs/wire.md.
// ---------------------------------------------------------------------------

using Gid = std::array<std::uint8_t, 16>;

// One path of a REQ (primary at data offset 52, alternate at 96).
struct ReqPath {
  std::uint16_t local_lid = kPermissiveLid;
  std::uint16_t remote_lid = kPermissiveLid;
  Gid local_gid{};
  Gid remote_gid{};
  std::uint32_t flow_label = 0;  // 20 bits
  std::uint8_t packet_rate = 0;  // 6 bits
  std::uint8_t traffic_class = 0;
  std::uint8_t hop_limit = 0;
  std::uint8_t sl = 0;  // 4 bits
  bool subnet_local = false;
  std::uint8_t local_ack_timeout = 0;  // 5 bits
  friend bool operator==(const ReqPath&, const ReqPath&) = default;
};

struct Req {
  std::uint32_t local_comm_id = 0;
  std::uint32_t vendor_id = 0;  // 24 bits (ECE)
  std::uint64_t service_id = 0;
  std::uint64_t local_ca_guid = 0;
  std::uint32_t local_qkey = 0;
  std::uint32_t local_qpn = 0;  // 24 bits
  std::uint8_t responder_resources = 0;
  std::uint32_t local_eecn = 0;  // 24 bits
  std::uint8_t initiator_depth = 0;
  std::uint32_t remote_eecn = 0;                   // 24 bits
  std::uint8_t remote_cm_response_timeout = 0;     // 5 bits
  Transport transport = Transport::kRc;            // 2 bits
  bool end_to_end_flow_control = false;
  std::uint32_t starting_psn = 0;                  // 24 bits
  std::uint8_t local_cm_response_timeout = 0;      // 5 bits
  std::uint8_t retry_count = 0;                    // 3 bits
  std::uint16_t pkey = 0xFFFF;
  std::uint8_t path_mtu = 0;  // 4 bits, IBV_MTU_* values
  bool rdc_exists = false;
  std::uint8_t rnr_retry_count = 0;  // 3 bits
  std::uint8_t max_cm_retries = 0;   // 4 bits
  bool srq = false;
  std::uint8_t extended_transport = 0;  // 3 bits
  ReqPath primary;
  ReqPath alternate{.local_lid = 0, .remote_lid = 0};  // all zero when there is none
  std::array<std::uint8_t, kReqPrivate> private_data{};
  friend bool operator==(const Req&, const Req&) = default;
};

struct Mra {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  MsgKind message_mraed = MsgKind::kReq;
  std::uint8_t service_timeout = 0;  // 5 bits
  std::array<std::uint8_t, kMraPrivate> private_data{};
  friend bool operator==(const Mra&, const Mra&) = default;
};

struct Rej {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  MsgKind message_rejected = MsgKind::kReq;
  std::uint8_t rejected_info_length = 0;  // 7 bits
  RejReason reason = RejReason::kConsumerDefined;
  std::array<std::uint8_t, kRejAriSize> ari{};
  std::array<std::uint8_t, kRejPrivate> private_data{};
  friend bool operator==(const Rej&, const Rej&) = default;
};

struct Rep {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::uint32_t local_qkey = 0;
  std::uint32_t local_qpn = 0;   // 24 bits
  std::uint32_t vendor_id = 0;   // 24 bits, split over bytes 15, 19, 23
  std::uint32_t local_eecn = 0;  // 24 bits
  std::uint32_t starting_psn = 0;  // 24 bits
  std::uint8_t responder_resources = 0;
  std::uint8_t initiator_depth = 0;
  std::uint8_t target_ack_delay = 0;   // 5 bits
  std::uint8_t failover_accepted = 0;  // 2 bits
  bool end_to_end_flow_control = false;
  std::uint8_t rnr_retry_count = 0;  // 3 bits
  bool srq = false;
  std::uint64_t local_ca_guid = 0;
  std::array<std::uint8_t, kRepPrivate> private_data{};
  friend bool operator==(const Rep&, const Rep&) = default;
};

struct Rtu {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::array<std::uint8_t, kRtuPrivate> private_data{};
  friend bool operator==(const Rtu&, const Rtu&) = default;
};

struct Dreq {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::uint32_t remote_qpn = 0;  // 24 bits (QPN or EECN)
  std::array<std::uint8_t, kDreqPrivate> private_data{};
  friend bool operator==(const Dreq&, const Dreq&) = default;
};

struct Drep {
  std::uint32_t local_comm_id = 0;
  std::uint32_t remote_comm_id = 0;
  std::array<std::uint8_t, kDrepPrivate> private_data{};
  friend bool operator==(const Drep&, const Drep&) = default;
};

// SIDR_REQ (IBTA Table 119): RequestID 0-3, P_Key 4-5, ServiceID 8-15, private 16-231.
struct SidrReq {
  std::uint32_t request_id = 0;
  std::uint16_t pkey = 0xFFFF;
  std::uint64_t service_id = 0;
  std::array<std::uint8_t, kSidrReqPrivate> private_data{};
  friend bool operator==(const SidrReq&, const SidrReq&) = default;
};

// SIDR_REP (IBTA Table 120): RequestID 0-3, Status 4, AdditionalInfoLength 5,
// QPN 8-10, ServiceID 12-19, Q_Key 20-23, ClassPortInfo 24-95, private 96-231.
struct SidrRep {
  std::uint32_t request_id = 0;
  SidrStatus status = SidrStatus::kValid;
  std::uint8_t additional_info_length = 0;
  std::uint32_t qpn = 0;  // 24 bits
  std::uint64_t service_id = 0;
  std::uint32_t qkey = 0;
  std::array<std::uint8_t, 72> class_port_info{};
  std::array<std::uint8_t, kSidrRepPrivate> private_data{};
  friend bool operator==(const SidrRep&, const SidrRep&) = default;
};

using Message = std::variant<Req, Mra, Rej, Rep, Rtu, Dreq, Drep, SidrReq, SidrRep>;

Attr attr_of(const Message& m) noexcept;

// ---------------------------------------------------------------------------
// MADs
// ---------------------------------------------------------------------------

// Writes the 256-byte MAD: `hdr` with its attr_id replaced by attr_of(msg),
// then the message in the data area.
void encode(const MadHeader& hdr, const Message& msg, std::span<std::uint8_t, kMadSize> out) noexcept;

enum class MadError : std::uint8_t {
  ok,
  too_short,          // fewer than 256 bytes
  bad_base_version,   // != 1
  not_cm_class,       // MgmtClass != 0x07
  bad_class_version,  // != 2 (the CM answers REJ 31 to a REQ of another version)
  bad_method,         // not Send
  unknown_attribute,  // ClassPortInfo, LAP, APR and unknown IDs
};
std::string_view to_string(MadError e) noexcept;

// Decodes a MAD. On any error but too_short `hdr` is filled, so the caller can
// count or answer it.
MadError decode(std::span<const std::uint8_t> mad, MadHeader& hdr, Message& msg) noexcept;

// ---------------------------------------------------------------------------
// rdma_cm: service IDs and the private-data header (IBTA Annex A11)
// ---------------------------------------------------------------------------

inline constexpr std::uint64_t kIpServicePrefix = 0x0000000001000000ull;  // "RDMA IP CM Service"
inline constexpr std::uint64_t kIpServiceMask = 0xFFFFFFFFFF000000ull;

// (port_space << 16) + port, as rdma_cm forms it (RDMA_PS_TCP 0x0106 → 0x1060000|port).
constexpr std::uint64_t service_id(std::uint16_t port_space, std::uint16_t port) noexcept {
  return (static_cast<std::uint64_t>(port_space) << 16) | port;
}
constexpr std::uint16_t service_port(std::uint64_t sid) noexcept { return static_cast<std::uint16_t>(sid & 0xFFFF); }
constexpr std::uint16_t service_ps(std::uint64_t sid) noexcept { return static_cast<std::uint16_t>((sid >> 16) & 0xFFFF); }

// The 36-byte header rdma_cm puts before the user's private data in REQ and
// SIDR_REQ. Addresses are 16 bytes; an IPv4 one is 12 zero bytes + the address.
struct CmaHeader {
  static constexpr std::size_t kSize = 36;
  std::uint8_t cma_version = 0;
  std::uint8_t ip_version = 4;  // 4 or 6 (the top nibble of byte 1 on the wire)
  std::uint16_t src_port = 0;
  Gid src_addr{};
  Gid dst_addr{};
  friend bool operator==(const CmaHeader&, const CmaHeader&) = default;
};
void encode(const CmaHeader& h, std::span<std::uint8_t, CmaHeader::kSize> out) noexcept;
// False (and `h` unspecified) when fewer than 36 bytes are given.
bool decode(std::span<const std::uint8_t> in, CmaHeader& h) noexcept;

// ---------------------------------------------------------------------------
// GMPs: a MAD in a UD SEND ONLY packet from QP1 to QP1
// ---------------------------------------------------------------------------

// Size of a GMP packet (BTH + DETH + 256 + ICRC).
inline constexpr std::size_t kGmpPacketSize = 12 + 8 + kMadSize + 4;

// Writes BTH (UD SEND ONLY, P_Key 0xFFFF, DestQP 1, the given PSN), DETH
// (Q_Key 0x80010000, SrcQP 1), the MAD and the ICRC over `flow` (0 bytes when
// flow is null). Returns kGmpPacketSize, or 0 when `out` is too small.
std::size_t build_gmp(std::span<const std::uint8_t, kMadSize> mad, std::uint32_t psn, std::span<std::uint8_t> out,
                      const IcrcFlow* flow) noexcept;

// The CM message a parsed packet carries, for those that look at traffic
// without decoding it (the fault rules' `cm` key): the MAD's AttributeID when
// the packet is a UD SEND ONLY to QP1 whose payload starts with a MAD header of
// the CM management class; nothing for any other packet. Only the 24-byte
// header is read, and only its class is checked, so a MAD decode() refuses
// (another class version, a short MAD) is still seen for what it claims to be.
std::optional<Attr> cm_attribute(const PacketView& p) noexcept;

}  // namespace softverbs::wire::cm

// The IB CM MAD codec (wire/cm_mad.hpp): each message's bytes against the
// offsets of IBTA Vol1 ch.12 (Tables 106-113 and the SIDR tables, written out
// here by hand, not taken from the encoder), round trips at the largest values,
// a decoder that takes any bytes, rdma_cm's private-data header and service
// IDs, and the GMP packet that carries a MAD.
#include "wire/cm_mad.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::wire::cm {
namespace {

using Mad = std::array<std::uint8_t, kMadSize>;

// MAD offset of data byte 0: the tables count from the start of the data area.
constexpr std::size_t D = kMadHeaderSize;

Mad encoded(const MadHeader& h, const Message& m) {
  Mad out{};
  out.fill(0xEE);  // the encoder writes all 256 bytes
  encode(h, m, out);
  return out;
}

// Writes `bytes` at `off` in `m`.
void put(Mad& m, std::size_t off, std::initializer_list<std::uint8_t> bytes) {
  for (std::uint8_t b : bytes) m[off++] = b;
}

// The expected 24-byte header of every MAD below, from the common MAD header
// layout: versions, method, status, class-specific, TID, attribute, modifier.
MadHeader test_header() {
  MadHeader h;
  h.status = 0x0102;
  h.class_specific = 0x0304;
  h.tid = 0x1122334455667788ull;
  h.attr_mod = 0xCAFEBABE;
  return h;
}
Mad expected_header(std::uint16_t attr) {
  Mad e{};
  put(e, 0, {0x01, 0x07, 0x02, 0x03, 0x01, 0x02, 0x03, 0x04});
  put(e, 8, {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88});
  put(e, 16, {static_cast<std::uint8_t>(attr >> 8), static_cast<std::uint8_t>(attr), 0x00, 0x00});
  put(e, 20, {0xCA, 0xFE, 0xBA, 0xBE});
  return e;
}

// Compares byte by byte so a failure names the offset (MAD and data offsets).
void expect_bytes(const Mad& got, const Mad& want) {
  for (std::size_t i = 0; i < kMadSize; ++i) {
    EXPECT_EQ(got[i], want[i]) << "MAD byte " << i << " (data byte " << static_cast<long>(i) - static_cast<long>(D)
                               << ")";
  }
}

template <std::size_t N>
std::array<std::uint8_t, N> counting(std::uint8_t from) {
  std::array<std::uint8_t, N> a{};
  for (std::size_t i = 0; i < N; ++i) a[i] = static_cast<std::uint8_t>(from + i);
  return a;
}
template <std::size_t N>
void put_counting(Mad& e, std::size_t off, std::uint8_t from) {
  for (std::size_t i = 0; i < N; ++i) e[off + i] = static_cast<std::uint8_t>(from + i);
}

Gid v4_mapped(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  return Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d};
}

// Layout checks: encode a message with distinct values, compare with bytes
// placed by hand at the table's offsets, and decode them back.
template <class M>
void check_layout(const M& m, const Mad& want) {
  const MadHeader h = test_header();
  expect_bytes(encoded(h, m), want);
  MadHeader dh;
  Message dm;
  ASSERT_EQ(decode(want, dh, dm), MadError::ok);
  EXPECT_EQ(dh.tid, h.tid);
  EXPECT_EQ(dh.attr_mod, h.attr_mod);
  EXPECT_EQ(dh.attr_id, attr_of(Message{m}));
  ASSERT_TRUE(std::holds_alternative<M>(dm));
  EXPECT_TRUE(std::get<M>(dm) == m);
}

// ---------------------------------------------------------------------------
// Table 106: REQ
// ---------------------------------------------------------------------------

Req sample_req() {
  Req r;
  r.local_comm_id = 0x11223344;
  r.vendor_id = 0xABCDEF;
  r.service_id = 0x0000000001061D2Full;
  r.local_ca_guid = 0x0102030405060708ull;
  r.local_qkey = 0xDEADBEEF;
  r.local_qpn = 0x123456;
  r.responder_resources = 0x10;
  r.local_eecn = 0x654321;
  r.initiator_depth = 0x20;
  r.remote_eecn = 0x0A0B0C;
  r.remote_cm_response_timeout = 20;
  r.transport = Transport::kUc;
  r.end_to_end_flow_control = true;
  r.starting_psn = 0xABCDE1;
  r.local_cm_response_timeout = 21;
  r.retry_count = 6;
  r.pkey = 0x8001;
  r.path_mtu = 3;
  r.rdc_exists = true;
  r.rnr_retry_count = 7;
  r.max_cm_retries = 15;
  r.srq = true;
  r.extended_transport = 5;
  r.primary.local_lid = 0xFFFF;
  r.primary.remote_lid = 0x1234;
  r.primary.local_gid = v4_mapped(10, 0, 0, 1);
  r.primary.remote_gid = v4_mapped(10, 0, 0, 2);
  r.primary.flow_label = 0xABCDE;
  r.primary.packet_rate = 0x2A;
  r.primary.traffic_class = 0x28;
  r.primary.hop_limit = 64;
  r.primary.sl = 0xC;
  r.primary.subnet_local = true;
  r.primary.local_ack_timeout = 19;
  r.alternate.local_lid = 0x0102;
  r.alternate.remote_lid = 0x0304;
  r.alternate.local_gid = counting<16>(0x40);
  r.alternate.remote_gid = counting<16>(0x60);
  r.alternate.flow_label = 0x12345;
  r.alternate.packet_rate = 0x3F;
  r.alternate.traffic_class = 0x55;
  r.alternate.hop_limit = 0x66;
  r.alternate.sl = 3;
  r.alternate.subnet_local = false;
  r.alternate.local_ack_timeout = 31;
  r.private_data = counting<kReqPrivate>(1);
  return r;
}

TEST(CmMadLayout, Req) {
  Mad e = expected_header(0x0010);
  put(e, D + 0, {0x11, 0x22, 0x33, 0x44});                           // Local Communication ID
  put(e, D + 4, {0x00, 0xAB, 0xCD, 0xEF});                           // reserved, VendorID
  put(e, D + 8, {0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x1D, 0x2F});   // ServiceID
  put(e, D + 16, {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08});  // Local CA GUID
  put(e, D + 24, {0x00, 0x00, 0x00, 0x00});                          // reserved
  put(e, D + 28, {0xDE, 0xAD, 0xBE, 0xEF});                          // Local Q_Key
  put(e, D + 32, {0x12, 0x34, 0x56, 0x10});                          // Local QPN, Responder Resources
  put(e, D + 36, {0x65, 0x43, 0x21, 0x20});                          // Local EECN, Initiator Depth
  // Remote EECN; byte 43: RemoteCMResponseTimeout 20 (10100) in bits 7-3,
  // Transport UC (01) in bits 2-1, EndToEndFlowControl in bit 0.
  put(e, D + 40, {0x0A, 0x0B, 0x0C, 0b1010'0011});
  // Starting PSN; byte 47: LocalCMResponseTimeout 21 (10101) bits 7-3, RetryCount 6.
  put(e, D + 44, {0xAB, 0xCD, 0xE1, 0b1010'1110});
  put(e, D + 48, {0x80, 0x01});              // P_Key
  put(e, D + 50, {0b0011'1111});             // PathMTU 3 | RDCExists | RNRRetryCount 7
  put(e, D + 51, {0b1111'1101});             // MaxCMRetries 15 | SRQ | ExtendedTransportType 5
  put(e, D + 52, {0xFF, 0xFF, 0x12, 0x34});  // primary LIDs
  put(e, D + 56, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 1});
  put(e, D + 72, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 0, 0, 2});
  // FlowLabel 0xABCDE in the top 20 bits of 88-91, PacketRate 0x2A in the low 6.
  put(e, D + 88, {0xAB, 0xCD, 0xE0, 0x2A});
  put(e, D + 92, {0x28, 64});                // TrafficClass, HopLimit
  put(e, D + 94, {0b1100'1000});             // SL 12 | SubnetLocal
  put(e, D + 95, {0b1001'1000});             // LocalAckTimeout 19
  put(e, D + 96, {0x01, 0x02, 0x03, 0x04});  // alternate LIDs
  put_counting<16>(e, D + 100, 0x40);
  put_counting<16>(e, D + 116, 0x60);
  put(e, D + 132, {0x12, 0x34, 0x50, 0x3F});
  put(e, D + 136, {0x55, 0x66, 0b0011'0000, 0b1111'1000});
  put_counting<kReqPrivate>(e, D + 140, 1);
  check_layout(sample_req(), e);
}

// A REQ without an alternate path leaves bytes 96-139 zero: Linux's CM takes a
// nonzero alternate local LID or GID for an alternate path (cm_req_has_alt_path).
TEST(CmMadLayout, ReqWithoutAnAlternatePath) {
  const Mad mad = encoded(MadHeader{}, Req{});
  for (std::size_t i = 96; i < 140; ++i) EXPECT_EQ(mad[D + i], 0) << "data byte " << i;
  EXPECT_EQ(mad[D + 52], 0xFF);  // the primary path's LIDs are permissive
  EXPECT_EQ(mad[D + 55], 0xFF);
}

// ---------------------------------------------------------------------------
// Tables 107 MRA, 108 REJ, 110 REP, 111 RTU, 112 DREQ, 113 DREP
// ---------------------------------------------------------------------------

TEST(CmMadLayout, Mra) {
  Mra m;
  m.local_comm_id = 0x01020304;
  m.remote_comm_id = 0x05060708;
  m.message_mraed = MsgKind::kRep;
  m.service_timeout = 24;
  m.private_data = counting<kMraPrivate>(9);
  Mad e = expected_header(0x0011);
  put(e, D + 0, {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08});
  put(e, D + 8, {0b0100'0000, 0b1100'0000});  // MessageMRAed 1 (top 2), ServiceTimeout 24 (top 5)
  put_counting<kMraPrivate>(e, D + 10, 9);
  check_layout(m, e);
}

TEST(CmMadLayout, Rej) {
  Rej m;
  m.local_comm_id = 0xA1A2A3A4;
  m.remote_comm_id = 0xB1B2B3B4;
  m.message_rejected = MsgKind::kOther;
  m.rejected_info_length = 72;
  m.reason = RejReason::kInvalidServiceId;
  m.ari = counting<kRejAriSize>(0x80);
  m.private_data = counting<kRejPrivate>(3);
  Mad e = expected_header(0x0012);
  put(e, D + 0, {0xA1, 0xA2, 0xA3, 0xA4, 0xB1, 0xB2, 0xB3, 0xB4});
  // MessageRejected 2 (top 2 of 8), RejectedInfoLength 72 = 1001000 (top 7 of 9), Reason 8.
  put(e, D + 8, {0b1000'0000, 0b1001'0000, 0x00, 0x08});
  put_counting<kRejAriSize>(e, D + 12, 0x80);
  put_counting<kRejPrivate>(e, D + 84, 3);
  check_layout(m, e);
}

TEST(CmMadLayout, Rep) {
  Rep m;
  m.local_comm_id = 0x01020304;
  m.remote_comm_id = 0x11121314;
  m.local_qkey = 0x21222324;
  m.local_qpn = 0x313233;
  m.vendor_id = 0xA1B2C3;
  m.local_eecn = 0x414243;
  m.starting_psn = 0x515253;
  m.responder_resources = 0x61;
  m.initiator_depth = 0x62;
  m.target_ack_delay = 17;
  m.failover_accepted = 2;
  m.end_to_end_flow_control = true;
  m.rnr_retry_count = 5;
  m.srq = true;
  m.local_ca_guid = 0x7172737475767778ull;
  m.private_data = counting<kRepPrivate>(0x20);
  Mad e = expected_header(0x0013);
  put(e, D + 0, {0x01, 0x02, 0x03, 0x04, 0x11, 0x12, 0x13, 0x14, 0x21, 0x22, 0x23, 0x24});
  // Local QPN | VendorID[23:16], Local EECN | VendorID[15:8], Starting PSN | VendorID[7:0].
  put(e, D + 12, {0x31, 0x32, 0x33, 0xA1, 0x41, 0x42, 0x43, 0xB2, 0x51, 0x52, 0x53, 0xC3});
  // ResponderResources, InitiatorDepth; byte 26: TargetACKDelay 17 (10001) bits 7-3,
  // FailoverAccepted 2 bits 2-1, E2E bit 0; byte 27: RNRRetryCount 5 bits 7-5, SRQ bit 4.
  put(e, D + 24, {0x61, 0x62, 0b1000'1101, 0b1011'0000});
  put(e, D + 28, {0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78});
  put_counting<kRepPrivate>(e, D + 36, 0x20);
  check_layout(m, e);
}

TEST(CmMadLayout, RtuDreqDrep) {
  Rtu rtu;
  rtu.local_comm_id = 0x01020304;
  rtu.remote_comm_id = 0x05060708;
  rtu.private_data = counting<kRtuPrivate>(7);
  Mad e = expected_header(0x0014);
  put(e, D + 0, {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08});
  put_counting<kRtuPrivate>(e, D + 8, 7);
  check_layout(rtu, e);

  Dreq dreq;
  dreq.local_comm_id = 0x0A0B0C0D;
  dreq.remote_comm_id = 0x1A1B1C1D;
  dreq.remote_qpn = 0xABCDEF;
  dreq.private_data = counting<kDreqPrivate>(5);
  e = expected_header(0x0015);
  put(e, D + 0, {0x0A, 0x0B, 0x0C, 0x0D, 0x1A, 0x1B, 0x1C, 0x1D, 0xAB, 0xCD, 0xEF, 0x00});
  put_counting<kDreqPrivate>(e, D + 12, 5);
  check_layout(dreq, e);

  Drep drep;
  drep.local_comm_id = 0xF0F1F2F3;
  drep.remote_comm_id = 0xE0E1E2E3;
  drep.private_data = counting<kDrepPrivate>(2);
  e = expected_header(0x0016);
  put(e, D + 0, {0xF0, 0xF1, 0xF2, 0xF3, 0xE0, 0xE1, 0xE2, 0xE3});
  put_counting<kDrepPrivate>(e, D + 8, 2);
  check_layout(drep, e);
}

TEST(CmMadLayout, SidrReqAndRep) {
  SidrReq q;
  q.request_id = 0x01020304;
  q.pkey = 0x7FFF;
  q.service_id = 0x0000000001111234ull;
  q.private_data = counting<kSidrReqPrivate>(4);
  Mad e = expected_header(0x0017);
  put(e, D + 0, {0x01, 0x02, 0x03, 0x04, 0x7F, 0xFF, 0x00, 0x00});
  put(e, D + 8, {0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x12, 0x34});
  put_counting<kSidrReqPrivate>(e, D + 16, 4);
  check_layout(q, e);

  SidrRep r;
  r.request_id = 0x11121314;
  r.status = SidrStatus::kNoQp;
  r.additional_info_length = 0x48;
  r.qpn = 0x212223;
  r.service_id = 0x3132333435363738ull;
  r.qkey = 0x41424344;
  r.class_port_info = counting<72>(0x90);
  r.private_data = counting<kSidrRepPrivate>(6);
  e = expected_header(0x0018);
  put(e, D + 0, {0x11, 0x12, 0x13, 0x14, 0x03, 0x48, 0x00, 0x00, 0x21, 0x22, 0x23, 0x00});
  put(e, D + 12, {0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x41, 0x42, 0x43, 0x44});
  put_counting<72>(e, D + 24, 0x90);
  put_counting<kSidrRepPrivate>(e, D + 96, 6);
  check_layout(r, e);
}

// Each message's private data ends exactly at the end of the MAD.
TEST(CmMadLayout, PrivateDataFillsTheDataArea) {
  EXPECT_EQ(140 + kReqPrivate, kMadDataSize);
  EXPECT_EQ(10 + kMraPrivate, kMadDataSize);
  EXPECT_EQ(84 + kRejPrivate, kMadDataSize);
  EXPECT_EQ(12 + kRejAriSize, 84u);
  EXPECT_EQ(36 + kRepPrivate, kMadDataSize);
  EXPECT_EQ(8 + kRtuPrivate, kMadDataSize);
  EXPECT_EQ(12 + kDreqPrivate, kMadDataSize);
  EXPECT_EQ(8 + kDrepPrivate, kMadDataSize);
  EXPECT_EQ(16 + kSidrReqPrivate, kMadDataSize);
  EXPECT_EQ(96 + kSidrRepPrivate, kMadDataSize);
}

// ---------------------------------------------------------------------------
// Round trips at the largest values: narrow fields come back masked, and
// reserved bits stay 0.
// ---------------------------------------------------------------------------

template <std::size_t N>
std::array<std::uint8_t, N> ones() {
  std::array<std::uint8_t, N> a{};
  a.fill(0xFF);
  return a;
}

ReqPath max_path() {
  ReqPath p;
  p.local_lid = p.remote_lid = 0xFFFF;
  p.local_gid = p.remote_gid = ones<16>();
  p.flow_label = 0xFFFFFFFF;
  p.packet_rate = p.traffic_class = p.hop_limit = p.sl = p.local_ack_timeout = 0xFF;
  p.subnet_local = true;
  return p;
}
ReqPath masked(ReqPath p) {
  p.flow_label &= 0xFFFFF;
  p.packet_rate &= 0x3F;
  p.sl &= 0xF;
  p.local_ack_timeout &= 0x1F;
  return p;
}

std::vector<std::pair<Message, Message>> max_messages() {
  std::vector<std::pair<Message, Message>> v;  // (max, what decodes back)
  Req q;
  q.local_comm_id = q.local_qkey = 0xFFFFFFFF;
  q.vendor_id = q.local_qpn = q.local_eecn = q.remote_eecn = q.starting_psn = 0xFFFFFFFF;
  q.service_id = q.local_ca_guid = ~0ull;
  q.responder_resources = q.initiator_depth = 0xFF;
  q.remote_cm_response_timeout = q.local_cm_response_timeout = q.retry_count = q.path_mtu = q.rnr_retry_count =
      q.max_cm_retries = q.extended_transport = 0xFF;
  q.transport = static_cast<Transport>(0xFF);
  q.end_to_end_flow_control = q.rdc_exists = q.srq = true;
  q.pkey = 0xFFFF;
  q.primary = q.alternate = max_path();
  q.private_data = ones<kReqPrivate>();
  Req qm = q;
  qm.vendor_id = qm.local_qpn = qm.local_eecn = qm.remote_eecn = qm.starting_psn = 0xFFFFFF;
  qm.remote_cm_response_timeout = qm.local_cm_response_timeout = 0x1F;
  qm.retry_count = qm.rnr_retry_count = qm.extended_transport = 7;
  qm.path_mtu = qm.max_cm_retries = 0xF;
  qm.transport = Transport::kXrc;
  qm.primary = qm.alternate = masked(max_path());
  v.emplace_back(q, qm);

  Mra a{0xFFFFFFFF, 0xFFFFFFFF, static_cast<MsgKind>(0xFF), 0xFF, ones<kMraPrivate>()};
  Mra am = a;
  am.message_mraed = static_cast<MsgKind>(3);
  am.service_timeout = 0x1F;
  v.emplace_back(a, am);

  Rej j{0xFFFFFFFF,          0xFFFFFFFF,         static_cast<MsgKind>(0xFF), 0xFF, static_cast<RejReason>(0xFFFF),
        ones<kRejAriSize>(), ones<kRejPrivate>()};
  Rej jm = j;
  jm.message_rejected = static_cast<MsgKind>(3);
  jm.rejected_info_length = 0x7F;
  v.emplace_back(j, jm);

  Rep p;
  p.local_comm_id = p.remote_comm_id = p.local_qkey = 0xFFFFFFFF;
  p.local_qpn = p.vendor_id = p.local_eecn = p.starting_psn = 0xFFFFFFFF;
  p.responder_resources = p.initiator_depth = p.target_ack_delay = p.failover_accepted = p.rnr_retry_count = 0xFF;
  p.end_to_end_flow_control = p.srq = true;
  p.local_ca_guid = ~0ull;
  p.private_data = ones<kRepPrivate>();
  Rep pm = p;
  pm.local_qpn = pm.vendor_id = pm.local_eecn = pm.starting_psn = 0xFFFFFF;
  pm.target_ack_delay = 0x1F;
  pm.failover_accepted = 3;
  pm.rnr_retry_count = 7;
  v.emplace_back(p, pm);

  Rtu u{0xFFFFFFFF, 0xFFFFFFFF, ones<kRtuPrivate>()};
  v.emplace_back(u, u);
  Dreq dq{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, ones<kDreqPrivate>()};
  Dreq dqm = dq;
  dqm.remote_qpn = 0xFFFFFF;
  v.emplace_back(dq, dqm);
  Drep dp{0xFFFFFFFF, 0xFFFFFFFF, ones<kDrepPrivate>()};
  v.emplace_back(dp, dp);
  SidrReq sq{0xFFFFFFFF, 0xFFFF, ~0ull, ones<kSidrReqPrivate>()};
  v.emplace_back(sq, sq);
  SidrRep sp{0xFFFFFFFF, static_cast<SidrStatus>(0xFF), 0xFF, 0xFFFFFFFF, ~0ull, 0xFFFFFFFF,
             ones<72>(), ones<kSidrRepPrivate>()};
  SidrRep spm = sp;
  spm.qpn = 0xFFFFFF;
  v.emplace_back(sp, spm);
  return v;
}

// (data offset, the bits of that byte that are reserved) for each message.
std::vector<std::pair<std::size_t, std::uint8_t>> reserved_bits(Attr a) {
  switch (a) {
    case Attr::kReq:  // byte 4, bytes 24-27, byte 95 bits 2-0, byte 139 bits 2-0
      return {{4, 0xFF}, {24, 0xFF}, {25, 0xFF}, {26, 0xFF}, {27, 0xFF}, {95, 0x07}, {139, 0x07}};
    case Attr::kMra:
      return {{8, 0x3F}, {9, 0x07}};
    case Attr::kRej:
      return {{8, 0x3F}, {9, 0x01}};
    case Attr::kRep:
      return {{27, 0x0F}};
    case Attr::kDreq:
      return {{11, 0xFF}};
    case Attr::kSidrReq:
      return {{6, 0xFF}, {7, 0xFF}};
    case Attr::kSidrRep:
      return {{6, 0xFF}, {7, 0xFF}, {11, 0xFF}};
    default:
      return {};
  }
}

TEST(CmMadRoundTrip, EveryMessageAtItsLargestValues) {
  MadHeader h;
  h.base_version = h.mgmt_class = h.class_version = h.method = 0xFF;
  h.status = h.class_specific = 0xFFFF;
  h.tid = ~0ull;
  h.attr_mod = 0xFFFFFFFF;
  for (const auto& [max, want] : max_messages()) {
    const Attr attr = attr_of(max);
    SCOPED_TRACE(std::string(to_string(attr)));
    Mad mad = encoded(h, max);
    EXPECT_EQ(mad[18], 0);  // reserved after the AttributeID
    EXPECT_EQ(mad[19], 0);
    for (const auto& [off, bits] : reserved_bits(attr)) EXPECT_EQ(mad[D + off] & bits, 0) << "data byte " << off;
    // A header this wrong is refused before the data is read; with the CM's
    // own versions and method the data comes back masked.
    MadHeader dh;
    Message dm;
    EXPECT_EQ(decode(mad, dh, dm), MadError::bad_base_version);
    EXPECT_EQ(dh.tid, h.tid);
    EXPECT_EQ(dh.status, h.status);
    EXPECT_EQ(dh.class_specific, h.class_specific);
    EXPECT_EQ(dh.attr_mod, h.attr_mod);
    EXPECT_EQ(dh.attr_id, attr);
    put(mad, 0, {kBaseVersion, kMgmtClassCm, kClassVersion, kMethodSend});
    ASSERT_EQ(decode(mad, dh, dm), MadError::ok);
    EXPECT_TRUE(dm == want);
    // Reserved bits set on the wire are ignored.
    for (const auto& [off, bits] : reserved_bits(attr)) mad[D + off] |= bits;
    mad[18] = mad[19] = 0xFF;
    ASSERT_EQ(decode(mad, dh, dm), MadError::ok);
    EXPECT_TRUE(dm == want);
  }
}

// ---------------------------------------------------------------------------
// The decoder is total
// ---------------------------------------------------------------------------

TEST(CmMadDecode, EveryErrorIsReachable) {
  const Mad good = encoded(MadHeader{}, Rtu{});
  MadHeader h;
  Message m;
  ASSERT_EQ(decode(good, h, m), MadError::ok);
  EXPECT_EQ(decode(std::span(good).first(kMadSize - 1), h, m), MadError::too_short);
  struct Case {
    std::size_t off;
    std::uint8_t value;
    MadError want;
  } cases[] = {
      {0, 2, MadError::bad_base_version},      {1, 0x81, MadError::not_cm_class},
      {1, 0x01, MadError::not_cm_class},       {2, 1, MadError::bad_class_version},
      {3, 0x83, MadError::bad_method},         {3, 0x01, MadError::bad_method},
      {17, 0x01, MadError::unknown_attribute},  // ClassPortInfo
      {17, 0x19, MadError::unknown_attribute},  // LAP
      {17, 0x1A, MadError::unknown_attribute},  // APR
      {17, 0x00, MadError::unknown_attribute}, {16, 0x10, MadError::unknown_attribute},
  };
  for (const Case& c : cases) {
    Mad bad = good;
    bad[c.off] = c.value;
    h = MadHeader{};
    EXPECT_EQ(decode(bad, h, m), c.want) << "byte " << c.off << " = " << int{c.value};
    // The header is filled so the caller can count or answer the MAD.
    EXPECT_EQ(h.base_version, bad[0]);
    EXPECT_EQ(h.mgmt_class, bad[1]);
    EXPECT_EQ(h.class_version, bad[2]);
    EXPECT_EQ(h.method, bad[3]);
    EXPECT_EQ(static_cast<std::uint16_t>(h.attr_id), load_be16(bad.data() + 16));
  }
  for (MadError e : {MadError::ok, MadError::too_short, MadError::bad_base_version, MadError::not_cm_class,
                     MadError::bad_class_version, MadError::bad_method, MadError::unknown_attribute})
    EXPECT_NE(to_string(e), "?");
}

TEST(CmMadDecode, TruncatedAndRandomInputs) {
  const Mad good = encoded(MadHeader{}, sample_req());
  MadHeader h;
  Message m;
  for (std::size_t n = 0; n < kMadSize; ++n) {
    std::vector<std::uint8_t> cut(good.begin(), good.begin() + static_cast<long>(n));  // its own allocation
    EXPECT_EQ(decode(cut, h, m), MadError::too_short) << n;
  }
  // A longer input is decoded from its first 256 bytes.
  std::vector<std::uint8_t> longer(good.begin(), good.end());
  longer.resize(300, 0xAB);
  ASSERT_EQ(decode(longer, h, m), MadError::ok);
  EXPECT_TRUE(std::get<Req>(m) == sample_req());

  std::mt19937 rng(7);
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::uint8_t> buf(rng() % 300);
    for (auto& b : buf) b = static_cast<std::uint8_t>(rng());
    // Half the inputs get a CM header so the message decoders run on noise.
    if (buf.size() >= 24 && (i & 1)) {
      buf[0] = kBaseVersion;
      buf[1] = kMgmtClassCm;
      buf[2] = kClassVersion;
      buf[3] = kMethodSend;
      buf[16] = 0;
      buf[17] = static_cast<std::uint8_t>(0x10 + rng() % 9);
    }
    const MadError e = decode(buf, h, m);
    if (e == MadError::ok) {
      ++ok;
      // What decodes re-encodes to a MAD that decodes to the same message.
      Mad again{};
      encode(h, m, again);
      MadHeader h2;
      Message m2;
      ASSERT_EQ(decode(again, h2, m2), MadError::ok);
      EXPECT_TRUE(m2 == m);
      EXPECT_TRUE(h2 == h);
    }
  }
  EXPECT_GT(ok, 1000);
}

TEST(CmMad, AttributeNames) {
  EXPECT_EQ(to_string(Attr::kReq), "REQ");
  EXPECT_EQ(to_string(Attr::kSidrRep), "SIDR_REP");
  EXPECT_EQ(to_string(static_cast<Attr>(0x7777)), "?");
  EXPECT_EQ(attr_of(Message{Dreq{}}), Attr::kDreq);
}

// ---------------------------------------------------------------------------
// rdma_cm: service IDs and the private-data header
// ---------------------------------------------------------------------------

TEST(CmaHeaderTest, ServiceIds) {
  static_assert(service_id(0x0106, 7471) == 0x0000000001061D2Full);
  EXPECT_EQ(service_port(0x0000000001061D2Full), 7471);
  EXPECT_EQ(service_ps(0x0000000001061D2Full), 0x0106);
  EXPECT_EQ(service_id(0x0106, 7471) & kIpServiceMask, kIpServicePrefix);
  EXPECT_EQ(service_id(0x0111, 1) & kIpServiceMask, kIpServicePrefix);
}

TEST(CmaHeaderTest, Ipv4EncodeAndDecode) {
  CmaHeader h;
  h.src_port = 0xC123;
  h.src_addr = Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 192, 168, 1, 2};
  h.dst_addr = Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 9};
  std::array<std::uint8_t, CmaHeader::kSize> out{};
  out.fill(0xEE);
  encode(h, out);
  const std::array<std::uint8_t, CmaHeader::kSize> want = {
      0x00, 0x40, 0xC1, 0x23,                          // version 0, IPv4 in the top nibble, port
      0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0,  // 12 zero bytes
      192,  168,  1,    2,                             // source address
      0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0, 0,  //
      10,   0,    0,    9};                            // destination address
  EXPECT_EQ(out, want);
  CmaHeader back;
  ASSERT_TRUE(decode(want, back));
  EXPECT_EQ(back, h);
  EXPECT_FALSE(decode(std::span(want).first(CmaHeader::kSize - 1), back));

  h.ip_version = 6;
  encode(h, out);
  EXPECT_EQ(out[1], 0x60);
  out[1] = 0x6F;  // the low nibble is reserved
  ASSERT_TRUE(decode(out, back));
  EXPECT_EQ(back.ip_version, 6);
}

// ---------------------------------------------------------------------------
// GMPs
// ---------------------------------------------------------------------------

TEST(Gmp, ParsesAsUdSendOnlyFromQp1ToQp1) {
  Ipv4Flow flow;
  flow.saddr = {10, 0, 0, 1};
  flow.daddr = {10, 0, 0, 2};
  flow.sport = 0xD872;
  const IcrcFlow f = flow;
  const Mad mad = encoded(test_header(), sample_req());
  std::array<std::uint8_t, kGmpPacketSize + 8> out{};
  ASSERT_EQ(build_gmp(mad, 0x1ABCDEF, out, &f), kGmpPacketSize);
  const std::span<const std::uint8_t> pkt(out.data(), kGmpPacketSize);

  PacketView v;
  ASSERT_EQ(parse(pkt, v, f), ParseError::ok);  // checks the ICRC first
  EXPECT_EQ(v.bth.opcode, 0x64);
  EXPECT_EQ(v.op->name, "UD_SEND_ONLY");
  EXPECT_EQ(v.bth.pkey, 0xFFFF);
  EXPECT_EQ(v.bth.dest_qp, 1u);
  EXPECT_EQ(v.bth.psn, 0xABCDEFu);  // 24 bits
  EXPECT_EQ(v.bth.pad_cnt, 0);
  EXPECT_EQ(v.deth.qkey, 0x80010000u);
  EXPECT_EQ(v.deth.src_qp, 1u);
  ASSERT_EQ(v.payload.size(), kMadSize);
  EXPECT_TRUE(std::equal(v.payload.begin(), v.payload.end(), mad.begin()));
  EXPECT_EQ(v.icrc, icrc(f, pkt.first(kGmpPacketSize - 4)));

  // The bytes as IBTA lays them out: BTH, then DETH, then the MAD.
  const std::array<std::uint8_t, 20> headers = {0x64, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x01, 0x00, 0xAB,
                                                0xCD, 0xEF, 0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01};
  EXPECT_TRUE(std::equal(headers.begin(), headers.end(), out.begin()));

  // Another flow does not verify; no flow leaves the ICRC 0; a short buffer is refused.
  Ipv4Flow other = flow;
  other.daddr = {10, 0, 0, 3};
  EXPECT_EQ(parse(pkt, v, IcrcFlow{other}), ParseError::icrc_mismatch);
  ASSERT_EQ(build_gmp(mad, 5, out, nullptr), kGmpPacketSize);
  EXPECT_EQ(load_icrc(out.data() + kGmpPacketSize - 4), 0u);
  EXPECT_EQ(build_gmp(mad, 5, std::span(out).first(kGmpPacketSize - 1), &f), 0u);
}

// cm_attribute() names the CM message of a GMP from its MAD header alone.
TEST(Gmp, CmAttributeOfAPacket) {
  const Mad mad = encoded(MadHeader{}, Drep{});
  std::array<std::uint8_t, kGmpPacketSize> out{};
  ASSERT_EQ(build_gmp(mad, 0, out, nullptr), kGmpPacketSize);
  PacketView v;
  ASSERT_EQ(parse(out, v), ParseError::ok);
  EXPECT_EQ(cm_attribute(v), Attr::kDrep);
  // Another class version is still a CM MAD; another class or QP is not.
  Mad other = mad;
  other[2] = 1;
  ASSERT_EQ(build_gmp(other, 0, out, nullptr), kGmpPacketSize);
  ASSERT_EQ(parse(out, v), ParseError::ok);
  EXPECT_EQ(cm_attribute(v), Attr::kDrep);
  other[1] = 0x03;  // subnet administration
  ASSERT_EQ(build_gmp(other, 0, out, nullptr), kGmpPacketSize);
  ASSERT_EQ(parse(out, v), ParseError::ok);
  EXPECT_EQ(cm_attribute(v), std::nullopt);
  ASSERT_EQ(build_gmp(mad, 0, out, nullptr), kGmpPacketSize);
  ASSERT_EQ(parse(out, v), ParseError::ok);
  v.bth.dest_qp = 2;
  EXPECT_EQ(cm_attribute(v), std::nullopt);
  v.bth.dest_qp = 1;
  v.bth.opcode = opcode::rc_send_only;
  EXPECT_EQ(cm_attribute(v), std::nullopt);
  v.bth.opcode = opcode::ud_send_only;
  v.payload = v.payload.first(kMadHeaderSize - 1);
  EXPECT_EQ(cm_attribute(v), std::nullopt);
}

}  // namespace
}  // namespace softverbs::wire::cm

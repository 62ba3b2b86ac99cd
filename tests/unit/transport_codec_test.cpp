// Opcode table, header layouts, packet build/parse and hostile input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::wire {
namespace {

using Bytes = std::vector<std::uint8_t>;

template <class H>
Bytes encoded(const H& h) {
  Bytes b(H::kSize);
  encode(h, HeaderBytes<H>(b.data(), H::kSize));
  return b;
}

template <class H>
ConstHeaderBytes<H> view_of(const Bytes& b) {
  return ConstHeaderBytes<H>(b.data(), H::kSize);
}

IcrcFlow test_flow() {
  Ipv4Flow f;
  f.saddr = {127, 0, 0, 2};
  f.daddr = {127, 0, 0, 3};
  f.sport = 0xC5A5;
  return f;
}

// ---------------------------------------------------------------------------
// Opcode table
// ---------------------------------------------------------------------------

std::vector<std::uint8_t> listed_opcodes() {
  std::vector<std::uint8_t> v;
  for (unsigned op = 0; op < 256; ++op) {
    const auto byte = static_cast<std::uint8_t>(op);
    if (opcode_info(byte).valid) v.push_back(byte);
  }
  return v;
}

std::vector<std::uint8_t> supported_opcodes() {
  std::vector<std::uint8_t> v;
  for (auto op : listed_opcodes()) {
    if (opcode_info(op).supported) v.push_back(op);
  }
  return v;
}

TEST(OpcodeTable, ListsExactlyTheRoceV2Opcodes) {
  std::set<unsigned> expected;
  for (unsigned op = 0x00; op <= 0x14; ++op) expected.insert(op);
  expected.insert({0x16, 0x17, 0x1C, 0x1D});
  for (unsigned op = 0x20; op <= 0x2B; ++op) expected.insert(op);
  expected.insert({0x64, 0x65, 0x81});
  for (unsigned op = 0xA0; op <= 0xB4; ++op) expected.insert(op);  // XRC (IBTA 9.5)
  expected.insert({0xB6, 0xB7});
  std::set<unsigned> listed;
  for (auto op : listed_opcodes()) listed.insert(op);
  EXPECT_EQ(listed, expected);

  const std::set<unsigned> unsupported = {0x1C, 0x1D, 0x81};
  for (auto op : listed_opcodes()) {
    EXPECT_EQ(opcode_info(op).supported, unsupported.count(op) == 0) << int(op);
  }
}

TEST(OpcodeTable, InvalidEntries) {
  for (unsigned op : {0x15u, 0x18u, 0x1Eu, 0x1Fu, 0x2Cu, 0x30u, 0x40u, 0x44u, 0x60u, 0x63u, 0x66u,
                      0x80u, 0x82u, 0xB5u, 0xB8u, 0xBCu, 0xBDu, 0xC0u, 0xFFu}) {
    const OpcodeInfo& e = opcode_info(static_cast<std::uint8_t>(op));
    EXPECT_FALSE(e.valid) << op;
    EXPECT_FALSE(e.supported) << op;
    EXPECT_EQ(e.opcode, op);
    EXPECT_EQ(e.name, "INVALID");
    EXPECT_EQ(e.header_len, 0);
  }
}

TEST(OpcodeTable, EntriesAreConsistent) {
  std::set<std::string_view> names;
  for (auto op : listed_opcodes()) {
    const OpcodeInfo& e = opcode_info(op);
    EXPECT_EQ(e.opcode, op);
    EXPECT_TRUE(names.insert(e.name).second) << e.name;
    // Transport from opcode bits 7..5, and the name says it too.
    const Transport t = op < 0x20   ? Transport::rc
                        : op < 0x40 ? Transport::uc
                        : op < 0x80 ? Transport::ud
                        : op < 0xA0 ? Transport::cnp
                                    : Transport::xrc;
    EXPECT_EQ(e.transport, t) << e.name;
    EXPECT_EQ(e.name.substr(0, 2), to_string(t).substr(0, 2)) << e.name;
    // Header length is BTH plus the listed headers.
    std::size_t len = Bth::kSize;
    for (unsigned i = 0; i < ext::kCount; ++i) {
      if (e.headers & (1u << i)) len += ext_header_size(static_cast<std::uint16_t>(1u << i));
    }
    EXPECT_EQ(e.header_len, len) << e.name;
    // Derived flags follow the class.
    EXPECT_EQ(e.has_imm(), e.name.find("IMMEDIATE") != std::string_view::npos) << e.name;
    EXPECT_EQ(e.has_ieth(), e.name.find("INVALIDATE") != std::string_view::npos) << e.name;
    EXPECT_EQ(e.has(ext::deth), e.transport == Transport::ud) << e.name;
    // IBTA 9.5: every XRC request, and nothing else, carries an XRCETH.
    EXPECT_EQ(e.has(ext::xrceth), e.transport == Transport::xrc && e.is_request) << e.name;
    if (e.transport == Transport::xrc) {
      // The same operation as the RC opcode 0xA0 below it.
      const OpcodeInfo& rc = opcode_info(static_cast<std::uint8_t>(op - 0xA0));
      EXPECT_EQ(e.name.substr(3), rc.name.substr(2)) << e.name;
      EXPECT_EQ(e.headers & ~ext::xrceth, rc.headers) << e.name;
    }
    EXPECT_NE(e.position, Position::none);
    EXPECT_NE(e.op_class, OpClass::none);
  }
}

TEST(OpcodeTable, SelectedFacts) {
  const auto& send_first = opcode_info(opcode::rc_send_first);
  EXPECT_TRUE(send_first.is_request);
  EXPECT_TRUE(send_first.needs_recv_wqe);
  EXPECT_TRUE(send_first.has_payload);
  EXPECT_EQ(send_first.position, Position::first);
  EXPECT_EQ(send_first.op_class, OpClass::send);

  EXPECT_TRUE(opcode_info(opcode::rc_send_middle).needs_recv_wqe);
  EXPECT_FALSE(opcode_info(opcode::rc_rdma_write_first).needs_recv_wqe);
  EXPECT_FALSE(opcode_info(opcode::rc_rdma_write_last).needs_recv_wqe);
  EXPECT_TRUE(opcode_info(opcode::rc_rdma_write_last_with_immediate).needs_recv_wqe);
  EXPECT_TRUE(opcode_info(opcode::uc_rdma_write_only_with_immediate).needs_recv_wqe);
  EXPECT_TRUE(opcode_info(opcode::ud_send_only).needs_recv_wqe);
  EXPECT_FALSE(opcode_info(opcode::rc_rdma_read_request).needs_recv_wqe);

  const auto& read_req = opcode_info(opcode::rc_rdma_read_request);
  EXPECT_TRUE(read_req.is_request);
  EXPECT_FALSE(read_req.has_payload);
  EXPECT_EQ(read_req.headers, ext::reth);

  const auto& middle = opcode_info(opcode::rc_rdma_read_response_middle);
  EXPECT_FALSE(middle.is_request);
  EXPECT_EQ(middle.headers, 0);  // no AETH in a MIDDLE response
  EXPECT_EQ(middle.op_class, OpClass::rdma_read_response);

  const auto& ack = opcode_info(opcode::rc_acknowledge);
  EXPECT_FALSE(ack.is_request);
  EXPECT_FALSE(ack.has_payload);
  EXPECT_EQ(ack.op_class, OpClass::ack);

  const auto& atomic_ack = opcode_info(opcode::rc_atomic_acknowledge);
  EXPECT_EQ(atomic_ack.headers, ext::aeth | ext::atomic_ack_eth);
  EXPECT_EQ(header_offset(atomic_ack, ext::aeth), 12u);
  EXPECT_EQ(header_offset(atomic_ack, ext::atomic_ack_eth), 16u);

  const auto& fetch_add = opcode_info(opcode::rc_fetch_add);
  EXPECT_EQ(fetch_add.op_class, OpClass::atomic);
  EXPECT_TRUE(fetch_add.is_request);
  EXPECT_EQ(fetch_add.header_len, 40);

  EXPECT_TRUE(opcode_info(opcode::rc_send_only).starts_message());
  EXPECT_TRUE(opcode_info(opcode::rc_send_only).ends_message());
  EXPECT_FALSE(opcode_info(opcode::rc_send_middle).ends_message());

  const auto& cnp = opcode_info(opcode::cnp);
  EXPECT_EQ(cnp.transport, Transport::cnp);
  EXPECT_FALSE(cnp.is_request);
  EXPECT_FALSE(cnp.supported);
  EXPECT_EQ(cnp.header_len, 28);
}

// Expected result of next_opcode_valid, written out from the IBTA rule.
bool expected_sequence(std::uint8_t prev, std::uint8_t cur) {
  auto in = [](std::uint8_t op, std::initializer_list<std::uint8_t> set) {
    return std::find(set.begin(), set.end(), op) != set.end();
  };
  using namespace opcode;
  const OpcodeInfo& c = opcode_info(cur);
  if (!c.valid || !c.is_request) return false;
  const OpcodeInfo& p = opcode_info(prev);
  if (p.valid && p.transport != c.transport) return false;
  // XRC follows RC's rules in its own class (0xA0 | the RC opcode).
  if (c.transport == Transport::xrc) {
    return expected_sequence(p.valid ? static_cast<std::uint8_t>(prev - 0xA0) : prev,
                             static_cast<std::uint8_t>(cur - 0xA0));
  }
  if (in(prev, {rc_send_first, rc_send_middle})) {
    return in(cur, {rc_send_middle, rc_send_last, rc_send_last_with_immediate,
                    rc_send_last_with_invalidate});
  }
  if (in(prev, {uc_send_first, uc_send_middle})) {
    return in(cur, {uc_send_middle, uc_send_last, uc_send_last_with_immediate});
  }
  if (in(prev, {rc_rdma_write_first, rc_rdma_write_middle})) {
    return in(cur, {rc_rdma_write_middle, rc_rdma_write_last, rc_rdma_write_last_with_immediate});
  }
  if (in(prev, {uc_rdma_write_first, uc_rdma_write_middle})) {
    return in(cur, {uc_rdma_write_middle, uc_rdma_write_last, uc_rdma_write_last_with_immediate});
  }
  return !in(
      cur, {rc_send_middle, rc_send_last, rc_send_last_with_immediate, rc_send_last_with_invalidate,
            rc_rdma_write_middle, rc_rdma_write_last, rc_rdma_write_last_with_immediate,
            uc_send_middle, uc_send_last, uc_send_last_with_immediate, uc_rdma_write_middle,
            uc_rdma_write_last, uc_rdma_write_last_with_immediate});
}

TEST(OpcodeSequence, AllPairs) {
  for (unsigned prev = 0; prev < 256; ++prev) {
    for (unsigned cur = 0; cur < 256; ++cur) {
      const auto p = static_cast<std::uint8_t>(prev);
      const auto c = static_cast<std::uint8_t>(cur);
      ASSERT_EQ(next_opcode_valid(p, c), expected_sequence(p, c))
          << opcode_info(p).name << " -> " << opcode_info(c).name;
    }
  }
}

TEST(OpcodeSequence, Examples) {
  using namespace opcode;
  EXPECT_TRUE(next_opcode_valid(kNoPrevOpcode, rc_send_first));
  EXPECT_TRUE(next_opcode_valid(kNoPrevOpcode, rc_rdma_read_request));
  EXPECT_FALSE(next_opcode_valid(kNoPrevOpcode, rc_send_middle));
  EXPECT_TRUE(next_opcode_valid(rc_send_first, rc_send_middle));
  EXPECT_TRUE(next_opcode_valid(rc_send_middle, rc_send_last_with_invalidate));
  EXPECT_FALSE(next_opcode_valid(rc_send_middle, rc_send_only));
  EXPECT_FALSE(next_opcode_valid(rc_send_first, rc_rdma_write_middle));
  EXPECT_FALSE(next_opcode_valid(rc_rdma_write_first, rc_send_last));
  EXPECT_TRUE(next_opcode_valid(rc_rdma_write_middle, rc_rdma_write_last_with_immediate));
  EXPECT_FALSE(next_opcode_valid(rc_rdma_write_last, rc_rdma_write_last));
  EXPECT_TRUE(next_opcode_valid(rc_send_last, rc_compare_swap));
  EXPECT_FALSE(next_opcode_valid(rc_send_only, rc_acknowledge));  // not a request
  EXPECT_FALSE(next_opcode_valid(rc_send_only, uc_send_only));    // transport change
  EXPECT_TRUE(next_opcode_valid(uc_rdma_write_first, uc_rdma_write_last));
  EXPECT_TRUE(next_opcode_valid(ud_send_only, ud_send_only_with_immediate));
}

// ---------------------------------------------------------------------------
// Header layouts against hand-written bytes
// ---------------------------------------------------------------------------

TEST(TransportHeaders, BthLayout) {
  Bth h;
  h.opcode = 0x0A;
  h.se = true;
  h.migreq = true;
  h.pad_cnt = 3;
  h.tver = 0;
  h.pkey = 0x1234;
  h.fecn = true;
  h.becn = false;
  h.dest_qp = 0xABCDEF;
  h.ack_req = true;
  h.psn = 0x123456;
  // opcode | SE M PadCnt=11 TVer=0000 | P_Key | F B resv6 | DestQP | A resv7 | PSN
  const Bytes expected = {0x0A, 0xF0, 0x12, 0x34, 0x80, 0xAB, 0xCD, 0xEF, 0x80, 0x12, 0x34, 0x56};
  EXPECT_EQ(encoded(h), expected);
  EXPECT_EQ(decode_bth(view_of<Bth>(expected)), h);

  Bth b;
  b.becn = true;
  b.tver = 0x5;
  b.pad_cnt = 1;
  b.dest_qp = 1;
  EXPECT_EQ(encoded(b),
            (Bytes{0x00, 0x15, 0xFF, 0xFF, 0x40, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00}));
  EXPECT_EQ(decode_bth(view_of<Bth>(encoded(b))), b);
}

TEST(TransportHeaders, BthMasksWideFieldsAndIgnoresReservedBits) {
  Bth h;
  h.pad_cnt = 0x7;         // only 2 bits on the wire
  h.tver = 0x1F;           // only 4 bits
  h.dest_qp = 0xFF123456;  // only 24 bits
  h.psn = 0x01ABCDEF;
  const Bytes b = encoded(h);
  EXPECT_EQ(b, (Bytes{0x00, 0x3F, 0xFF, 0xFF, 0x00, 0x12, 0x34, 0x56, 0x00, 0xAB, 0xCD, 0xEF}));

  const Bytes with_reserved = {0x04, 0x00, 0xFF, 0xFF, 0x3F, 0x00,
                               0x00, 0x22, 0x7F, 0x00, 0x00, 0x01};
  const Bth d = decode_bth(view_of<Bth>(with_reserved));
  EXPECT_FALSE(d.fecn);
  EXPECT_FALSE(d.becn);
  EXPECT_FALSE(d.ack_req);
  EXPECT_EQ(d.dest_qp, 0x22u);
  EXPECT_EQ(d.psn, 1u);
}

TEST(TransportHeaders, DethLayout) {
  const Deth h{0x80010000, 0x000001};
  const Bytes expected = {0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01};
  EXPECT_EQ(encoded(h), expected);
  EXPECT_EQ(decode_deth(view_of<Deth>(expected)), h);
  const Bytes reserved_set = {0x80, 0x01, 0x00, 0x00, 0xEE, 0x00, 0x00, 0x01};
  EXPECT_EQ(decode_deth(view_of<Deth>(reserved_set)), h);
}

// resv8 | XRCSRQ(24): the reserved byte is written as 0 and ignored on decode.
TEST(TransportHeaders, XrcethLayout) {
  const Xrceth h{0xABCDEF};
  const Bytes expected = {0x00, 0xAB, 0xCD, 0xEF};
  EXPECT_EQ(encoded(h), expected);
  EXPECT_EQ(decode_xrceth(view_of<Xrceth>(expected)), h);
  const Bytes reserved_set = {0x5A, 0xAB, 0xCD, 0xEF};
  EXPECT_EQ(decode_xrceth(view_of<Xrceth>(reserved_set)), h);
  EXPECT_EQ(encoded(Xrceth{0x1ABCDEF}), expected);  // 24 bits
}

// XRC RDMA WRITE ONLY with immediate: BTH, XRCETH, RETH, ImmDt, in that order.
TEST(TransportPacket, HandWrittenXrcWriteOnlyWithImmediate) {
  PacketHeaders h;
  h.bth.opcode = 0xAB;
  h.bth.dest_qp = 0x000102;
  h.bth.psn = 0x000005;
  h.xrceth.srqn = 0x00C0DE;
  h.reth = {0x1000, 0x0000AA55, 4};
  const std::uint8_t imm[4] = {0xA0, 0xB0, 0xC0, 0xD0};
  std::memcpy(&h.imm.data, imm, 4);
  const Bytes payload = {0x01, 0x02, 0x03, 0x04};
  Bytes out(64, 0xEE);
  const std::size_t n = build(h, payload, out, nullptr);
  // clang-format off
  const Bytes expected = {
      0xAB, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x05,  // BTH
      0x00, 0x00, 0xC0, 0xDE,                                                  // XRCETH
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,                          // RETH va
      0x00, 0x00, 0xAA, 0x55, 0x00, 0x00, 0x00, 0x04,                          // rkey, len
      0xA0, 0xB0, 0xC0, 0xD0,                                                  // ImmDt
      0x01, 0x02, 0x03, 0x04,                                                  // payload
      0x00, 0x00, 0x00, 0x00};                                                 // no ICRC
  // clang-format on
  ASSERT_EQ(n, expected.size());
  EXPECT_EQ(Bytes(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), expected);
  PacketView v;
  ASSERT_EQ(parse(Bytes(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), v), ParseError::ok);
  EXPECT_EQ(v.xrceth.srqn, 0x00C0DEu);
  EXPECT_EQ(v.reth.rkey, 0x0000AA55u);
  EXPECT_EQ(v.op->transport, Transport::xrc);
}

TEST(TransportHeaders, RethLayout) {
  const Reth h{0x0123456789ABCDEFull, 0xCAFEBABE, 0x00100000};
  const Bytes expected = {0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF,
                          0xCA, 0xFE, 0xBA, 0xBE, 0x00, 0x10, 0x00, 0x00};
  EXPECT_EQ(encoded(h), expected);
  EXPECT_EQ(decode_reth(view_of<Reth>(expected)), h);
}

TEST(TransportHeaders, AethLayoutAndHelpers) {
  const Aeth nak = Aeth::nak(0x010203, NakCode::remote_access_error);
  EXPECT_EQ(encoded(nak), (Bytes{0x62, 0x01, 0x02, 0x03}));
  EXPECT_TRUE(nak.is_nak());
  EXPECT_FALSE(nak.is_ack());
  EXPECT_FALSE(nak.is_rnr_nak());
  EXPECT_EQ(nak.nak_code(), NakCode::remote_access_error);

  const Aeth ack = Aeth::ack(1);
  EXPECT_EQ(encoded(ack), (Bytes{0x1F, 0x00, 0x00, 0x01}));
  EXPECT_TRUE(ack.is_ack());
  EXPECT_EQ(ack.credit_code(), Aeth::kCreditInvalid);
  EXPECT_EQ(credit_count(ack.credit_code()), 0xFFFFFFFFu);
  EXPECT_EQ(credit_count(Aeth::ack(0, 10).credit_code()), 32u);

  // Syndrome 46 = RNR NAK, timer 14 (1.28 ms), as Wireshark shows it.
  const Aeth rnr = decode_aeth(view_of<Aeth>(Bytes{0x2E, 0x00, 0x00, 0x03}));
  EXPECT_TRUE(rnr.is_rnr_nak());
  EXPECT_EQ(rnr.rnr_timer(), 14);
  EXPECT_EQ(rnr.msn, 3u);
  EXPECT_EQ(rnr, Aeth::rnr_nak(3, 14));
  EXPECT_EQ(rnr_timer_us(14), 1280u);
  EXPECT_EQ(rnr_timer_us(0), 655360u);
  EXPECT_EQ(rnr_timer_us(1), 10u);
  EXPECT_EQ(rnr_timer_us(25), 61440u);
  EXPECT_EQ(rnr_timer_us(31), 491520u);

  EXPECT_EQ(Aeth::nak(0, NakCode::psn_sequence_error).syndrome, 0x60);
  EXPECT_EQ(static_cast<int>(NakCode::invalid_rd_request), 0x64);
  const Aeth reserved_type{0x40, 0};
  EXPECT_FALSE(reserved_type.is_ack() || reserved_type.is_nak() || reserved_type.is_rnr_nak());
}

TEST(TransportHeaders, AtomicEthLayout) {
  const AtomicEth h{0x1122334455667788ull, 0x99AABBCC, 0x0102030405060708ull,
                    0xF1F2F3F4F5F6F7F8ull};
  const Bytes expected = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA,
                          0xBB, 0xCC, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
                          0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF7, 0xF8};
  EXPECT_EQ(encoded(h), expected);
  EXPECT_EQ(decode_atomic_eth(view_of<AtomicEth>(expected)), h);
}

TEST(TransportHeaders, AtomicAckEthLayout) {
  const AtomicAckEth h{0xDEADBEEF00C0FFEEull};
  const Bytes expected = {0xDE, 0xAD, 0xBE, 0xEF, 0x00, 0xC0, 0xFF, 0xEE};
  EXPECT_EQ(encoded(h), expected);
  EXPECT_EQ(decode_atomic_ack_eth(view_of<AtomicAckEth>(expected)), h);
}

TEST(TransportHeaders, ImmIsCopiedVerbatim) {
  // imm_data is already big-endian in verbs: its memory bytes are the wire bytes.
  const std::uint8_t wire[4] = {0x12, 0x34, 0x56, 0x78};
  Imm h;
  std::memcpy(&h.data, wire, 4);
  EXPECT_EQ(encoded(h), (Bytes{0x12, 0x34, 0x56, 0x78}));
  EXPECT_EQ(decode_imm(view_of<Imm>(Bytes{0x12, 0x34, 0x56, 0x78})), h);
}

TEST(TransportHeaders, IethLayout) {
  const Ieth h{0x00ABCDEF};
  EXPECT_EQ(encoded(h), (Bytes{0x00, 0xAB, 0xCD, 0xEF}));
  EXPECT_EQ(decode_ieth(view_of<Ieth>(Bytes{0x00, 0xAB, 0xCD, 0xEF})), h);
}

// ---------------------------------------------------------------------------
// Packet build / parse
// ---------------------------------------------------------------------------

TEST(TransportPacket, HandWrittenWriteOnlyWithImmediate) {
  PacketHeaders h;
  h.bth.opcode = opcode::rc_rdma_write_only_with_immediate;
  h.bth.se = true;
  h.bth.dest_qp = 0x000102;
  h.bth.ack_req = true;
  h.bth.psn = 0xFFFFFF;
  h.reth = {0x1000, 0x0000AA55, 3};
  const std::uint8_t imm[4] = {0xA0, 0xB0, 0xC0, 0xD0};
  std::memcpy(&h.imm.data, imm, 4);
  const Bytes payload = {0x01, 0x02, 0x03};
  Bytes out(64, 0xEE);
  const std::size_t n = build(h, payload, out, nullptr);
  // clang-format off
  const Bytes expected = {
      0x0B, 0x90, 0xFF, 0xFF, 0x00, 0x00, 0x01, 0x02, 0x80, 0xFF, 0xFF, 0xFF,  // BTH, SE, pad 1
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00,                          // RETH va
      0x00, 0x00, 0xAA, 0x55, 0x00, 0x00, 0x00, 0x03,                          // rkey, len
      0xA0, 0xB0, 0xC0, 0xD0,                                                  // ImmDt
      0x01, 0x02, 0x03, 0x00,                                                  // payload, pad
      0x00, 0x00, 0x00, 0x00};                                                 // no ICRC
  // clang-format on
  ASSERT_EQ(n, expected.size());
  EXPECT_EQ(Bytes(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), expected);
  EXPECT_EQ(out[n], 0xEE);  // nothing written past the packet
  EXPECT_EQ(packet_size(h.bth.opcode, payload.size()), n);
}

TEST(TransportPacket, HandWrittenAtomicAcknowledge) {
  PacketHeaders h;
  h.bth.opcode = opcode::rc_atomic_acknowledge;
  h.bth.dest_qp = 0x11;
  h.bth.psn = 0x10;
  h.aeth = Aeth::ack(5);
  h.atomic_ack_eth = {0x0102030405060708ull};
  Bytes out(64);
  const std::size_t n = build(h, std::span<const std::uint8_t>(), out, nullptr);
  // clang-format off
  const Bytes expected = {
      0x12, 0x00, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x10,  // BTH
      0x1F, 0x00, 0x00, 0x05,                                                  // AETH
      0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,                          // AtomicAckETH
      0x00, 0x00, 0x00, 0x00};                                                 // no ICRC
  // clang-format on
  EXPECT_EQ(Bytes(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(n)), expected);
}

PacketHeaders random_headers(std::mt19937& rng, std::uint8_t op) {
  auto r32 = [&] { return static_cast<std::uint32_t>(rng()); };
  auto r64 = [&] { return (std::uint64_t{r32()} << 32) | r32(); };
  PacketHeaders h;
  h.bth.opcode = op;
  h.bth.se = rng() & 1;
  h.bth.migreq = rng() & 1;
  h.bth.pkey = static_cast<std::uint16_t>(rng());
  h.bth.fecn = rng() & 1;
  h.bth.becn = rng() & 1;
  h.bth.dest_qp = r32() & kQpnMask;
  h.bth.ack_req = rng() & 1;
  h.bth.psn = r32() & 0xFFFFFF;
  h.deth = {r32(), r32() & kQpnMask};
  h.xrceth = {r32() & kQpnMask};
  h.reth = {r64(), r32(), r32()};
  h.aeth = {static_cast<std::uint8_t>(rng()), r32() & 0xFFFFFF};
  h.atomic_eth = {r64(), r32(), r64(), r64()};
  h.atomic_ack_eth = {r64()};
  h.imm = {r32()};
  h.ieth = {r32()};
  return h;
}

// The headers parse() is expected to return: the opcode's headers, the rest
// value-initialised, and the pad count build() computes.
PacketHeaders expected_after_parse(const PacketHeaders& in, std::size_t payload_len) {
  const OpcodeInfo& op = opcode_info(in.bth.opcode);
  PacketHeaders e;
  e.bth = in.bth;
  e.bth.pad_cnt = static_cast<std::uint8_t>((4 - payload_len % 4) % 4);
  if (op.has(ext::deth)) e.deth = in.deth;
  if (op.has(ext::xrceth)) e.xrceth = in.xrceth;
  if (op.has(ext::reth)) e.reth = in.reth;
  if (op.has(ext::aeth)) e.aeth = in.aeth;
  if (op.has(ext::atomic_eth)) e.atomic_eth = in.atomic_eth;
  if (op.has(ext::atomic_ack_eth)) e.atomic_ack_eth = in.atomic_ack_eth;
  if (op.has(ext::imm)) e.imm = in.imm;
  if (op.has(ext::ieth)) e.ieth = in.ieth;
  return e;
}

TEST(TransportPacket, EveryOpcodeRoundTrips) {
  std::mt19937 rng(42);
  const IcrcFlow flow = test_flow();
  Bytes out(8192);
  for (auto op : supported_opcodes()) {
    const OpcodeInfo& info = opcode_info(op);
    const std::vector<std::size_t> lengths =
        info.has_payload ? std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 7, 256, 1027, 4096}
                         : std::vector<std::size_t>{0};
    for (std::size_t len : lengths) {
      const PacketHeaders h = random_headers(rng, op);
      Bytes payload(len);
      for (auto& b : payload) b = static_cast<std::uint8_t>(rng());
      const std::size_t n = build(h, payload, out, &flow);
      ASSERT_EQ(n, info.header_len + len + (4 - len % 4) % 4 + kIcrcBytes) << info.name;
      ASSERT_EQ(n % 4, 0u);
      ASSERT_EQ(packet_size(op, len), n);

      PacketView v;
      const std::span<const std::uint8_t> pkt(out.data(), n);
      ASSERT_EQ(parse(pkt, v, flow), ParseError::ok) << info.name << " len " << len;
      EXPECT_EQ(v.op, &info);
      EXPECT_EQ(static_cast<const PacketHeaders&>(v), expected_after_parse(h, len)) << info.name;
      EXPECT_EQ(Bytes(v.payload.begin(), v.payload.end()), payload) << info.name;
      EXPECT_EQ(v.icrc, icrc(flow, pkt.first(n - 4)));
      for (std::size_t i = n - 4 - v.bth.pad_cnt; i < n - 4; ++i) {
        EXPECT_EQ(out[i], 0) << "pad byte";
      }
    }
  }
}

TEST(TransportPacket, GatherEqualsContiguous) {
  std::mt19937 rng(3);
  Bytes payload(1000);
  for (auto& b : payload) b = static_cast<std::uint8_t>(rng());
  const PacketHeaders h = random_headers(rng, opcode::rc_send_first);
  const IcrcFlow flow = test_flow();
  Bytes a(2048), b(2048);
  const std::size_t na = build(h, payload, a, &flow);

  const std::span<const std::uint8_t> all(payload);
  const std::span<const std::uint8_t> pieces[] = {
      all.subspan(0, 1), all.subspan(1, 0), all.subspan(1, 500), std::span<const std::uint8_t>(),
      all.subspan(501, 499)};
  const std::size_t nb = build(h, pieces, b, &flow);
  ASSERT_EQ(na, nb);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(na), b.begin()));
}

TEST(TransportPacket, BuildRefusals) {
  Bytes out(256);
  const Bytes payload(8, 0x11);
  PacketHeaders h;
  for (std::uint8_t op : {std::uint8_t{0x15}, std::uint8_t{0x40}, std::uint8_t{0xFF},
                          opcode::rc_flush, opcode::rc_atomic_write, opcode::cnp}) {
    h.bth.opcode = op;
    EXPECT_EQ(build(h, payload, out, nullptr), 0u) << int(op);
    EXPECT_EQ(packet_size(op, 0), 0u) << int(op);
  }
  // Payload on an opcode without payload.
  h.bth.opcode = opcode::rc_acknowledge;
  EXPECT_EQ(build(h, payload, out, nullptr), 0u);
  EXPECT_EQ(build(h, std::span<const std::uint8_t>(), out, nullptr), 20u);  // BTH + AETH + ICRC
  // Every buffer shorter than the packet is refused (ASan checks we stay inside).
  h.bth.opcode = opcode::rc_rdma_write_only;
  const std::size_t need = packet_size(h.bth.opcode, payload.size());
  ASSERT_EQ(need, 12u + 16u + 8u + 4u);
  for (std::size_t size = 0; size < need; ++size) {
    Bytes small(size);
    EXPECT_EQ(build(h, payload, small, nullptr), 0u) << size;
  }
  Bytes exact(need);
  EXPECT_EQ(build(h, payload, exact, nullptr), need);
  // Oversized packets.
  h.bth.opcode = opcode::rc_send_only;
  EXPECT_EQ(packet_size(h.bth.opcode, kMaxUdpPayload), 0u);
  // Packets are 4-byte multiples, so the largest is 65504 bytes.
  EXPECT_EQ(packet_size(h.bth.opcode, 65504 - 16), 65504u);
  EXPECT_EQ(packet_size(h.bth.opcode, 65504 - 15), 0u);
}

// ---------------------------------------------------------------------------
// Parse errors and hostile input
// ---------------------------------------------------------------------------

Bytes build_packet(const PacketHeaders& h, const Bytes& payload, const IcrcFlow* flow) {
  Bytes out(payload.size() + 128);
  out.resize(build(h, payload, out, flow));
  return out;
}

// What must hold whenever parse() says ok.
void check_ok_invariants(std::span<const std::uint8_t> in, const PacketView& v) {
  ASSERT_TRUE(v.op->valid && v.op->supported);
  ASSERT_EQ(v.bth.tver, 0);
  ASSERT_GE(v.payload.data(), in.data() + v.op->header_len);
  ASSERT_EQ(v.op->header_len + v.payload.size() + v.bth.pad_cnt + kIcrcBytes, in.size());
  if (!v.op->has_payload) {
    ASSERT_TRUE(v.payload.empty());
  }
}

TEST(TransportParseErrors, Specific) {
  PacketView v;
  PacketHeaders h;
  h.bth.opcode = opcode::rc_send_only;
  h.bth.dest_qp = 0x22;
  const Bytes good = build_packet(h, Bytes{1, 2, 3, 4, 5}, nullptr);
  ASSERT_EQ(parse(good, v), ParseError::ok);

  EXPECT_EQ(parse(std::span<const std::uint8_t>(), v), ParseError::too_short);
  EXPECT_EQ(parse(std::span<const std::uint8_t>(good).first(15), v), ParseError::too_short);

  Bytes bad = good;
  bad[1] |= 0x01;  // TVer 1
  EXPECT_EQ(parse(bad, v), ParseError::bad_tver);
  EXPECT_EQ(v.bth.tver, 1);

  bad = good;
  bad[0] = 0x15;  // reserved RC opcode
  EXPECT_EQ(parse(bad, v), ParseError::unknown_opcode);
  EXPECT_EQ(v.bth.opcode, 0x15);
  EXPECT_FALSE(v.op->valid);
  bad[0] = 0x44;  // RD
  EXPECT_EQ(parse(bad, v), ParseError::unknown_opcode);

  bad = good;
  bad[0] = opcode::cnp;
  bad[4] = 0x40;  // BECN
  EXPECT_EQ(parse(bad, v), ParseError::unsupported_opcode);
  EXPECT_TRUE(v.bth.becn);
  EXPECT_EQ(v.op->op_class, OpClass::cnp);

  bad = good;
  bad[0] = opcode::rc_rdma_write_only;  // needs a 16-byte RETH; only 12 bytes follow the BTH
  EXPECT_EQ(parse(bad, v), ParseError::truncated_headers);

  bad = good;
  bad[0] = opcode::rc_acknowledge;  // AETH + 4 stray bytes
  EXPECT_EQ(parse(bad, v), ParseError::unexpected_payload);

  // PadCnt 3 with only 2 bytes of payload+pad.
  h.bth.opcode = opcode::rc_send_only;
  bad = build_packet(h, Bytes{9, 9}, nullptr);
  ASSERT_EQ(parse(bad, v), ParseError::ok);
  EXPECT_EQ(v.bth.pad_cnt, 2);
  bad.erase(bad.begin() + 12, bad.begin() + 14);  // 2 bytes of pad left, no payload
  bad[1] = 0x30;                                  // PadCnt 3
  EXPECT_EQ(parse(bad, v), ParseError::pad_exceeds_payload);
  bad[1] = 0x20;  // PadCnt 2: an empty payload, fine
  EXPECT_EQ(parse(bad, v), ParseError::ok);
  EXPECT_TRUE(v.payload.empty());

  // A zero-length SEND with PadCnt 1 and nothing between BTH and ICRC.
  Bytes empty = build_packet(h, Bytes{}, nullptr);
  ASSERT_EQ(empty.size(), 16u);
  empty[1] = 0x10;
  EXPECT_EQ(parse(empty, v), ParseError::pad_exceeds_payload);
}

TEST(TransportParseErrors, ErrorNamesAreDistinct) {
  std::set<std::string_view> names;
  for (int e = 0; e <= static_cast<int>(ParseError::pad_exceeds_payload); ++e) {
    EXPECT_TRUE(names.insert(to_string(static_cast<ParseError>(e))).second);
  }
}

TEST(TransportParseHostile, EveryTruncationOfEveryOpcode) {
  std::mt19937 rng(11);
  const IcrcFlow flow = test_flow();
  for (auto op : listed_opcodes()) {
    const OpcodeInfo& info = opcode_info(op);
    Bytes pkt;
    if (info.supported) {
      pkt = build_packet(random_headers(rng, op), Bytes(info.has_payload ? 37 : 0, 0x5A), &flow);
    } else {
      // Not buildable: hand-made BTH + zeroed headers + ICRC.
      pkt.assign(info.header_len + kIcrcBytes, 0);
      pkt[0] = op;
      write_icrc(flow, pkt);
    }
    for (std::size_t len = 0; len < pkt.size(); ++len) {
      // Copy so ASan sees the exact end of the input.
      const Bytes cut(pkt.begin(), pkt.begin() + static_cast<std::ptrdiff_t>(len));
      PacketView v;
      EXPECT_NE(parse(cut, v, flow), ParseError::ok) << info.name << " len " << len;
      const ParseError e = parse(cut, v);  // unverified: may be a valid shorter packet
      if (e == ParseError::ok) check_ok_invariants(cut, v);
    }
  }
}

TEST(TransportParseHostile, RandomBytes) {
  std::mt19937 rng(12345);
  const IcrcFlow flow = test_flow();
  const auto listed = listed_opcodes();
  int ok = 0;
  for (int iter = 0; iter < 100000; ++iter) {
    Bytes in(rng() % 80);
    for (auto& b : in) b = static_cast<std::uint8_t>(rng());
    // Steer most inputs past the first checks so deeper paths get exercised.
    if (in.size() >= 2 && (iter % 4) != 0) {
      in[0] = listed[rng() % listed.size()];
      in[1] &= 0xF0;
    }
    PacketView v;
    const ParseError e = parse(in, v);
    if (e == ParseError::ok) {
      ++ok;
      check_ok_invariants(in, v);
    }
    if (iter % 16 == 0) {
      if (parse(in, v, flow) == ParseError::ok) check_ok_invariants(in, v);
    }
  }
  EXPECT_GT(ok, 1000);  // the steering works
}

TEST(TransportParseHostile, BitFlipsOfValidPackets) {
  std::mt19937 rng(99);
  const IcrcFlow flow = test_flow();
  for (auto op : supported_opcodes()) {
    const Bytes good = build_packet(random_headers(rng, op),
                                    Bytes(opcode_info(op).has_payload ? 9 : 0, 0x33), &flow);
    for (std::size_t i = 0; i < good.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes bad = good;
        bad[i] ^= static_cast<std::uint8_t>(1u << bit);
        PacketView v;
        const ParseError e = parse(bad, v, flow);
        // Byte 4 of the BTH is outside the ICRC; every other flip is caught.
        if (i == 4) {
          EXPECT_EQ(e, ParseError::ok);
        } else {
          EXPECT_EQ(e, ParseError::icrc_mismatch) << opcode_info(op).name << " byte " << i;
        }
        if (parse(bad, v) == ParseError::ok) check_ok_invariants(bad, v);
      }
    }
  }
}

}  // namespace
}  // namespace softverbs::wire

// Packets sent in pieces (fabric::Link::send_gathered: the headers encoded,
// the payload straight from registered memory, no ICRC, as into a same-host
// ring) between two emulated devices on virtual time
// (tests/unit/qp_harness.hpp): each is byte for byte the packet the QP would
// have built, but for its ICRC field, which is 0; and over a link that does
// not take pieces every packet is still built whole, with its ICRC.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tests/unit/qp_harness.hpp"
#include "wire/packet.hpp"

namespace softverbs::emu {
namespace {

using harness::Bytes;
using harness::Packet;
using harness::RcPair;

constexpr int kA = 0;  // the requester
constexpr int kB = 1;  // the responder

// The packet build() writes for what `p` parses to, with its ICRC computed
// for the flow between the two devices.
Bytes rebuilt(RcPair& pair, const Packet& p, int from) {
  wire::PacketView v;
  EXPECT_EQ(wire::parse(p.bytes, v), wire::ParseError::ok);
  const wire::IcrcFlow flow{pair.dev(from).flow(pair.dev(from).addr(), pair.dev(1 - from).addr())};
  Bytes out(p.bytes.size() + 64);
  out.resize(wire::build(v, v.payload, out, &flow));
  return out;
}

// A SEND of 2500 bytes (three packets at the 1024-byte MTU) and an RDMA READ
// of 1500 (two response packets), with their ACKs, both ways in pieces or not.
TEST(QpGathered, APacketInPiecesIsTheBuiltPacketWithoutItsIcrc) {
  for (bool pieces : {false, true}) {
    SCOPED_TRACE(pieces ? "in pieces" : "built");
    RcPair pair;
    pair.wire(kA).take_gathered = pieces;
    pair.wire(kB).take_gathered = pieces;
    Bytes& a = pair.end(kA).buf;
    Bytes& b = pair.end(kB).buf;
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7 + 3);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 5 + 1);
    const Bytes source = b;
    ASSERT_EQ(pair.post_recv(kB, 4096, 1), 0);
    ASSERT_EQ(pair.post_send(kA, 2500, 2), 0);
    // The READ: 1500 bytes of B's first half into A's second half.
    ibv_sge sge{reinterpret_cast<uintptr_t>(a.data() + a.size() / 2), 1500, pair.end(kA).mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 3;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b.data());
    wr.wr.rdma.rkey = pair.end(kB).mr->rkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(pair.qp(kA), &wr, &bad), 0);
    pair.settle();

    const std::vector<ibv_wc> at_a = pair.poll(kA), at_b = pair.poll(kB);
    ASSERT_EQ(at_a.size(), 2u);
    ASSERT_EQ(at_b.size(), 1u);
    for (const ibv_wc& wc : at_a) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(at_b[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(at_b[0].byte_len, 2500u);
    EXPECT_EQ(std::memcmp(a.data(), b.data() + b.size() / 2, 2500), 0);
    EXPECT_EQ(std::memcmp(a.data() + a.size() / 2, source.data(), 1500), 0);

    size_t requests = 0, responses = 0;
    for (int from : {kA, kB}) {
      for (const Packet& p : pair.wire(from).sent) {
        EXPECT_EQ(p.gathered, pieces);
        (p.is_request() ? requests : responses) += 1;
        const Bytes whole = rebuilt(pair, p, from);
        ASSERT_EQ(whole.size(), p.bytes.size());
        if (!pieces) {
          EXPECT_EQ(p.bytes, whole);  // built, with its ICRC
          continue;
        }
        const size_t icrc_at = whole.size() - wire::kIcrcBytes;
        EXPECT_TRUE(std::equal(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(icrc_at), p.bytes.begin()))
            << p.op->name;
        EXPECT_TRUE(std::all_of(p.bytes.begin() + static_cast<std::ptrdiff_t>(icrc_at), p.bytes.end(),
                                [](uint8_t x) { return x == 0; }));
      }
    }
    EXPECT_EQ(requests, 4u);    // three SEND packets, one READ request
    EXPECT_GE(responses, 3u);   // the READ's two responses, at least one ACK
  }
}

}  // namespace
}  // namespace softverbs::emu

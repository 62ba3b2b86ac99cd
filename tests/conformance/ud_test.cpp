// The unreliable datagram service (IBTA 9.8.4, 10.2.5): two UD QPs of the device,
// addressed through an address handle of its own port.
#include <arpa/inet.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "conformance.hpp"

// Exported by libibverbs (IBVERBS_1.0) and declared in rdma-core's
// <infiniband/driver.h>, the providers' header, which is not included here.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace conformance {
namespace {

constexpr uint32_t kQkey = 0x11111111;  // valid_attr()'s
constexpr uint32_t kGrh = 40;

class UdTest : public VerbsCqTest {
 protected:
  void SetUp() override {
    VerbsCqTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (Qp* q : {&a_, &b_}) {
      *q = make_qp(IBV_QPT_UD, cq_.get());
      ASSERT_TRUE(*q);
      ASSERT_EQ(move_to(q->get(), IBV_QPS_RTS), 0);
    }
    buf_.assign(64 * 1024, 0);
    mr_ = Mr(ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE));
    ASSERT_TRUE(mr_);
    ibv_ah_attr attr = loopback_ah_attr();
    ah_ = Ah(ibv_create_ah(pd_, &attr));
    ASSERT_TRUE(ah_) << std::strerror(errno);
  }

  void TearDown() override {
    a_.reset();
    b_.reset();
    ah_.reset();
    mr_.reset();
    VerbsCqTest::TearDown();
  }

  // Posts a receive of `len` bytes at offset 32 KiB of the buffer.
  void post_recv(ibv_qp* qp, uint32_t len, uint64_t wr_id) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()) + 32 * 1024, len, mr_->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(ibv_post_recv(qp, &wr, &bad), 0);
  }

  // Sends `len` bytes from offset 0 of the buffer to `to`.
  int send(ibv_qp* from, ibv_qp* to, uint32_t len, uint64_t wr_id, uint32_t qkey = kQkey, bool imm = false,
           ibv_ah* ah = nullptr) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), len, mr_->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
    wr.imm_data = htonl(0xabcd1234);
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.ud.ah = ah ? ah : ah_.get();
    wr.wr.ud.remote_qpn = to->qp_num;
    wr.wr.ud.remote_qkey = qkey;
    return ibv_post_send(from, &wr, &bad);
  }

  // The completion of wr_id, already collected or the next to arrive within the
  // timeout (completions of other work requests are collected meanwhile).
  bool wait_for(uint64_t wr_id, ibv_wc* out, int ms = kEventTimeoutMs) {
    for (auto it = others_.begin(); it != others_.end(); ++it) {
      if (it->wr_id != wr_id) continue;
      *out = *it;
      others_.erase(it);
      return true;
    }
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    do {
      ibv_wc wc;
      while (ibv_poll_cq(cq_.get(), 1, &wc) == 1) {
        if (wc.wr_id == wr_id) {
          *out = wc;
          return true;
        }
        others_.push_back(wc);
      }
    } while (std::chrono::steady_clock::now() < end);
    return false;
  }

  Qp a_, b_;
  Mr mr_;
  Ah ah_;
  std::vector<uint8_t> buf_;
  std::vector<ibv_wc> others_;
};
CONFORMANCE_INSTANTIATE(UdTest);

// A SEND and a SEND with immediate: the receive holds 40 bytes of GRH area, then
// the payload; the completion names the sending QP; on RoCE the GRH area holds
// the IPv4 header the datagram came with, which ibv_init_ah_from_wc turns into an
// address handle back to the sender.
TEST_P(UdTest, SendsArriveAfterTheGrhWithTheSourceQp) {
  for (bool imm : {false, true}) {
    SCOPED_TRACE(imm ? "SEND with immediate" : "SEND");
    for (uint32_t i = 0; i < 512; ++i) buf_[i] = static_cast<uint8_t>(i * 7 + imm);
    std::memset(buf_.data() + 32 * 1024, 0xee, 1024);
    ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + 512, 200 + imm));
    ASSERT_EQ(send(a_.get(), b_.get(), 512, 100 + imm, kQkey, imm), 0);
    ibv_wc wc{};
    ASSERT_TRUE(wait_for(100 + imm, &wc)) << "no send completion";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
    ASSERT_TRUE(wait_for(200 + imm, &wc)) << "no receive completion";
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.byte_len, kGrh + 512);
    EXPECT_EQ(wc.qp_num, b_->qp_num);
    EXPECT_EQ(wc.src_qp, a_->qp_num);
    EXPECT_EQ((wc.wc_flags & IBV_WC_WITH_IMM) != 0, imm);
    if (imm) {
      EXPECT_EQ(ntohl(wc.imm_data), 0xabcd1234u);
    }
    EXPECT_EQ(std::memcmp(buf_.data() + 32 * 1024 + kGrh, buf_.data(), 512), 0) << "payload not after the GRH";
    EXPECT_EQ(buf_[32 * 1024 + kGrh + 512], 0xee) << "written past the payload";
    observe("recv.IBV_WC_GRH", (wc.wc_flags & IBV_WC_GRH) ? "set" : "clear");
    if (is_ethernet()) {
      EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH) << "RoCE datagrams carry a GRH";
      ibv_ah_attr back{};
      ASSERT_EQ(ibv_init_ah_from_wc(ctx_, kPort, &wc, reinterpret_cast<ibv_grh*>(buf_.data() + 32 * 1024), &back), 0)
          << std::strerror(errno);
      EXPECT_EQ(back.is_global, 1);
      EXPECT_EQ(std::memcmp(back.grh.dgid.raw, sgid_.raw, 16), 0) << "the reply address is not the sender's";
    } else {
      EXPECT_EQ(wc.slid, pattr_.lid) << "the sender's LID";
    }
  }
}

// The traffic class a datagram is sent with (its AH's, the IPv4 TOS byte on
// RoCEv2) shows on the receiving side in the IPv4 header of the GRH area, with
// the TTL it arrived with (the hop limit) and a zero first word (no flow label,
// as rxe writes it). ibv_init_ah_from_wc reads them back into the reply's
// address, so a reply through ibv_create_ah_from_wc carries the same class.
TEST_P(UdTest, TrafficClassArrivesInTheGrhAndGoesBackThroughTheWcAh) {
  if (!is_ethernet()) GTEST_SKIP() << "no GRH on an InfiniBand port's emulated wire";
  ibv_ah_attr attr = loopback_ah_attr();
  attr.grh.traffic_class = 0xb8;  // DSCP 46 (expedited forwarding), ECN 0
  Ah tc_ah(ibv_create_ah(pd_, &attr));
  ASSERT_TRUE(tc_ah) << std::strerror(errno);
  uint8_t* grh = buf_.data() + 32 * 1024;
  std::memset(grh, 0xee, kGrh + 64);
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + 64, 300));
  ASSERT_EQ(send(a_.get(), b_.get(), 64, 301, kQkey, false, tc_ah.get()), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(300, &wc)) << "no receive completion";
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(wc.wc_flags & IBV_WC_GRH);
  observe("recv.grh.tos", std::to_string(grh[21]));
  observe("recv.grh.ttl", std::to_string(grh[28]));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(grh[i], 0) << "GRH byte " << i << " (before the IPv4 header)";
  EXPECT_EQ(grh[20], 0x45) << "IPv4, 20-byte header";
  EXPECT_EQ(grh[21], 0xb8) << "the TOS byte is the sender's traffic class";
  EXPECT_EQ(grh[28], 64) << "the TTL the datagram arrived with";
  ibv_ah_attr back{};
  ASSERT_EQ(ibv_init_ah_from_wc(ctx_, kPort, &wc, reinterpret_cast<ibv_grh*>(grh), &back), 0) << std::strerror(errno);
  EXPECT_EQ(back.grh.traffic_class, 0xb8);
  EXPECT_EQ(back.grh.hop_limit, 64);
  EXPECT_EQ(back.grh.flow_label, 0u);
  // The reply, from b to a through the address made from the completion.
  Ah reply(ibv_create_ah_from_wc(pd_, &wc, reinterpret_cast<ibv_grh*>(grh), kPort));
  ASSERT_TRUE(reply) << std::strerror(errno);
  ASSERT_TRUE(wait_for(301, &wc)) << "no send completion";
  std::memset(grh, 0xee, kGrh + 64);
  ASSERT_NO_FATAL_FAILURE(post_recv(a_.get(), kGrh + 64, 302));
  ASSERT_EQ(send(b_.get(), a_.get(), 64, 303, kQkey, false, reply.get()), 0);
  ASSERT_TRUE(wait_for(302, &wc)) << "no receive completion of the reply";
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(grh[21], 0xb8) << "the reply's traffic class";
  ASSERT_TRUE(wait_for(303, &wc));
  // Traffic class 0 arrives as 0 (no class left over from another datagram).
  std::memset(grh, 0xee, kGrh + 64);
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + 64, 304));
  ASSERT_EQ(send(a_.get(), b_.get(), 64, 305), 0);
  ASSERT_TRUE(wait_for(304, &wc));
  EXPECT_EQ(grh[21], 0);
  ASSERT_TRUE(wait_for(305, &wc));
}

// The port counters a device shows in sysfs (ports/1/counters, rxe's
// ports/1/hw_counters), read through ibv_read_sysfs_file: one datagram is one
// packet each way and its octets in 4-octet words (IPv4 and UDP headers, BTH,
// DETH, payload, ICRC), one send and one receive completed. Skipped where the
// device has no such files (a real device without a sysfs view in the test).
TEST_P(UdTest, PortCountersCountTheDatagram) {
  const std::string port = std::string(device_->ibdev_path) + "/ports/1/";
  auto read = [&](const char* dir, const char* name, uint64_t* out) {
    char buf[64] = {};
    if (ibv_read_sysfs_file((port + dir).c_str(), name, buf, sizeof buf) <= 0) return false;
    *out = std::strtoull(buf, nullptr, 10);
    return true;
  };
  struct Snapshot {
    uint64_t xmit_packets, rcv_packets, xmit_data, rcv_data, sends, recvs;
  };
  auto snapshot = [&](Snapshot* s) {
    return read("counters", "port_xmit_packets", &s->xmit_packets) &&
           read("counters", "port_rcv_packets", &s->rcv_packets) && read("counters", "port_xmit_data", &s->xmit_data) &&
           read("counters", "port_rcv_data", &s->rcv_data) && read("hw_counters", "rdma_sends", &s->sends) &&
           read("hw_counters", "rdma_recvs", &s->recvs);
  };
  Snapshot before{}, after{};
  if (!snapshot(&before)) GTEST_SKIP() << "no counter files under " << port;
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + 512, 400));
  ASSERT_EQ(send(a_.get(), b_.get(), 512, 401), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(401, &wc));
  ASSERT_TRUE(wait_for(400, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(snapshot(&after));
  // 20 (IPv4) + 8 (UDP) + 12 (BTH) + 8 (DETH) + 512 + 4 (ICRC) octets.
  constexpr uint64_t kWords = (20 + 8 + 12 + 8 + 512 + 4) / 4;
  EXPECT_EQ(after.xmit_packets - before.xmit_packets, 1u);
  EXPECT_EQ(after.rcv_packets - before.rcv_packets, 1u);
  EXPECT_EQ(after.xmit_data - before.xmit_data, kWords);
  EXPECT_EQ(after.rcv_data - before.rcv_data, kWords);
  EXPECT_EQ(after.sends - before.sends, 1u);
  EXPECT_EQ(after.recvs - before.recvs, 1u);
}

// A datagram whose Q_Key is not the receiving QP's is dropped silently: no
// receive completion, the receive WQE stays posted for the next datagram. A Q_Key
// with the high-order bit set in the work request means the sender QP's own.
TEST_P(UdTest, QkeyMismatchIsDroppedAndTheHighBitMeansTheQpsOwn) {
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + 64, 200));
  ASSERT_EQ(send(a_.get(), b_.get(), 64, 100, kQkey + 1), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(100, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "a datagram sender does not learn of the drop";
  EXPECT_FALSE(wait_for(200, &wc, 200)) << "a datagram with a wrong Q_Key was received";
  ASSERT_EQ(send(a_.get(), b_.get(), 64, 101, 0x80000000u), 0);
  ASSERT_TRUE(wait_for(200, &wc)) << "the QP's own Q_Key (high bit set) was not used";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// Without a posted receive a datagram is lost (UD has no RNR); a receive posted
// later takes the next one.
TEST_P(UdTest, NoReceiveLosesTheDatagram) {
  ASSERT_EQ(send(a_.get(), b_.get(), 64, 100), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(100, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + 64, 200));
  EXPECT_FALSE(wait_for(200, &wc, 200)) << "a datagram sent before the receive was posted arrived";
  ASSERT_EQ(send(a_.get(), b_.get(), 64, 101), 0);
  ASSERT_TRUE(wait_for(200, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
}

// A receive buffer without room for the GRH and the payload: the datagram is
// discarded silently, like one that finds no receive WQE (UD reports nothing it
// cannot deliver; ConnectX drops it), the WQE stays posted and takes the next
// datagram that fits, and the QP stays in RTS.
TEST_P(UdTest, ReceiveTooSmallForGrhAndPayloadDropsTheDatagram) {
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), 64, 200));  // 64 < 40 + 64
  ASSERT_EQ(send(a_.get(), b_.get(), 64, 100), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(100, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "a datagram sender does not learn of the drop";
  EXPECT_FALSE(wait_for(200, &wc, 200)) << "a datagram larger than the receive buffer completed";
  ASSERT_EQ(send(a_.get(), b_.get(), 24, 101), 0);  // 40 + 24 fits
  ASSERT_TRUE(wait_for(200, &wc)) << "the receive WQE did not stay posted";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.byte_len, kGrh + 24);
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(b_.get(), &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTS);
}

// A datagram larger than the path MTU cannot be sent: refused at post time or
// completed in error, never delivered (recorded).
TEST_P(UdTest, DatagramLargerThanTheMtu) {
  const uint32_t mtu = 128u << pattr_.active_mtu;
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + mtu + 64, 200));
  const int rc = send(a_.get(), b_.get(), mtu + 1, 100);
  if (rc != 0) {
    observe("ud.larger_than_mtu", "post:" + errno_name(rc));
    return;
  }
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(100, &wc));
  observe("ud.larger_than_mtu", ibv_wc_status_str(wc.status));
  EXPECT_NE(wc.status, IBV_WC_SUCCESS);
  EXPECT_FALSE(wait_for(200, &wc, 200)) << "a datagram larger than the MTU was delivered";
}

// GID index 0 of a RoCE port is its link-local GID (fe80::/64, RoCE v2): an
// address handle from it to it reaches the port as the IPv4-mapped one does.
TEST_P(UdTest, LinkLocalGidAddressHandleDelivers) {
  if (!is_ethernet()) GTEST_SKIP() << "InfiniBand port";
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(ctx_, kPort, 0, &e, 0), 0);
  if (e.gid.raw[0] != 0xfe || (e.gid.raw[1] & 0xc0) != 0x80) GTEST_SKIP() << "GID 0 is not link-local";
  ibv_ah_attr attr = loopback_ah_attr();
  attr.grh.dgid = e.gid;
  attr.grh.sgid_index = 0;
  ah_ = Ah(ibv_create_ah(pd_, &attr));
  ASSERT_TRUE(ah_) << std::strerror(errno);
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), 256 + kGrh, 1));
  std::memset(buf_.data(), 0x5a, 256);
  ASSERT_EQ(send(a_.get(), b_.get(), 256, 2), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(2, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(wait_for(1, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.byte_len, 256 + kGrh);
  EXPECT_EQ(wc.src_qp, a_->qp_num);
  EXPECT_EQ(buf_[32 * 1024 + kGrh], 0x5a);
}

// An address handle of another PD of the context: ConnectX copies the address
// vector into the work request and sends the datagram (rxe fails it with
// IBV_WC_LOC_QP_OP_ERR); emulated devices do as ConnectX.
TEST_P(UdTest, AddressHandleOfAnotherPdIsUsed) {
  Pd other(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(other);
  ibv_ah_attr attr = loopback_ah_attr();
  Ah foreign(ibv_create_ah(other.get(), &attr));
  ASSERT_TRUE(foreign);
  ASSERT_NO_FATAL_FAILURE(post_recv(b_.get(), kGrh + 64, 200));
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 8, mr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = 100;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.ud.ah = foreign.get();
  wr.wr.ud.remote_qpn = b_->qp_num;
  wr.wr.ud.remote_qkey = kQkey;
  const int rc = ibv_post_send(a_.get(), &wr, &bad);
  observe("ud.foreign_pd_ah", rc ? "post:" + errno_name(rc) : std::string("accepted"));
  ASSERT_EQ(rc, 0) << "an address handle of another PD was refused";
  ibv_wc wc{};
  ASSERT_TRUE(wait_for(100, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  ASSERT_TRUE(wait_for(200, &wc)) << "the datagram did not arrive";
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.byte_len, kGrh + 8);
}

// An RDMA or atomic opcode on a UD QP: ConnectX posts it and completes it with
// IBV_WC_LOC_QP_OP_ERR (so does rxe); the QP then leaves RTS and the work
// requests behind it are flushed.
TEST_P(UdTest, OpcodeOfAnotherServiceCompletesInError) {
  for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    SCOPED_TRACE("opcode " + std::to_string(op));
    Qp qp = make_qp(IBV_QPT_UD, cq_.get());
    ASSERT_TRUE(qp);
    ASSERT_EQ(move_to(qp.get(), IBV_QPS_RTS), 0);
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf_.data()), 8, mr_->lkey};
    ibv_send_wr wr[2]{};
    for (int i = 0; i < 2; ++i) {
      wr[i].wr_id = 300 + static_cast<uint64_t>(i);
      wr[i].opcode = i == 0 ? op : IBV_WR_SEND;
      wr[i].send_flags = IBV_SEND_SIGNALED;
      wr[i].sg_list = &sge;
      wr[i].num_sge = 1;
      wr[i].wr.ud.ah = ah_.get();
      wr[i].wr.ud.remote_qpn = b_->qp_num;
      wr[i].wr.ud.remote_qkey = kQkey;
    }
    wr[0].next = &wr[1];
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(qp.get(), wr, &bad), 0);
    ibv_wc wc{};
    ASSERT_TRUE(wait_for(300, &wc));
    EXPECT_EQ(wc.status, IBV_WC_LOC_QP_OP_ERR) << ibv_wc_status_str(wc.status);
    ASSERT_TRUE(wait_for(301, &wc));
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << ibv_wc_status_str(wc.status);
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(ibv_query_qp(qp.get(), &attr, IBV_QP_STATE, &init), 0);
    EXPECT_TRUE(attr.qp_state == IBV_QPS_ERR || attr.qp_state == IBV_QPS_SQE) << qp_state_name(attr.qp_state);
  }
}

}  // namespace
}  // namespace conformance

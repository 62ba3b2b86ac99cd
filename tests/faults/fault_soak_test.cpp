// Reliable-connection soak under packet loss, duplication and reordering: two
// RC QPs on two emulated devices of this process exchange a mix of SEND, RDMA
// WRITE with immediate, RDMA READ and FETCH_ADD in both directions while the
// fault layer drops 5 %, duplicates 1 % and reorders 1 % of all packets. Every
// message must arrive exactly once, in order, with its contents; every posted
// request must complete exactly once, successfully, in order; atomics must be
// exact.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <softverbs/faults.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/faults/rc_pair.hpp"

namespace {

constexpr uint32_t kMsg = 3000;      // bytes per SEND / WRITE / READ: three packets at MTU 1024
constexpr int kDepth = 8;            // outstanding requests per direction
constexpr int kSlots = 16;           // receive buffers per side
constexpr uint32_t kPsn = 0xfffff0;  // start near the 24-bit wrap

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  std::vector<uint8_t> send_buf, recv_buf, target, read_src, read_dst;
  uint64_t counter = 0;  // the peer's FETCH_ADD target
  uint64_t fetched = 0;
  ibv_mr *send_mr = nullptr, *recv_mr = nullptr, *target_mr = nullptr, *read_src_mr = nullptr, *read_dst_mr = nullptr,
         *counter_mr = nullptr, *fetched_mr = nullptr;
  ibv_gid gid{};
  // progress
  uint64_t posted = 0, completed = 0, received = 0, recv_posted = 0, fetch_adds = 0;
};

uint8_t pattern(uint64_t seq, uint32_t i) { return static_cast<uint8_t>(seq * 131 + i * 7 + 1); }

class FaultSoak : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GE(list_.size(), 2) << "needs two emulated devices (SOFTVERBS_DEVICES=fa,fb)";
    open(a_, list_[0]);
    open(b_, list_[1]);
    connect(a_, b_);
    connect(b_, a_);
  }

  void TearDown() override {
    softverbs_faults_clear();
    for (Side* s : {&a_, &b_}) {
      if (s->qp) ibv_destroy_qp(s->qp);
      for (ibv_mr* m :
           {s->send_mr, s->recv_mr, s->target_mr, s->read_src_mr, s->read_dst_mr, s->counter_mr, s->fetched_mr})
        if (m) ibv_dereg_mr(m);
      if (s->cq) ibv_destroy_cq(s->cq);
      if (s->pd) ibv_dealloc_pd(s->pd);
      if (s->ctx) ibv_close_device(s->ctx);
    }
  }

  void open(Side& s, ibv_device* dev) {
    s.ctx = ibv_open_device(dev);
    ASSERT_NE(s.ctx, nullptr);
    s.pd = ibv_alloc_pd(s.ctx);
    s.cq = ibv_create_cq(s.ctx, 256, nullptr, nullptr, 0);
    ASSERT_NE(s.cq, nullptr);
    softverbs::testkit::QpShape shape;
    shape.max_send_wr = shape.max_recv_wr = 64;
    ibv_qp_init_attr a = softverbs::testkit::qp_init_attr(shape, s.cq, s.cq);
    s.qp = ibv_create_qp(s.pd, &a);
    ASSERT_NE(s.qp, nullptr);
    s.send_buf.assign(kMsg, 0);
    s.recv_buf.assign(static_cast<size_t>(kMsg) * kSlots, 0);
    s.target.assign(static_cast<size_t>(kMsg) * kSlots, 0);
    s.read_src.assign(kMsg, 0);
    for (uint32_t i = 0; i < kMsg; ++i) s.read_src[i] = pattern(777, i);
    s.read_dst.assign(kMsg, 0);
    const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    s.send_mr = ibv_reg_mr(s.pd, s.send_buf.data(), kMsg, 0);
    s.recv_mr = ibv_reg_mr(s.pd, s.recv_buf.data(), s.recv_buf.size(), IBV_ACCESS_LOCAL_WRITE);
    s.target_mr = ibv_reg_mr(s.pd, s.target.data(), s.target.size(), rw);
    s.read_src_mr = ibv_reg_mr(s.pd, s.read_src.data(), kMsg, rw);
    s.read_dst_mr = ibv_reg_mr(s.pd, s.read_dst.data(), kMsg, IBV_ACCESS_LOCAL_WRITE);
    s.counter_mr = ibv_reg_mr(s.pd, &s.counter, 8, rw | IBV_ACCESS_REMOTE_ATOMIC);
    s.fetched_mr = ibv_reg_mr(s.pd, &s.fetched, 8, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_TRUE(s.send_mr && s.recv_mr && s.target_mr && s.read_src_mr && s.read_dst_mr && s.counter_mr &&
                s.fetched_mr);
    // The IPv4-mapped RoCEv2 GID of the device (index 1 on an emulated port).
    ASSERT_EQ(ibv_query_gid(s.ctx, 1, 1, &s.gid), 0);
  }

  static void connect(Side& s, const Side& peer) {
    faults_test::QpParams p;  // timeout 8 (about 1 ms), retry_cnt 7, rnr_retry 7, min_rnr_timer 1
    p.psn = kPsn;
    ASSERT_NO_FATAL_FAILURE(faults_test::connect_rc(s.qp, peer.qp->qp_num, peer.gid, p));
  }

  static void post_recv(Side& s) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(s.recv_buf.data()) + (s.recv_posted % kSlots) * kMsg, kMsg,
                s.recv_mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = s.recv_posted;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(ibv_post_recv(s.qp, &wr, &bad), 0);
    ++s.recv_posted;
  }

  // Operation i of a side: SEND, WRITE_WITH_IMM, READ, FETCH_ADD in turn.
  static void post_op(Side& s, const Side& peer) {
    const uint64_t i = s.posted;
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    ibv_sge sge{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    switch (i % 4) {
      case 0:
      case 1:
        // The payload is a function of the operation's number, so the receiver can
        // tell which message it got and whether it is intact.
        for (uint32_t k = 0; k < kMsg; ++k) s.send_buf[k] = pattern(i, k);
        sge = {reinterpret_cast<uintptr_t>(s.send_buf.data()), kMsg, s.send_mr->lkey};
        if (i % 4 == 0) {
          wr.opcode = IBV_WR_SEND;
        } else {
          wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
          wr.imm_data = htonl(static_cast<uint32_t>(i));
          wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(peer.target.data()) + (i % kSlots) * kMsg;
          wr.wr.rdma.rkey = peer.target_mr->rkey;
        }
        break;
      case 2:
        sge = {reinterpret_cast<uintptr_t>(s.read_dst.data()), kMsg, s.read_dst_mr->lkey};
        wr.opcode = IBV_WR_RDMA_READ;
        wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(peer.read_src.data());
        wr.wr.rdma.rkey = peer.read_src_mr->rkey;
        break;
      default:
        sge = {reinterpret_cast<uintptr_t>(&s.fetched), 8, s.fetched_mr->lkey};
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(&peer.counter);
        wr.wr.atomic.rkey = peer.counter_mr->rkey;
        wr.wr.atomic.compare_add = 1;
        ++s.fetch_adds;
        break;
    }
    ASSERT_EQ(ibv_post_send(s.qp, &wr, &bad), 0);
    ++s.posted;
  }

  // Runs `ops` operations per direction under the scenario.
  void run(uint64_t ops, const std::string& scenario, std::chrono::seconds limit) {
    char err[256] = {};
    ASSERT_EQ(softverbs_faults_load(scenario.c_str(), err, sizeof err), 0) << err;
    for (Side* s : {&a_, &b_})
      for (int k = 0; k < kSlots; ++k) ASSERT_NO_FATAL_FAILURE(post_recv(*s));
    // Messages that consume a receive: ops with i % 4 == 0 or 1.
    const uint64_t expected_recvs = (ops + 3) / 4 + (ops + 2) / 4;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (a_.completed < ops || b_.completed < ops || a_.received < expected_recvs || b_.received < expected_recvs) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline)
          << "no progress: A " << a_.completed << "/" << a_.received << ", B " << b_.completed << "/" << b_.received;
      for (auto [s, peer] : {std::pair<Side*, Side*>{&a_, &b_}, {&b_, &a_}}) {
        // One request in flight at a time keeps each buffer's contents defined
        // while it is on the wire; the window still fills with retransmissions.
        while (s->posted < ops && s->posted - s->completed < 1) ASSERT_NO_FATAL_FAILURE(post_op(*s, *peer));
        ibv_wc wc[16];
        int n = ibv_poll_cq(s->cq, 16, wc);
        ASSERT_GE(n, 0);
        for (int k = 0; k < n; ++k) {
          ASSERT_EQ(wc[k].status, IBV_WC_SUCCESS)
              << ibv_wc_status_str(wc[k].status) << " wr_id " << wc[k].wr_id << " opcode " << wc[k].opcode;
          if (wc[k].opcode & IBV_WC_RECV) {
            // Receives complete in posting order, each exactly once.
            ASSERT_EQ(wc[k].wr_id, s->received);
            const uint64_t seq = s->received;  // the peer's op number: 2 receives per 4 ops
            const uint64_t op = (seq / 2) * 4 + (seq % 2);
            if (wc[k].opcode == IBV_WC_RECV) {
              ASSERT_EQ(op % 4, 0u);
              ASSERT_EQ(wc[k].byte_len, kMsg);
              const uint8_t* got = s->recv_buf.data() + (wc[k].wr_id % kSlots) * kMsg;
              for (uint32_t b = 0; b < kMsg; ++b) ASSERT_EQ(got[b], pattern(op, b)) << "SEND " << op << " byte " << b;
            } else {
              ASSERT_EQ(wc[k].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
              ASSERT_EQ(ntohl(wc[k].imm_data), op);
              const uint8_t* got = s->target.data() + (op % kSlots) * kMsg;
              for (uint32_t b = 0; b < kMsg; ++b) ASSERT_EQ(got[b], pattern(op, b)) << "WRITE " << op << " byte " << b;
            }
            ++s->received;
            ASSERT_NO_FATAL_FAILURE(post_recv(*s));
          } else {
            // Requests complete in posting order, each exactly once.
            ASSERT_EQ(wc[k].wr_id, s->completed);
            if (wc[k].opcode == IBV_WC_RDMA_READ) {
              ASSERT_EQ(std::memcmp(s->read_dst.data(), peer->read_src.data(), kMsg), 0);
              std::memset(s->read_dst.data(), 0, kMsg);
            }
            if (wc[k].opcode == IBV_WC_FETCH_ADD) {
              // One fetch-and-add in flight at a time: the old value counts them.
              ASSERT_EQ(s->fetched, s->fetch_adds - 1);
            }
            ++s->completed;
          }
        }
      }
    }
    EXPECT_EQ(a_.counter, b_.fetch_adds);
    EXPECT_EQ(b_.counter, a_.fetch_adds);
    softverbs_counters ca{}, cb{};
    softverbs_device_counters(list_.name(0).c_str(), &ca, sizeof ca);
    softverbs_device_counters(list_.name(1).c_str(), &cb, sizeof cb);
    // The faults really happened, and the transport really recovered from them.
    EXPECT_GT(ca.faults_dropped + cb.faults_dropped, 0u);
    EXPECT_GT(ca.retransmits + cb.retransmits, 0u);
    RecordProperty("retransmits", std::to_string(ca.retransmits + cb.retransmits));
    RecordProperty("timeouts", std::to_string(ca.timeouts + cb.timeouts));
  }

  softverbs::testkit::DeviceList list_;
  Side a_, b_;
};

const char* kLossy =
    "seed = 11\n"
    "[[rule]]\nname = \"drop\"\nprobability = 0.05\naction = \"drop\"\n"
    "[[rule]]\nname = \"dup\"\nprobability = 0.01\naction = \"duplicate\"\n"
    "[[rule]]\nname = \"reorder\"\nprobability = 0.01\naction = \"reorder\"\n";

TEST_F(FaultSoak, EveryOperationExactlyOnceUnderLossDuplicationReordering) {
  run(2000, kLossy, std::chrono::seconds(240));
  EXPECT_GT(softverbs_fault_hits("drop"), 0u);
  EXPECT_GT(softverbs_fault_hits("dup"), 0u);
  EXPECT_GT(softverbs_fault_hits("reorder"), 0u);
}

TEST_F(FaultSoak, LongMillionOperations) { run(500000, kLossy, std::chrono::seconds(3000)); }

}  // namespace

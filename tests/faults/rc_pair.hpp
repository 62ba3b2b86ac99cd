// Two connected RC QPs on the two emulated devices of the test process
// (SOFTVERBS_DEVICES=fa,fb), with bounded waits for completions and events.
#pragma once

#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <softverbs/faults.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/support/connect.hpp"
#include "tests/support/verbs.hpp"
#include "tests/support/wait.hpp"

namespace faults_test {

constexpr int kWaitMs = 10000;  // generous: a hang fails the test, it never waits forever
constexpr size_t kBuf = 64 * 1024;

struct QpParams {
  uint8_t timeout = 8;  // about 1 ms
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  int cq_depth = 64;
  bool with_srq = false;
  uint32_t psn = 0;  // first PSN, both directions
  // Create the QPs with ibv_create_qp_ex and these send ops flags (the ibv_wr_* API).
  uint64_t send_ops_flags = 0;
};

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_srq* srq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(kBuf);
  ibv_gid gid{};
  std::string device;
};

using softverbs::testkit::query_state;

// One completion within ms; false on timeout.
inline bool wait_wc(ibv_cq* cq, ibv_wc* wc, int ms = kWaitMs) { return softverbs::testkit::wait_wc(cq, wc, ms); }

// Reads the next async event within ms (the caller acknowledges it).
inline bool next_event(ibv_context* ctx, ibv_async_event* ev, int ms = kWaitMs) {
  return softverbs::testkit::next_async_event(ctx, ev, ms);
}

// Takes an RC QP from RESET to RTS towards a peer QP of a device with the given
// IPv4-mapped GID (index 1 on an emulated RoCE port), with every remote right,
// path MTU 1024 and 4 RDMA READs or atomics in flight each way.
inline void connect_rc(ibv_qp* qp, uint32_t peer_qpn, const ibv_gid& peer_gid, const QpParams& p) {
  softverbs::testkit::QpPath path;
  path.rq_psn = path.sq_psn = p.psn;
  path.min_rnr_timer = p.min_rnr_timer;
  path.timeout = p.timeout;
  path.retry_cnt = p.retry_cnt;
  path.rnr_retry = p.rnr_retry;
  const softverbs::testkit::Connected r =
      softverbs::testkit::connect_qp(qp, peer_qpn, softverbs::testkit::ah_to_gid(peer_gid), path);
  ASSERT_EQ(r.rc, 0) << r.step;
}

class PairTest : public ::testing::Test {
 protected:
  void TearDown() override {
    softverbs_faults_clear();
    // A port a test took down comes back for the next test of this process.
    for (Side* s : {&a_, &b_})
      if (!s->device.empty()) (void)softverbs_port_set_state(s->device.c_str(), 1, 1);
    for (Side* s : {&a_, &b_}) {
      if (s->qp) ibv_destroy_qp(s->qp);
      if (s->srq) ibv_destroy_srq(s->srq);
      if (s->mr) ibv_dereg_mr(s->mr);
      if (s->cq) ibv_destroy_cq(s->cq);
      if (s->pd) ibv_dealloc_pd(s->pd);
      if (s->ctx) ibv_close_device(s->ctx);
    }
  }

  // Opens both sides and connects them (call from the test, after any
  // scenario that must see the setup).
  void setup(const QpParams& p = {}) {
    ASSERT_GE(list_.size(), 2) << "needs two emulated devices (SOFTVERBS_DEVICES=fa,fb)";
    for (int i = 0; i < 2; ++i) {
      Side& s = i ? b_ : a_;
      s.device = list_.name(i);
      s.ctx = ibv_open_device(list_[i]);
      ASSERT_NE(s.ctx, nullptr);
      s.pd = ibv_alloc_pd(s.ctx);
      s.cq = ibv_create_cq(s.ctx, p.cq_depth, nullptr, nullptr, 0);
      ASSERT_TRUE(s.pd && s.cq);
      if (p.with_srq) {
        s.srq = softverbs::testkit::create_srq(s.pd, 16);
        ASSERT_NE(s.srq, nullptr);
      }
      ibv_qp_init_attr a = softverbs::testkit::qp_init_attr({}, s.cq, s.cq, s.srq);
      if (p.send_ops_flags) {
        ibv_qp_init_attr_ex ex{};
        std::memcpy(&ex, &a, sizeof a);  // ibv_qp_init_attr_ex starts with ibv_qp_init_attr's fields
        ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        ex.pd = s.pd;
        ex.send_ops_flags = p.send_ops_flags;
        s.qp = ibv_create_qp_ex(s.ctx, &ex);
      } else {
        s.qp = ibv_create_qp(s.pd, &a);
      }
      ASSERT_NE(s.qp, nullptr);
      s.mr = ibv_reg_mr(
          s.pd, s.buf.data(), kBuf,
          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
      ASSERT_NE(s.mr, nullptr);
      ASSERT_EQ(ibv_query_gid(s.ctx, 1, 1, &s.gid), 0);
    }
    ASSERT_NO_FATAL_FAILURE(connect(a_, b_, p));
    ASSERT_NO_FATAL_FAILURE(connect(b_, a_, p));
  }

  static void connect(Side& s, const Side& peer, const QpParams& p) {
    ASSERT_NO_FATAL_FAILURE(connect_rc(s.qp, peer.qp->qp_num, peer.gid, p));
  }

  // Posts one work request from s's buffer at `offset` (to the peer's at the
  // same offset for RDMA); returns ibv_post_send's result.
  static int post(Side& s, const Side& peer, ibv_wr_opcode op, uint32_t len, uint64_t wr_id = 1, uint32_t lkey = 0,
                  uint32_t rkey = 0, uint64_t offset = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()) + offset, len, lkey ? lkey : s.mr->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(peer.buf.data()) + offset;
      wr.wr.atomic.rkey = rkey ? rkey : peer.mr->rkey;
      wr.wr.atomic.compare_add = 1;
    } else {
      wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(peer.buf.data()) + offset;
      wr.wr.rdma.rkey = rkey ? rkey : peer.mr->rkey;
    }
    return ibv_post_send(s.qp, &wr, &bad);
  }

  // A chain of n signaled RDMA WRITEs of `len` bytes (wr_id 1..n) from s to peer.
  template <size_t N>
  static void write_chain(Side& s, const Side& peer, ibv_sge& sge, ibv_send_wr (&wr)[N], uint32_t len = 64) {
    sge = {reinterpret_cast<uintptr_t>(s.buf.data()), len, s.mr->lkey};
    for (size_t i = 0; i < N; ++i) {
      wr[i] = {};
      wr[i].wr_id = i + 1;
      wr[i].opcode = IBV_WR_RDMA_WRITE;
      wr[i].sg_list = &sge;
      wr[i].num_sge = 1;
      wr[i].send_flags = IBV_SEND_SIGNALED;
      wr[i].wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(peer.buf.data());
      wr[i].wr.rdma.rkey = peer.mr->rkey;
      wr[i].next = i + 1 < N ? &wr[i + 1] : nullptr;
    }
  }

  static int post_recv(Side& s, uint32_t len, uint64_t wr_id = 100, uint32_t lkey = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf.data()), len, lkey ? lkey : s.mr->lkey};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    return s.srq ? ibv_post_srq_recv(s.srq, &wr, &bad) : ibv_post_recv(s.qp, &wr, &bad);
  }

  int load(const std::string& text) {
    char err[256] = {};
    int rc = softverbs_faults_load(text.c_str(), err, sizeof err);
    EXPECT_EQ(rc, 0) << err;
    return rc;
  }

  softverbs::testkit::DeviceList list_;
  Side a_, b_;
};

}  // namespace faults_test

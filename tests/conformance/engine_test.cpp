// Data-path behaviours where an engine may follow the letter of the IBTA or a
// real adapter and applications depend on the adapter's choice: which PD an
// SRQ's receive buffers belong to, what becomes of the receive WQE a failed
// RDMA WRITE with immediate consumed, and the like. The expected outcome is
// ConnectX's (mlx5), or rxe's where both agree.
#include <arpa/inet.h>

#include <chrono>

#include "datapath.hpp"
#include "tests/support/connect.hpp"

namespace conformance {
namespace {

constexpr uint8_t kFill = 0xee;

class EngineTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &src_));
    ASSERT_NO_FATAL_FAILURE(make_region(64 * 1024, kAllAccess, &dst_));
    fill_pattern(src_.data(), src_.size(), 1);
    std::memset(dst_.data(), kFill, dst_.size());
  }
  void TearDown() override {
    src_ = Region{};
    dst_ = Region{};
    DataPathTest::TearDown();
  }

  void post_recvs(ibv_qp* qp, uint64_t first, int n, size_t offset = 0, uint32_t len = 256) {
    for (int i = 0; i < n; ++i) {
      ibv_sge s = dst_.sge(offset + len * static_cast<size_t>(i), len);
      ASSERT_NO_FATAL_FAILURE(post_recv_ok(qp, first + static_cast<uint64_t>(i), &s, 1));
    }
  }

  // Waits (bounded) until qp reaches `state`, without polling its CQs.
  bool wait_state(ibv_qp* qp, ibv_qp_state state) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kCompletionTimeoutMs);
    while (query_state(qp) != state) {
      if (std::chrono::steady_clock::now() > end) return false;
    }
    return true;
  }

  // A UD QP in RTS on the given CQs that sends datagrams to itself: its
  // completions mark the place of another QP's on shared CQs.
  Qp make_marker(ibv_cq* scq, ibv_cq* rcq) {
    ibv_qp_init_attr init = qp_init_attr(IBV_QPT_UD, scq);
    init.recv_cq = rcq;
    Qp qp = make_qp(init);
    if (qp) {
      EXPECT_EQ(move_to(qp.get(), IBV_QPS_RTS), 0);
    }
    return qp;
  }
  // One datagram of the marker QP to itself: wr_id on the send CQ and on the
  // receive CQ (which has the completion channel ch). Returns once the receive
  // completion is queued, without polling it: it raises the armed CQ's event.
  void mark(ibv_qp* qp, ibv_ah* ah, ibv_comp_channel* ch, uint64_t wr_id) {
    ASSERT_EQ(ibv_req_notify_cq(qp->recv_cq, 0), 0);
    ibv_sge rs = dst_.sge(32768 + 128 * (wr_id % 64), 128);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(qp, wr_id, &rs, 1));
    ibv_sge s = src_.sge(0, 16);
    ibv_send_wr w = send_wr(wr_id, IBV_WR_SEND, &s, 1);
    w.wr.ud.ah = ah;
    w.wr.ud.remote_qpn = qp->qp_num;
    w.wr.ud.remote_qkey = 0x11111111;  // valid_attr()'s
    ASSERT_NO_FATAL_FAILURE(post_send_ok(qp, &w));
    ASSERT_TRUE(wait_readable(ch->fd, kCompletionTimeoutMs)) << "no completion event";
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    ASSERT_EQ(ibv_get_cq_event(ch, &cq, &cq_context), 0);
    ibv_ack_cq_events(cq, 1);
    ASSERT_EQ(cq, qp->recv_cq);
  }

  Region src_;
  Region dst_;
};
CONFORMANCE_INSTANTIATE(EngineTest);

// The receive WQEs of an SRQ are posted to the SRQ, so their lkeys are checked
// against the SRQ's PD, not against the PD of the QP that takes them (IBTA
// 10.2.9: an SRQ has a PD of its own; mlx5 and rxe check the SRQ's).
TEST_P(EngineTest, SrqReceiveBuffersBelongToTheSrqsPd) {
  Pd other(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(other);
  Region landing;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &landing, other.get()));
  std::memset(landing.data(), kFill, landing.size());
  ibv_srq_init_attr sattr{};
  sattr.attr.max_wr = 8;
  sattr.attr.max_sge = 1;
  Srq srq(ibv_create_srq(other.get(), &sattr));
  ASSERT_TRUE(srq) << std::strerror(errno);

  PairOptions o{.type = IBV_QPT_RC};
  Endpoint a, b;
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &a));
  b.scq = make_cq(o.cqe);
  b.rcq = make_cq(o.cqe);
  ASSERT_TRUE(b.scq && b.rcq);
  ibv_qp_init_attr init{};
  init.qp_type = IBV_QPT_RC;
  init.send_cq = b.scq.get();
  init.recv_cq = b.rcq.get();
  init.srq = srq.get();
  init.cap.max_send_wr = 4;
  init.cap.max_send_sge = 1;
  b.qp.reset(ibv_create_qp(pd_, &init));
  ASSERT_TRUE(b.qp) << std::strerror(errno);
  ASSERT_NO_FATAL_FAILURE(connect(a, b.qpn(), o, true));
  ASSERT_NO_FATAL_FAILURE(connect(b, a.qpn(), o, false));

  ibv_sge rs = landing.sge(0, 256);
  ibv_recv_wr rwr{};
  rwr.wr_id = 7;
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_srq_recv(srq.get(), &rwr, &bad), 0);
  fill_pattern(src_.data(), 100, 9);
  ibv_sge s = src_.sge(0, 100);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_SEND, a.qpn()));
  wc = expect_wcs(b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(7, IBV_WC_RECV, b.qpn()).len(100));
  EXPECT_EQ(first_pattern_mismatch(landing.data(), 100, 9), -1);
  a.reset();
  b.reset();
}

// An RDMA WRITE with immediate whose R_Key the responder refuses consumes the
// receive WQE it would have completed: that WQE completes with
// IBV_WC_REM_ACCESS_ERR, the ones behind it are flushed (rxe's responder takes
// the WQE before it checks the R_Key and completes it with that status).
TEST_P(EngineTest, WriteWithImmAndBadRkeyConsumesItsReceiveWqeRc) {
  PairOptions o{.type = IBV_QPT_RC};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 40, 2));
  ibv_sge s = src_.sge(0, 64);
  ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE_WITH_IMM, &s, 1);
  w.imm_data = htonl(0x1234);
  w.wr.rdma.remote_addr = dst_.addr(8192);
  w.wr.rdma.rkey = dst_.rkey() ^ 0x80;  // another key variant: names no region
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_REM_ACCESS_ERR, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect::error(40, IBV_WC_REM_ACCESS_ERR, p.b.qpn()));
  check_wc(wc[1], WcExpect::error(41, IBV_WC_WR_FLUSH_ERR, p.b.qpn()));
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
  expect_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_ACCESS_ERR});
  EXPECT_EQ(first_byte_not(dst_.data(), dst_.size(), kFill), -1) << "the target region was modified";
}

// Moving a QP to RESET removes its completions from its CQs, flushes of an
// earlier error included, and so does destroying it; the completions of other
// QPs on the same CQs stay, in order (mlx5 cleans the CQs on both paths).
TEST_P(EngineTest, ResetAndDestroyRemoveTheQpsCompletionsFromItsCqs) {
  Channel ch(ibv_create_comp_channel(ctx_));
  ASSERT_TRUE(ch);
  PairOptions o{.type = IBV_QPT_RC, .rnr_retry = 0, .channel = ch.get()};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  ibv_ah_attr ah_attr = loopback_ah_attr();
  Ah ah(ibv_create_ah(pd_, &ah_attr));
  ASSERT_TRUE(ah) << std::strerror(errno);
  Qp marker = make_marker(p.a.scq.get(), p.a.rcq.get());
  ASSERT_TRUE(marker);

  ASSERT_NO_FATAL_FAILURE(mark(marker.get(), ah.get(), ch.get(), 100));
  // A's send finds no receive at B: RNR with no retry, A goes to ERR and its
  // receives are flushed.
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.a.qp.get(), 10, 2));
  ibv_sge s = src_.sge(0, 32);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ibv_send_wr w2 = send_wr(2, IBV_WR_SEND, &s, 1);
  w.next = &w2;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  ASSERT_TRUE(wait_state(p.a.qp.get(), IBV_QPS_ERR));
  ASSERT_NO_FATAL_FAILURE(mark(marker.get(), ah.get(), ch.get(), 101));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  std::vector<ibv_wc> wc;
  ASSERT_EQ(ibv_modify_qp(p.a.qp.get(), &a, IBV_QP_STATE), 0);
  wc = expect_wcs(p.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  for (size_t i = 0; i < 2; ++i) check_wc(wc[i], WcExpect(100 + i, IBV_WC_SEND, marker->qp_num));
  wc = expect_wcs(p.a.rcq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  for (size_t i = 0; i < 2; ++i) check_wc(wc[i], WcExpect(100 + i, IBV_WC_RECV, marker->qp_num));
  expect_no_wc(p.a.scq.get(), 0);
  expect_no_wc(p.a.rcq.get(), 0);

  // Up again: only new completions. Then a completion of A's is followed by
  // the marker's, and destroying the marker removes its.
  ASSERT_EQ(ibv_modify_qp(p.b.qp.get(), &a, IBV_QP_STATE), 0);
  o.psn_a = 0x300000;
  o.psn_b = 0x400000;
  ASSERT_NO_FATAL_FAILURE(connect(p.a, p.b.qpn(), o, true));
  ASSERT_NO_FATAL_FAILURE(connect(p.b, p.a.qpn(), o, false));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 20, 1, 4096));
  ibv_send_wr w3 = send_wr(3, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w3));
  ASSERT_EQ(expect_wcs(p.b.rcq.get(), 1).size(), 1u);
  ASSERT_NO_FATAL_FAILURE(mark(marker.get(), ah.get(), ch.get(), 103));
  ASSERT_EQ(marker.destroy(), 0);
  wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(3, IBV_WC_SEND, p.a.qpn()));
  expect_no_wc(p.a.scq.get(), 0);
  expect_no_wc(p.a.rcq.get(), 0);
}

// ConnectX accepts work requests on a QP that cannot execute them yet (mlx5
// does not look at the QP state when posting): a receive posted in RESET or
// INIT and sends posted in RESET, INIT and RTR wait in their queues, and the
// sends go out in order once the QP reaches RTS. (SOFTVERBS_POST_BEFORE_RTS=
// refuse makes an emulated device answer EINVAL instead, as rxe does.)
TEST_P(EngineTest, WorkRequestsPostedBeforeRtsRunAtRtsRc) {
  PairOptions o{.type = IBV_QPT_RC};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &p.a));
  ASSERT_NO_FATAL_FAILURE(make_endpoint(o, &p.b));
  namespace tk = softverbs::testkit;
  tk::QpPath pa;
  pa.port = kPort;
  pa.path_mtu = active_mtu();
  pa.rq_psn = o.psn_b;
  pa.sq_psn = o.psn_a;
  tk::QpPath pb = pa;
  pb.rq_psn = o.psn_a;
  pb.sq_psn = o.psn_b;
  const ibv_ah_attr ah = loopback_ah_attr();

  ibv_sge s[3] = {src_.sge(0, 32), src_.sge(64, 32), src_.sge(128, 32)};
  ibv_send_wr w[3] = {send_wr(1, IBV_WR_SEND, &s[0], 1), send_wr(2, IBV_WR_SEND, &s[1], 1),
                      send_wr(3, IBV_WR_SEND, &s[2], 1)};
  ibv_send_wr* bad = nullptr;
  // B: one receive in RESET, two in INIT.
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 10, 1, 0));
  ASSERT_EQ(tk::modify_to_init(p.b.qp.get(), pb), 0);
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 11, 2, 256));
  ASSERT_EQ(tk::modify_to_rtr(p.b.qp.get(), p.a.qpn(), ah, pb), 0);
  ASSERT_EQ(tk::modify_to_rts(p.b.qp.get(), pb), 0);
  // A: one send in each state before RTS.
  EXPECT_EQ(ibv_post_send(p.a.qp.get(), &w[0], &bad), 0) << "RESET";
  ASSERT_EQ(tk::modify_to_init(p.a.qp.get(), pa), 0);
  EXPECT_EQ(ibv_post_send(p.a.qp.get(), &w[1], &bad), 0) << "INIT";
  ASSERT_EQ(tk::modify_to_rtr(p.a.qp.get(), p.b.qpn(), ah, pa), 0);
  EXPECT_EQ(ibv_post_send(p.a.qp.get(), &w[2], &bad), 0) << "RTR";
  expect_no_wc(p.a.scq.get());
  expect_no_wc(p.b.rcq.get(), 0);
  ASSERT_EQ(tk::modify_to_rts(p.a.qp.get(), pa), 0);
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 3);
  ASSERT_EQ(wc.size(), 3u);
  for (size_t i = 0; i < 3; ++i) check_wc(wc[i], WcExpect(1 + i, IBV_WC_SEND, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 3);
  ASSERT_EQ(wc.size(), 3u);
  for (size_t i = 0; i < 3; ++i) check_wc(wc[i], WcExpect(10 + i, IBV_WC_RECV, p.b.qpn()).len(32));
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(std::memcmp(dst_.data() + 256 * i, src_.data() + 64 * i, 32), 0) << "message " << i;
}

// ibv_rereg_mr(IBV_REREG_MR_CHANGE_TRANSLATION) moves a region while a receive
// WQE still points into its old range: the WQE's SGE is no longer inside the
// region, so the SEND that takes it fails as for any bad receive lkey, with
// IBV_WC_REM_OP_ERR at the requester and IBV_WC_LOC_PROT_ERR at the responder
// (ConnectX), and neither the old nor the new memory is written.
TEST_P(EngineTest, ReceiveIntoTheOldRangeOfAReregisteredRegionRc) {
  PairOptions o{.type = IBV_QPT_RC};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  Region r;
  ASSERT_NO_FATAL_FAILURE(make_region(16 * 1024, kAllAccess, &r));
  std::memset(r.data(), kFill, r.size());
  ibv_sge rs = r.sge(0, 256);
  ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 50, &rs, 1));
  Buffer moved(16 * 1024);
  std::memset(moved.data(), kFill, moved.size());
  ASSERT_EQ(ibv_rereg_mr(r.mr.get(), IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, moved.data(), moved.size(), 0), 0)
      << std::strerror(errno);
  ibv_sge s = src_.sge(0, 64);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_REM_OP_ERR, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(50, IBV_WC_LOC_PROT_ERR, p.b.qpn()));
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
  allow_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR});
  EXPECT_EQ(first_byte_not(r.data(), r.size(), kFill), -1) << "the old range was written";
  EXPECT_EQ(first_byte_not(moved.data(), moved.size(), kFill), -1) << "the new range was written";
  p.reset();
  r = Region{};
}

// A request to a QP in RESET, INIT or ERR gets no answer: such a QP drops what
// it receives (IBTA 10.3.1; ConnectX answers nothing either, the usual
// IBV_WC_RETRY_EXC_ERR of a peer whose QP failed), so the requester fails with
// IBV_WC_RETRY_EXC_ERR once its retries are spent, never with a NAK's status.
TEST_P(EngineTest, RequestsToAQpThatCannotReceiveRunOutOfRetriesRc) {
  for (ibv_qp_state target : {IBV_QPS_ERR, IBV_QPS_RESET, IBV_QPS_INIT}) {
    SCOPED_TRACE(qp_state_name(target));
    PairOptions o{.type = IBV_QPT_RC, .retry_cnt = 1, .timeout = 8};  // ~1 ms
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
    ibv_qp_attr a{};
    a.qp_state = target == IBV_QPS_ERR ? IBV_QPS_ERR : IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(p.b.qp.get(), &a, IBV_QP_STATE), 0);
    if (target == IBV_QPS_INIT) {
      softverbs::testkit::QpPath pb;
      pb.port = kPort;
      ASSERT_EQ(softverbs::testkit::modify_to_init(p.b.qp.get(), pb), 0);
    }
    // B's receive CQ gets nothing but, in ERR, the flush of this WQE.
    ibv_sge s = src_.sge(0, 32);
    ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect::error(1, IBV_WC_RETRY_EXC_ERR, p.a.qpn()));
    EXPECT_EQ(query_state(p.b.qp.get()), target);
    p.reset();
  }
}

}  // namespace
}  // namespace conformance

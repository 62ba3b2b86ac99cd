// Completion events driven by traffic: ibv_req_notify_cq with and without
// solicited_only, IBV_SEND_SOLICITED, and error completions. The channel's fd
// is always polled with a timeout before ibv_get_cq_event is called.
#include <arpa/inet.h>

#include "datapath.hpp"

namespace conformance {
namespace {

class EventTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    channel_.reset(ibv_create_comp_channel(ctx_));
    ASSERT_TRUE(channel_) << std::strerror(errno);
    ASSERT_NO_FATAL_FAILURE(make_region(16 * 1024, kAllAccess, &buf_));
  }
  void TearDown() override {
    p_.reset();
    buf_ = Region{};
    channel_.reset();
    DataPathTest::TearDown();
  }

  void connect_pair(ibv_qp_type type, uint8_t rnr_retry = 7) {
    make_pair({.type = type, .rnr_retry = rnr_retry, .channel = channel_.get()}, &p_);
  }

  // Sends `len` bytes A -> B with `opcode` and flags (and a receive for it).
  void send(uint64_t wr_id, ibv_wr_opcode opcode, unsigned flags, uint32_t len = 32) {
    ibv_sge rs = buf_.sge(8192, 1024);
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p_.b.qp.get(), wr_id, &rs, 1));
    ibv_sge s = buf_.sge(0, len);
    ibv_send_wr w = send_wr(wr_id, opcode, &s, 1, flags | IBV_SEND_SIGNALED);
    w.imm_data = htonl(0x5a5a0000u + static_cast<uint32_t>(wr_id));
    w.wr.rdma.remote_addr = buf_.addr(4096);
    w.wr.rdma.rkey = buf_.rkey();
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p_.a.qp.get(), &w));
  }

  // The next completion event must be for `cq`, within the timeout.
  void expect_event(ibv_cq* cq) {
    ASSERT_TRUE(wait_readable(channel_->fd, kEventTimeoutMs))
        << "no completion event within " << kEventTimeoutMs << " ms";
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(channel_.get(), &ev_cq, &ev_ctx), 0) << std::strerror(errno);
    ibv_ack_cq_events(ev_cq, 1);
    EXPECT_EQ(ev_cq, cq) << "the event names another CQ";
    EXPECT_EQ(ev_ctx, cq->cq_context);
  }

  void expect_no_event(int quiet_ms = kQuietMs) {
    if (!wait_readable(channel_->fd, quiet_ms)) return;
    ibv_cq* ev_cq = nullptr;
    void* ev_ctx = nullptr;
    ASSERT_EQ(ibv_get_cq_event(channel_.get(), &ev_cq, &ev_ctx), 0);
    ibv_ack_cq_events(ev_cq, 1);
    ADD_FAILURE() << "unexpected completion event for "
                  << (ev_cq == p_.b.rcq.get()   ? "B's receive CQ"
                      : ev_cq == p_.a.scq.get() ? "A's send CQ"
                                                : "another CQ");
  }

  void solicited_only(ibv_qp_type type);

  Channel channel_;
  Region buf_;
  Pair p_;
};
CONFORMANCE_INSTANTIATE(EventTest);

// Armed with solicited_only=1, a CQ raises an event for a receive completion
// of a message sent with IBV_SEND_SOLICITED (the SE bit) and not for one sent
// without it (IBTA 11.4.2.2). RDMA WRITE with immediate can be solicited too.
void EventTest::solicited_only(ibv_qp_type type) {
  ASSERT_NO_FATAL_FAILURE(connect_pair(type));
  ibv_cq* cq = p_.b.rcq.get();
  ASSERT_EQ(ibv_req_notify_cq(cq, 1), 0);

  // Unsolicited: the completion arrives, the event does not.
  ASSERT_NO_FATAL_FAILURE(send(1, IBV_WR_SEND, 0));
  std::vector<ibv_wc> wc = expect_wcs(cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RECV, p_.b.qpn()).len(32));
  ASSERT_NO_FATAL_FAILURE(expect_no_event());

  // Solicited: the event fires (the CQ is still armed).
  ASSERT_NO_FATAL_FAILURE(send(2, IBV_WR_SEND_WITH_IMM, IBV_SEND_SOLICITED));
  ASSERT_NO_FATAL_FAILURE(expect_event(cq));
  wc = expect_wcs(cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(2, IBV_WC_RECV, p_.b.qpn()).len(32).flags(IBV_WC_WITH_IMM).imm(htonl(0x5a5a0002u)));

  // Re-armed: an unsolicited WRITE with immediate does not fire, a solicited
  // one does.
  ASSERT_EQ(ibv_req_notify_cq(cq, 1), 0);
  ASSERT_NO_FATAL_FAILURE(send(3, IBV_WR_RDMA_WRITE_WITH_IMM, 0));
  ASSERT_EQ(expect_wcs(cq, 1).size(), 1u);
  ASSERT_NO_FATAL_FAILURE(expect_no_event());
  ASSERT_NO_FATAL_FAILURE(send(4, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SOLICITED));
  ASSERT_NO_FATAL_FAILURE(expect_event(cq));
  wc = expect_wcs(cq, 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(4, IBV_WC_RECV_RDMA_WITH_IMM, p_.b.qpn()).len(32).flags(IBV_WC_WITH_IMM));

  // Not re-armed: a further solicited message raises nothing.
  ASSERT_NO_FATAL_FAILURE(send(5, IBV_WR_SEND, IBV_SEND_SOLICITED));
  ASSERT_EQ(expect_wcs(cq, 1).size(), 1u);
  ASSERT_NO_FATAL_FAILURE(expect_no_event(0));
  // The sender's CQ was never armed.
  ASSERT_EQ(expect_wcs(p_.a.scq.get(), 5).size(), 5u);
  ASSERT_NO_FATAL_FAILURE(expect_no_event(0));
}

TEST_P(EventTest, SolicitedOnlyFiresForSolicitedMessagesRc) { solicited_only(IBV_QPT_RC); }
TEST_P(EventTest, SolicitedOnlyFiresForSolicitedMessagesUc) { solicited_only(IBV_QPT_UC); }

// Armed with solicited_only=0, any completion raises the event, solicited or
// not, on the receive and on the send side.
TEST_P(EventTest, NextCompletionFiresForAnyMessage) {
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC}) {
    SCOPED_TRACE(qp_type_name(type));
    ASSERT_NO_FATAL_FAILURE(connect_pair(type));
    ASSERT_EQ(ibv_req_notify_cq(p_.b.rcq.get(), 0), 0);
    ASSERT_NO_FATAL_FAILURE(send(1, IBV_WR_SEND, 0));
    ASSERT_NO_FATAL_FAILURE(expect_event(p_.b.rcq.get()));
    ASSERT_EQ(expect_wcs(p_.b.rcq.get(), 1).size(), 1u);
    ASSERT_EQ(expect_wcs(p_.a.scq.get(), 1).size(), 1u);

    ASSERT_EQ(ibv_req_notify_cq(p_.a.scq.get(), 0), 0);
    ASSERT_NO_FATAL_FAILURE(send(2, IBV_WR_SEND, 0));
    ASSERT_NO_FATAL_FAILURE(expect_event(p_.a.scq.get()));
    ASSERT_EQ(expect_wcs(p_.a.scq.get(), 1).size(), 1u);
    ASSERT_EQ(expect_wcs(p_.b.rcq.get(), 1).size(), 1u);
    ASSERT_NO_FATAL_FAILURE(expect_no_event(0));
    p_.reset();
  }
}

// A CQ armed for solicited completions only is also woken by a completion in
// error (IBTA 11.4.2.2): here the requester's RNR retry failure.
TEST_P(EventTest, ErrorCompletionWakesASolicitedOnlyCqRc) {
  ASSERT_NO_FATAL_FAILURE(connect_pair(IBV_QPT_RC, 0));
  ASSERT_EQ(ibv_req_notify_cq(p_.a.scq.get(), 1), 0);
  ibv_sge s = buf_.sge(0, 16);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p_.a.qp.get(), &w));
  ASSERT_NO_FATAL_FAILURE(expect_event(p_.a.scq.get()));
  std::vector<ibv_wc> wc = expect_wcs(p_.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_RNR_RETRY_EXC_ERR, p_.a.qpn()));
}

// An unsolicited successful send completion does not wake a send CQ armed
// for solicited completions only (send completions are never solicited).
TEST_P(EventTest, SuccessfulSendCompletionDoesNotWakeASolicitedOnlyCq) {
  ASSERT_NO_FATAL_FAILURE(connect_pair(IBV_QPT_RC));
  ASSERT_EQ(ibv_req_notify_cq(p_.a.scq.get(), 1), 0);
  ASSERT_NO_FATAL_FAILURE(send(1, IBV_WR_SEND, IBV_SEND_SOLICITED));
  ASSERT_EQ(expect_wcs(p_.a.scq.get(), 1).size(), 1u);
  ASSERT_EQ(expect_wcs(p_.b.rcq.get(), 1).size(), 1u);
  ASSERT_NO_FATAL_FAILURE(expect_no_event());
}

}  // namespace
}  // namespace conformance

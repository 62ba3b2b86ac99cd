// Errors on the data path of connected QPs: local protection and length
// errors, remote access and invalid-request errors, receiver-not-ready, and
// what follows every error: the QP in ERR, every outstanding work request
// flushed in order exactly once, and (at the responder) an affiliated
// asynchronous event. Also flushing by posting to a QP in ERR and dropping by
// moving to RESET.
#include <sys/mman.h>

#include <array>

#include "datapath.hpp"

namespace conformance {
namespace {

constexpr uint8_t kFill = 0xee;

class ErrorTest : public DataPathTest {
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

  // A key that names no registration: that of a region registered and
  // released again (register nothing after calling this in a test).
  uint32_t stale_key() {
    Region r;
    make_region(4096, kAllAccess, &r);
    if (!r.mr) return 0;
    const uint32_t key = r.lkey();
    EXPECT_EQ(r.mr.destroy(), 0);
    return key;
  }

  // Expects wr_ids first..first+n-1 flushed on cq, in order, from qp.
  void expect_flushed(ibv_cq* cq, uint32_t qpn, uint64_t first, int n) {
    std::vector<ibv_wc> wc = expect_wcs(cq, n);
    for (size_t i = 0; i < wc.size(); ++i) {
      SCOPED_TRACE("flushed work request " + std::to_string(i));
      check_wc(wc[i], WcExpect::error(first + i, IBV_WC_WR_FLUSH_ERR, qpn));
    }
  }

  void post_recvs(ibv_qp* qp, uint64_t first, int n, size_t offset = 0, uint32_t len = 256) {
    for (int i = 0; i < n; ++i) {
      ibv_sge s = dst_.sge(offset + len * static_cast<size_t>(i), len);
      ASSERT_NO_FATAL_FAILURE(post_recv_ok(qp, first + static_cast<uint64_t>(i), &s, 1));
    }
  }

  Region src_;
  Region dst_;
};
CONFORMANCE_INSTANTIATE(ErrorTest);

// ---- requester (local) errors -----------------------------------------------

// A gather entry with an invalid lkey fails the work request with
// IBV_WC_LOC_PROT_ERR (IBTA 10.6.3.1); the QP goes to ERR and everything still
// outstanding on both of its queues is flushed, in order. The responder never
// saw the failed request and stays as it was.
TEST_P(ErrorTest, BadLkeyInSendSgeFlushesBothQueuesRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .max_send_wr = 16, .max_recv_wr = 16}, &p));
  const uint32_t bad = stale_key();
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.a.qp.get(), 100, 4));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 200, 1, 4096));

  ibv_sge good = src_.sge(0, 64);
  ibv_sge broken = src_.sge(0, 64);
  broken.lkey = bad;
  std::array<ibv_send_wr, 5> w = {
      send_wr(0, IBV_WR_SEND, &good, 1),          send_wr(1, IBV_WR_SEND, &broken, 1),
      send_wr(2, IBV_WR_RDMA_WRITE, &good, 1, 0),  // unsignaled: flushed all the same
      send_wr(3, IBV_WR_SEND, &good, 1),          send_wr(4, IBV_WR_RDMA_READ, &good, 1),
  };
  for (size_t i = 0; i < w.size(); ++i) {
    w[i].wr.rdma.remote_addr = dst_.addr(8192);
    w[i].wr.rdma.rkey = dst_.rkey();
    if (i) w[i - 1].next = &w[i];
  }
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w[0]));

  // Send completions come in posting order, each exactly once.
  // The first SEND was valid: it completes before the failed one, successfully
  // or (if its acknowledgement had not come back when the QP entered ERR)
  // flushed, depending on the adapter.
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 5);
  ASSERT_EQ(wc.size(), 5u);
  EXPECT_EQ(wc[0].wr_id, 0u) << describe(wc[0]);
  observe("first_send.status", ibv_wc_status_str(wc[0].status));
  EXPECT_TRUE(wc[0].status == IBV_WC_SUCCESS || wc[0].status == IBV_WC_WR_FLUSH_ERR) << describe(wc[0]);
  if (wc[0].status == IBV_WC_SUCCESS) check_wc(wc[0], WcExpect(0, IBV_WC_SEND, p.a.qpn()));
  check_wc(wc[1], WcExpect::error(1, IBV_WC_LOC_PROT_ERR, p.a.qpn()));
  for (uint64_t i = 2; i < 5; ++i) check_wc(wc[i], WcExpect::error(i, IBV_WC_WR_FLUSH_ERR, p.a.qpn()));
  expect_flushed(p.a.rcq.get(), p.a.qpn(), 100, 4);
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);

  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(200, IBV_WC_RECV, p.b.qpn()).len(64));
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_RTS);
  // Exactly once: nothing more on any queue.
  expect_no_wc(p.a.scq.get());
  expect_no_wc(p.a.rcq.get(), 0);
  expect_no_wc(p.b.rcq.get(), 0);
  expect_no_wc(p.b.scq.get(), 0);
}

// The invalid lkey sits in a later gather entry of a multi-packet SEND: the
// packets before it may already be on the wire when the requester fails the
// request with IBV_WC_LOC_PROT_ERR. The responder never sees the message end,
// so its receive WQE does not complete, and it stays in RTS.
TEST_P(ErrorTest, BadLkeyInALaterSgeOfAMultiPacketSendRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .max_send_sge = 2}, &p));
  const uint32_t bad = stale_key();
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 10, 1, 0, 8192));
  ibv_sge g[2] = {src_.sge(0, 3 * mtu_bytes(active_mtu())), src_.sge(16384, 100)};
  g[1].lkey = bad;
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, g, 2);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  // scripts/divergence.py personality reads it (completions.bad_lkey).
  observe("bad_lkey.status", ibv_wc_status_str(wc[0].status));
  check_wc(wc[0], WcExpect::error(1, IBV_WC_LOC_PROT_ERR, p.a.qpn()));
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
  expect_no_wc(p.b.rcq.get());
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_RTS);
}

// On UC a send-queue error takes the QP to SQE (IBTA 10.3.1: UC/UD only) or,
// on adapters without that state (ConnectX), to ERR; either way the failed
// request reports IBV_WC_LOC_PROT_ERR and the send queue behind it is flushed.
TEST_P(ErrorTest, BadLkeyInSendSgeUc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC, .max_send_wr = 16}, &p));
  const uint32_t bad = stale_key();
  ibv_sge good = src_.sge(0, 64);
  ibv_sge broken = src_.sge(0, 64);
  broken.lkey = bad;
  ibv_send_wr w0 = send_wr(1, IBV_WR_RDMA_WRITE, &broken, 1);
  ibv_send_wr w1 = send_wr(2, IBV_WR_RDMA_WRITE, &good, 1);
  w0.wr.rdma.remote_addr = w1.wr.rdma.remote_addr = dst_.addr();
  w0.wr.rdma.rkey = w1.wr.rdma.rkey = dst_.rkey();
  w0.next = &w1;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w0));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_LOC_PROT_ERR, p.a.qpn()));
  check_wc(wc[1], WcExpect::error(2, IBV_WC_WR_FLUSH_ERR, p.a.qpn()));
  const ibv_qp_state s = query_state(p.a.qp.get());
  observe("requester.qp_state", qp_state_name(s));
  EXPECT_TRUE(s == IBV_QPS_SQE || s == IBV_QPS_ERR) << "state " << qp_state_name(s);
  EXPECT_EQ(first_byte_not(dst_.data(), 128, kFill), -1) << "the failed or flushed write reached memory";
}

// An lkey of the same device but another protection domain is a protection
// error too (IBTA 10.6.3.1: the region must belong to the QP's PD).
TEST_P(ErrorTest, LkeyOfAnotherPdRc) {
  Pd other(ibv_alloc_pd(ctx_));
  ASSERT_TRUE(other);
  Region foreign;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &foreign, other.get()));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 1, 1));
  ibv_sge s = foreign.sge(0, 64);
  ibv_send_wr w = send_wr(7, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(7, IBV_WC_LOC_PROT_ERR, p.a.qpn()));
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
  expect_no_wc(p.b.rcq.get());
  p.reset();
  foreign = Region{};
}

// RDMA READ responses are written into local memory, which needs
// IBV_ACCESS_LOCAL_WRITE on the region: without it the READ fails with
// IBV_WC_LOC_PROT_ERR.
TEST_P(ErrorTest, ReadIntoRegionWithoutLocalWriteRc) {
  Region ro;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, IBV_ACCESS_REMOTE_READ, &ro));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  ibv_sge s = ro.sge(0, 128);
  ibv_send_wr w = send_wr(3, IBV_WR_RDMA_READ, &s, 1);
  w.wr.rdma.remote_addr = src_.addr();
  w.wr.rdma.rkey = src_.rkey();
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(3, IBV_WC_LOC_PROT_ERR, p.a.qpn()));
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
  EXPECT_EQ(first_byte_not(ro.data(), 128, 0), -1) << "a region without local write was written";
}

// A message longer than the port's max_msg_sz fails: refused at post time or
// completed with IBV_WC_LOC_LEN_ERR (the gather list is longer than the
// largest message the port carries). The gather list reuses one 64 MiB
// region: 16 entries of 64 MiB make max_msg_sz (1 GiB), one more byte exceeds it.
TEST_P(ErrorTest, MessageLongerThanMaxMsgSz) {
  constexpr size_t kPiece = 64u << 20;
  if (pattr_.max_msg_sz % kPiece != 0 || pattr_.max_msg_sz / kPiece + 1 > static_cast<uint32_t>(dattr_.max_sge))
    GTEST_SKIP() << "max_msg_sz " << pattr_.max_msg_sz << " cannot be built from 64 MiB gather entries";
  const uint32_t n = pattr_.max_msg_sz / kPiece + 1;
  if (usable_sges(IBV_QPT_RC, true, n) < n) GTEST_SKIP() << "the device cannot gather " << n << " entries";
  Region big;
  // Registered read-only: the region is only gathered from, and most of it is
  // never touched.
  ASSERT_NO_FATAL_FAILURE(make_region(kPiece, 0, &big));
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC}) {
    SCOPED_TRACE(qp_type_name(type));
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = type, .max_send_sge = n}, &p));
    ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 1, 1));
    std::vector<ibv_sge> g(n, big.sge(0, static_cast<uint32_t>(kPiece)));
    g.back().length = 1;
    ibv_send_wr w = send_wr(9, IBV_WR_SEND, g.data(), static_cast<int>(n));
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(p.a.qp.get(), &w, &bad);
    if (rc != 0) {
      EXPECT_EQ(bad, &w);
      expect_no_wc(p.a.scq.get(), 0);
    } else {
      std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
      ASSERT_EQ(wc.size(), 1u);
      check_wc(wc[0], WcExpect::error(9, IBV_WC_LOC_LEN_ERR, p.a.qpn()));
    }
    expect_no_wc(p.b.rcq.get());
  }
}

// ---- responder errors --------------------------------------------------------

// A SEND longer than the receive buffer: the receiver's WQE completes with
// IBV_WC_LOC_LEN_ERR, the requester is NAKed (invalid request) and sees
// IBV_WC_REM_INV_REQ_ERR (a class C responder error). Both QPs end in ERR with
// their remaining WQEs flushed. The receive WQE carries the error, so an
// affiliated event is optional (rxe raises none; the emulated device raises
// IBV_EVENT_QP_REQ_ERR).
TEST_P(ErrorTest, ReceiveBufferTooSmallRc) {
  for (auto [msg, buf] : {std::pair<uint32_t, uint32_t>{100, 64}, {3000, 1500}}) {
    SCOPED_TRACE(std::to_string(msg) + " bytes into " + std::to_string(buf));
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
    ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 10, 3, 0, buf));
    // B has a send of its own outstanding (A posts no receive, so it waits in
    // RNR retries): the responder's error flushes its send queue too.
    ibv_sge bs = dst_.sge(32 * 1024, 16);
    ibv_send_wr bw = send_wr(77, IBV_WR_SEND, &bs, 1);
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.b.qp.get(), &bw));
    expect_no_wc(p.b.scq.get(), 0);
    ibv_sge s = src_.sge(0, msg);
    ibv_send_wr w0 = send_wr(1, IBV_WR_SEND, &s, 1);
    ibv_send_wr w1 = send_wr(2, IBV_WR_SEND, &s, 1);
    w0.next = &w1;
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w0));
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 2);
    ASSERT_EQ(wc.size(), 2u);
    // scripts/divergence.py personality reads both (completions.recv_too_small_*).
    observe("recv_too_small.sender", ibv_wc_status_str(wc[0].status));
    check_wc(wc[0], WcExpect::error(1, IBV_WC_REM_INV_REQ_ERR, p.a.qpn()));
    check_wc(wc[1], WcExpect::error(2, IBV_WC_WR_FLUSH_ERR, p.a.qpn()));
    wc = expect_wcs(p.b.rcq.get(), 3);
    ASSERT_EQ(wc.size(), 3u);
    observe("recv_too_small.receiver", ibv_wc_status_str(wc[0].status));
    check_wc(wc[0], WcExpect::error(10, IBV_WC_LOC_LEN_ERR, p.b.qpn()));
    check_wc(wc[1], WcExpect::error(11, IBV_WC_WR_FLUSH_ERR, p.b.qpn()));
    check_wc(wc[2], WcExpect::error(12, IBV_WC_WR_FLUSH_ERR, p.b.qpn()));
    expect_flushed(p.b.scq.get(), p.b.qpn(), 77, 1);
    EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
    EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
    allow_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR});
  }
}

// UC has no NAK: the requester completes successfully. The responder either
// drops the message silently (IBTA class D: rxe) or completes the receive WQE
// with IBV_WC_LOC_LEN_ERR (ConnectX); it never reports success.
TEST_P(ErrorTest, ReceiveBufferTooSmallUc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_UC}, &p));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 10, 1, 0, 64));
  ibv_sge s = src_.sge(0, 100);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_SEND, p.a.qpn()));
  wc = poll_completions(p.b.rcq.get(), 1, kQuietMs);
  observe("responder.completion", wc.empty() ? "none" : ibv_wc_status_str(wc[0].status));
  for (const ibv_wc& r : wc) check_wc(r, WcExpect::error(10, IBV_WC_LOC_LEN_ERR, p.b.qpn()));
}

// A receive WQE whose scatter entry has an invalid lkey: the receiver
// completes it with IBV_WC_LOC_PROT_ERR and NAKs the requester with a remote
// operational error, IBV_WC_REM_OP_ERR (class C). Same with a
// region that does not grant local write.
TEST_P(ErrorTest, BadLkeyInReceiveWqeRc) {
  Region ro;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, IBV_ACCESS_REMOTE_READ, &ro));
  const uint32_t bad = stale_key();
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "invalid lkey" : "region without local write");
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
    ibv_sge rs = variant == 0 ? dst_.sge(0, 256) : ro.sge(0, 256);
    if (variant == 0) rs.lkey = bad;
    ASSERT_NO_FATAL_FAILURE(post_recv_ok(p.b.qp.get(), 20, &rs, 1));
    ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 21, 1, 1024));
    ibv_sge s = src_.sge(0, 64);
    ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    check_wc(wc[0], WcExpect::error(1, IBV_WC_REM_OP_ERR, p.a.qpn()));
    wc = expect_wcs(p.b.rcq.get(), 2);
    ASSERT_EQ(wc.size(), 2u);
    check_wc(wc[0], WcExpect::error(20, IBV_WC_LOC_PROT_ERR, p.b.qpn()));
    check_wc(wc[1], WcExpect::error(21, IBV_WC_WR_FLUSH_ERR, p.b.qpn()));
    EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
    EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
    allow_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR});
    EXPECT_EQ(first_byte_not(ro.data(), 256, 0), -1);
  }
}

// ---- remote access ------------------------------------------------------------

enum class Violation { kStaleRkey, kPastTheEnd, kBeforeTheStart, kRegionLacksRight, kQpLacksRight, kOtherPd };

const char* violation_name(Violation v) {
  switch (v) {
    case Violation::kStaleRkey:
      return "invalid rkey";
    case Violation::kPastTheEnd:
      return "range past the end of the region";
    case Violation::kBeforeTheStart:
      return "range before the start of the region";
    case Violation::kRegionLacksRight:
      return "region without the remote right";
    case Violation::kQpLacksRight:
      return "QP access flags without the remote right";
    case Violation::kOtherPd:
      return "rkey of another PD";
  }
  return "?";
}

class RemoteAccessTest : public ErrorTest {
 protected:
  // Runs `opcode` against a target that violates the responder's checks in
  // the way `v` says, and checks the outcome: IBV_WC_REM_ACCESS_ERR at the
  // requester (class C responder error: NAK remote access error), the next
  // work request flushed, both QPs in ERR, IBV_EVENT_QP_ACCESS_ERR on the
  // responder's QP (IBTA 11.6.3: "Local Access Violation Work Queue Error",
  // for RDMA and atomic requests), and the target memory untouched.
  void violate(ibv_wr_opcode opcode, Violation v);
};
CONFORMANCE_INSTANTIATE(RemoteAccessTest);

void RemoteAccessTest::violate(ibv_wr_opcode opcode, Violation v) {
  SCOPED_TRACE(violation_name(v));
  const bool atomic = opcode == IBV_WR_ATOMIC_CMP_AND_SWP || opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  unsigned right = IBV_ACCESS_REMOTE_WRITE;
  if (opcode == IBV_WR_RDMA_READ) right = IBV_ACCESS_REMOTE_READ;
  if (atomic) right = IBV_ACCESS_REMOTE_ATOMIC;
  const uint32_t len = atomic ? 8 : 512;

  Pd other;
  Region target;
  if (v == Violation::kOtherPd) {
    other.reset(ibv_alloc_pd(ctx_));
    ASSERT_TRUE(other);
    ASSERT_NO_FATAL_FAILURE(make_region(8192, kAllAccess, &target, other.get()));
  } else if (v == Violation::kRegionLacksRight) {
    ASSERT_NO_FATAL_FAILURE(make_region(8192, kAllAccess & ~right, &target));
  } else {
    ASSERT_NO_FATAL_FAILURE(make_region(8192, kAllAccess, &target));
  }
  std::memset(target.data(), kFill, target.size());
  uint32_t rkey = target.rkey();
  uint64_t addr = target.addr(1024);
  switch (v) {
    case Violation::kStaleRkey:
      rkey = stale_key();
      break;
    case Violation::kPastTheEnd:
      addr = target.addr(target.size() - (atomic ? 0 : len / 2));
      break;
    case Violation::kBeforeTheStart:
      addr = target.addr() - (atomic ? 8 : len / 2);
      break;
    default:
      break;
  }
  PairOptions o{.type = IBV_QPT_RC};
  if (v == Violation::kQpLacksRight) o.access_b = static_cast<int>(kAllAccess & ~right & ~IBV_ACCESS_LOCAL_WRITE);
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));

  std::memset(src_.data(), 0x11, 1024);
  ibv_sge s = src_.sge(0, len);
  ibv_send_wr w = send_wr(1, opcode, &s, 1);
  if (atomic) {
    w.wr.atomic.remote_addr = addr;
    w.wr.atomic.rkey = rkey;
    w.wr.atomic.compare_add = 1;
    w.wr.atomic.swap = 2;
  } else {
    w.wr.rdma.remote_addr = addr;
    w.wr.rdma.rkey = rkey;
  }
  // A write with immediate needs a receive WQE, or the responder may answer
  // RNR before it looks at the R_Key. What becomes of that WQE is not
  // specified beyond not succeeding.
  const bool with_recv = opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (with_recv) {
    ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 40, 1, 0, 64));
  }
  ibv_sge s2 = src_.sge(2048, 8);
  ibv_send_wr next = send_wr(2, IBV_WR_SEND, &s2, 1);
  w.next = &next;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_REM_ACCESS_ERR, p.a.qpn()));
  check_wc(wc[1], WcExpect::error(2, IBV_WC_WR_FLUSH_ERR, p.a.qpn()));
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
  if (with_recv) {
    wc = expect_wcs(p.b.rcq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, 40u);
    EXPECT_NE(wc[0].status, IBV_WC_SUCCESS) << describe(wc[0]);
  }
  expect_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_ACCESS_ERR});
  EXPECT_EQ(first_byte_not(target.data(), target.size(), kFill), -1) << "the target region was modified";
  if (opcode == IBV_WR_RDMA_READ || atomic) {
    EXPECT_EQ(first_byte_not(src_.data(), len, 0x11), -1) << "the local buffer of a failed request was written";
  }
  p.reset();
  target = Region{};
}

constexpr Violation kAllViolations[] = {Violation::kStaleRkey,      Violation::kPastTheEnd,
                                        Violation::kBeforeTheStart, Violation::kRegionLacksRight,
                                        Violation::kQpLacksRight,   Violation::kOtherPd};

TEST_P(RemoteAccessTest, RdmaWriteRc) {
  for (Violation v : kAllViolations) ASSERT_NO_FATAL_FAILURE(violate(IBV_WR_RDMA_WRITE, v));
}

TEST_P(RemoteAccessTest, RdmaWriteWithImmRc) {
  for (Violation v : {Violation::kStaleRkey, Violation::kPastTheEnd, Violation::kRegionLacksRight})
    ASSERT_NO_FATAL_FAILURE(violate(IBV_WR_RDMA_WRITE_WITH_IMM, v));
}

TEST_P(RemoteAccessTest, RdmaReadRc) {
  for (Violation v : kAllViolations) ASSERT_NO_FATAL_FAILURE(violate(IBV_WR_RDMA_READ, v));
}

TEST_P(RemoteAccessTest, AtomicCompareAndSwapRc) {
  for (Violation v : kAllViolations) ASSERT_NO_FATAL_FAILURE(violate(IBV_WR_ATOMIC_CMP_AND_SWP, v));
}

TEST_P(RemoteAccessTest, AtomicFetchAndAddRc) {
  for (Violation v : kAllViolations) ASSERT_NO_FATAL_FAILURE(violate(IBV_WR_ATOMIC_FETCH_AND_ADD, v));
}

// A zero-length RDMA WRITE or READ names no memory: the responder checks
// neither its R_Key nor its address (IBTA C9-88), so a bogus rkey succeeds.
TEST_P(ErrorTest, ZeroLengthRdmaIgnoresTheRkeyRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
  const uint32_t bad = stale_key();
  ibv_send_wr w = send_wr(1, IBV_WR_RDMA_WRITE, nullptr, 0);
  ibv_send_wr r = send_wr(2, IBV_WR_RDMA_READ, nullptr, 0);
  w.wr.rdma.remote_addr = r.wr.rdma.remote_addr = 0;
  w.wr.rdma.rkey = r.wr.rdma.rkey = bad;
  w.next = &r;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect(1, IBV_WC_RDMA_WRITE, p.a.qpn()));
  check_wc(wc[1], WcExpect(2, IBV_WC_RDMA_READ, p.a.qpn()).len(0));
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_RTS);
}

// An atomic whose address is not 8-byte aligned is an invalid request
// (atomics operate on naturally aligned 64-bit words), NAKed as such:
// IBV_WC_REM_INV_REQ_ERR at the requester and IBV_EVENT_QP_REQ_ERR ("Invalid
// Request Local Work Queue Error") at the responder, as rxe does. Vendor
// dependent: some adapters report the misalignment as an access violation
// (IBV_WC_REM_ACCESS_ERR / IBV_EVENT_QP_ACCESS_ERR).
TEST_P(ErrorTest, MisalignedAtomicRc) {
  for (ibv_wr_opcode opcode : {IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    SCOPED_TRACE(opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? "compare and swap" : "fetch and add");
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC}, &p));
    ibv_sge s = src_.sge(0, 8);
    ibv_send_wr w = send_wr(1, opcode, &s, 1);
    w.wr.atomic.remote_addr = dst_.addr(1028);
    w.wr.atomic.rkey = dst_.rkey();
    w.wr.atomic.compare_add = 0xeeeeeeeeeeeeeeeeull;
    w.wr.atomic.swap = 5;
    const std::string what = opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? "cmp_and_swp" : "fetch_and_add";
    // rxe checks the alignment at post time (EINVAL); the IBTA leaves it to the
    // responder, as ConnectX and emu do. Either is accepted and recorded.
    ibv_send_wr* bad = nullptr;
    const int rc = ibv_post_send(p.a.qp.get(), &w, &bad);
    if (rc != 0) {
      observe(what + ".post", errno_name(rc));
      EXPECT_EQ(rc, EINVAL);
      EXPECT_EQ(bad, &w);
      EXPECT_EQ(first_byte_not(dst_.data() + 1024, 16, kFill), -1) << "the misaligned target was modified";
      continue;
    }
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
    ASSERT_EQ(wc.size(), 1u);
    observe(what + ".status", ibv_wc_status_str(wc[0].status));
    check_wc(wc[0], WcExpect::error(1, IBV_WC_REM_INV_REQ_ERR, p.a.qpn()));
    EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
    EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_ERR);
    expect_qp_async_event(p.b.qp.get(), {IBV_EVENT_QP_REQ_ERR});
    EXPECT_EQ(first_byte_not(dst_.data() + 1024, 16, kFill), -1) << "the misaligned target was modified";
  }
}

// ---- receiver not ready ----------------------------------------------------

// With no receive posted the responder answers RNR NAK (IBTA 9.7.5.2.8); with
// rnr_retry = 0 the requester gives up at once: IBV_WC_RNR_RETRY_EXC_ERR, QP in
// ERR. The responder did nothing wrong and stays in RTS. The same holds for an
// RDMA WRITE with immediate, which consumes a receive WQE too.
TEST_P(ErrorTest, RnrWithNoRetryFailsRc) {
  for (ibv_wr_opcode opcode : {IBV_WR_SEND, IBV_WR_RDMA_WRITE_WITH_IMM}) {
    SCOPED_TRACE(opcode == IBV_WR_SEND ? "SEND" : "RDMA_WRITE_WITH_IMM");
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .rnr_retry = 0}, &p));
    ibv_sge s = src_.sge(0, 64);
    ibv_send_wr w = send_wr(1, opcode, &s, 1);
    w.wr.rdma.remote_addr = dst_.addr();
    w.wr.rdma.rkey = dst_.rkey();
    ibv_send_wr w2 = send_wr(2, IBV_WR_SEND, &s, 1);
    w.next = &w2;
    ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
    std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 2);
    ASSERT_EQ(wc.size(), 2u);
    check_wc(wc[0], WcExpect::error(1, IBV_WC_RNR_RETRY_EXC_ERR, p.a.qpn()));
    check_wc(wc[1], WcExpect::error(2, IBV_WC_WR_FLUSH_ERR, p.a.qpn()));
    EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
    EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_RTS);
    expect_no_wc(p.b.rcq.get(), 0);
    expect_no_async_event(0);
  }
}

// A finite rnr_retry is a count of retries: with the shortest RNR timer the
// requester still gives up, with IBV_WC_RNR_RETRY_EXC_ERR.
TEST_P(ErrorTest, RnrRetriesRunOutRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .rnr_retry = 3, .min_rnr_timer = 1}, &p));
  ibv_sge s = src_.sge(0, 64);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_RNR_RETRY_EXC_ERR, p.a.qpn()));
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_ERR);
}

// rnr_retry = 7 retries for ever: the send waits (no completion, QP still in
// RTS) until the receiver posts a receive, then completes.
TEST_P(ErrorTest, RnrRetryForeverWaitsForTheReceiveRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .rnr_retry = 7, .min_rnr_timer = 1}, &p));
  fill_pattern(src_.data(), 300, 5);
  ibv_sge s = src_.sge(0, 300);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  // The sender is waiting: nothing completes meanwhile.
  expect_no_wc(p.a.scq.get());
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_RTS);
  EXPECT_EQ(query_state(p.b.qp.get()), IBV_QPS_RTS);
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 30, 1, 0, 512));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(1, IBV_WC_SEND, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(30, IBV_WC_RECV, p.b.qpn()).len(300).flags(0));
  EXPECT_EQ(first_pattern_mismatch(dst_.data(), 300, 5), -1);
  // Exactly one delivery despite the retries.
  expect_no_wc(p.b.rcq.get());
}

// Requests behind one that is waiting in RNR retries do not overtake it: an
// RDMA WRITE posted after the waiting SEND does not reach memory before the
// SEND is accepted (the responder only accepts the expected PSN), and
// everything completes in order once the receive is posted. Many RNR rounds
// pass meanwhile; none of them may count against retry_cnt.
TEST_P(ErrorTest, RnrWaitKeepsLaterRequestsBehindRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .rnr_retry = 7, .min_rnr_timer = 1, .retry_cnt = 1}, &p));
  fill_pattern(src_.data(), 4096, 12);
  ibv_sge s = src_.sge(0, 100);
  ibv_sge ws = src_.sge(1024, 2000);
  ibv_send_wr send = send_wr(1, IBV_WR_SEND, &s, 1);
  ibv_send_wr write = send_wr(2, IBV_WR_RDMA_WRITE, &ws, 1);
  write.wr.rdma.remote_addr = dst_.addr(16 * 1024);
  write.wr.rdma.rkey = dst_.rkey();
  ibv_send_wr send2 = send_wr(3, IBV_WR_SEND, &s, 1);
  send.next = &write;
  write.next = &send2;
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &send));
  expect_no_wc(p.a.scq.get());
  EXPECT_EQ(first_byte_not(dst_.data() + 16 * 1024, 2000, kFill), -1) << "the WRITE overtook the waiting SEND";
  EXPECT_EQ(query_state(p.a.qp.get()), IBV_QPS_RTS);
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 10, 2, 0, 256));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 3);
  ASSERT_EQ(wc.size(), 3u);
  check_wc(wc[0], WcExpect(1, IBV_WC_SEND, p.a.qpn()));
  check_wc(wc[1], WcExpect(2, IBV_WC_RDMA_WRITE, p.a.qpn()));
  check_wc(wc[2], WcExpect(3, IBV_WC_SEND, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 2);
  ASSERT_EQ(wc.size(), 2u);
  check_wc(wc[0], WcExpect(10, IBV_WC_RECV, p.b.qpn()).len(100));
  check_wc(wc[1], WcExpect(11, IBV_WC_RECV, p.b.qpn()).len(100));
  EXPECT_EQ(std::memcmp(dst_.data() + 16 * 1024, src_.data() + 1024, 2000), 0);
  expect_no_wc(p.b.rcq.get(), 0);
}

// ---- flush semantics -------------------------------------------------------

// After an error every outstanding WQE completes exactly once with
// IBV_WC_WR_FLUSH_ERR, in posting order, signaled or not (IBTA 10.7.3.1: a
// work request that completes in error always produces a completion); the
// receive queue is flushed the same way. Several post calls, several opcodes.
TEST_P(ErrorTest, FlushCompletesEveryOutstandingWqeInOrderExactlyOnceRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .max_send_wr = 32, .max_recv_wr = 32}, &p));
  const uint32_t bad = stale_key();
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.a.qp.get(), 1000, 12, 0, 64));
  ibv_sge broken = src_.sge(0, 64);
  broken.lkey = bad;
  ibv_send_wr first = send_wr(0, IBV_WR_RDMA_WRITE, &broken, 1);
  first.wr.rdma.remote_addr = dst_.addr(4096);
  first.wr.rdma.rkey = dst_.rkey();
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &first));
  // Behind it, posted one by one (the first may already have failed).
  static constexpr ibv_wr_opcode kOps[] = {IBV_WR_SEND, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ,
                                           IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_SEND_WITH_IMM};
  ibv_sge good = src_.sge(1024, 8);
  constexpr int kMore = 15;
  for (int i = 1; i <= kMore; ++i) {
    ibv_send_wr w = send_wr(i, kOps[i % 5], &good, 1, i % 3 ? 0 : IBV_SEND_SIGNALED);
    w.wr.rdma.remote_addr = dst_.addr(8192);
    w.wr.rdma.rkey = dst_.rkey();
    if (kOps[i % 5] == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      w.wr.atomic.remote_addr = dst_.addr(8192);
      w.wr.atomic.rkey = dst_.rkey();
      w.wr.atomic.compare_add = 1;
    }
    ibv_send_wr* badwr = nullptr;
    ASSERT_EQ(ibv_post_send(p.a.qp.get(), &w, &badwr), 0) << "post " << i;
  }
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1 + kMore);
  ASSERT_EQ(wc.size(), 1u + kMore);
  check_wc(wc[0], WcExpect::error(0, IBV_WC_LOC_PROT_ERR, p.a.qpn()));
  for (int i = 1; i <= kMore; ++i) {
    SCOPED_TRACE("send " + std::to_string(i));
    check_wc(wc[i], WcExpect::error(i, IBV_WC_WR_FLUSH_ERR, p.a.qpn()));
  }
  expect_flushed(p.a.rcq.get(), p.a.qpn(), 1000, 12);
  expect_no_wc(p.a.scq.get());
  expect_no_wc(p.a.rcq.get(), 0);
  EXPECT_EQ(first_byte_not(dst_.data() + 4096, 8192, kFill), -1) << "a flushed request reached memory";
}

// Work requests posted to a QP in ERR are accepted and complete at once with
// IBV_WC_WR_FLUSH_ERR, each exactly once, in order, on both queues: whether
// the QP was moved to ERR or got there through an error.
TEST_P(ErrorTest, PostingToAQpInErrFlushes) {
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC}) {
    SCOPED_TRACE(qp_type_name(type));
    Pair p;
    ASSERT_NO_FATAL_FAILURE(make_pair({.type = type}, &p));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(ibv_modify_qp(p.a.qp.get(), &a, IBV_QP_STATE), 0);
    expect_no_wc(p.a.scq.get(), 0);
    for (int round = 0; round < 3; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      ASSERT_NO_FATAL_FAILURE(post_recvs(p.a.qp.get(), 50 + 10 * round, 2, 0, 64));
      ibv_sge s = src_.sge(0, 16);
      ibv_send_wr w0 = send_wr(60 + 10 * round, IBV_WR_SEND, &s, 1, 0);  // unsignaled
      ibv_send_wr w1 = send_wr(61 + 10 * round, IBV_WR_RDMA_WRITE, &s, 1);
      w1.wr.rdma.remote_addr = dst_.addr();
      w1.wr.rdma.rkey = dst_.rkey();
      w0.next = &w1;
      ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w0));
      expect_flushed(p.a.rcq.get(), p.a.qpn(), 50 + 10 * round, 2);
      expect_flushed(p.a.scq.get(), p.a.qpn(), 60 + 10 * round, 2);
    }
    expect_no_wc(p.a.scq.get());
    expect_no_wc(p.a.rcq.get(), 0);
    expect_no_wc(p.b.rcq.get(), 0);
    EXPECT_EQ(first_byte_not(dst_.data(), 64, kFill), -1);
  }
}

TEST_P(ErrorTest, PostingToAQpThatFailedFlushesRc) {
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair({.type = IBV_QPT_RC, .rnr_retry = 0}, &p));
  ibv_sge s = src_.sge(0, 16);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_RNR_RETRY_EXC_ERR, p.a.qpn()));
  ibv_send_wr w2 = send_wr(2, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w2));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.a.qp.get(), 3, 1));
  expect_flushed(p.a.scq.get(), p.a.qpn(), 2, 1);
  expect_flushed(p.a.rcq.get(), p.a.qpn(), 3, 1);
  expect_no_wc(p.a.scq.get(), 0);
}

// Moving a QP to RESET discards its outstanding work requests without any
// completion (IBTA 10.3.1: RESET empties the queues). The QP then comes up
// again and works normally, with no stale completion.
TEST_P(ErrorTest, ResetDropsOutstandingWqesWithoutCompletionsRc) {
  PairOptions o{.type = IBV_QPT_RC, .rnr_retry = 7, .min_rnr_timer = 1};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  // A send stuck in RNR retries, and receives nobody sends to.
  ibv_sge s = src_.sge(0, 32);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.a.qp.get(), 10, 3));
  expect_no_wc(p.a.scq.get());
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(p.a.qp.get(), &a, IBV_QP_STATE), 0);
  // B gets receives too, then is reset as well.
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 20, 3, 4096));
  ASSERT_EQ(ibv_modify_qp(p.b.qp.get(), &a, IBV_QP_STATE), 0);
  expect_no_wc(p.a.scq.get());
  expect_no_wc(p.a.rcq.get(), 0);
  expect_no_wc(p.b.rcq.get(), 0);
  expect_no_wc(p.b.scq.get(), 0);

  // Up again (new PSNs, so nothing of the old connection can match).
  o.psn_a = 0x500000;
  o.psn_b = 0x600000;
  ASSERT_NO_FATAL_FAILURE(connect(p.a, p.b.qpn(), o, true));
  ASSERT_NO_FATAL_FAILURE(connect(p.b, p.a.qpn(), o, false));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 30, 1, 8192));
  fill_pattern(src_.data(), 32, 6);
  ibv_send_wr w2 = send_wr(2, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w2));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(2, IBV_WC_SEND, p.a.qpn()));
  wc = expect_wcs(p.b.rcq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(30, IBV_WC_RECV, p.b.qpn()).len(32));
  EXPECT_EQ(first_pattern_mismatch(dst_.data() + 8192, 32, 6), -1);
  expect_no_wc(p.a.scq.get());
  expect_no_wc(p.b.rcq.get(), 0);
  expect_no_wc(p.a.rcq.get(), 0);
}

// After an error, ERR -> RESET -> ... -> RTS recovers the QP; the error's
// completion, polled before the reset, is the last of the old connection.
// (Completions not polled before the reset are removed by it:
// EngineTest.ResetAndDestroyRemoveTheQpsCompletionsFromItsCqs.)
TEST_P(ErrorTest, QpRecoversThroughResetAfterAnErrorRc) {
  PairOptions o{.type = IBV_QPT_RC, .rnr_retry = 0};
  Pair p;
  ASSERT_NO_FATAL_FAILURE(make_pair(o, &p));
  ibv_sge s = src_.sge(0, 32);
  ibv_send_wr w = send_wr(1, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w));
  std::vector<ibv_wc> wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect::error(1, IBV_WC_RNR_RETRY_EXC_ERR, p.a.qpn()));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(p.a.qp.get(), &a, IBV_QP_STATE), 0);
  ASSERT_EQ(ibv_modify_qp(p.b.qp.get(), &a, IBV_QP_STATE), 0);
  o.psn_a = 0x700000;
  o.psn_b = 0x800000;
  ASSERT_NO_FATAL_FAILURE(connect(p.a, p.b.qpn(), o, true));
  ASSERT_NO_FATAL_FAILURE(connect(p.b, p.a.qpn(), o, false));
  ASSERT_NO_FATAL_FAILURE(post_recvs(p.b.qp.get(), 5, 1));
  ibv_send_wr w2 = send_wr(2, IBV_WR_SEND, &s, 1);
  ASSERT_NO_FATAL_FAILURE(post_send_ok(p.a.qp.get(), &w2));
  wc = expect_wcs(p.a.scq.get(), 1);
  ASSERT_EQ(wc.size(), 1u);
  check_wc(wc[0], WcExpect(2, IBV_WC_SEND, p.a.qpn()));
  ASSERT_EQ(expect_wcs(p.b.rcq.get(), 1).size(), 1u);
  expect_no_wc(p.a.scq.get(), 0);
}

}  // namespace
}  // namespace conformance

// The RC transport roles (emu/qp/requester, responder, completer) between two
// emulated devices on virtual time (tests/unit/qp_harness.hpp): the local ACK
// timeout and retry_cnt, RNR NAKs and rnr_retry, PSN sequence NAKs and
// go-back-N, duplicates after a lost ACK. Every packet is moved by the test and
// every timer fires when the test moves the clock, so each exchange is exact
// and a 67 ms timeout costs no wall time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "emu/qp/qp.hpp"
#include "tests/unit/qp_harness.hpp"
#include "wire/headers.hpp"
#include "wire/opcode.hpp"

namespace softverbs::emu {
namespace {

using namespace std::chrono_literals;
using harness::Packet;
using harness::RcPair;
using harness::RcParams;
using wire::NakCode;

constexpr int kA = 0;  // the requester in every test
constexpr int kB = 1;  // the responder

// Fills A's send buffer with a pattern the receive buffer is compared with.
void fill_pattern(RcPair& pair, size_t len) {
  for (size_t i = 0; i < len; ++i) pair.end(kA).buf[i] = static_cast<uint8_t>(i * 7 + 3);
}

bool received_pattern(RcPair& pair, size_t len) {
  const auto& sent = pair.end(kA).buf;
  const auto& got = pair.end(kB).buf;
  return std::memcmp(sent.data(), got.data() + got.size() / 2, len) == 0;
}

size_t count_naks(const std::vector<Packet>& sent, NakCode code) {
  size_t n = 0;
  for (const Packet& p : sent) n += p.is_nak(code);
  return n;
}

// ---------------------------------------------------------------------------
// Local ACK timeout and retry_cnt (IBTA 9.7.6.1.3)

// The parameter is retry_cnt.
class RetryCount : public ::testing::TestWithParam<int> {};

TEST_P(RetryCount, LostRequestIsResentAtEachTimeoutThenFailsWithRetryExceeded) {
  RcParams params;
  params.timeout = 14;  // 4.096 us * 2^14 = 67.1 ms a try, in virtual time
  params.retry_cnt = static_cast<uint8_t>(GetParam());
  RcPair pair(params);
  const auto start = pair.clock.now();
  const auto timeout = pair.ack_timeout();
  ASSERT_EQ(timeout, 67108864ns);

  ASSERT_EQ(pair.post_send(kA, 100, 7), 0);
  const auto& sent = pair.wire(kA).sent;
  ASSERT_EQ(sent.size(), 1u);
  const uint32_t psn = sent[0].psn();
  EXPECT_EQ(psn, params.sq_psn[kA]);
  EXPECT_EQ(sent[0].op->opcode, wire::opcode::rc_send_only);

  // Every transmission is lost and the peer stays silent: each timeout sends
  // the same PSN again, until retry_cnt retries are spent.
  for (unsigned attempt = 1; attempt <= params.retry_cnt + 1u; ++attempt) {
    SCOPED_TRACE(attempt);
    pair.drop_all(kA);
    pair.advance(timeout - 1ns);
    EXPECT_EQ(sent.size(), attempt) << "nothing is resent before the timeout";
    EXPECT_TRUE(pair.poll(kA).empty());
    EXPECT_EQ(pair.state(kA), IBV_QPS_RTS);
    pair.advance(1ns);
    if (attempt <= params.retry_cnt) {
      ASSERT_EQ(sent.size(), attempt + 1u);
      EXPECT_EQ(sent.back().psn(), psn);
      EXPECT_EQ(sent.back().op->opcode, wire::opcode::rc_send_only);
    }
  }
  EXPECT_EQ(sent.size(), params.retry_cnt + 1u);
  EXPECT_EQ(pair.clock.now() - start, (params.retry_cnt + 1) * timeout);
  EXPECT_EQ(pair.dev(kA).counters().timeouts, params.retry_cnt + 1u);

  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(pair.state(kA), IBV_QPS_ERR);

  // A QP in the error state sends nothing more.
  pair.drop_all(kA);
  pair.advance(10 * timeout);
  EXPECT_EQ(sent.size(), params.retry_cnt + 1u);
  EXPECT_TRUE(pair.poll(kB).empty());
}

INSTANTIATE_TEST_SUITE_P(QpTransport, RetryCount, ::testing::Values(0, 1, 7));

TEST(QpTransport, AnAnswerBeforeTheTimeoutStopsTheRetries) {
  RcPair pair;
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 1), 0);
  pair.advance(pair.ack_timeout() - 1ns);
  pair.settle();
  pair.advance(10 * pair.ack_timeout());
  EXPECT_EQ(pair.wire(kA).sent.size(), 1u);
  EXPECT_EQ(pair.dev(kA).counters().timeouts, 0u);
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

// The path's traffic class is every packet's IPv4 TOS (RoCEv2 carries the GRH
// traffic class there): requests and the responder's acknowledgements alike.
TEST(QpTransport, ThePathsTrafficClassIsTheTosOfEveryPacket) {
  RcParams params;
  params.traffic_class = 0x68;  // DSCP 26, not ECN-capable
  RcPair pair(params);
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 3000, 1), 0);
  pair.settle();
  ASSERT_EQ(pair.poll(kA).size(), 1u);
  ASSERT_FALSE(pair.wire(kA).sent.empty());
  ASSERT_FALSE(pair.wire(kB).sent.empty());
  for (int side : {kA, kB})
    for (const Packet& p : pair.wire(side).sent) EXPECT_EQ(p.tos, 0x68) << "side " << side << " psn " << p.psn();
}

// ---------------------------------------------------------------------------
// RNR NAKs and rnr_retry (IBTA 9.7.5.2.8)

TEST(QpTransport, RnrNakMakesTheRequesterWaitExactlyTheRnrTimer) {
  RcParams params;
  params.rnr_retry = 3;
  params.min_rnr_timer = 14;  // 1.28 ms (IBTA table 45)
  RcPair pair(params);
  const auto rnr_wait = std::chrono::microseconds(wire::rnr_timer_us(params.min_rnr_timer));
  ASSERT_EQ(rnr_wait, 1280us);

  ASSERT_EQ(pair.post_send(kA, 100, 1), 0);
  const Packet request = pair.deliver(kA);  // B has no receive posted
  ASSERT_EQ(pair.waiting(kB), 1u);
  const Packet nak = pair.deliver(kB);
  EXPECT_TRUE(nak.is_rnr_nak());
  EXPECT_EQ(nak.aeth.rnr_timer(), params.min_rnr_timer);
  EXPECT_EQ(nak.psn(), request.psn());
  EXPECT_EQ(pair.waiting(kA), 0u);

  pair.advance(rnr_wait - 1ns);
  EXPECT_EQ(pair.waiting(kA), 0u) << "resent before the RNR timer ran out";
  pair.advance(1ns);
  ASSERT_EQ(pair.waiting(kA), 1u);
  EXPECT_EQ(pair.wire(kA).outbox.front().psn(), request.psn());

  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  pair.settle();
  const auto sent = pair.poll(kA);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
  const auto recv = pair.poll(kB);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].wr_id, 9u);
  EXPECT_EQ(recv[0].byte_len, 100u);
  EXPECT_EQ(pair.dev(kA).counters().rnr_naks_received, 1u);
  EXPECT_EQ(pair.dev(kB).counters().rnr_naks_sent, 1u);
}

// The parameter is rnr_retry (7, retry forever, is not a count).
class RnrRetry : public ::testing::TestWithParam<int> {};

TEST_P(RnrRetry, EachRnrNakCostsOneRetryThenRnrRetryExceeded) {
  RcParams params;
  params.rnr_retry = static_cast<uint8_t>(GetParam());
  params.min_rnr_timer = 1;  // 10 us
  RcPair pair(params);
  const auto rnr_wait = std::chrono::microseconds(wire::rnr_timer_us(params.min_rnr_timer));

  ASSERT_EQ(pair.post_send(kA, 100, 5), 0);
  for (unsigned nak = 1; nak <= params.rnr_retry + 1u; ++nak) {
    SCOPED_TRACE(nak);
    ASSERT_EQ(pair.waiting(kA), 1u);
    EXPECT_EQ(pair.deliver(kA).psn(), params.sq_psn[kA]);
    ASSERT_TRUE(pair.deliver(kB).is_rnr_nak());
    if (nak <= params.rnr_retry) {
      EXPECT_TRUE(pair.poll(kA).empty());
      pair.advance(rnr_wait - 1ns);
      EXPECT_EQ(pair.waiting(kA), 0u);
      pair.advance(1ns);
    }
  }
  EXPECT_EQ(pair.wire(kA).sent.size(), params.rnr_retry + 1u);
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 5u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(pair.state(kA), IBV_QPS_ERR);
  pair.advance(pair.ack_timeout() * 2);
  EXPECT_EQ(pair.waiting(kA), 0u);
}

INSTANTIATE_TEST_SUITE_P(QpTransport, RnrRetry, ::testing::Values(0, 1, 3));

// ---------------------------------------------------------------------------
// PSN sequence errors and go-back-N (IBTA 9.7.5.1.2, 9.7.5.1.4)

TEST(QpTransport, ReorderedPairGetsOneSequenceNakThenGoBackN) {
  RcPair pair;
  constexpr uint32_t kLen = 2048;  // two packets of the 1024-byte path MTU
  fill_pattern(pair, kLen);
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, kLen, 1), 0);
  const uint32_t first = pair.params().sq_psn[kA];
  ASSERT_EQ(pair.waiting(kA), 2u);

  // The second packet overtakes the first.
  EXPECT_EQ(pair.deliver(kA, 1).psn(), first + 1);
  EXPECT_EQ(pair.deliver(kA).psn(), first);
  const auto& answers = pair.wire(kB).sent;
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_TRUE(answers[0].is_nak(NakCode::psn_sequence_error));
  EXPECT_EQ(answers[0].psn(), first);  // the PSN the responder expected

  // The NAK sends the requester back to that PSN: both packets again.
  pair.deliver(kB);
  const auto& sent = pair.wire(kA).sent;
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(sent[2].psn(), first);
  EXPECT_EQ(sent[3].psn(), first + 1);

  pair.settle();
  EXPECT_EQ(count_naks(answers, NakCode::psn_sequence_error), 1u);
  EXPECT_EQ(sent.size(), 4u);
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  const auto recv = pair.poll(kB);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv[0].byte_len, kLen);
  EXPECT_TRUE(received_pattern(pair, kLen));
  EXPECT_EQ(pair.state(kA), IBV_QPS_RTS);
  EXPECT_EQ(pair.state(kB), IBV_QPS_RTS);
}

TEST(QpTransport, PacketsAfterAGapGetOneNakBetweenThem) {
  RcPair pair;
  constexpr uint32_t kLen = 3072;  // three packets
  fill_pattern(pair, kLen);
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, kLen, 1), 0);
  const uint32_t first = pair.params().sq_psn[kA];
  ASSERT_EQ(pair.waiting(kA), 3u);

  // The first packet is held back; the two behind it are out of sequence,
  // and the responder NAKs only the first of them.
  pair.deliver(kA, 1);
  pair.deliver(kA, 1);
  EXPECT_EQ(pair.wire(kB).sent.size(), 1u);
  pair.drop(kA);
  pair.settle();
  EXPECT_EQ(count_naks(pair.wire(kB).sent, NakCode::psn_sequence_error), 1u);
  const auto& sent = pair.wire(kA).sent;
  ASSERT_EQ(sent.size(), 6u);  // three, then all three again from the NAK's PSN
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(sent[3 + i].psn(), first + i);
  const auto recv = pair.poll(kB);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].byte_len, kLen);
  EXPECT_TRUE(received_pattern(pair, kLen));
  ASSERT_EQ(pair.poll(kA).size(), 1u);
}

// ---------------------------------------------------------------------------
// Duplicates (IBTA 9.7.5.1.1)

TEST(QpTransport, LostAckMakesADuplicateThatIsAcknowledgedNotExecuted) {
  RcPair pair;
  fill_pattern(pair, 100);
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_recv(kB, 4096, 10), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 1), 0);
  const uint32_t psn = pair.deliver(kA).psn();
  auto recv = pair.poll(kB);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].wr_id, 9u);
  EXPECT_TRUE(received_pattern(pair, 100));

  const Packet ack = pair.drop(kB);
  EXPECT_TRUE(ack.is_ack());
  EXPECT_EQ(ack.psn(), psn);
  pair.advance(pair.ack_timeout());
  ASSERT_EQ(pair.waiting(kA), 1u);
  EXPECT_EQ(pair.deliver(kA).psn(), psn);  // the request again, to a responder that has it
  EXPECT_EQ(pair.dev(kB).counters().duplicates, 1u);
  EXPECT_TRUE(pair.poll(kB).empty()) << "the duplicate was executed again";
  ASSERT_EQ(pair.waiting(kB), 1u);
  const Packet again = pair.deliver(kB);
  EXPECT_TRUE(again.is_ack());
  EXPECT_EQ(again.psn(), psn);

  auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(pair.poll(kA).empty());

  // The second receive is still there for the next message.
  ASSERT_EQ(pair.post_send(kA, 50, 2), 0);
  pair.settle();
  recv = pair.poll(kB);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].wr_id, 10u);
  EXPECT_EQ(recv[0].byte_len, 50u);
  ASSERT_EQ(pair.poll(kA).size(), 1u);
}

}  // namespace
}  // namespace softverbs::emu

// Adaptive retransmission (emu/qp/retransmit.hpp, SOFTVERBS_ADAPTIVE_RETRANSMIT)
// between two emulated devices on virtual time (tests/unit/qp_harness.hpp): a
// lost retransmission or a lost sequence NAK is repaired after the repair
// timeout, not the local ACK timeout, in a loss episode; the repair timeout
// follows the measured round trip and doubles; a peer that stops answering still fails the request
// after exactly the configured local ACK timeouts and retry_cnt. Each test
// expects what the process's setting says: unit.adaptive_retransmit_off runs
// them again with the variable at 0, where only the local ACK timeout resends
// (IBTA 9.7.6.1.3, as rxe).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "emu/qp/qp.hpp"
#include "emu/qp/retransmit.hpp"
#include "tests/unit/qp_harness.hpp"
#include "wire/headers.hpp"

namespace softverbs::emu {
namespace {

using namespace std::chrono_literals;
using harness::Packet;
using harness::RcPair;
using harness::RcParams;
using wire::NakCode;

constexpr int kA = 0;  // the requester
constexpr int kB = 1;  // the responder
constexpr auto kRepair = AdaptiveRetransmit::kMinTimeout;

bool adaptive() { return adaptive_retransmit_enabled(); }

TEST(QpRetransmit, TheSettingParses) {
  EXPECT_EQ(parse_adaptive_retransmit("1"), true);
  EXPECT_EQ(parse_adaptive_retransmit("on"), true);
  EXPECT_EQ(parse_adaptive_retransmit("0"), false);
  EXPECT_EQ(parse_adaptive_retransmit("off"), false);
  EXPECT_EQ(parse_adaptive_retransmit("yes"), std::nullopt);
  EXPECT_EQ(parse_adaptive_retransmit(""), std::nullopt);
  EXPECT_EQ(parse_adaptive_retransmit(nullptr), std::nullopt);
}

TEST(QpRetransmit, RoundTripEstimateFollowsRfc6298AndDoubles) {
  AdaptiveRetransmit r;
  const Clock::time_point t0{};
  EXPECT_EQ(r.timeout(), kRepair) << "no sample yet: the floor";
  r.probe(10, t0);
  r.probe(11, t0 + 1ms);  // one at a time: ignored
  EXPECT_EQ(r.probe_psn(), 10u);
  r.sample(t0 + 2ms);  // first sample: mean 2 ms, variation 1 ms
  EXPECT_FALSE(r.probing());
  EXPECT_EQ(r.timeout(), 6ms);
  r.probe(20, t0 + 10ms);
  r.sample(t0 + 12ms);  // the same again: the variation shrinks by a quarter
  EXPECT_EQ(r.timeout(), 5ms);
  r.back_off();
  EXPECT_EQ(r.timeout(), 10ms);
  r.back_off();
  EXPECT_EQ(r.timeout(), 20ms);
  r.probe(30, t0 + 20ms);
  r.sample(t0 + 22ms);  // a new sample ends the backoff
  EXPECT_EQ(r.timeout(), 4250us);
  r.back_off();
  r.probe(40, t0 + 30ms);
  r.cancel_probe();  // a resend: no sample from it, and the backoff stays
  r.sample(t0 + 100ms);
  EXPECT_EQ(r.timeout(), 8500us);
  EXPECT_FALSE(r.lossy());
  r.loss_seen(t0 + 1s);
  EXPECT_TRUE(r.lossy());
  EXPECT_TRUE(r.in_loss_episode(t0 + 1s + AdaptiveRetransmit::kLossEpisode - 1ns));
  EXPECT_FALSE(r.in_loss_episode(t0 + 1s + AdaptiveRetransmit::kLossEpisode));
}

// Advances to `at` (from `start`) and expects one more packet from A exactly
// then, none a nanosecond before; the packets are lost.
void expect_resend_at(RcPair& pair, Clock::time_point start, Clock::duration at) {
  SCOPED_TRACE(std::chrono::duration_cast<std::chrono::nanoseconds>(at).count());
  const size_t before = pair.wire(kA).sent.size();
  pair.advance(start + at - 1ns - pair.clock.now());
  EXPECT_EQ(pair.wire(kA).sent.size(), before) << "resent early";
  pair.advance(1ns);
  EXPECT_EQ(pair.wire(kA).sent.size(), before + 1) << "not resent on time";
  pair.drop_all(kA);
}

// One exchange without loss: the requester has heard from its peer.
void first_message(RcPair& pair) {
  ASSERT_EQ(pair.post_recv(kB, 4096, 8), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 1), 0);
  pair.settle();
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  ASSERT_EQ(pair.poll(kB).size(), 1u);
}

// One exchange whose first packet is lost and repaired by a sequence NAK: the
// requester has heard from its peer and is in a loss episode.
void lossy_first_message(RcPair& pair) {
  ASSERT_EQ(pair.post_recv(kB, 4096, 8), 0);
  ASSERT_EQ(pair.post_send(kA, 2048, 1), 0);  // two packets
  pair.drop(kA);
  pair.deliver(kA);
  ASSERT_TRUE(pair.deliver(kB).is_nak(NakCode::psn_sequence_error));
  pair.settle();
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  ASSERT_EQ(pair.poll(kB).size(), 1u);
}

// Sends a three-packet message whose second packet and the responder's NAK
// for it are lost; returns the message's first PSN.
uint32_t message_with_lost_nak(RcPair& pair, uint64_t wr_id) {
  EXPECT_EQ(pair.post_recv(kB, 4096, 9), 0);
  EXPECT_EQ(pair.post_send(kA, 3072, wr_id), 0);
  EXPECT_EQ(pair.waiting(kA), 3u);
  const uint32_t first = pair.deliver(kA).psn();
  pair.drop(kA);
  pair.deliver(kA);
  EXPECT_EQ(pair.waiting(kB), 1u);
  EXPECT_TRUE(pair.drop(kB).is_nak(NakCode::psn_sequence_error));
  return first;
}

// The sequence NAK names the gap; its retransmission is lost too, and the
// responder, which NAKs once per gap, stays silent (IBTA 9.7.5.1.2).
TEST(QpRetransmit, ALostRetransmissionIsRepairedAfterTheRepairTimeout) {
  RcPair pair;
  const auto start = pair.clock.now();
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 3072, 1), 0);  // three packets
  const uint32_t first = pair.params().sq_psn[kA];
  ASSERT_EQ(pair.waiting(kA), 3u);
  pair.deliver(kA);
  EXPECT_EQ(pair.drop(kA).psn(), first + 1);
  pair.deliver(kA);
  ASSERT_EQ(pair.waiting(kB), 1u);
  const Packet nak = pair.deliver(kB);
  EXPECT_TRUE(nak.is_nak(NakCode::psn_sequence_error));
  EXPECT_EQ(nak.psn(), first + 1);
  ASSERT_EQ(pair.waiting(kA), 2u);
  EXPECT_EQ(pair.drop(kA).psn(), first + 1);  // the repair is lost
  pair.deliver(kA);
  EXPECT_EQ(pair.waiting(kB), 0u) << "one NAK per gap";

  const Clock::duration wait = adaptive() ? Clock::duration(kRepair) : Clock::duration(pair.ack_timeout());
  pair.advance(start + wait - 1ns - pair.clock.now());
  EXPECT_EQ(pair.waiting(kA), 0u);
  pair.advance(1ns);
  ASSERT_EQ(pair.waiting(kA), 2u);
  EXPECT_EQ(pair.wire(kA).outbox.front().psn(), first + 1);
  pair.settle();
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  const auto recv = pair.poll(kB);
  ASSERT_EQ(recv.size(), 1u);
  EXPECT_EQ(recv[0].byte_len, 3072u);
  EXPECT_EQ(pair.dev(kA).counters().timeouts, adaptive() ? 0u : 1u);
  EXPECT_EQ(pair.state(kA), IBV_QPS_RTS);
}

// The responder's only NAK for a gap is lost: the requester, which has heard
// from it and seen loss before, resends from the oldest unacknowledged PSN.
TEST(QpRetransmit, ALostNakIsRepairedAfterTheRepairTimeout) {
  RcPair pair;
  lossy_first_message(pair);
  const auto start = pair.clock.now();
  const uint32_t first = message_with_lost_nak(pair, 2);

  const Clock::duration wait = adaptive() ? Clock::duration(kRepair) : Clock::duration(pair.ack_timeout());
  pair.advance(start + wait - 1ns - pair.clock.now());
  EXPECT_EQ(pair.waiting(kA), 0u);
  pair.advance(1ns);
  ASSERT_EQ(pair.waiting(kA), 3u) << "the whole message again: nothing of it is acknowledged";
  EXPECT_EQ(pair.wire(kA).outbox.front().psn(), first);
  pair.settle();
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  ASSERT_EQ(pair.poll(kB).size(), 1u);
  EXPECT_EQ(pair.dev(kA).counters().timeouts, adaptive() ? 0u : 1u);
}

// The repair timer runs only in a loss episode: on a connection that has seen
// no loss, or none for AdaptiveRetransmit::kLossEpisode, the first lost NAK
// waits for the local ACK timeout (and starts an episode).
TEST(QpRetransmit, WithoutRecentLossALostNakWaitsForTheLocalAckTimeout) {
  for (const bool earlier_loss : {false, true}) {
    SCOPED_TRACE(earlier_loss);
    RcPair pair;
    if (earlier_loss) {
      lossy_first_message(pair);
      pair.advance(AdaptiveRetransmit::kLossEpisode);
    } else {
      first_message(pair);
    }
    const auto start = pair.clock.now();
    message_with_lost_nak(pair, 2);
    pair.advance(start + pair.ack_timeout() - 1ns - pair.clock.now());
    EXPECT_EQ(pair.waiting(kA), 0u);
    pair.advance(1ns);
    ASSERT_EQ(pair.waiting(kA), 3u);
    pair.settle();
    ASSERT_EQ(pair.poll(kA).size(), 1u);
    EXPECT_EQ(pair.dev(kA).counters().timeouts, 1u);
  }
}

// An exchange that takes 0.4 ms of virtual time gives a round trip of 0.4 ms
// (RFC 6298: mean 0.4 ms, variation 0.2 ms), so the repair timeout is 1.2 ms.
TEST(QpRetransmit, TheRepairTimeoutFollowsTheMeasuredRoundTrip) {
  RcPair pair;
  lossy_first_message(pair);  // its round trip is not measured: the timed packet was resent
  ASSERT_EQ(pair.post_recv(kB, 4096, 8), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 2), 0);
  pair.advance(200us);
  pair.deliver(kA);
  pair.advance(200us);
  ASSERT_TRUE(pair.deliver(kB).is_ack());
  ASSERT_EQ(pair.poll(kA).size(), 1u);
  ASSERT_EQ(pair.poll(kB).size(), 1u);
  ASSERT_EQ(pair.waiting(kA), 0u);

  // A gap, then its retransmission lost.
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 2048, 3), 0);  // two packets
  pair.drop(kA);
  pair.deliver(kA);
  ASSERT_TRUE(pair.deliver(kB).is_nak(NakCode::psn_sequence_error));
  const auto start = pair.clock.now();
  ASSERT_EQ(pair.waiting(kA), 2u);
  pair.drop(kA);
  pair.deliver(kA);
  const Clock::duration wait = adaptive() ? Clock::duration(1200us) : Clock::duration(pair.ack_timeout());
  pair.advance(start + wait - 1ns - pair.clock.now());
  EXPECT_EQ(pair.waiting(kA), 0u);
  pair.advance(1ns);
  ASSERT_EQ(pair.waiting(kA), 2u);
  pair.settle();
  ASSERT_EQ(pair.poll(kA).size(), 1u);
}

// A peer that stops answering: the early resends back off (0.5, 1, 2, ... ms)
// within the first local ACK timeout, which fires on time, and the request
// fails with IBV_WC_RETRY_EXC_ERR at the same moment as without them. (The
// first timeout after a packet from the peer does not count against retry_cnt:
// docs/compatibility.md; retry_cnt 7 then takes 8 more, 9 in all.)
TEST(QpRetransmit, APeerThatStopsAnsweringFailsAfterExactlyTheConfiguredTimeouts) {
  RcParams params;
  params.retry_cnt = 7;
  RcPair pair(params);
  lossy_first_message(pair);
  const auto start = pair.clock.now();
  const Clock::duration t = pair.ack_timeout();
  ASSERT_EQ(pair.post_send(kA, 100, 2), 0);
  pair.drop_all(kA);  // from here on, everything A sends is lost

  if (adaptive()) {
    Clock::duration at = kRepair;
    for (Clock::duration wait = kRepair; at < t; wait *= 2, at += wait) expect_resend_at(pair, start, at);
  }
  for (int n = 1; n <= 8; ++n) expect_resend_at(pair, start, n * t);
  pair.advance(start + 9 * t - 1ns - pair.clock.now());
  EXPECT_TRUE(pair.poll(kA).empty());
  EXPECT_EQ(pair.state(kA), IBV_QPS_RTS);
  pair.advance(1ns);
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(pair.dev(kA).counters().timeouts, 9u);
  EXPECT_EQ(pair.wire(kA).sent.size(), 4u + 1u + 8u + (adaptive() ? 7u : 0u));
}

// A peer that answers late (the ACK is delayed, not lost): an early resend is
// a duplicate, acknowledged and not executed again, and retry_cnt is untouched.
TEST(QpRetransmit, AnEarlyResendToASlowPeerIsADuplicate) {
  RcParams params;
  params.retry_cnt = 1;  // two counted retries would fail the request
  RcPair pair(params);
  lossy_first_message(pair);
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 2), 0);
  pair.deliver(kA);
  ASSERT_EQ(pair.waiting(kB), 1u);  // the ACK, held back
  pair.advance(kRepair);
  EXPECT_EQ(pair.waiting(kA), adaptive() ? 1u : 0u);
  pair.advance(2 * kRepair);  // doubled
  EXPECT_EQ(pair.waiting(kA), adaptive() ? 2u : 0u);
  pair.settle();
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  const auto recv = pair.poll(kB);
  ASSERT_EQ(recv.size(), 1u) << "executed once";
  EXPECT_EQ(pair.dev(kB).counters().duplicates, adaptive() ? 2u : 0u);
  EXPECT_EQ(pair.dev(kA).counters().timeouts, 0u);
  EXPECT_EQ(pair.state(kA), IBV_QPS_RTS);
}

}  // namespace
}  // namespace softverbs::emu

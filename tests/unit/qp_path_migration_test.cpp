// Path migration of RC QPs (emu/qp/path_migration.cpp, IBTA 17.2.8) on the
// wire of tests/unit/qp_harness.hpp: the BTH MigReq bit of every packet, the
// REARM -> ARMED handshake it carries, migration on request and on retry
// exhaustion, and the events of both ends, exact to the packet.
#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <optional>

#include "emu/qp/qp.hpp"
#include "tests/unit/qp_harness.hpp"
#include "wire/opcode.hpp"

namespace softverbs::emu {
namespace {

using namespace std::chrono_literals;
using harness::Packet;
using harness::RcPair;
using harness::RcParams;

constexpr int kA = 0;
constexpr int kB = 1;

ibv_qp_attr query(RcPair& pair, int side) {
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  EmuProvider::instance().query_qp(pair.qp(side), &attr, 0, &init);
  return attr;
}

ibv_mig_state mig_state(RcPair& pair, int side) { return query(pair, side).path_mig_state; }

// Loads the alternate path (the same destination, another timeout, as a
// single-port host does) and asks for REARM: RTS -> RTS.
int rearm(RcPair& pair, int side, uint8_t alt_timeout = 10) {
  ibv_qp_attr a = query(pair, side);
  a.alt_ah_attr = a.ah_attr;
  a.alt_port_num = a.port_num;
  a.alt_pkey_index = a.pkey_index;
  a.alt_timeout = alt_timeout;
  a.path_mig_state = IBV_MIG_REARM;
  return EmuProvider::instance().modify_qp(pair.qp(side), &a, IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE);
}

// The async event queued on the side's context, if any (without waiting).
std::optional<ibv_async_event> event(RcPair& pair, int side) {
  pollfd p{pair.end(side).ctx->async_fd, POLLIN, 0};
  if (::poll(&p, 1, 0) != 1) return std::nullopt;
  ibv_async_event ev{};
  EmuProvider& prov = EmuProvider::instance();
  if (prov.get_async_event(pair.end(side).ctx, &ev) != 0) return std::nullopt;
  prov.ack_async_event(&ev);
  return ev;
}

// Both ends rearmed; one SEND A -> B and its ACK make both ARMED.
void arm_both(RcPair& pair) {
  ASSERT_EQ(rearm(pair, kA), 0);
  ASSERT_EQ(rearm(pair, kB), 0);
  ASSERT_EQ(pair.post_recv(kB, 4096, 50), 0);
  ASSERT_EQ(pair.post_send(kA, 64, 1), 0);
  pair.settle();
  ASSERT_EQ(mig_state(pair, kA), IBV_MIG_ARMED);
  ASSERT_EQ(mig_state(pair, kB), IBV_MIG_ARMED);
  pair.poll(kA);
  pair.poll(kB);
}

TEST(QpPathMigration, WithoutAnAlternatePathEveryPacketCarriesMigReq) {
  RcPair pair;
  EXPECT_EQ(mig_state(pair, kA), IBV_MIG_MIGRATED);
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 1), 0);
  const Packet req = pair.deliver(kA);
  EXPECT_TRUE(req.is_request());
  EXPECT_TRUE(req.bth.migreq);
  const Packet ack = pair.deliver(kB);
  EXPECT_TRUE(ack.is_ack());
  EXPECT_TRUE(ack.bth.migreq);
}

TEST(QpPathMigration, RearmClearsMigReqAndThePeersMigReqZeroArms) {
  RcPair pair;
  ASSERT_EQ(rearm(pair, kA), 0);
  EXPECT_EQ(mig_state(pair, kA), IBV_MIG_REARM);
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 1), 0);
  Packet p = pair.deliver(kA);
  EXPECT_FALSE(p.bth.migreq);
  // B never loaded an alternate path: its ACK says so, A stays REARM.
  p = pair.deliver(kB);
  EXPECT_TRUE(p.bth.migreq);
  EXPECT_EQ(mig_state(pair, kA), IBV_MIG_REARM);
  EXPECT_EQ(mig_state(pair, kB), IBV_MIG_MIGRATED);

  // B rearms: its next packet (an ACK) has MigReq 0 and arms A; A's next
  // request arms B.
  ASSERT_EQ(rearm(pair, kB), 0);
  ASSERT_EQ(pair.post_recv(kB, 4096, 10), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 2), 0);
  p = pair.deliver(kA);
  EXPECT_FALSE(p.bth.migreq);
  EXPECT_EQ(mig_state(pair, kB), IBV_MIG_ARMED);
  p = pair.deliver(kB);
  EXPECT_FALSE(p.bth.migreq);
  EXPECT_EQ(mig_state(pair, kA), IBV_MIG_ARMED);
  EXPECT_FALSE(event(pair, kA));
  EXPECT_FALSE(event(pair, kB));
}

TEST(QpPathMigration, RequestedMigrationSetsMigReqAndThePeerFollows) {
  RcPair pair;
  ASSERT_NO_FATAL_FAILURE(arm_both(pair));
  ibv_qp_attr a{};
  a.path_mig_state = IBV_MIG_MIGRATED;
  ASSERT_EQ(EmuProvider::instance().modify_qp(pair.qp(kA), &a, IBV_QP_PATH_MIG_STATE), 0);
  const ibv_qp_attr q = query(pair, kA);
  EXPECT_EQ(q.path_mig_state, IBV_MIG_MIGRATED);
  EXPECT_EQ(q.timeout, 10) << "the alternate path's timeout is the QP's now";
  auto ev = event(pair, kA);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->event_type, IBV_EVENT_PATH_MIG);
  EXPECT_EQ(ev->element.qp, pair.qp(kA));

  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 2), 0);
  const Packet p = pair.deliver(kA);
  EXPECT_TRUE(p.bth.migreq);
  EXPECT_EQ(mig_state(pair, kB), IBV_MIG_MIGRATED);
  ev = event(pair, kB);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->event_type, IBV_EVENT_PATH_MIG);
  EXPECT_EQ(ev->element.qp, pair.qp(kB));
  EXPECT_TRUE(pair.deliver(kB).bth.migreq);
  ASSERT_EQ(pair.poll(kA).size(), 1u);
  // A second request to migrate, with nothing armed, is an error (IBTA 17.2.8)
  // only when the QP is not already MIGRATED: there it changes nothing.
  EXPECT_EQ(EmuProvider::instance().modify_qp(pair.qp(kA), &a, IBV_QP_PATH_MIG_STATE), 0);
  EXPECT_FALSE(event(pair, kA));
}

TEST(QpPathMigration, RetriesExhaustedOnThePrimaryPathMigrateAnArmedQp) {
  RcParams params;
  params.retry_cnt = 2;
  RcPair pair(params);
  ASSERT_NO_FATAL_FAILURE(arm_both(pair));
  ASSERT_EQ(pair.post_recv(kB, 4096, 9), 0);
  ASSERT_EQ(pair.post_send(kA, 100, 7), 0);
  const auto& sent = pair.wire(kA).sent;
  const size_t first = sent.size() - 1;
  // The primary path loses everything: the first try and retry_cnt retries,
  // plus one resend that costs no retry: A heard from B (the ACK of
  // arm_both) since its last timeout (Qp::on_timer, docs/compatibility.md).
  for (int i = 0; i <= params.retry_cnt + 1; ++i) {
    EXPECT_FALSE(sent.back().bth.migreq);
    pair.drop_all(kA);
    pair.advance(pair.ack_timeout());
  }
  EXPECT_EQ(sent.size(), first + params.retry_cnt + 3u);
  // The last timeout migrated A instead of failing it: the resend goes on the
  // alternate path, with MigReq set, and B follows on receipt.
  EXPECT_TRUE(sent.back().bth.migreq);
  EXPECT_EQ(mig_state(pair, kA), IBV_MIG_MIGRATED);
  auto ev = event(pair, kA);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->event_type, IBV_EVENT_PATH_MIG);
  pair.settle();
  EXPECT_EQ(mig_state(pair, kB), IBV_MIG_MIGRATED);
  ev = event(pair, kB);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->event_type, IBV_EVENT_PATH_MIG);
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(pair.state(kA), IBV_QPS_RTS);
}

TEST(QpPathMigration, RetriesExhaustedWithAnUnarmedAlternatePathRaisePathMigErr) {
  RcParams params;
  params.retry_cnt = 1;
  RcPair pair(params);
  ASSERT_EQ(rearm(pair, kA), 0);  // B never rearms: A cannot arm
  ASSERT_EQ(pair.post_send(kA, 100, 7), 0);
  for (int i = 0; i <= params.retry_cnt; ++i) {
    pair.drop_all(kA);
    pair.advance(pair.ack_timeout());
  }
  auto ev = event(pair, kA);
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->event_type, IBV_EVENT_PATH_MIG_ERR);
  const auto wc = pair.poll(kA);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(pair.state(kA), IBV_QPS_ERR);
}

}  // namespace
}  // namespace softverbs::emu

// Reliability cases that need a fault at one exact place.
#include <cstdlib>
#include <string>

#include "tests/faults/rc_pair.hpp"

namespace faults_test {
namespace {

class Reliability : public PairTest {};

// The only response of an RDMA READ is lost and the WRITE behind it is
// acknowledged: the ACK covers the READ's PSN, which tells the requester its
// response will not come. The READ is requested again at once (no local ACK
// timeout is configured: timeout 0 waits forever), and both complete in order.
TEST_F(Reliability, ReadWhoseResponseIsLostBehindALaterAck) {
  QpParams p;
  p.timeout = 0;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  for (size_t i = 0; i < 64; ++i) b_.buf[i] = static_cast<uint8_t>(i * 3 + 1);
  load("[[rule]]\nname = \"lost\"\nclass = \"read_response\"\ncount = 1\naction = \"drop\"\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_READ, 64, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 2, 0, 0, 4096), 0);
  ibv_wc wc{};
  for (uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(wait_wc(a_.cq, &wc)) << "work request " << id << " never completed";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, id);
  }
  EXPECT_EQ(softverbs_fault_hits("lost"), 1u);
  EXPECT_EQ(std::memcmp(a_.buf.data(), b_.buf.data(), 64), 0);
}

// The same with an atomic: its response (the atomic ACK) is lost, a later
// request is acknowledged; the atomic is asked again and answered from the
// responder's cache, so it is executed once.
TEST_F(Reliability, AtomicWhoseResponseIsLostBehindALaterAck) {
  QpParams p;
  p.timeout = 0;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  uint64_t counter = 5;
  std::memcpy(b_.buf.data(), &counter, 8);
  load("[[rule]]\nname = \"lost\"\nclass = \"atomic_ack\"\ncount = 1\naction = \"drop\"\n");
  ASSERT_EQ(post(a_, b_, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 1), 0);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 64, 2, 0, 0, 4096), 0);
  ibv_wc wc{};
  for (uint64_t id : {1u, 2u}) {
    ASSERT_TRUE(wait_wc(a_.cq, &wc)) << "work request " << id << " never completed";
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(wc.wr_id, id);
  }
  uint64_t fetched = 0, now = 0;
  std::memcpy(&fetched, a_.buf.data(), 8);
  std::memcpy(&now, b_.buf.data(), 8);
  EXPECT_EQ(fetched, 5u);
  EXPECT_EQ(now, 6u) << "the atomic ran twice";
}

// The device's clock (virtual under SOFTVERBS_CLOCK=virtual), in ns.
uint64_t device_ns(ibv_context* ctx) {
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  EXPECT_EQ(ibv_query_rt_values_ex(ctx, &v), 0);
  return static_cast<uint64_t>(v.raw_clock.tv_sec) * 1000000000ull + static_cast<uint64_t>(v.raw_clock.tv_nsec);
}

bool env_is(const char* name, const std::string& value) {
  const char* v = std::getenv(name);
  return v && value == v;
}

// A gap whose repair is lost too (docs/faults.md, "Recovery from loss"): the
// second packet of a WRITE is dropped, and again when the sequence NAK makes
// the requester resend it. The responder NAKs once per gap and then drops the
// packets after it without an answer (IBTA 9.7.5.1.2), so only a timer of the
// requester's can end the wait: its repair timer (adaptive retransmission,
// 0.5 ms with no round trip measured; on virtual time the round trip is 0),
// or, with SOFTVERBS_ADAPTIVE_RETRANSMIT=0 or the rxe personality, the local ACK timeout of timeout
// 14, 67 ms. On virtual time the WRITE completes after exactly that.
TEST_F(Reliability, ALostRepairIsResentAfterTheRepairTimeout) {
  QpParams p;
  p.timeout = 14;
  ASSERT_NO_FATAL_FAILURE(setup(p));
  load("[[rule]]\nname = \"gap\"\ndevice = \"" + a_.device +
       "\"\ndirection = \"tx\"\npsn = [1, 1]\ncount = 2\naction = \"drop\"\n");
  softverbs_counters c0{};
  ASSERT_EQ(softverbs_device_counters(a_.device.c_str(), &c0, sizeof c0), 0);
  const uint64_t start = device_ns(a_.ctx);
  ASSERT_EQ(post(a_, b_, IBV_WR_RDMA_WRITE, 4096, 1), 0);  // four packets of the 1024-byte path MTU
  ibv_wc wc{};
  ASSERT_TRUE(wait_wc(a_.cq, &wc));
  const uint64_t elapsed = device_ns(a_.ctx) - start;
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(softverbs_fault_hits("gap"), 2u);
  softverbs_counters c{};
  ASSERT_EQ(softverbs_device_counters(a_.device.c_str(), &c, sizeof c), 0);
  // Off by the variable, or, when it is unset, by the rxe personality.
  const bool adaptive = std::getenv("SOFTVERBS_ADAPTIVE_RETRANSMIT")
                            ? !env_is("SOFTVERBS_ADAPTIVE_RETRANSMIT", "0") && !env_is("SOFTVERBS_ADAPTIVE_RETRANSMIT", "off")
                            : !env_is("SOFTVERBS_PERSONALITY", "rxe");
  EXPECT_EQ(c.timeouts - c0.timeouts, adaptive ? 0u : 1u);
  if (env_is("SOFTVERBS_CLOCK", "virtual")) {
    EXPECT_EQ(elapsed, adaptive ? 500000u : 4096u << 14);
  }
}

}  // namespace
}  // namespace faults_test

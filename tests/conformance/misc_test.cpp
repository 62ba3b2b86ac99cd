// Library utilities (strings, rates, fork support) and optional features a
// device may or may not implement (memory windows, device memory, XRC, ECE).
#include <fcntl.h>

#include <cstdlib>

#include "conformance.hpp"

namespace conformance {
namespace {

// ---- strings --------------------------------------------------------------

TEST(Strings, WcStatus) {
  static const char* const expected[] = {
      "success",
      "local length error",
      "local QP operation error",
      "local EE context operation error",
      "local protection error",
      "Work Request Flushed Error",
      "memory management operation error",
      "bad response error",
      "local access error",
      "remote invalid request error",
      "remote access error",
      "remote operation error",
      "transport retry counter exceeded",
      "RNR retry counter exceeded",
      "local RDD violation error",
      "remote invalid RD request",
      "aborted error",
      "invalid EE context number",
      "invalid EE context state",
      "fatal error",
      "response timeout error",
      "general error",
      "TM error",
      "TM software rendezvous",
  };
  static_assert(std::size(expected) == IBV_WC_TM_RNDV_INCOMPLETE + 1);
  for (int i = 0; i <= IBV_WC_TM_RNDV_INCOMPLETE; ++i)
    EXPECT_STREQ(ibv_wc_status_str(static_cast<ibv_wc_status>(i)), expected[i]) << i;
  for (int v : {IBV_WC_TM_RNDV_INCOMPLETE + 1, 100, -1})
    EXPECT_STREQ(ibv_wc_status_str(static_cast<ibv_wc_status>(v)), "unknown") << v;
}

TEST(Strings, EventType) {
  static const char* const expected[] = {
      "CQ error",
      "local work queue catastrophic error",
      "invalid request local work queue error",
      "local access violation work queue error",
      "communication established",
      "send queue drained",
      "path migrated",
      "path migration request error",
      "local catastrophic error",
      "port active",
      "port error",
      "LID change",
      "P_Key change",
      "SM change",
      "SRQ catastrophic error",
      "SRQ limit reached",
      "last WQE reached",
      "client reregistration",
      "GID table change",
      "WQ fatal",
  };
  static_assert(std::size(expected) == IBV_EVENT_WQ_FATAL + 1);
  for (int i = 0; i <= IBV_EVENT_WQ_FATAL; ++i)
    EXPECT_STREQ(ibv_event_type_str(static_cast<ibv_event_type>(i)), expected[i]) << i;
  for (int v : {IBV_EVENT_WQ_FATAL + 1, 1000, -1})
    EXPECT_STREQ(ibv_event_type_str(static_cast<ibv_event_type>(v)), "unknown") << v;
}

TEST(Strings, NodeType) {
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_CA), "InfiniBand channel adapter");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_SWITCH), "InfiniBand switch");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_ROUTER), "InfiniBand router");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_RNIC), "iWARP NIC");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_USNIC), "usNIC");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_USNIC_UDP), "usNIC UDP");
  EXPECT_STREQ(ibv_node_type_str(IBV_NODE_UNSPECIFIED), "unspecified");
  for (int v : {static_cast<int>(IBV_NODE_UNKNOWN), 0, IBV_NODE_UNSPECIFIED + 1, 99})
    EXPECT_STREQ(ibv_node_type_str(static_cast<ibv_node_type>(v)), "unknown") << v;
}

TEST(Strings, PortState) {
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_NOP), "no state change (NOP)");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_DOWN), "down");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_INIT), "init");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_ARMED), "armed");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_ACTIVE), "active");
  EXPECT_STREQ(ibv_port_state_str(IBV_PORT_ACTIVE_DEFER), "active defer");
  for (int v : {IBV_PORT_ACTIVE_DEFER + 1, 42, -1})
    EXPECT_STREQ(ibv_port_state_str(static_cast<ibv_port_state>(v)), "unknown") << v;
}

// ---- rates ----------------------------------------------------------------

struct RateRow {
  ibv_rate rate;
  int mult;  // -1: not a multiple of 2.5 Gb/s
  int mbps;
};
constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},     {IBV_RATE_5_GBPS, 2, 5000},         {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},     {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},    {IBV_RATE_80_GBPS, 32, 80000},      {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, -1, 14062},    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},  {IBV_RATE_25_GBPS, -1, 25781},      {IBV_RATE_100_GBPS, -1, 103125},
    {IBV_RATE_200_GBPS, -1, 206250},  {IBV_RATE_300_GBPS, -1, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},    {IBV_RATE_400_GBPS, 160, 425000},   {IBV_RATE_600_GBPS, 240, 637500},
    {IBV_RATE_800_GBPS, 320, 850000}, {IBV_RATE_1200_GBPS, 480, 1275000},
};

TEST(Rates, ConversionsRoundTrip) {
  for (const RateRow& r : kRates) {
    SCOPED_TRACE("rate " + std::to_string(r.rate));
    EXPECT_EQ(ibv_rate_to_mult(r.rate), r.mult);
    EXPECT_EQ(ibv_rate_to_mbps(r.rate), r.mbps);
    EXPECT_EQ(mbps_to_ibv_rate(r.mbps), r.rate);
    if (r.mult > 0) {
      EXPECT_EQ(mult_to_ibv_rate(r.mult), r.rate);
    }
  }
}

TEST(Rates, OutOfRange) {
  EXPECT_EQ(ibv_rate_to_mult(IBV_RATE_MAX), -1);
  EXPECT_EQ(ibv_rate_to_mbps(IBV_RATE_MAX), -1);
  EXPECT_EQ(ibv_rate_to_mult(static_cast<ibv_rate>(IBV_RATE_1200_GBPS + 1)), -1);
  EXPECT_EQ(ibv_rate_to_mbps(static_cast<ibv_rate>(IBV_RATE_1200_GBPS + 1)), -1);
  EXPECT_EQ(mult_to_ibv_rate(3), IBV_RATE_MAX);
  EXPECT_EQ(mult_to_ibv_rate(0), IBV_RATE_MAX);
  EXPECT_EQ(mbps_to_ibv_rate(100000), IBV_RATE_MAX);  // exact values only
  EXPECT_EQ(mbps_to_ibv_rate(0), IBV_RATE_MAX);
}

// ---- fork support ----------------------------------------------------------

TEST(ForkSupport, ForkInitInAFreshProcess) {
  // ibv_fork_init must come before any memory registration, so it runs in a
  // process of its own that has registered nothing.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        ibv_fork_status before = ibv_is_fork_initialized();
        if (before != IBV_FORK_DISABLED && before != IBV_FORK_UNNEEDED) std::_Exit(2);
        if (ibv_fork_init() != 0) std::_Exit(3);
        // Idempotent.
        if (ibv_fork_init() != 0) std::_Exit(4);
        ibv_fork_status after = ibv_is_fork_initialized();
        if (after != IBV_FORK_ENABLED && after != IBV_FORK_UNNEEDED) std::_Exit(5);
        if (before == IBV_FORK_UNNEEDED && after != IBV_FORK_UNNEEDED) std::_Exit(6);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// ---- optional features ------------------------------------------------------

class OptionalFeatureTest : public VerbsTest {};
CONFORMANCE_INSTANTIATE(OptionalFeatureTest);

TEST_P(OptionalFeatureTest, QueryEce) {
  // Enhanced connection establishment is optional: EOPNOTSUPP without it.
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ibv_ece ece{};
  int rc = ibv_query_ece(qp.get(), &ece);
  observe("ibv_query_ece", errno_name(rc));
  EXPECT_TRUE(rc == 0 || rc == EOPNOTSUPP) << "rc " << rc;
  if (rc == 0) {
    EXPECT_NE(ece.vendor_id, 0u);
  }
}

TEST_P(OptionalFeatureTest, SetEceWithoutVendor) {
  // rdma-core refuses a zero vendor id itself.
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ibv_ece ece{};
  errno = 0;
  EXPECT_EQ(ibv_set_ece(qp.get(), &ece), EOPNOTSUPP);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_P(OptionalFeatureTest, MemoryWindowWorksOrIsNotSupported) {
  for (ibv_mw_type type : {IBV_MW_TYPE_1, IBV_MW_TYPE_2}) {
    SCOPED_TRACE("type " + std::to_string(type));
    errno = 0;
    ibv_mw* mw = ibv_alloc_mw(pd_, type);
    observe("ibv_alloc_mw.type" + std::to_string(type), outcome(mw));
    if (mw) {
      EXPECT_EQ(mw->pd, pd_);
      EXPECT_EQ(mw->context, ctx_);
      EXPECT_EQ(mw->type, type);
      EXPECT_EQ(ibv_dealloc_mw(mw), 0);
      continue;
    }
    EXPECT_EQ(errno, EOPNOTSUPP);
  }
  if (dattr_.max_mw == 0) {
    errno = 0;
    EXPECT_EQ(ibv_alloc_mw(pd_, IBV_MW_TYPE_1), nullptr) << "max_mw is 0 but a window was allocated";
  }
}

TEST_P(OptionalFeatureTest, DeviceMemoryWorksOrIsNotSupported) {
  ibv_alloc_dm_attr attr{};
  attr.length = 64;
  attr.log_align_req = 0;
  attr.comp_mask = 0;
  errno = 0;
  ibv_dm* dm = ibv_alloc_dm(ctx_, &attr);
  observe("ibv_alloc_dm", outcome(dm));
  if (!dm) {
    EXPECT_EQ(errno, EOPNOTSUPP);
    return;
  }
  EXPECT_EQ(dm->context, ctx_);
  EXPECT_EQ(ibv_free_dm(dm), 0);
}

TEST_P(OptionalFeatureTest, XrcDomainWorksOrIsNotSupported) {
  ibv_xrcd_init_attr attr{};
  attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
  attr.fd = -1;
  attr.oflags = O_CREAT;
  errno = 0;
  ibv_xrcd* xrcd = ibv_open_xrcd(ctx_, &attr);
  observe("ibv_open_xrcd", outcome(xrcd));
  if (!xrcd) {
    EXPECT_EQ(errno, EOPNOTSUPP);
    return;
  }
  EXPECT_EQ(xrcd->context, ctx_);
  EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

}  // namespace
}  // namespace conformance

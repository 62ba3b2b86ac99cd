// Tests of the modify-QP state machine rules (emu/qp/qp_state.hpp).
//
// The expected transition table below is written out by hand from IBTA Vol 1
// §11.2.5.2 as the Linux kernel encodes it (qp_state_table in
// drivers/infiniband/core/verbs.c); it is deliberately not derived from the
// code under test. The required sets of the RESET->INIT->RTR->RTS path are
// checked a second time against the rdma-core ibv_modify_qp(3) man page.
#include "emu/qp/qp_state.hpp"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace softverbs::emu {
namespace {

constexpr std::uint32_t kState = IBV_QP_STATE;
constexpr std::uint32_t kCur = IBV_QP_CUR_STATE;

constexpr std::array<ibv_qp_state, 7> kStates = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR,
                                                 IBV_QPS_RTS,   IBV_QPS_SQD,  IBV_QPS_SQE,
                                                 IBV_QPS_ERR};

// The three IBTA transport services the task is about, then the kernel's
// extra types.
constexpr std::array<ibv_qp_type, 3> kIbtaTypes = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};
constexpr std::array<ibv_qp_type, 6> kAllTypes = {IBV_QPT_RC,         IBV_QPT_UC,
                                                  IBV_QPT_UD,         IBV_QPT_RAW_PACKET,
                                                  IBV_QPT_XRC_SEND,   IBV_QPT_XRC_RECV};

// ---------------------------------------------------------------------------
// Expected table, transcribed by hand
// ---------------------------------------------------------------------------

// Which state pairs have a row at all (for every QP type).
//                                   to: RESET INIT RTR RTS SQD SQE ERR
constexpr bool kRowExists[7][7] = {
    /* from RESET */ {true, true, false, false, false, false, false},
    /* from INIT  */ {true, true, true, false, false, false, true},
    /* from RTR   */ {true, false, false, true, false, false, true},
    /* from RTS   */ {true, false, false, true, true, false, true},
    /* from SQD   */ {true, false, false, true, true, false, true},
    /* from SQE   */ {true, false, false, true, false, false, true},
    /* from ERR   */ {true, false, false, false, false, false, true},
};

struct ExpectedRow {
  ibv_qp_type type;
  ibv_qp_state cur;
  ibv_qp_state next;
  std::uint32_t req;
  std::uint32_t opt;
};

// Every (type, cur, next) with a non-empty attribute set. Existing rows not
// listed here take no attribute at all (required = optional = 0).
const std::vector<ExpectedRow>& expected_rows() {
  static const std::vector<ExpectedRow> rows = {
      // ---- RC ---------------------------------------------------------------
      {IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
      {IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, 0,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
      {IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
       IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
      {IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
       IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
           IBV_QP_MAX_QP_RD_ATOMIC,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
           IBV_QP_MIN_RNR_TIMER},
      {IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
      {IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_SQD, 0,
       IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
           IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
           IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE},

      // ---- UC ---------------------------------------------------------------
      {IBV_QPT_UC, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
      {IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_INIT, 0,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
      {IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
       IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
      {IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_UC, IBV_QPS_RTS, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_UC, IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
      {IBV_QPT_UC, IBV_QPS_SQD, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_UC, IBV_QPS_SQD, IBV_QPS_SQD, 0,
       IBV_QP_AV | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX |
           IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},

      // ---- UD ---------------------------------------------------------------
      {IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
       0},
      {IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY},
      {IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
      {IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_QKEY},
      {IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
      {IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
      {IBV_QPT_UD, IBV_QPS_SQD, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
      {IBV_QPT_UD, IBV_QPS_SQD, IBV_QPS_SQD, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
      {IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},

      // ---- RAW_PACKET -------------------------------------------------------
      {IBV_QPT_RAW_PACKET, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PORT, 0},
      {IBV_QPT_RAW_PACKET, IBV_QPS_RTR, IBV_QPS_RTS, 0, IBV_QP_RATE_LIMIT},
      {IBV_QPT_RAW_PACKET, IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QP_RATE_LIMIT},

      // ---- XRC_SEND (XRC initiator) -----------------------------------------
      {IBV_QPT_XRC_SEND, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
      {IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_INIT, 0,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
      {IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
       IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
      {IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS,
       IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
           IBV_QP_MAX_QP_RD_ATOMIC,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_XRC_SEND, IBV_QPS_RTS, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_XRC_SEND, IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
      {IBV_QPT_XRC_SEND, IBV_QPS_SQD, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_XRC_SEND, IBV_QPS_SQD, IBV_QPS_SQD, 0,
       IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
           IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
           IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE},

      // ---- XRC_RECV (XRC target) --------------------------------------------
      {IBV_QPT_XRC_RECV, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
      {IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_INIT, 0,
       IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
      {IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
       IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
      {IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_TIMEOUT | IBV_QP_SQ_PSN,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_XRC_RECV, IBV_QPS_RTS, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
           IBV_QP_MIN_RNR_TIMER},
      {IBV_QPT_XRC_RECV, IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
      {IBV_QPT_XRC_RECV, IBV_QPS_SQD, IBV_QPS_RTS, 0,
       IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE},
      {IBV_QPT_XRC_RECV, IBV_QPS_SQD, IBV_QPS_SQD, 0,
       IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_ALT_PATH |
           IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER |
           IBV_QP_PATH_MIG_STATE},
  };
  return rows;
}

struct Expected {
  bool exists = false;
  std::uint32_t req = 0;
  std::uint32_t opt = 0;
};

Expected expected(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) {
  Expected e;
  e.exists = kRowExists[cur][next];
  for (const auto& r : expected_rows()) {
    if (r.type == type && r.cur == cur && r.next == next) {
      e.req = r.req;
      e.opt = r.opt;
    }
  }
  return e;
}

std::string type_name(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC: return "RC";
    case IBV_QPT_UC: return "UC";
    case IBV_QPT_UD: return "UD";
    case IBV_QPT_RAW_PACKET: return "RAW_PACKET";
    case IBV_QPT_XRC_SEND: return "XRC_SEND";
    case IBV_QPT_XRC_RECV: return "XRC_RECV";
    default: return "type " + std::to_string(static_cast<int>(t));
  }
}

std::string mask_names(std::uint32_t mask) {
  std::string out;
  for (int i = 0; i < 32; ++i) {
    const std::uint32_t b = 1u << i;
    if (!(mask & b)) continue;
    if (!out.empty()) out += '|';
    const auto name = qp_attr_mask_bit_name(b);
    out += name.empty() ? "bit" + std::to_string(i) : std::string(name);
  }
  return out.empty() ? "0" : out;
}

std::string describe(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, std::uint32_t mask) {
  std::ostringstream os;
  os << type_name(type) << ' ' << qp_state_name(cur) << "->" << qp_state_name(next) << " mask "
     << mask_names(mask);
  return os.str();
}

// Stores any int in an enum member, as C code may. Assigning an out-of-range
// value through a C++ enum type would itself be undefined.
template <typename E>
void set_raw(E& field, long long value) {
  std::underlying_type_t<E> v = static_cast<std::underlying_type_t<E>>(value);
  std::memcpy(&field, &v, sizeof v);
}

// All 32 bit positions, defined or not.
std::vector<std::uint32_t> all_32_bits() {
  std::vector<std::uint32_t> bits;
  for (int i = 0; i < 32; ++i) bits.push_back(1u << i);
  return bits;
}

// Checks every mask that matters for one (type, cur, next) against the
// expectation; stops at the first mismatch so a broken row yields one report.
::testing::AssertionResult check_pair(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next,
                                      std::uint64_t& checked) {
  const Expected e = expected(type, cur, next);
  auto verdict = [&](std::uint32_t mask, bool want) -> ::testing::AssertionResult {
    ++checked;
    if (modify_qp_is_ok(type, cur, next, mask) == want) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << describe(type, cur, next, mask) << ": expected " << (want ? "ok" : "invalid");
  };

  if (!e.exists) {
    // No row: nothing passes, whatever the mask.
    for (std::uint32_t m : {0u, kState, kQpAttrKnownMask, ~0u}) {
      if (auto r = verdict(m, false); !r) return r;
    }
    for (std::uint32_t a : all_32_bits()) {
      for (std::uint32_t b : all_32_bits()) {
        if (auto r = verdict(a | b, false); !r) return r;
      }
    }
    return ::testing::AssertionSuccess();
  }

  const std::uint32_t universe = e.req | e.opt;
  std::vector<std::uint32_t> outside;
  for (std::uint32_t b : all_32_bits())
    if (!(b & (universe | kState))) outside.push_back(b);

  // Every subset of required | optional, with and without IBV_QP_STATE.
  std::uint32_t sub = universe;
  while (true) {
    for (std::uint32_t with_state : {0u, kState}) {
      const std::uint32_t mask = sub | with_state;
      const bool ok = (mask & e.req) == e.req;
      if (auto r = verdict(mask, ok); !r) return r;
      if (ok) {
        // Dropping any single required attribute fails ...
        for (int i = 0; i < 32; ++i) {
          const std::uint32_t b = 1u << i;
          if (e.req & b) {
            if (auto r = verdict(mask & ~b, false); !r) return r;
          }
        }
        // ... and so does adding any single attribute outside the row.
        for (std::uint32_t b : outside) {
          if (auto r = verdict(mask | b, false); !r) return r;
        }
      }
    }
    if (sub == 0) break;
    sub = (sub - 1) & universe;
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// Transition table
// ---------------------------------------------------------------------------

TEST(QpStateTable, AccessorsMatchExpectedTable) {
  for (ibv_qp_type type : kAllTypes) {
    for (ibv_qp_state cur : kStates) {
      for (ibv_qp_state next : kStates) {
        const Expected e = expected(type, cur, next);
        const std::string where = describe(type, cur, next, 0);
        EXPECT_EQ(qp_transition_exists(type, cur, next), e.exists) << where;
        EXPECT_EQ(qp_transition_required_mask(type, cur, next), e.req)
            << where << ": got " << mask_names(qp_transition_required_mask(type, cur, next))
            << ", want " << mask_names(e.req);
        EXPECT_EQ(qp_transition_optional_mask(type, cur, next), e.opt)
            << where << ": got " << mask_names(qp_transition_optional_mask(type, cur, next))
            << ", want " << mask_names(e.opt);
      }
    }
  }
}

TEST(QpStateTable, ExpectedTableIsSelfConsistent) {
  // Guards the hand-written table: attribute rows only where a row exists,
  // no row listed twice, required and optional disjoint, no IBV_QP_STATE,
  // and CUR_STATE only from RTR/RTS/SQD/SQE.
  std::set<std::tuple<int, int, int>> seen;
  for (const auto& r : expected_rows()) {
    const std::string where = describe(r.type, r.cur, r.next, 0);
    EXPECT_TRUE(kRowExists[r.cur][r.next]) << where;
    EXPECT_TRUE(seen.emplace(r.type, r.cur, r.next).second) << where << " listed twice";
    EXPECT_EQ(r.req & r.opt, 0u) << where;
    EXPECT_EQ((r.req | r.opt) & kState, 0u) << where;
    EXPECT_EQ((r.req | r.opt) & ~kQpAttrKnownMask, 0u) << where;
    EXPECT_EQ(r.req & kCur, 0u) << where;
    if (r.opt & kCur) {
      EXPECT_TRUE(r.cur == IBV_QPS_RTR || r.cur == IBV_QPS_RTS || r.cur == IBV_QPS_SQD ||
                  r.cur == IBV_QPS_SQE)
          << where;
    }
  }
}

// The task's core requirement: RC, UC and UD, all 49 state pairs, all masks
// that matter.
TEST(QpStateTable, ExhaustiveIbtaTypes) {
  std::uint64_t checked = 0;
  for (ibv_qp_type type : kIbtaTypes)
    for (ibv_qp_state cur : kStates)
      for (ibv_qp_state next : kStates) EXPECT_TRUE(check_pair(type, cur, next, checked));
  EXPECT_GT(checked, 100000u);
}

TEST(QpStateTable, ExhaustiveKernelExtraTypes) {
  std::uint64_t checked = 0;
  for (ibv_qp_type type : {IBV_QPT_RAW_PACKET, IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV})
    for (ibv_qp_state cur : kStates)
      for (ibv_qp_state next : kStates) EXPECT_TRUE(check_pair(type, cur, next, checked));
}

// Second, independent source: the "minimum list of attributes" tables of
// rdma-core's ibv_modify_qp(3) for RESET -> INIT -> RTR -> RTS.
TEST(QpStateTable, MatchesIbvModifyQpManPage) {
  struct ManRow {
    ibv_qp_type type;
    ibv_qp_state cur;
    ibv_qp_state next;
    std::uint32_t required;  // as printed, including IBV_QP_STATE
  };
  const ManRow rows[] = {
      {IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY},
      {IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_STATE},
      {IBV_QPT_UD, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN},
      {IBV_QPT_UC, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
      {IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN},
      {IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN},
      {IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
      {IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR,
       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER},
      {IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS,
       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT |
           IBV_QP_RNR_RETRY | IBV_QP_TIMEOUT},
      {IBV_QPT_RAW_PACKET, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT},
      {IBV_QPT_RAW_PACKET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_STATE},
      {IBV_QPT_RAW_PACKET, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_STATE},
  };
  for (const auto& r : rows) {
    const std::string where = describe(r.type, r.cur, r.next, r.required);
    EXPECT_EQ(qp_transition_required_mask(r.type, r.cur, r.next) | kState, r.required) << where;
    EXPECT_TRUE(modify_qp_is_ok(r.type, r.cur, r.next, r.required)) << where;
  }
}

TEST(QpStateTable, SpotChecks) {
  // The usual RC bring-up.
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
                              kState | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
                               kState | IBV_QP_PKEY_INDEX | IBV_QP_PORT));
  // UD does not take access flags; RC does not take a Q_Key.
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
                               kState | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
                                   IBV_QP_ACCESS_FLAGS));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT,
                               kState | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                                   IBV_QP_QKEY));
  // The port cannot change at INIT->RTR.
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, kState | IBV_QP_PORT));
  // Any state -> RESET, no attributes; RESET -> ERR does not exist.
  for (ibv_qp_state s : kStates) {
    EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, s, IBV_QPS_RESET, kState)) << qp_state_name(s);
    EXPECT_EQ(modify_qp_is_ok(IBV_QPT_RC, s, IBV_QPS_ERR, kState), s != IBV_QPS_RESET)
        << qp_state_name(s);
  }
  // Moving to ERR takes no attribute, not even CUR_STATE.
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, kState | kCur));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, kState | IBV_QP_QKEY));
  // CUR_STATE is refused before RTR even where nothing else would object.
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_INIT, kCur));
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_UD, IBV_QPS_RTS, IBV_QPS_RTS, kCur | IBV_QP_QKEY));
  // RTS->SQD accepts the drain notification but no CUR_STATE.
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD,
                              kState | IBV_QP_EN_SQD_ASYNC_NOTIFY));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD, kState | kCur));
  // Attribute-only modifies: fine in RTS, impossible in RTR and SQE.
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTR, IBV_QP_MIN_RNR_TIMER));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_SQE, IBV_QP_QKEY));
  // SQE -> RTS: UD and UC recover with optional attributes; RC has nothing
  // to offer but the (state-pair wide) row still exists.
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_UD, IBV_QPS_SQE, IBV_QPS_RTS, kState | kCur | IBV_QP_QKEY));
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_UC, IBV_QPS_SQE, IBV_QPS_RTS,
                              kState | IBV_QP_ACCESS_FLAGS));
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, kState));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, kState | kCur));
  // RATE_LIMIT is for raw Ethernet QPs only.
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RAW_PACKET, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_RATE_LIMIT));
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_RATE_LIMIT));
  // IBV_QP_CAP is never accepted (no QP resize through modify).
  for (ibv_qp_type type : kAllTypes)
    for (ibv_qp_state cur : kStates)
      for (ibv_qp_state next : kStates)
        EXPECT_FALSE(modify_qp_is_ok(type, cur, next, kState | IBV_QP_CAP))
            << describe(type, cur, next, kState | IBV_QP_CAP);
}

TEST(QpStateTable, RejectsUncoveredTypesAndBadStates) {
  for (ibv_qp_state s : kStates) {
    EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, s, IBV_QPS_UNKNOWN, kState));
    EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_UNKNOWN, s, kState));
    EXPECT_FALSE(qp_transition_exists(IBV_QPT_RC, s, IBV_QPS_UNKNOWN));
    EXPECT_FALSE(qp_transition_exists(IBV_QPT_RC, IBV_QPS_UNKNOWN, s));
    EXPECT_EQ(qp_transition_required_mask(IBV_QPT_UD, IBV_QPS_UNKNOWN, s), 0u);
    EXPECT_EQ(qp_transition_optional_mask(IBV_QPT_UD, s, IBV_QPS_UNKNOWN), 0u);
    for (ibv_qp_state t : kStates) {
      for (auto type :
           {IBV_QPT_DRIVER, static_cast<ibv_qp_type>(0), static_cast<ibv_qp_type>(5)}) {
        EXPECT_FALSE(modify_qp_is_ok(type, s, t, kState));
        EXPECT_FALSE(qp_transition_exists(type, s, t));
      }
    }
  }
  EXPECT_FALSE(qp_type_has_transition_table(IBV_QPT_DRIVER));
  for (ibv_qp_type type : kAllTypes) EXPECT_TRUE(qp_type_has_transition_table(type));
}

TEST(QpStateTable, SqeOnlyForUnreliableServices) {
  EXPECT_TRUE(qp_type_has_sqe(IBV_QPT_UC));
  EXPECT_TRUE(qp_type_has_sqe(IBV_QPT_UD));
  EXPECT_FALSE(qp_type_has_sqe(IBV_QPT_RC));
  EXPECT_FALSE(qp_type_has_sqe(IBV_QPT_RAW_PACKET));
  EXPECT_FALSE(qp_type_has_sqe(IBV_QPT_XRC_SEND));
  EXPECT_FALSE(qp_type_has_sqe(IBV_QPT_XRC_RECV));
}

TEST(QpStateTable, ResolveTransition) {
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.cur_qp_state = IBV_QPS_SQE;

  auto t = resolve_modify_qp_transition(IBV_QPS_RTR, attr, kState);
  EXPECT_EQ(t.cur, IBV_QPS_RTR);
  EXPECT_EQ(t.next, IBV_QPS_RTS);

  t = resolve_modify_qp_transition(IBV_QPS_RTS, attr, IBV_QP_MIN_RNR_TIMER);
  EXPECT_EQ(t.cur, IBV_QPS_RTS);
  EXPECT_EQ(t.next, IBV_QPS_RTS);

  t = resolve_modify_qp_transition(IBV_QPS_RTS, attr, kState | kCur);
  EXPECT_EQ(t.cur, IBV_QPS_SQE);
  EXPECT_EQ(t.next, IBV_QPS_RTS);

  t = resolve_modify_qp_transition(IBV_QPS_RTS, attr, kCur);
  EXPECT_EQ(t.cur, IBV_QPS_SQE);
  EXPECT_EQ(t.next, IBV_QPS_SQE);

  // Garbage from a C caller resolves to UNKNOWN, which nothing accepts.
  set_raw(attr.qp_state, 42);
  t = resolve_modify_qp_transition(IBV_QPS_RTS, attr, kState);
  EXPECT_EQ(t.next, IBV_QPS_UNKNOWN);
  EXPECT_FALSE(modify_qp_is_ok(IBV_QPT_RC, t.cur, t.next, kState));
  set_raw(attr.cur_qp_state, -1);
  t = resolve_modify_qp_transition(IBV_QPS_RTS, attr, kCur);
  EXPECT_EQ(t.cur, IBV_QPS_UNKNOWN);
  EXPECT_EQ(t.next, IBV_QPS_UNKNOWN);
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

TEST(QpStateHelpers, StateNames) {
  EXPECT_EQ(qp_state_name(IBV_QPS_RESET), "RESET");
  EXPECT_EQ(qp_state_name(IBV_QPS_INIT), "INIT");
  EXPECT_EQ(qp_state_name(IBV_QPS_RTR), "RTR");
  EXPECT_EQ(qp_state_name(IBV_QPS_RTS), "RTS");
  EXPECT_EQ(qp_state_name(IBV_QPS_SQD), "SQD");
  EXPECT_EQ(qp_state_name(IBV_QPS_SQE), "SQE");
  EXPECT_EQ(qp_state_name(IBV_QPS_ERR), "ERR");
  EXPECT_EQ(qp_state_name(IBV_QPS_UNKNOWN), "UNKNOWN");
  for (ibv_qp_state s : kStates) EXPECT_TRUE(qp_state_is_valid(s));
  EXPECT_FALSE(qp_state_is_valid(IBV_QPS_UNKNOWN));
}

TEST(QpStateHelpers, AttrMaskBits) {
  const auto bits = qp_attr_mask_bits();
  ASSERT_EQ(bits.size(), 22u);
  std::uint32_t all = 0;
  std::uint32_t prev = 0;
  for (std::uint32_t b : bits) {
    EXPECT_EQ(std::popcount(b), 1) << b;
    EXPECT_GT(b, prev) << "not ascending";
    EXPECT_EQ(all & b, 0u) << "duplicate";
    prev = b;
    all |= b;
    const auto name = qp_attr_mask_bit_name(b);
    EXPECT_EQ(name.substr(0, 7), "IBV_QP_") << b;
  }
  EXPECT_EQ(all, kQpAttrKnownMask);
  EXPECT_EQ(all, ((1u << 21) - 1) | (1u << 25));
  EXPECT_EQ(qp_attr_mask_bit_name(IBV_QP_DEST_QPN), "IBV_QP_DEST_QPN");
  EXPECT_EQ(qp_attr_mask_bit_name(IBV_QP_RATE_LIMIT), "IBV_QP_RATE_LIMIT");
  EXPECT_TRUE(qp_attr_mask_bit_name(1u << 21).empty());
  EXPECT_TRUE(qp_attr_mask_bit_name(0).empty());
  EXPECT_TRUE(qp_attr_mask_bit_name(kState | kCur).empty());

  EXPECT_EQ(qp_attr_mask_unsupported_bits(kQpAttrKnownMask), 0u);
  for (int i = 21; i <= 24; ++i)
    EXPECT_EQ(qp_attr_mask_unsupported_bits(kState | (1u << i)), 1u << i);
  EXPECT_EQ(qp_attr_mask_unsupported_bits(1u << 31), 1u << 31);
}

// ---------------------------------------------------------------------------
// Attribute values
// ---------------------------------------------------------------------------

class QpAttrValues : public ::testing::Test {
 protected:
  void SetUp() override {
    roce.phys_port_cnt = 2;
    roce.pkey_tbl_len = 4;
    roce.gid_tbl_len = 8;
    roce.active_mtu = IBV_MTU_1024;
    roce.link_layer = IBV_LINK_LAYER_ETHERNET;
    roce.grh_required = false;
    roce.max_qp_rd_atom = 16;
    roce.max_qp_init_rd_atom = 8;  // differs, to catch a swap

    ib = roce;
    ib.link_layer = IBV_LINK_LAYER_INFINIBAND;
  }

  static ibv_ah_attr good_ah(std::uint8_t port = 1) {
    ibv_ah_attr ah{};
    ah.port_num = port;
    ah.is_global = 1;
    ah.grh.sgid_index = 0;
    ah.grh.hop_limit = 64;
    ah.static_rate = IBV_RATE_MAX;
    return ah;
  }

  int check(const ibv_qp_attr& a, std::uint32_t mask, std::uint8_t qp_port = 0) const {
    return validate_qp_attr_values(a, mask, roce, qp_port);
  }

  QpAttrLimits roce;
  QpAttrLimits ib;
  ibv_qp_attr attr{};
};

TEST_F(QpAttrValues, AttributesOutsideTheMaskAreIgnored) {
  std::memset(&attr, 0xFF, sizeof(attr));
  EXPECT_EQ(check(attr, 0), 0);
  // IBV_QP_CAP and IBV_QP_RATE_LIMIT carry no value rule here.
  EXPECT_EQ(check(attr, IBV_QP_CAP | IBV_QP_RATE_LIMIT), 0);
}

TEST_F(QpAttrValues, States) {
  attr.qp_state = IBV_QPS_ERR;
  attr.cur_qp_state = IBV_QPS_RTS;
  EXPECT_EQ(check(attr, kState | kCur), 0);
  attr.qp_state = IBV_QPS_UNKNOWN;
  EXPECT_EQ(check(attr, kState), EINVAL);
  EXPECT_EQ(check(attr, kCur), 0);
  for (long long bad : {8LL, 9LL, 0x7FFFFFFFLL, -1LL}) {
    set_raw(attr.qp_state, bad);
    EXPECT_EQ(check(attr, kState), EINVAL) << bad;
    attr.qp_state = IBV_QPS_RTS;
    set_raw(attr.cur_qp_state, bad);
    EXPECT_EQ(check(attr, kCur), EINVAL) << bad;
    EXPECT_EQ(check(attr, kState), 0) << bad;  // cur_qp_state not in the mask
    attr.cur_qp_state = IBV_QPS_RTS;
  }
}

TEST_F(QpAttrValues, PortNum) {
  for (int port : {1, 2}) {
    attr.port_num = static_cast<std::uint8_t>(port);
    EXPECT_EQ(check(attr, IBV_QP_PORT), 0) << port;
  }
  for (int port : {0, 3, 255}) {
    attr.port_num = static_cast<std::uint8_t>(port);
    EXPECT_EQ(check(attr, IBV_QP_PORT), EINVAL) << port;
  }
}

TEST_F(QpAttrValues, PkeyIndex) {
  attr.pkey_index = 3;
  EXPECT_EQ(check(attr, IBV_QP_PKEY_INDEX), 0);
  attr.pkey_index = 4;
  EXPECT_EQ(check(attr, IBV_QP_PKEY_INDEX), EINVAL);
  attr.pkey_index = 0xFFFF;
  EXPECT_EQ(check(attr, IBV_QP_PKEY_INDEX), EINVAL);
}

TEST_F(QpAttrValues, QkeyAnyValue) {
  for (std::uint32_t q : {0u, 0x11111111u, 0x80000000u, 0xFFFFFFFFu}) {
    attr.qkey = q;
    EXPECT_EQ(check(attr, IBV_QP_QKEY), 0) << q;
  }
}

TEST_F(QpAttrValues, PathMtu) {
  for (int mtu : {IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024}) {
    attr.path_mtu = static_cast<ibv_mtu>(mtu);
    EXPECT_EQ(check(attr, IBV_QP_PATH_MTU), 0) << mtu;
  }
  // Above the active MTU of the port.
  for (int mtu : {IBV_MTU_2048, IBV_MTU_4096}) {
    attr.path_mtu = static_cast<ibv_mtu>(mtu);
    EXPECT_EQ(check(attr, IBV_QP_PATH_MTU), EINVAL) << mtu;
  }
  // Not an ibv_mtu value.
  for (long long mtu : {0LL, 6LL, 7LL, 255LL, -1LL, 0x80000000LL}) {
    set_raw(attr.path_mtu, mtu);
    EXPECT_EQ(check(attr, IBV_QP_PATH_MTU), EINVAL) << mtu;
  }
  QpAttrLimits big = roce;
  big.active_mtu = IBV_MTU_4096;
  attr.path_mtu = IBV_MTU_4096;
  EXPECT_EQ(validate_qp_attr_values(attr, IBV_QP_PATH_MTU, big), 0);
  set_raw(attr.path_mtu, 6);
  EXPECT_EQ(validate_qp_attr_values(attr, IBV_QP_PATH_MTU, big), EINVAL);
}

TEST_F(QpAttrValues, NarrowFields) {
  struct Case {
    std::uint32_t bit;
    std::uint8_t ibv_qp_attr::*field;
    int max;
  };
  const Case cases[] = {
      {IBV_QP_TIMEOUT, &ibv_qp_attr::timeout, 31},
      {IBV_QP_RETRY_CNT, &ibv_qp_attr::retry_cnt, 7},
      {IBV_QP_RNR_RETRY, &ibv_qp_attr::rnr_retry, 7},
      {IBV_QP_MIN_RNR_TIMER, &ibv_qp_attr::min_rnr_timer, 31},
      {IBV_QP_MAX_QP_RD_ATOMIC, &ibv_qp_attr::max_rd_atomic, 8},        // max_qp_init_rd_atom
      {IBV_QP_MAX_DEST_RD_ATOMIC, &ibv_qp_attr::max_dest_rd_atomic, 16},  // max_qp_rd_atom
  };
  for (const auto& c : cases) {
    const auto name = qp_attr_mask_bit_name(c.bit);
    for (int v = 0; v <= 255; ++v) {
      ibv_qp_attr a{};
      a.*c.field = static_cast<std::uint8_t>(v);
      EXPECT_EQ(check(a, c.bit), v <= c.max ? 0 : EINVAL) << name << " = " << v;
      // The same value is not looked at when the bit is absent.
      EXPECT_EQ(check(a, 0), 0) << name;
    }
  }
}

TEST_F(QpAttrValues, DestQpn) {
  attr.dest_qp_num = 0x00FFFFFF;
  EXPECT_EQ(check(attr, IBV_QP_DEST_QPN), 0);
  attr.dest_qp_num = 0x01000000;
  EXPECT_EQ(check(attr, IBV_QP_DEST_QPN), EINVAL);
  attr.dest_qp_num = 0xFFFFFFFF;
  EXPECT_EQ(check(attr, IBV_QP_DEST_QPN), EINVAL);
}

TEST_F(QpAttrValues, PsnsAreMaskedNotRejected) {
  attr.sq_psn = 0xFF123456;
  attr.rq_psn = 0x01ABCDEF;
  EXPECT_EQ(check(attr, IBV_QP_SQ_PSN | IBV_QP_RQ_PSN), 0);

  ibv_qp_attr a = attr;
  mask_qp_attr_psns(a, IBV_QP_SQ_PSN);
  EXPECT_EQ(a.sq_psn, 0x123456u);
  EXPECT_EQ(a.rq_psn, 0x01ABCDEFu);  // not in the mask: untouched

  a = attr;
  mask_qp_attr_psns(a, IBV_QP_SQ_PSN | IBV_QP_RQ_PSN);
  EXPECT_EQ(a.sq_psn, 0x123456u);
  EXPECT_EQ(a.rq_psn, 0xABCDEFu);

  a = attr;
  mask_qp_attr_psns(a, 0);
  EXPECT_EQ(a.sq_psn, attr.sq_psn);
  EXPECT_EQ(a.rq_psn, attr.rq_psn);
}

TEST_F(QpAttrValues, AddressVector) {
  attr.ah_attr = good_ah();
  EXPECT_EQ(check(attr, IBV_QP_AV), 0);

  // Port.
  for (int port : {0, 3}) {
    attr.ah_attr = good_ah(static_cast<std::uint8_t>(port));
    EXPECT_EQ(check(attr, IBV_QP_AV), EINVAL) << port;
  }
  attr.ah_attr = good_ah(2);
  EXPECT_EQ(check(attr, IBV_QP_AV), 0);

  // RoCE needs a GRH.
  attr.ah_attr = good_ah();
  attr.ah_attr.is_global = 0;
  EXPECT_EQ(check(attr, IBV_QP_AV), EINVAL);
  // ... IB does not, unless the port says so.
  EXPECT_EQ(validate_qp_attr_values(attr, IBV_QP_AV, ib), 0);
  QpAttrLimits ib_grh = ib;
  ib_grh.grh_required = true;
  EXPECT_EQ(validate_qp_attr_values(attr, IBV_QP_AV, ib_grh), EINVAL);
  // Without a GRH the SGID index is not used.
  attr.ah_attr.grh.sgid_index = 200;
  EXPECT_EQ(validate_qp_attr_values(attr, IBV_QP_AV, ib), 0);

  // SGID index inside the GID table.
  attr.ah_attr = good_ah();
  attr.ah_attr.grh.sgid_index = 7;
  EXPECT_EQ(check(attr, IBV_QP_AV), 0);
  attr.ah_attr.grh.sgid_index = 8;
  EXPECT_EQ(check(attr, IBV_QP_AV), EINVAL);
  EXPECT_EQ(validate_qp_attr_values(attr, IBV_QP_AV, ib), EINVAL);

  // Any non-zero is_global counts as "has a GRH".
  attr.ah_attr = good_ah();
  attr.ah_attr.is_global = 2;
  EXPECT_EQ(check(attr, IBV_QP_AV), 0);
}

TEST_F(QpAttrValues, StaticRate) {
  for (int rate = 0; rate <= 255; ++rate) {
    attr.ah_attr = good_ah();
    attr.ah_attr.static_rate = static_cast<std::uint8_t>(rate);
    const bool valid = rate == 0 || (rate >= 2 && rate <= 24);
    EXPECT_EQ(check(attr, IBV_QP_AV), valid ? 0 : EINVAL) << rate;
  }
  // Every value enum ibv_rate names is accepted.
  for (ibv_rate r : {IBV_RATE_MAX, IBV_RATE_2_5_GBPS, IBV_RATE_5_GBPS, IBV_RATE_10_GBPS,
                     IBV_RATE_20_GBPS, IBV_RATE_30_GBPS, IBV_RATE_40_GBPS, IBV_RATE_60_GBPS,
                     IBV_RATE_80_GBPS, IBV_RATE_120_GBPS, IBV_RATE_14_GBPS, IBV_RATE_56_GBPS,
                     IBV_RATE_112_GBPS, IBV_RATE_168_GBPS, IBV_RATE_25_GBPS, IBV_RATE_100_GBPS,
                     IBV_RATE_200_GBPS, IBV_RATE_300_GBPS, IBV_RATE_28_GBPS, IBV_RATE_50_GBPS,
                     IBV_RATE_400_GBPS, IBV_RATE_600_GBPS, IBV_RATE_800_GBPS,
                     IBV_RATE_1200_GBPS}) {
    attr.ah_attr = good_ah();
    attr.ah_attr.static_rate = static_cast<std::uint8_t>(r);
    EXPECT_EQ(check(attr, IBV_QP_AV), 0) << static_cast<int>(r);
  }
}

TEST_F(QpAttrValues, AddressVectorPortConsistency) {
  attr.ah_attr = good_ah(2);
  attr.qp_state = IBV_QPS_RTR;
  // INIT->RTR: AV port must be the QP's port.
  EXPECT_EQ(check(attr, kState | IBV_QP_AV, /*qp_port=*/1), EINVAL);
  EXPECT_EQ(check(attr, kState | IBV_QP_AV, /*qp_port=*/2), 0);
  EXPECT_EQ(check(attr, kState | IBV_QP_AV, /*qp_port=*/0), 0);  // unknown: skipped

  // SQD->SQD (no state change): PORT and AV together must agree.
  attr.port_num = 1;
  EXPECT_EQ(check(attr, IBV_QP_PORT | IBV_QP_AV, 1), EINVAL);
  attr.port_num = 2;
  EXPECT_EQ(check(attr, IBV_QP_PORT | IBV_QP_AV, 1), 0);
  // AV alone may name another valid port there.
  EXPECT_EQ(check(attr, IBV_QP_AV, 1), 0);
}

TEST_F(QpAttrValues, AlternatePath) {
  attr.alt_ah_attr = good_ah(2);
  attr.alt_port_num = 2;
  attr.alt_pkey_index = 3;
  attr.alt_timeout = 31;

  // Emulated devices migrate on either link layer (the kernel refuses RoCE).
  EXPECT_EQ(check(attr, IBV_QP_ALT_PATH), 0);
  EXPECT_EQ(validate_qp_attr_values(attr, IBV_QP_ALT_PATH, ib), 0);

  ibv_qp_attr a = attr;
  a.alt_port_num = 0;
  a.alt_ah_attr.port_num = 0;
  EXPECT_EQ(validate_qp_attr_values(a, IBV_QP_ALT_PATH, ib), EINVAL);

  a = attr;
  a.alt_port_num = 1;  // disagrees with alt_ah_attr.port_num
  EXPECT_EQ(validate_qp_attr_values(a, IBV_QP_ALT_PATH, ib), EINVAL);

  a = attr;
  a.alt_pkey_index = 4;
  EXPECT_EQ(validate_qp_attr_values(a, IBV_QP_ALT_PATH, ib), EINVAL);

  a = attr;
  a.alt_timeout = 32;
  EXPECT_EQ(validate_qp_attr_values(a, IBV_QP_ALT_PATH, ib), EINVAL);

  a = attr;
  a.alt_ah_attr.static_rate = 1;
  EXPECT_EQ(validate_qp_attr_values(a, IBV_QP_ALT_PATH, ib), EINVAL);

  a = attr;
  a.alt_ah_attr.grh.sgid_index = 8;
  EXPECT_EQ(validate_qp_attr_values(a, IBV_QP_ALT_PATH, ib), EINVAL);

  // Alternate-path fields are not looked at without the bit.
  a.alt_timeout = 200;
  EXPECT_EQ(check(a, 0), 0);
}

TEST_F(QpAttrValues, PathMigState) {
  for (int m : {IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_MIG_ARMED}) {
    attr.path_mig_state = static_cast<ibv_mig_state>(m);
    EXPECT_EQ(check(attr, IBV_QP_PATH_MIG_STATE), 0) << m;
  }
  for (long long m : {3LL, 255LL, -1LL}) {
    set_raw(attr.path_mig_state, m);
    EXPECT_EQ(check(attr, IBV_QP_PATH_MIG_STATE), EINVAL) << m;
  }
}

TEST_F(QpAttrValues, AccessFlags) {
  const unsigned allowed[] = {
      0,
      IBV_ACCESS_LOCAL_WRITE,
      IBV_ACCESS_REMOTE_WRITE,
      IBV_ACCESS_REMOTE_READ,
      IBV_ACCESS_REMOTE_ATOMIC,
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
          IBV_ACCESS_REMOTE_ATOMIC,
      IBV_ACCESS_MW_BIND,
      IBV_ACCESS_ON_DEMAND,
      IBV_ACCESS_RELAXED_ORDERING,
      1u << 29,  // last bit of the optional range
  };
  for (unsigned f : allowed) {
    attr.qp_access_flags = f;
    EXPECT_EQ(check(attr, IBV_QP_ACCESS_FLAGS), 0) << std::hex << f;
  }
  const unsigned refused[] = {
      IBV_ACCESS_ZERO_BASED, IBV_ACCESS_HUGETLB, 1u << 8, 1u << 9, 1u << 19, 1u << 30, 1u << 31,
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED,
  };
  for (unsigned f : refused) {
    attr.qp_access_flags = f;
    EXPECT_EQ(check(attr, IBV_QP_ACCESS_FLAGS), EINVAL) << std::hex << f;
  }
}

TEST_F(QpAttrValues, EnSqdAsyncNotifyAnyValue) {
  for (int v : {0, 1, 255}) {
    attr.en_sqd_async_notify = static_cast<std::uint8_t>(v);
    EXPECT_EQ(check(attr, IBV_QP_EN_SQD_ASYNC_NOTIFY), 0) << v;
  }
}

TEST_F(QpAttrValues, TypicalRcBringUp) {
  // RESET->INIT
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = 1;
  a.qp_access_flags =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  std::uint32_t m = kState | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, m));
  EXPECT_EQ(check(a, m), 0);

  // INIT->RTR
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x123456;
  a.rq_psn = 0xABCDEF;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr = good_ah();
  m = kState | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, m));
  EXPECT_EQ(check(a, m, 1), 0);

  // RTR->RTS
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0x654321;
  a.max_rd_atomic = 8;
  m = kState | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
      IBV_QP_MAX_QP_RD_ATOMIC;
  EXPECT_TRUE(modify_qp_is_ok(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, m));
  EXPECT_EQ(check(a, m), 0);
}

TEST(QpAttrLimitsTest, FromDeviceAndPortAttributes) {
  ibv_device_attr dev{};
  dev.phys_port_cnt = 2;
  dev.max_qp_rd_atom = 32;
  dev.max_qp_init_rd_atom = 4;
  ibv_port_attr port{};
  port.pkey_tbl_len = 128;
  port.gid_tbl_len = 255;
  port.active_mtu = IBV_MTU_4096;
  port.link_layer = IBV_LINK_LAYER_INFINIBAND;
  port.flags = IBV_QPF_GRH_REQUIRED;

  const QpAttrLimits lim = make_qp_attr_limits(dev, port);
  EXPECT_EQ(lim.phys_port_cnt, 2);
  EXPECT_EQ(lim.pkey_tbl_len, 128);
  EXPECT_EQ(lim.gid_tbl_len, 255);
  EXPECT_EQ(lim.active_mtu, IBV_MTU_4096);
  EXPECT_EQ(lim.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_TRUE(lim.grh_required);
  EXPECT_EQ(lim.max_qp_rd_atom, 32);
  EXPECT_EQ(lim.max_qp_init_rd_atom, 4);

  port.flags = 0;
  EXPECT_FALSE(make_qp_attr_limits(dev, port).grh_required);
}

}  // namespace
}  // namespace softverbs::emu

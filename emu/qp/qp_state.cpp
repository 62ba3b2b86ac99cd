#include "emu/qp/qp_state.hpp"

#include "emu/device/personality.hpp"

#include <array>
#include <cerrno>
#include <cstring>
#include <type_traits>

#include "wire/psn.hpp"

namespace softverbs::emu {

namespace {

// Short names for the attribute bits, to keep the table readable.
constexpr std::uint32_t kCurState = IBV_QP_CUR_STATE;
constexpr std::uint32_t kSqdNotify = IBV_QP_EN_SQD_ASYNC_NOTIFY;
constexpr std::uint32_t kAccess = IBV_QP_ACCESS_FLAGS;
constexpr std::uint32_t kPkey = IBV_QP_PKEY_INDEX;
constexpr std::uint32_t kPort = IBV_QP_PORT;
constexpr std::uint32_t kQkey = IBV_QP_QKEY;
constexpr std::uint32_t kAv = IBV_QP_AV;
constexpr std::uint32_t kMtu = IBV_QP_PATH_MTU;
constexpr std::uint32_t kTimeout = IBV_QP_TIMEOUT;
constexpr std::uint32_t kRetry = IBV_QP_RETRY_CNT;
constexpr std::uint32_t kRnrRetry = IBV_QP_RNR_RETRY;
constexpr std::uint32_t kRqPsn = IBV_QP_RQ_PSN;
constexpr std::uint32_t kRdAtomic = IBV_QP_MAX_QP_RD_ATOMIC;
constexpr std::uint32_t kAltPath = IBV_QP_ALT_PATH;
constexpr std::uint32_t kMinRnr = IBV_QP_MIN_RNR_TIMER;
constexpr std::uint32_t kSqPsn = IBV_QP_SQ_PSN;
constexpr std::uint32_t kDestRdAtomic = IBV_QP_MAX_DEST_RD_ATOMIC;
constexpr std::uint32_t kMigState = IBV_QP_PATH_MIG_STATE;
constexpr std::uint32_t kDestQpn = IBV_QP_DEST_QPN;
constexpr std::uint32_t kRateLimit = IBV_QP_RATE_LIMIT;

constexpr int kNumStates = IBV_QPS_ERR + 1;

// One mask per covered QP type. XRC_SEND is the kernel's XRC_INI (initiator)
// and XRC_RECV its XRC_TGT (target).
struct PerType {
  std::uint32_t rc = 0;
  std::uint32_t uc = 0;
  std::uint32_t ud = 0;
  std::uint32_t raw_packet = 0;
  std::uint32_t xrc_send = 0;
  std::uint32_t xrc_recv = 0;
};

struct Row {
  bool valid = false;
  PerType req;
  PerType opt;
};

using Table = std::array<std::array<Row, kNumStates>, kNumStates>;

// The modify-QP transition table, IBTA Vol 1 §11.2.5.2, with the QP types
// and the non-IBTA RATE_LIMIT attribute as Linux (v6.1, the kernel of the
// rdma-core 44 era) carries them. Over 100 lines because it is the table: one
// entry per transition, in the order of the kernel's qp_state_table, so that the
// two can be compared row by row; splitting it would only scatter the rows.
constexpr Table make_table() {
  Table t{};

  // Any state -> RESET, no attributes: a consumer may always reset a QP
  // (IBTA §10.3.1 state diagram; ERR->RESET is the only way out of ERR).
  for (auto& from : t) from[IBV_QPS_RESET].valid = true;

  // Any state but RESET -> ERR, no attributes (same diagram). RESET->ERR has
  // no row: a QP that was never initialised cannot be put in error.
  for (int s = IBV_QPS_INIT; s <= IBV_QPS_ERR; ++s) t[s][IBV_QPS_ERR].valid = true;

  // RESET -> INIT: bind the QP to a port and partition. Connected services
  // name their remote access rights; UD names its Q_Key instead. A raw
  // Ethernet QP only needs the port (kernel extension).
  t[IBV_QPS_RESET][IBV_QPS_INIT] = {
      .valid = true,
      .req = {.rc = kPkey | kPort | kAccess,
              .uc = kPkey | kPort | kAccess,
              .ud = kPkey | kPort | kQkey,
              .raw_packet = kPort,
              .xrc_send = kPkey | kPort | kAccess,
              .xrc_recv = kPkey | kPort | kAccess},
      .opt = {},
  };

  // INIT -> INIT: the RESET->INIT attributes may be changed again, none is
  // required. RAW_PACKET accepts nothing here.
  t[IBV_QPS_INIT][IBV_QPS_INIT] = {
      .valid = true,
      .req = {},
      .opt = {.rc = kPkey | kPort | kAccess,
              .uc = kPkey | kPort | kAccess,
              .ud = kPkey | kPort | kQkey,
              .raw_packet = 0,
              .xrc_send = kPkey | kPort | kAccess,
              .xrc_recv = kPkey | kPort | kAccess},
  };

  // INIT -> RTR: the receive side of a connection needs the remote address,
  // path MTU, remote QPN and expected PSN; reliable receivers (RC, XRC
  // target) also their responder resources and RNR NAK timer. UD needs
  // nothing. The port is fixed by now: it is not accepted here.
  t[IBV_QPS_INIT][IBV_QPS_RTR] = {
      .valid = true,
      .req = {.rc = kAv | kMtu | kDestQpn | kRqPsn | kDestRdAtomic | kMinRnr,
              .uc = kAv | kMtu | kDestQpn | kRqPsn,
              .ud = 0,
              .raw_packet = 0,
              .xrc_send = kAv | kMtu | kDestQpn | kRqPsn,
              .xrc_recv = kAv | kMtu | kDestQpn | kRqPsn | kDestRdAtomic | kMinRnr},
      .opt = {.rc = kAltPath | kAccess | kPkey,
              .uc = kAltPath | kAccess | kPkey,
              .ud = kPkey | kQkey,
              .raw_packet = 0,
              .xrc_send = kAltPath | kAccess | kPkey,
              .xrc_recv = kAltPath | kAccess | kPkey},
  };

  // RTR -> RTS: the send side needs its starting PSN; reliable senders (RC,
  // XRC initiator) also the ACK timeout, retry counts and initiator depth.
  // The XRC target has no send queue but answers reads/atomics, hence
  // TIMEOUT and SQ_PSN. CUR_STATE becomes acceptable from RTR on.
  t[IBV_QPS_RTR][IBV_QPS_RTS] = {
      .valid = true,
      .req = {.rc = kTimeout | kRetry | kRnrRetry | kSqPsn | kRdAtomic,
              .uc = kSqPsn,
              .ud = kSqPsn,
              .raw_packet = 0,
              .xrc_send = kTimeout | kRetry | kRnrRetry | kSqPsn | kRdAtomic,
              .xrc_recv = kTimeout | kSqPsn},
      .opt = {.rc = kCurState | kAltPath | kAccess | kMinRnr | kMigState,
              .uc = kCurState | kAltPath | kAccess | kMigState,
              .ud = kCurState | kQkey,
              .raw_packet = kRateLimit,
              .xrc_send = kCurState | kAltPath | kAccess | kMigState,
              .xrc_recv = kCurState | kAltPath | kAccess | kMinRnr | kMigState},
  };

  // RTS -> RTS: a live QP may change access rights, alternate path and
  // migration state (RNR timer for reliable receivers, Q_Key for UD).
  // Packet pacing (RATE_LIMIT) is a raw Ethernet extension.
  t[IBV_QPS_RTS][IBV_QPS_RTS] = {
      .valid = true,
      .req = {},
      .opt = {.rc = kCurState | kAccess | kAltPath | kMigState | kMinRnr,
              .uc = kCurState | kAccess | kAltPath | kMigState,
              .ud = kCurState | kQkey,
              .raw_packet = kRateLimit,
              .xrc_send = kCurState | kAccess | kAltPath | kMigState,
              .xrc_recv = kCurState | kAccess | kAltPath | kMigState | kMinRnr},
  };

  // RTS -> SQD: start draining the send queue; the consumer may ask for the
  // "SQ drained" affiliated event.
  t[IBV_QPS_RTS][IBV_QPS_SQD] = {
      .valid = true,
      .req = {},
      .opt = {.rc = kSqdNotify,
              .uc = kSqdNotify,
              .ud = kSqdNotify,
              .raw_packet = 0,
              .xrc_send = kSqdNotify,
              .xrc_recv = kSqdNotify},
  };

  // SQD -> RTS: resume sending; same optional set as RTS -> RTS minus
  // RATE_LIMIT.
  t[IBV_QPS_SQD][IBV_QPS_RTS] = {
      .valid = true,
      .req = {},
      .opt = {.rc = kCurState | kAltPath | kAccess | kMinRnr | kMigState,
              .uc = kCurState | kAltPath | kAccess | kMigState,
              .ud = kCurState | kQkey,
              .raw_packet = 0,
              .xrc_send = kCurState | kAltPath | kAccess | kMigState,
              .xrc_recv = kCurState | kAltPath | kAccess | kMinRnr | kMigState},
  };

  // SQD -> SQD: with the send queue drained, the path and transport
  // parameters may be renegotiated (the widest optional set). CUR_STATE is
  // not accepted here.
  t[IBV_QPS_SQD][IBV_QPS_SQD] = {
      .valid = true,
      .req = {},
      .opt = {.rc = kPort | kAv | kTimeout | kRetry | kRnrRetry | kRdAtomic | kDestRdAtomic |
                    kAltPath | kAccess | kPkey | kMinRnr | kMigState,
              .uc = kAv | kAltPath | kAccess | kPkey | kMigState,
              .ud = kPkey | kQkey,
              .raw_packet = 0,
              .xrc_send = kPort | kAv | kTimeout | kRetry | kRnrRetry | kRdAtomic | kAltPath |
                          kAccess | kPkey | kMigState,
              .xrc_recv = kPort | kAv | kTimeout | kDestRdAtomic | kAltPath | kAccess | kPkey |
                          kMinRnr | kMigState},
  };

  // SQE -> RTS: recover the send queue of an unreliable QP after a send
  // error. Only UC and UD enter SQE; the row exists for every type (as in
  // the kernel) but names attributes for those two only.
  t[IBV_QPS_SQE][IBV_QPS_RTS] = {
      .valid = true,
      .req = {},
      .opt = {.rc = 0,
              .uc = kCurState | kAccess,
              .ud = kCurState | kQkey,
              .raw_packet = 0,
              .xrc_send = 0,
              .xrc_recv = 0},
  };

  return t;
}

constexpr Table kTable = make_table();

constexpr std::uint32_t pick(const PerType& m, ibv_qp_type type) noexcept {
  switch (type) {
    case IBV_QPT_RC: return m.rc;
    case IBV_QPT_UC: return m.uc;
    case IBV_QPT_UD: return m.ud;
    case IBV_QPT_RAW_PACKET: return m.raw_packet;
    case IBV_QPT_XRC_SEND: return m.xrc_send;
    case IBV_QPT_XRC_RECV: return m.xrc_recv;
    default: return 0;
  }
}

// The row for a covered type and two valid states, or nullptr.
const Row* find_row(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) noexcept {
  if (!qp_type_has_transition_table(type) || !qp_state_is_valid(cur) || !qp_state_is_valid(next))
    return nullptr;
  const Row& row = kTable[cur][next];
  return row.valid ? &row : nullptr;
}

struct BitName {
  std::uint32_t bit;
  std::string_view name;
};

constexpr std::array<BitName, 22> kAttrBits = {{
    {IBV_QP_STATE, "IBV_QP_STATE"},
    {IBV_QP_CUR_STATE, "IBV_QP_CUR_STATE"},
    {IBV_QP_EN_SQD_ASYNC_NOTIFY, "IBV_QP_EN_SQD_ASYNC_NOTIFY"},
    {IBV_QP_ACCESS_FLAGS, "IBV_QP_ACCESS_FLAGS"},
    {IBV_QP_PKEY_INDEX, "IBV_QP_PKEY_INDEX"},
    {IBV_QP_PORT, "IBV_QP_PORT"},
    {IBV_QP_QKEY, "IBV_QP_QKEY"},
    {IBV_QP_AV, "IBV_QP_AV"},
    {IBV_QP_PATH_MTU, "IBV_QP_PATH_MTU"},
    {IBV_QP_TIMEOUT, "IBV_QP_TIMEOUT"},
    {IBV_QP_RETRY_CNT, "IBV_QP_RETRY_CNT"},
    {IBV_QP_RNR_RETRY, "IBV_QP_RNR_RETRY"},
    {IBV_QP_RQ_PSN, "IBV_QP_RQ_PSN"},
    {IBV_QP_MAX_QP_RD_ATOMIC, "IBV_QP_MAX_QP_RD_ATOMIC"},
    {IBV_QP_ALT_PATH, "IBV_QP_ALT_PATH"},
    {IBV_QP_MIN_RNR_TIMER, "IBV_QP_MIN_RNR_TIMER"},
    {IBV_QP_SQ_PSN, "IBV_QP_SQ_PSN"},
    {IBV_QP_MAX_DEST_RD_ATOMIC, "IBV_QP_MAX_DEST_RD_ATOMIC"},
    {IBV_QP_PATH_MIG_STATE, "IBV_QP_PATH_MIG_STATE"},
    {IBV_QP_CAP, "IBV_QP_CAP"},
    {IBV_QP_DEST_QPN, "IBV_QP_DEST_QPN"},
    {IBV_QP_RATE_LIMIT, "IBV_QP_RATE_LIMIT"},
}};

constexpr std::array<std::uint32_t, kAttrBits.size()> make_bit_list() {
  std::array<std::uint32_t, kAttrBits.size()> out{};
  for (std::size_t i = 0; i < kAttrBits.size(); ++i) out[i] = kAttrBits[i].bit;
  return out;
}

constexpr auto kAttrBitList = make_bit_list();

// ---- value checks ----------------------------------------------------------

// ibv_qp_attr is filled in by C code, where an enum member is an int that may
// hold any value. In C++ loading an enum object whose value lies outside the
// enum's range is undefined, so enum members are read through their object
// representation and checked as integers.
template <typename E>
std::int64_t raw_enum(const E& field) noexcept {
  static_assert(std::is_enum_v<E>);
  std::underlying_type_t<E> v;
  std::memcpy(&v, &field, sizeof v);
  return static_cast<std::int64_t>(v);
}

constexpr bool raw_state_is_valid(std::int64_t s) noexcept {
  return s >= IBV_QPS_RESET && s <= IBV_QPS_ERR;
}

// Field widths from IBTA Vol 1: the local ACK timeout and the RNR NAK timer
// are 5-bit encodings, the retry counters 3 bits, QPNs 24 bits.
constexpr unsigned kMaxTimeout = 31;
constexpr unsigned kMaxMinRnrTimer = 31;
constexpr unsigned kMaxRetryCnt = 7;
constexpr unsigned kMaxRnrRetry = 7;  // 7 means "retry forever"
constexpr std::uint32_t kMaxQpn = 0x00FF'FFFFu;

constexpr bool port_is_valid(unsigned port, const QpAttrLimits& lim) noexcept {
  return port >= 1 && port <= lim.phys_port_cnt;
}

// ibv_rate: 0 (port current rate) or one of the defined rates. There is no
// value 1. mlx5 rejects anything else with EINVAL (ib_rate_to_mlx5: rate <
// 2.5 Gbps or above the highest rate it knows).
constexpr bool static_rate_is_valid(unsigned rate) noexcept {
  return rate == IBV_RATE_MAX || (rate >= IBV_RATE_2_5_GBPS && rate <= kMaxStaticRate);
}

// An address vector, as the kernel checks it before any driver sees it
// (core/verbs.c rdma_check_ah_attr and rdma_fill_sgid_attr, reached from
// _ib_modify_qp for both IB_QP_AV and IB_QP_ALT_PATH):
//   * port_num must name a port (EINVAL);
//   * a RoCE port, or a port flagged IBV_QPF_GRH_REQUIRED, needs a GRH:
//     is_global == 0 there is EINVAL;
//   * with a GRH, sgid_index must lie inside the port's GID table
//     (rdma_get_gid_attr: index >= table size is EINVAL; an empty slot inside
//     the table is ENODATA, which needs the table contents and is left to the
//     caller).
// static_rate follows the provider (see static_rate_is_valid).
int validate_ah_attr(const ibv_ah_attr& ah, const QpAttrLimits& lim) noexcept {
  if (!port_is_valid(ah.port_num, lim)) return EINVAL;
  const bool roce = lim.link_layer == IBV_LINK_LAYER_ETHERNET;
  if ((roce || lim.grh_required) && !ah.is_global) return EINVAL;
  if (ah.is_global && (lim.gid_tbl_len <= 0 || ah.grh.sgid_index >= lim.gid_tbl_len)) return EINVAL;
  if (!static_rate_is_valid(ah.static_rate)) return EINVAL;
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// Names
// ---------------------------------------------------------------------------

std::span<const std::uint32_t> qp_attr_mask_bits() noexcept { return kAttrBitList; }

std::string_view qp_attr_mask_bit_name(std::uint32_t bit) noexcept {
  for (const auto& b : kAttrBits)
    if (b.bit == bit) return b.name;
  return {};
}

std::string_view qp_state_name(ibv_qp_state state) noexcept {
  switch (state) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "UNKNOWN";
  }
}

// ---------------------------------------------------------------------------
// Transition table
// ---------------------------------------------------------------------------

QpTransition resolve_modify_qp_transition(ibv_qp_state qp_state, const ibv_qp_attr& attr,
                                          std::uint32_t attr_mask) noexcept {
  auto state_field = [](const ibv_qp_state& field) {
    const std::int64_t v = raw_enum(field);
    return raw_state_is_valid(v) ? static_cast<ibv_qp_state>(v) : IBV_QPS_UNKNOWN;
  };
  const ibv_qp_state cur =
      (attr_mask & IBV_QP_CUR_STATE) ? state_field(attr.cur_qp_state) : qp_state;
  const ibv_qp_state next = (attr_mask & IBV_QP_STATE) ? state_field(attr.qp_state) : cur;
  return {cur, next};
}

bool qp_type_has_transition_table(ibv_qp_type type) noexcept {
  switch (type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_UD:
    case IBV_QPT_RAW_PACKET:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      return true;
    default:
      return false;
  }
}

bool qp_type_has_sqe(ibv_qp_type type) noexcept {
  return type == IBV_QPT_UC || type == IBV_QPT_UD;
}

bool qp_transition_exists(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) noexcept {
  return find_row(type, cur, next) != nullptr;
}

std::uint32_t qp_transition_required_mask(ibv_qp_type type, ibv_qp_state cur,
                                          ibv_qp_state next) noexcept {
  const Row* row = find_row(type, cur, next);
  return row ? pick(row->req, type) : 0;
}

std::uint32_t qp_transition_optional_mask(ibv_qp_type type, ibv_qp_state cur,
                                          ibv_qp_state next) noexcept {
  const Row* row = find_row(type, cur, next);
  return row ? pick(row->opt, type) : 0;
}

bool modify_qp_is_ok(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next,
                     std::uint32_t attr_mask) noexcept {
  // Asserting the current state only makes sense once the QP can have moved
  // on its own (RTR onwards: COMM_EST, SQ drain, send errors). The table
  // enforces this too, as no row from RESET or INIT lists CUR_STATE; the
  // explicit test mirrors the kernel.
  if ((attr_mask & IBV_QP_CUR_STATE) && cur != IBV_QPS_RTR && cur != IBV_QPS_RTS &&
      cur != IBV_QPS_SQD && cur != IBV_QPS_SQE)
    return false;

  const Row* row = find_row(type, cur, next);
  if (!row) return false;

  const std::uint32_t req = pick(row->req, type);
  const std::uint32_t opt = pick(row->opt, type);
  if ((attr_mask & req) != req) return false;
  if (attr_mask & ~(req | opt | static_cast<std::uint32_t>(IBV_QP_STATE))) return false;
  return true;
}

// ---------------------------------------------------------------------------
// Attribute values
// ---------------------------------------------------------------------------

QpAttrLimits make_qp_attr_limits(const ibv_device_attr& dev, const ibv_port_attr& port) noexcept {
  QpAttrLimits lim;
  lim.phys_port_cnt = dev.phys_port_cnt;
  lim.pkey_tbl_len = port.pkey_tbl_len;
  lim.gid_tbl_len = port.gid_tbl_len;
  std::memcpy(&lim.active_mtu, &port.active_mtu, sizeof lim.active_mtu);  // no enum load
  lim.link_layer = port.link_layer;
  lim.grh_required = (port.flags & IBV_QPF_GRH_REQUIRED) != 0;
  lim.max_qp_rd_atom = dev.max_qp_rd_atom;
  lim.max_qp_init_rd_atom = dev.max_qp_init_rd_atom;
  return lim;
}

// Sources for each rule:
//   uverbs  = kernel drivers/infiniband/core/uverbs_cmd.c, modify_qp()
//   core    = kernel drivers/infiniband/core/verbs.c, _ib_modify_qp()
//   mlx5    = kernel drivers/infiniband/hw/mlx5/qp.c, mlx5_ib_modify_qp() and
//             __mlx5_ib_modify_qp()
//   rxe     = kernel drivers/infiniband/sw/rxe/rxe_qp.c, rxe_qp_chk_attr()
int validate_qp_attr_values(const ibv_qp_attr& attr, std::uint32_t attr_mask,
                            const QpAttrLimits& lim, std::uint8_t qp_port) noexcept {
  // rxe does not range-check the P_Key indexes, retry_cnt and min_rnr_timer,
  // and takes path_mtu 0 (the personality's qp.validate_attributes).
  const bool strict = personality().validate_qp_attributes;
  // States beyond ERR (uverbs).
  if ((attr_mask & IBV_QP_STATE) && !raw_state_is_valid(raw_enum(attr.qp_state))) return EINVAL;
  if ((attr_mask & IBV_QP_CUR_STATE) && !raw_state_is_valid(raw_enum(attr.cur_qp_state)))
    return EINVAL;

  // port_num in 1..phys_port_cnt (uverbs rdma_is_port_valid, mlx5, rxe).
  if ((attr_mask & IBV_QP_PORT) && !port_is_valid(attr.port_num, lim)) return EINVAL;

  if (attr_mask & IBV_QP_AV) {
    if (int err = validate_ah_attr(attr.ah_attr, lim)) return err;
    if ((attr_mask & IBV_QP_STATE) && raw_enum(attr.qp_state) == IBV_QPS_RTR) {
      // INIT->RTR: the address vector must use the port the QP was bound to
      // at RESET->INIT (uverbs).
      if (qp_port != 0 && attr.ah_attr.port_num != qp_port) return EINVAL;
    } else if ((attr_mask & IBV_QP_PORT) && attr.port_num != attr.ah_attr.port_num) {
      // SQD->SQD may move the QP to another port; the AV must agree (uverbs).
      return EINVAL;
    }
  }

  // Alternate path (IBTA 17.2.8), checked like the primary path: the kernel
  // runs the same address-vector checks for IB_QP_ALT_PATH as for IB_QP_AV
  // (core), alt_port_num must be a valid port equal to alt_ah_attr.port_num
  // (uverbs), alt_timeout is a 5-bit field (rxe) and alt_pkey_index must lie
  // inside the P_Key table like pkey_index. The kernel refuses alternate
  // paths on RoCE ports ("APM only for IB"); emulated devices migrate on
  // either link layer, as ConnectX does on InfiniBand (docs/compatibility.md).
  // Whether the destination is reachable is the QP's check (Qp::modify).
  if (attr_mask & IBV_QP_ALT_PATH) {
    if (!port_is_valid(attr.alt_port_num, lim)) return EINVAL;
    if (attr.alt_ah_attr.port_num != attr.alt_port_num) return EINVAL;
    if (int err = validate_ah_attr(attr.alt_ah_attr, lim)) return err;
    if (attr.alt_pkey_index >= lim.pkey_tbl_len && strict) return EINVAL;
    if (attr.alt_timeout > kMaxTimeout) return EINVAL;
  }

  // pkey_index inside the P_Key table (mlx5: >= pkey_table_len is EINVAL).
  if ((attr_mask & IBV_QP_PKEY_INDEX) && attr.pkey_index >= lim.pkey_tbl_len && strict) return EINVAL;

  // qkey: any 32-bit value is accepted.

  // path_mtu: an ibv_mtu value, 256..4096 (mlx5: "invalid mtu", EINVAL), and
  // not above the port's active MTU. rxe compares against the port's max MTU
  // instead; for the emulated port the active MTU is what the link carries,
  // and a larger path MTU could never be delivered.
  if (attr_mask & IBV_QP_PATH_MTU) {
    const std::int64_t mtu = raw_enum(attr.path_mtu);
    // rxe takes 0 (Qp::modify then keeps the port's active MTU).
    if ((mtu < IBV_MTU_256 || mtu > IBV_MTU_4096) && (strict || mtu != 0)) return EINVAL;
    if (mtu > raw_enum(lim.active_mtu)) return EINVAL;
  }

  // Local ACK timeout: 5-bit field (rxe: > 31 is EINVAL; mlx5 would silently
  // drop the high bits).
  if ((attr_mask & IBV_QP_TIMEOUT) && attr.timeout > kMaxTimeout) return EINVAL;

  // Retry counters: 3-bit fields in IBTA. Neither mlx5 nor rxe range-check
  // them (mlx5 would spill into neighbouring context bits); we refuse rather
  // than truncate.
  if ((attr_mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > kMaxRetryCnt && strict) return EINVAL;
  if ((attr_mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > kMaxRnrRetry) return EINVAL;

  // Minimum RNR NAK timer: 5-bit encoding (IBTA Table "Encoding for RNR NAK
  // Timer Field"); not range-checked by mlx5 or rxe.
  if ((attr_mask & IBV_QP_MIN_RNR_TIMER) && attr.min_rnr_timer > kMaxMinRnrTimer && strict) return EINVAL;

  // Initiator depth against max_qp_init_rd_atom, responder resources against
  // max_qp_rd_atom. mlx5 does exactly this (log_max_ra_res_qp /
  // log_max_ra_req_qp, which it reports as those two device limits).
  if ((attr_mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > lim.max_qp_init_rd_atom)
    return EINVAL;
  if ((attr_mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > lim.max_qp_rd_atom)
    return EINVAL;

  // Destination QPN: 24 bits on the wire. The kernel does not check it
  // (mlx5 would corrupt the neighbouring context field); we refuse.
  if ((attr_mask & IBV_QP_DEST_QPN) && attr.dest_qp_num > kMaxQpn) return EINVAL;

  // sq_psn / rq_psn: never rejected; see mask_qp_attr_psns().

  // Access flags. Neither core nor mlx5 validate them (mlx5 looks at the
  // three REMOTE_* bits and ignores the rest). rxe refuses any bit outside
  // the set it accepts for memory regions: LOCAL_WRITE, the three REMOTE_*
  // rights, MW_BIND, ON_DEMAND, the FLUSH rights (not in this ABI) and the
  // optional range. We follow rxe, so MR-only flags (ZERO_BASED, HUGETLB)
  // and undefined bits are EINVAL.
  if ((attr_mask & IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~kQpAccessFlagsAllowed))
    return EINVAL;

  // Path migration state: one of MIGRATED, REARM, ARMED. mlx5 and rxe store
  // an unknown value without complaint; we refuse it.
  if (attr_mask & IBV_QP_PATH_MIG_STATE) {
    const std::int64_t mig = raw_enum(attr.path_mig_state);
    if (mig < IBV_MIG_MIGRATED || mig > IBV_MIG_ARMED) return EINVAL;
  }

  // en_sqd_async_notify: any value (non-zero means "notify").
  return 0;
}

// The kernel, not the provider, normalises PSNs: core/verbs.c _ib_modify_qp()
// masks rq_psn and sq_psn to 24 bits (with a "psn overflow, masking to 24
// bits" warning) on IB and RoCE ports instead of failing the call.
void mask_qp_attr_psns(ibv_qp_attr& attr, std::uint32_t attr_mask) noexcept {
  if (attr_mask & IBV_QP_RQ_PSN) attr.rq_psn = wire::psn_mask(attr.rq_psn);
  if (attr_mask & IBV_QP_SQ_PSN) attr.sq_psn = wire::psn_mask(attr.sq_psn);
}

}  // namespace softverbs::emu

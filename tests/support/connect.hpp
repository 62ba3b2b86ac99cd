// Bringing QPs from RESET to RTS: one set of attributes with the values the
// suites use as defaults, the three modify steps (IBTA Vol 1 11.2.5.2: the
// attributes each transition requires of an RC, UC or UD QP), and whole
// connections of a pair in one call. Public verbs API only; results are the
// ibv_modify_qp() return values, so that gtest suites and plain programs alike
// can say which step failed.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace softverbs::testkit {

inline constexpr unsigned kRemoteAll = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// The attributes of a connection, for one QP. Fields that do not apply to the
// QP's service (say, timeout for UC) are not passed to ibv_modify_qp().
struct QpPath {
  uint8_t port = 1;
  uint16_t pkey_index = 0;
  unsigned access = kRemoteAll;  // RC and UC: rights granted to the peer (INIT)
  uint32_t qkey = 0x11111111;    // UD
  ibv_mtu path_mtu = IBV_MTU_1024;
  uint32_t rq_psn = 0;  // the peer's first send PSN
  uint32_t sq_psn = 0;  // this QP's first send PSN
  uint8_t max_dest_rd_atomic = 4;
  uint8_t min_rnr_timer = 1;  // 0.01 ms
  uint8_t timeout = 14;       // 4.096 us * 2^14 = 67 ms
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;  // for ever
  uint8_t max_rd_atomic = 4;
};

// An address vector to a GID (RoCE: GID index 1 is the IPv4-mapped RoCEv2 GID
// of an emulated port) or to a LID (InfiniBand).
inline ibv_ah_attr ah_to_gid(const ibv_gid& dgid, uint8_t sgid_index = 1, uint8_t port = 1) {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.grh.dgid = dgid;
  a.grh.sgid_index = sgid_index;
  a.grh.hop_limit = 64;
  a.port_num = port;
  return a;
}
inline ibv_ah_attr ah_to_lid(uint16_t dlid, uint8_t port = 1) {
  ibv_ah_attr a{};
  a.dlid = dlid;
  a.port_num = port;
  return a;
}

// RESET -> INIT.
inline int modify_to_init(ibv_qp* qp, const QpPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = p.pkey_index;
  a.port_num = p.port;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (qp->qp_type == IBV_QPT_UD) {
    a.qkey = p.qkey;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = p.access;
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  return ibv_modify_qp(qp, &a, mask);
}

// INIT -> RTR towards QP dest_qpn at ah (both ignored for UD).
inline int modify_to_rtr(ibv_qp* qp, uint32_t dest_qpn, const ibv_ah_attr& ah, const QpPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  if (qp->qp_type == IBV_QPT_UD) return ibv_modify_qp(qp, &a, IBV_QP_STATE);
  a.path_mtu = p.path_mtu;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = p.rq_psn;
  a.ah_attr = ah;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (qp->qp_type == IBV_QPT_RC) {
    a.max_dest_rd_atomic = p.max_dest_rd_atomic;
    a.min_rnr_timer = p.min_rnr_timer;
    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  }
  return ibv_modify_qp(qp, &a, mask);
}

// RTR -> RTS.
inline int modify_to_rts(ibv_qp* qp, const QpPath& p) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.sq_psn;
  int mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (qp->qp_type == IBV_QPT_RC) {
    a.timeout = p.timeout;
    a.retry_cnt = p.retry_cnt;
    a.rnr_retry = p.rnr_retry;
    a.max_rd_atomic = p.max_rd_atomic;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(qp, &a, mask);
}

// The outcome of a connection: the first failing modify's result and which
// transition it was ("RESET->INIT", "INIT->RTR", "RTR->RTS"), or 0 and null.
struct Connected {
  int rc = 0;
  const char* step = nullptr;
  explicit operator bool() const { return rc == 0; }
};

// One QP in RESET to RTS, towards dest_qpn at ah (RC, UC) or ready to send
// datagrams (UD, where dest_qpn and ah are not used).
inline Connected connect_qp(ibv_qp* qp, uint32_t dest_qpn, const ibv_ah_attr& ah, const QpPath& p) {
  if (int rc = modify_to_init(qp, p)) return {rc, "RESET->INIT"};
  if (int rc = modify_to_rtr(qp, dest_qpn, ah, p)) return {rc, "INIT->RTR"};
  if (int rc = modify_to_rts(qp, p)) return {rc, "RTR->RTS"};
  return {};
}

// Two QPs in RESET connected to each other in one call: a's path goes towards b
// at ah_b and the other way round. Each side's rq_psn is set from the other's
// sq_psn, so only sq_psn needs setting per side.
inline Connected connect_pair(ibv_qp* a, const ibv_ah_attr& ah_b, QpPath pa, ibv_qp* b, const ibv_ah_attr& ah_a,
                              QpPath pb) {
  pa.rq_psn = pb.sq_psn;
  pb.rq_psn = pa.sq_psn;
  if (Connected r = connect_qp(a, b->qp_num, ah_b, pa); !r) return r;
  return connect_qp(b, a->qp_num, ah_a, pb);
}

// The same attributes for both sides.
inline Connected connect_pair(ibv_qp* a, const ibv_ah_attr& ah_b, ibv_qp* b, const ibv_ah_attr& ah_a,
                              const QpPath& p = {}) {
  return connect_pair(a, ah_b, p, b, ah_a, p);
}

// Two UD QPs in RESET to RTS with one Q_Key (the address of a datagram is in its
// work request, so the QPs need not know each other).
inline Connected connect_ud_pair(ibv_qp* a, ibv_qp* b, const QpPath& p = {}) {
  if (Connected r = connect_qp(a, 0, {}, p); !r) return r;
  return connect_qp(b, 0, {}, p);
}

// A QP's current state from ibv_query_qp(), or -1 cast to ibv_qp_state on error.
inline ibv_qp_state query_state(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr i{};
  if (ibv_query_qp(qp, &a, IBV_QP_STATE, &i)) return static_cast<ibv_qp_state>(-1);
  return a.qp_state;
}

}  // namespace softverbs::testkit

// The nodes of a simulated fabric as the topology tests and the all-to-all
// program use them: one open device with a PD, one CQ, a registered buffer,
// and RC QPs connected to other nodes. Public verbs API only, plus
// ibv_query_rt_values_ex for the device's (virtual) clock.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/connect.hpp"

namespace softverbs::topotest {

// Fails the program (or test) with a message: these helpers are shared by a
// plain program, so they do not use gtest assertions.
[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "fatal: %s (errno %d: %s)\n", what, errno, std::strerror(errno));
  std::exit(2);
}

struct Node {
  std::string name;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq_ex* cqx = nullptr;  // with completion timestamps (wall clock: the virtual one's)
  ibv_cq* cq = nullptr;      // the same CQ
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf;
  ibv_gid gid{};

  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node() {
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

// Opens dev with a CQ of cqe entries and a buffer of bytes, registered for
// remote writes.
inline void open_node(ibv_device* dev, Node* n, int cqe, size_t bytes) {
  n->name = ibv_get_device_name(dev);
  if (!(n->ctx = ibv_open_device(dev))) die("ibv_open_device");
  if (!(n->pd = ibv_alloc_pd(n->ctx))) die("ibv_alloc_pd");
  ibv_cq_init_attr_ex ca{};
  ca.cqe = static_cast<uint32_t>(cqe);
  ca.wc_flags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  if (!(n->cqx = ibv_create_cq_ex(n->ctx, &ca))) die("ibv_create_cq_ex");
  n->cq = ibv_cq_ex_to_cq(n->cqx);
  n->buf.assign(bytes, 0);
  if (!(n->mr = ibv_reg_mr(n->pd, n->buf.data(), bytes,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)))
    die("ibv_reg_mr");
  // GID index 1: the IPv4-mapped RoCEv2 GID of an emulated port.
  if (ibv_query_gid(n->ctx, 1, 1, &n->gid)) die("ibv_query_gid");
}

inline ibv_qp* rc_qp(Node& n, uint32_t depth) {
  ibv_qp_init_attr a{};
  a.send_cq = n.cq;
  a.recv_cq = n.cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = depth;
  a.cap.max_recv_wr = depth;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(n.pd, &a);
  if (!qp) die("ibv_create_qp");
  return qp;
}

// Connects qa on a and qb on b to each other.
inline void connect_rc(Node& a, ibv_qp* qa, Node& b, ibv_qp* qb, const testkit::QpPath& path) {
  if (!testkit::connect_pair(qa, testkit::ah_to_gid(b.gid), qb, testkit::ah_to_gid(a.gid), path))
    die("connecting an RC pair");
}

// The device's clock in nanoseconds: virtual time under SOFTVERBS_CLOCK=virtual.
inline uint64_t device_ns(ibv_context* ctx) {
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  if (ibv_query_rt_values_ex(ctx, &v)) die("ibv_query_rt_values_ex");
  return static_cast<uint64_t>(v.raw_clock.tv_sec) * 1000000000ull + static_cast<uint64_t>(v.raw_clock.tv_nsec);
}

inline int post_recv(ibv_qp* qp, Node& n, uint64_t wr_id, uint32_t offset, uint32_t len) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(n.buf.data()) + offset, len, n.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

// A signaled SEND (rkey 0) or RDMA WRITE (to remote_addr/rkey) of len bytes
// from n's buffer at offset.
inline int post_send(ibv_qp* qp, Node& n, uint64_t wr_id, uint32_t offset, uint32_t len, uint64_t remote_addr = 0,
                     uint32_t rkey = 0) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(n.buf.data()) + offset, len, n.mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = rkey ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

// Polls cq until one completion arrives or `limit` of wall time passed (every
// empty poll lets virtual time move on); false on timeout.
inline bool wait_one(ibv_cq* cq, ibv_wc* wc, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const int got = ibv_poll_cq(cq, 1, wc);
    if (got < 0) return false;
    if (got == 1) return true;
    if (std::chrono::steady_clock::now() > end) return false;
  }
}

}  // namespace softverbs::topotest

/* An RC pair between two emulated devices of this process for the virtual-time
 * programs (virtual_retry.c, virtual_replay.c), on the public verbs API only:
 * one context, PD, CQ, buffer (registered at kIova) and RC QP per side, connected over the
 * RoCE v2 GID at index 1, and the device's clock read through
 * ibv_query_rt_values_ex (the clock completion timestamps come from). */
#ifndef SV_TESTS_FAULTS_VIRTUAL_PAIR_H
#define SV_TESTS_FAULTS_VIRTUAL_PAIR_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { kBufSize = 1 << 16 };
static const uint64_t kIova = 0x100000; /* where each side's buffer is registered */

#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

struct side {
  struct ibv_context* ctx;
  struct ibv_pd* pd;
  struct ibv_cq* cq;
  struct ibv_qp* qp;
  struct ibv_mr* mr;
  union ibv_gid gid;
  char* buf; /* kBufSize bytes */
};

static void open_side(struct ibv_device* dev, struct side* s) {
  struct ibv_qp_init_attr qa;
  s->ctx = ibv_open_device(dev);
  CHECK(s->ctx);
  s->pd = ibv_alloc_pd(s->ctx);
  CHECK(s->pd);
  s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
  CHECK(s->cq);
  s->buf = aligned_alloc(4096, kBufSize);
  CHECK(s->buf);
  memset(s->buf, 0, kBufSize);
  /* Registered at a fixed I/O virtual address, so that the addresses RDMA
   * operations carry (the RETH) are the same on every run. */
  s->mr = ibv_reg_mr_iova(s->pd, s->buf, kBufSize, kIova,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC);
  CHECK(s->mr);
  memset(&qa, 0, sizeof qa);
  qa.send_cq = s->cq;
  qa.recv_cq = s->cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = 16;
  qa.cap.max_recv_wr = 16;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  s->qp = ibv_create_qp(s->pd, &qa);
  CHECK(s->qp);
  CHECK(ibv_query_gid(s->ctx, 1, 1, &s->gid) == 0); /* index 1: the IPv4-mapped RoCE v2 GID */
}

/* RESET -> INIT -> RTR -> RTS towards peer: retry_cnt 7, rnr_retry 7 (forever),
 * the given local ACK timeout. */
static void connect_side(struct side* s, const struct side* peer, uint8_t timeout) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer->qp->qp_num;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = peer->gid;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  CHECK(ibv_modify_qp(s->qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = timeout;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  CHECK(ibv_modify_qp(s->qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

/* The device's clock in nanoseconds (the completion timestamps' clock). */
static uint64_t device_ns(struct ibv_context* ctx) {
  struct ibv_values_ex v;
  memset(&v, 0, sizeof v);
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
  CHECK(ibv_query_rt_values_ex(ctx, &v) == 0);
  return (uint64_t)v.raw_clock.tv_sec * 1000000000ull + (uint64_t)v.raw_clock.tv_nsec;
}
static void close_side(struct side* s) {
  CHECK(ibv_destroy_qp(s->qp) == 0);
  CHECK(ibv_dereg_mr(s->mr) == 0);
  CHECK(ibv_destroy_cq(s->cq) == 0);
  CHECK(ibv_dealloc_pd(s->pd) == 0);
  CHECK(ibv_close_device(s->ctx) == 0);
  free(s->buf);
}

#endif

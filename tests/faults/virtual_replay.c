/* A single-threaded workload under seeded packet faults, for the determinism of
 * virtual time (docs/simulation.md, "Determinism"). From emu0 to emu1, one
 * operation at a time (120 by default, or argv[1]), in turn: an RDMA WRITE of 3
 * packets, a SEND, an RDMA READ of 2 response packets, a compare-and-swap, a
 * fetch-and-add, a SEND that finds no receive posted (the responder answers RNR
 * NAKs until the receive is posted, which happens once emu0 has counted one),
 * and a UD SEND, which the faults may lose or duplicate. Probabilistic drops,
 * duplicates, reordering and delays act on every packet of both RC QPs and on
 * the UD datagrams, each kind of traffic with rules of its own.
 *
 * It prints one line per operation (its completion: status, opcode, length, the
 * device clock's nanoseconds; for a UD SEND, how many copies arrived) and the
 * fault and transport counters. Run with SOFTVERBS_CLOCK=virtual, the same
 * SOFTVERBS_FAULT_SEED and fixed device addresses, the output, the capture
 * (SOFTVERBS_PCAP) and the trace (SOFTVERBS_TRACE) are identical from run to run
 * (virtual_replay_test.cpp). Buffers are registered at a fixed I/O virtual
 * address so that the RETH's addresses repeat too.
 *
 * Every wait polls until something the engine did can be seen (a completion, a
 * counter), never a number of times: that is what keeps the run independent of
 * how fast it goes. */
#include <softverbs/faults.h>

#include "virtual_pair.h"

enum { kUdRecvs = 8, kUdQkey = 0x11111111, kGrh = 40 };

/* Rules per traffic: the QPN is the packet's destination QP (the BTH's), so
 * each rule sees one direction of one QP pair and draws from its own stream. */
static const char kRcRules[] =
    "[[rule]]\nname = \"drop_%c\"\nqpn = %u\nprobability = 0.05\naction = \"drop\"\n"
    "[[rule]]\nname = \"dup_%c\"\nqpn = %u\nprobability = 0.03\naction = \"duplicate\"\n"
    "[[rule]]\nname = \"reorder_%c\"\nqpn = %u\nprobability = 0.03\naction = \"reorder\"\n"
    "[[rule]]\nname = \"delay_%c\"\nqpn = %u\nprobability = 0.03\naction = \"delay\"\ndelay_us = 700\n";
static const char kUdRules[] =
    "[[rule]]\nname = \"ud_drop\"\ndirection = \"tx\"\nqpn = %u\nprobability = 0.15\naction = \"drop\"\n"
    "[[rule]]\nname = \"ud_dup\"\ndirection = \"tx\"\nqpn = %u\nprobability = 0.15\naction = \"duplicate\"\n"
    "[[rule]]\nname = \"ud_delay\"\ndirection = \"tx\"\nqpn = %u\nprobability = 0.15\naction = \"delay\"\n"
    "delay_us = 300\n";

struct ud {
  struct ibv_cq* cq;
  struct ibv_qp* qp;
};

static void post_recv(struct side* s) {
  struct ibv_sge sge = {kIova + 32768, 4096, s->mr->lkey}; /* SGEs use the region's I/O addresses */
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

static void post_ud_recv(const struct side* s, struct ud* u) {
  struct ibv_sge sge = {kIova + 49152, 4096 + kGrh, s->mr->lkey};
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  CHECK(ibv_post_recv(u->qp, &wr, &bad) == 0);
}

/* A UD QP of s's device, in RTS. */
static void open_ud(const struct side* s, struct ud* u) {
  struct ibv_qp_init_attr qa;
  struct ibv_qp_attr a;
  u->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
  CHECK(u->cq);
  memset(&qa, 0, sizeof qa);
  qa.send_cq = u->cq;
  qa.recv_cq = u->cq;
  qa.qp_type = IBV_QPT_UD;
  qa.cap.max_send_wr = 16;
  qa.cap.max_recv_wr = 16;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  u->qp = ibv_create_qp(s->pd, &qa);
  CHECK(u->qp);
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = kUdQkey;
  CHECK(ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
  a.qp_state = IBV_QPS_RTR;
  CHECK(ibv_modify_qp(u->qp, &a, IBV_QP_STATE) == 0);
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  CHECK(ibv_modify_qp(u->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
}

/* Polls cq until one completion; bounded by a generous count of empty polls. */
static void wait_one(struct ibv_cq* cq, struct ibv_wc* wc) {
  long spins = 0;
  int got;
  while ((got = ibv_poll_cq(cq, 1, wc)) == 0) CHECK(++spins < 100000000L);
  CHECK(got == 1);
}

static struct softverbs_counters counters(const char* dev) {
  struct softverbs_counters c;
  CHECK(softverbs_device_counters(dev, &c, sizeof c) == 0);
  return c;
}

/* One RC operation of kind 0..5 from a to b, waited for; prints its completion. */
static void rc_op(struct side* a, struct side* b, int i, int kind) {
  static const char* const kNames[] = {"write", "send", "read", "cas", "fadd", "rnr"};
  static const enum ibv_wr_opcode kOps[] = {IBV_WR_RDMA_WRITE,         IBV_WR_SEND,
                                            IBV_WR_RDMA_READ,          IBV_WR_ATOMIC_CMP_AND_SWP,
                                            IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_SEND};
  static const uint32_t kLens[] = {3000, 100, 2000, 8, 8, 200};
  struct ibv_sge sge;
  struct ibv_send_wr wr, *bad = NULL;
  struct ibv_wc wc;
  const int send = kind == 1 || kind == 5;
  memset(a->buf, i, 3000);
  memset(&sge, 0, sizeof sge);
  sge.addr = kIova;
  sge.length = kLens[kind];
  sge.lkey = a->mr->lkey;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = (uint64_t)i;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = kOps[kind];
  wr.send_flags = IBV_SEND_SIGNALED;
  if (kind == 3 || kind == 4) {
    wr.wr.atomic.remote_addr = kIova + 8192; /* 8-byte aligned */
    wr.wr.atomic.rkey = b->mr->rkey;
    wr.wr.atomic.compare_add = kind == 3 ? 0 : 1; /* the compare-and-swap swaps the first time only */
    wr.wr.atomic.swap = (uint64_t)i;
  } else {
    wr.wr.rdma.remote_addr = kIova + 4096;
    wr.wr.rdma.rkey = b->mr->rkey;
  }
  if (kind == 1) post_recv(b);
  if (kind == 5) {
    /* No receive yet: wait until emu0 has received an RNR NAK, then post it. */
    const uint64_t before = counters("emu0").rnr_naks_received;
    long spins = 0;
    CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
    while (counters("emu0").rnr_naks_received == before) {
      CHECK(ibv_poll_cq(a->cq, 1, &wc) == 0); /* it cannot complete before its receive exists */
      CHECK(++spins < 100000000L);
    }
    post_recv(b);
  } else {
    CHECK(ibv_post_send(a->qp, &wr, &bad) == 0);
  }
  wait_one(a->cq, &wc);
  printf("%3d %-5s %s opcode %d len %u t %llu\n", i, kNames[kind], ibv_wc_status_str(wc.status), wc.opcode,
         wc.byte_len, (unsigned long long)device_ns(a->ctx));
  CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)i);
  if (send) {
    wait_one(b->cq, &wc); /* the receive */
    CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == kLens[kind]);
  }
}

/* One UD SEND from ua to ub, waited for until every copy of it is accounted
 * for: received, or lost by the ud_drop rule (a duplicate arrives twice). */
static void ud_op(struct side* a, struct side* b, struct ud* ua, struct ud* ub, struct ibv_ah* ah, int i,
                  uint64_t* sent, uint64_t* received) {
  struct ibv_sge sge = {kIova, 300, a->mr->lkey};
  struct ibv_send_wr wr, *bad = NULL;
  struct ibv_wc wc;
  const uint64_t before = *received;
  long spins = 0;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = (uint64_t)i;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = ub->qp->qp_num;
  wr.wr.ud.remote_qkey = kUdQkey;
  CHECK(ibv_post_send(ua->qp, &wr, &bad) == 0);
  ++*sent;
  wait_one(ua->cq, &wc);
  CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)i);
  while (*received + softverbs_fault_hits("ud_drop") != *sent + softverbs_fault_hits("ud_dup")) {
    const int got = ibv_poll_cq(ub->cq, 1, &wc);
    CHECK(got >= 0 && ++spins < 100000000L);
    if (got == 0) continue;
    CHECK(wc.status == IBV_WC_SUCCESS && wc.byte_len == 300 + kGrh);
    ++*received;
    post_ud_recv(b, ub);
  }
  printf("%3d ud    %llu cop%s t %llu\n", i, (unsigned long long)(*received - before),
         *received - before == 1 ? "y" : "ies", (unsigned long long)device_ns(a->ctx));
}

int main(int argc, char** argv) {
  int n = 0, i;
  const int ops = argc > 1 ? atoi(argv[1]) : 120;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct side a, b;
  struct ud ua, ub;
  struct ibv_ah_attr ah_attr;
  struct ibv_ah* ah;
  char scenario[4096], err[256] = "";
  struct softverbs_counters ca, cb;
  uint64_t ud_sent = 0, ud_received = 0;
  int len;

  CHECK(list && n >= 2 && ops > 0);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  open_side(list[0], &a);
  open_side(list[1], &b);
  connect_side(&a, &b, 10);
  connect_side(&b, &a, 10);
  open_ud(&a, &ua);
  open_ud(&b, &ub);
  memset(&ah_attr, 0, sizeof ah_attr);
  ah_attr.is_global = 1;
  ah_attr.grh.dgid = b.gid;
  ah_attr.grh.sgid_index = 1;
  ah_attr.grh.hop_limit = 64;
  ah_attr.port_num = 1;
  ah = ibv_create_ah(a.pd, &ah_attr);
  CHECK(ah);
  for (i = 0; i < kUdRecvs; ++i) post_ud_recv(&b, &ub);
  len = snprintf(scenario, sizeof scenario, kUdRules, ub.qp->qp_num, ub.qp->qp_num, ub.qp->qp_num);
  len += snprintf(scenario + len, sizeof scenario - (size_t)len, kRcRules, 'a', a.qp->qp_num, 'a', a.qp->qp_num,
                  'a', a.qp->qp_num, 'a', a.qp->qp_num);
  len += snprintf(scenario + len, sizeof scenario - (size_t)len, kRcRules, 'b', b.qp->qp_num, 'b', b.qp->qp_num,
                  'b', b.qp->qp_num, 'b', b.qp->qp_num);
  CHECK(len > 0 && (size_t)len < sizeof scenario);
  if (softverbs_faults_load(scenario, err, sizeof err) != 0) {
    fprintf(stderr, "scenario: %s\n", err);
    return 1;
  }
  for (i = 0; i < ops; ++i) {
    if (i % 7 == 6)
      ud_op(&a, &b, &ua, &ub, ah, i, &ud_sent, &ud_received);
    else
      rc_op(&a, &b, i, i % 7);
  }
  ca = counters("emu0");
  cb = counters("emu1");
  printf("emu0 tx %llu rx %llu retransmits %llu timeouts %llu naks %llu rnr naks %llu\n",
         (unsigned long long)ca.tx_packets, (unsigned long long)ca.rx_packets, (unsigned long long)ca.retransmits,
         (unsigned long long)ca.timeouts, (unsigned long long)ca.naks_received,
         (unsigned long long)ca.rnr_naks_received);
  printf("emu1 tx %llu rx %llu duplicates %llu\n", (unsigned long long)cb.tx_packets,
         (unsigned long long)cb.rx_packets, (unsigned long long)cb.duplicates);
  printf("faults drop %llu/%llu dup %llu/%llu reorder %llu/%llu delay %llu/%llu ud drop %llu dup %llu delay %llu\n",
         (unsigned long long)softverbs_fault_hits("drop_a"), (unsigned long long)softverbs_fault_hits("drop_b"),
         (unsigned long long)softverbs_fault_hits("dup_a"), (unsigned long long)softverbs_fault_hits("dup_b"),
         (unsigned long long)softverbs_fault_hits("reorder_a"), (unsigned long long)softverbs_fault_hits("reorder_b"),
         (unsigned long long)softverbs_fault_hits("delay_a"), (unsigned long long)softverbs_fault_hits("delay_b"),
         (unsigned long long)softverbs_fault_hits("ud_drop"), (unsigned long long)softverbs_fault_hits("ud_dup"),
         (unsigned long long)softverbs_fault_hits("ud_delay"));
  CHECK(ibv_destroy_ah(ah) == 0);
  CHECK(ibv_destroy_qp(ua.qp) == 0 && ibv_destroy_qp(ub.qp) == 0);
  CHECK(ibv_destroy_cq(ua.cq) == 0 && ibv_destroy_cq(ub.cq) == 0);
  close_side(&a);
  close_side(&b);
  ibv_free_device_list(list);
  return 0;
}

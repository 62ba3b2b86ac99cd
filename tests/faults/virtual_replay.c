/* A single-threaded workload under seeded packet faults, for the determinism of
 * virtual time (docs/simulation.md, "Determinism"): 120 operations (RDMA
 * WRITEs of 3 packets, SENDs, RDMA READs of 2 response packets) from emu0's QP
 * to emu1's, one at a time, under probabilistic drops, duplicates, reordering
 * and delays on both devices. It prints one line per completion (operation,
 * status, opcode, length, the device clock's nanoseconds at the completion) and
 * the fault and transport counters. Run twice with SOFTVERBS_CLOCK=virtual, the
 * same SOFTVERBS_FAULT_SEED and fixed device addresses, the output and the
 * capture (SOFTVERBS_PCAP) are identical (virtual_replay_test.cpp). Buffers are
 * registered at a fixed I/O virtual address so that the RETH's addresses repeat
 * too. */
#include <softverbs/faults.h>

#include "virtual_pair.h"

static const char kScenario[] =
    "[[rule]]\nname = \"drop\"\nprobability = 0.05\naction = \"drop\"\n"
    "[[rule]]\nname = \"dup\"\nprobability = 0.03\naction = \"duplicate\"\n"
    "[[rule]]\nname = \"reorder\"\nprobability = 0.03\naction = \"reorder\"\n"
    "[[rule]]\nname = \"delay\"\nprobability = 0.03\naction = \"delay\"\ndelay_us = 700\n";

static void post_recv(struct side* s) {
  struct ibv_sge sge = {kIova + 32768, 4096, s->mr->lkey}; /* SGEs use the region's I/O addresses */
  struct ibv_recv_wr wr, *bad = NULL;
  memset(&wr, 0, sizeof wr);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

/* Polls cq until one completion; bounded by a generous count of empty polls. */
static void wait_one(struct ibv_cq* cq, struct ibv_wc* wc) {
  long spins = 0;
  int got;
  while ((got = ibv_poll_cq(cq, 1, wc)) == 0) CHECK(++spins < 100000000L);
  CHECK(got == 1);
}

int main(void) {
  int n = 0, i;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct side a, b;
  char err[256] = "";
  struct softverbs_counters ca, cb;
  static const char* const kNames[] = {"write", "send", "read"};

  CHECK(list && n >= 2);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  open_side(list[0], &a);
  open_side(list[1], &b);
  connect_side(&a, &b, 10);
  connect_side(&b, &a, 10);
  if (softverbs_faults_load(kScenario, err, sizeof err) != 0) {
    fprintf(stderr, "scenario: %s\n", err);
    return 1;
  }
  for (i = 0; i < 8; ++i) post_recv(&b);
  for (i = 0; i < 120; ++i) {
    const int kind = i % 3;
    struct ibv_sge sge;
    struct ibv_send_wr wr, *bad = NULL;
    struct ibv_wc wc;
    memset(a.buf, i, 3000);
    memset(&sge, 0, sizeof sge);
    sge.addr = kIova;
    sge.length = kind == 0 ? 3000 : kind == 1 ? 100 : 2000;
    sge.lkey = a.mr->lkey;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = (uint64_t)i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = kind == 0 ? IBV_WR_RDMA_WRITE : kind == 1 ? IBV_WR_SEND : IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = kIova + 4096;
    wr.wr.rdma.rkey = b.mr->rkey;
    CHECK(ibv_post_send(a.qp, &wr, &bad) == 0);
    wait_one(a.cq, &wc);
    printf("%3d %-5s %s opcode %d len %u t %llu\n", i, kNames[kind], ibv_wc_status_str(wc.status), wc.opcode,
           wc.byte_len, (unsigned long long)device_ns(a.ctx));
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == (uint64_t)i);
    if (kind == 1) {
      wait_one(b.cq, &wc); /* the receive */
      CHECK(wc.status == IBV_WC_SUCCESS);
      post_recv(&b);
    }
  }
  CHECK(softverbs_device_counters("emu0", &ca, sizeof ca) == 0);
  CHECK(softverbs_device_counters("emu1", &cb, sizeof cb) == 0);
  printf("emu0 tx %llu rx %llu retransmits %llu timeouts %llu naks %llu\n", (unsigned long long)ca.tx_packets,
         (unsigned long long)ca.rx_packets, (unsigned long long)ca.retransmits, (unsigned long long)ca.timeouts,
         (unsigned long long)ca.naks_received);
  printf("emu1 tx %llu rx %llu duplicates %llu\n", (unsigned long long)cb.tx_packets,
         (unsigned long long)cb.rx_packets, (unsigned long long)cb.duplicates);
  printf("faults drop %llu dup %llu reorder %llu delay %llu\n", (unsigned long long)softverbs_fault_hits("drop"),
         (unsigned long long)softverbs_fault_hits("dup"), (unsigned long long)softverbs_fault_hits("reorder"),
         (unsigned long long)softverbs_fault_hits("delay"));
  close_side(&a);
  close_side(&b);
  ibv_free_device_list(list);
  return 0;
}

/* Retry exhaustion on virtual time, through the public API only (plain C,
 * libibverbs and softverbs' control API): two emulated devices of this process
 * (SOFTVERBS_DEVICES=2), an RC pair with retry_cnt 7 and timeout 14, a scenario
 * that drops every packet emu0 sends, one RDMA WRITE. Under
 * SOFTVERBS_CLOCK=virtual (set by the test's registration) the WRITE fails with
 * IBV_WC_RETRY_EXC_ERR after 8 local ACK timeouts (the first try and 7
 * retries) of 4.096 us * 2^14 each: 0.537 s of virtual time, measured with
 * ibv_query_rt_values_ex (the device's clock), taken in a few milliseconds of
 * wall time. The wall-time bound asserted is deliberately loose (2 s); the
 * measured figure is printed. Without SOFTVERBS_CLOCK=virtual the same run
 * takes the timeouts' real time (for comparison: docs/simulation.md). Exit
 * status 0 on success. */
#include <softverbs/faults.h>

#include "virtual_pair.h"

static const char kScenario[] =
    "[[rule]]\n"
    "name = \"emu0-tx\"\n"
    "device = \"emu0\"\n"
    "direction = \"tx\"\n"
    "action = \"drop\"\n";

static uint64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(void) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct side a, b;
  char err[256] = "";
  struct ibv_sge sge;
  struct ibv_send_wr wr, *bad = NULL;
  struct ibv_wc wc;
  uint64_t v0, v1, w0, w1, expected;
  int got;
  const char* clock = getenv("SOFTVERBS_CLOCK");
  const int virtual_clock = clock && strcmp(clock, "virtual") == 0;

  CHECK(list && n >= 2);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  open_side(list[0], &a);
  open_side(list[1], &b);
  CHECK(strcmp(ibv_get_device_name(list[0]), "emu0") == 0);
  connect_side(&a, &b, 14);
  connect_side(&b, &a, 14);
  if (softverbs_faults_load(kScenario, err, sizeof err) != 0) {
    fprintf(stderr, "scenario: %s\n", err);
    return 1;
  }

  memset(&sge, 0, sizeof sge);
  sge.addr = kIova; /* SGEs name the region by its I/O virtual address too */
  sge.length = 16;
  sge.lkey = a.mr->lkey;
  memset(&wr, 0, sizeof wr);
  wr.wr_id = 7;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = kIova;
  wr.wr.rdma.rkey = b.mr->rkey;

  v0 = device_ns(a.ctx);
  w0 = wall_ns();
  CHECK(ibv_post_send(a.qp, &wr, &bad) == 0);
  /* Bounded: under the virtual clock every empty poll moves time on. */
  do {
    got = ibv_poll_cq(a.cq, 1, &wc);
    CHECK(got >= 0);
  } while (got == 0 && wall_ns() - w0 < 10ull * 1000000000ull);
  w1 = wall_ns();
  v1 = device_ns(a.ctx);
  CHECK(got == 1);
  printf("status %s, virtual elapsed %.6f s, wall time %.3f ms, emu0-tx drops %llu\n",
         ibv_wc_status_str(wc.status), (double)(v1 - v0) / 1e9, (double)(w1 - w0) / 1e6,
         (unsigned long long)softverbs_fault_hits("emu0-tx"));
  CHECK(wc.status == IBV_WC_RETRY_EXC_ERR);
  CHECK(wc.wr_id == 7);
  CHECK(softverbs_fault_hits("emu0-tx") == 8);
  expected = 8ull * (4096ull << 14);
  if (!virtual_clock) {
    /* On real time (run so for comparison) the timeouts take at least as long. */
    CHECK(v1 - v0 >= expected);
  } else {
    /* 8 timeouts of 4.096 us * 2^14, exactly: nothing else moved the clock. */
    CHECK(v1 - v0 == expected);
    CHECK(w1 - w0 < 2ull * 1000000000ull);
  }

  close_side(&a);
  close_side(&b);
  ibv_free_device_list(list);
  return 0;
}

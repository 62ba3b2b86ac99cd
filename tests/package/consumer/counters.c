/* The control API from an installed softverbs, with a scenario loaded from the
 * environment (SOFTVERBS_FAULTS, set by softverbs_add_test's FAULTS): the named
 * devices exist with their link layers, the scenario's rule fails a receive
 * post, the control API counts the hit, and the device counters answer. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <softverbs/faults.h>
#include <stdio.h>
#include <string.h>

static int post_one_recv(struct ibv_context* ctx) {
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  struct ibv_cq* cq = pd ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL;
  struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* qp = cq ? ibv_create_qp(pd, &init) : NULL;
  struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT, .port_num = 1};
  if (qp && ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    qp = NULL;
  }
  static char buf[64];
  struct ibv_mr* mr = qp ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
  int rc = -1;
  if (mr) {
    struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad = NULL;
    rc = ibv_post_recv(qp, &wr, &bad);
    ibv_dereg_mr(mr);
  }
  if (qp) ibv_destroy_qp(qp);
  if (cq) ibv_destroy_cq(cq);
  if (pd) ibv_dealloc_pd(pd);
  return rc;
}

int main(void) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (!list || n != 2) return 1;
  int ok = strcmp(ibv_get_device_name(list[0]), "a") == 0 && strcmp(ibv_get_device_name(list[1]), "b") == 0;
  struct ibv_context* a = ibv_open_device(list[0]);
  struct ibv_context* b = ibv_open_device(list[1]);
  struct ibv_port_attr port;
  ok = ok && a && b && ibv_query_port(b, 1, &port) == 0 && port.link_layer == IBV_LINK_LAYER_INFINIBAND;
  int rc = a ? post_one_recv(a) : -1;
  if (rc != ENOMEM) printf("post_recv on a returned %d, expected ENOMEM\n", rc);
  ok = ok && rc == ENOMEM && softverbs_fault_hits("fail_recv") == 1;
  ok = ok && b && post_one_recv(b) == 0;  /* the rule names device a only */
  struct softverbs_counters c;
  memset(&c, 0, sizeof c);
  ok = ok && softverbs_device_counters("a", &c, sizeof c) == 0;
  if (a) ibv_close_device(a);
  if (b) ibv_close_device(b);
  ibv_free_device_list(list);
  printf("%s\n", ok ? "ok" : "failed");
  return ok ? 0 : 1;
}

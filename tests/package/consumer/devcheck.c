/* Passes only when the process sees exactly N devices (argv[1]), each with an
 * ACTIVE port 1: what a user's first test on emulated devices checks. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  int want = argc > 1 ? atoi(argv[1]) : 2;
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    perror("ibv_get_device_list");
    return 1;
  }
  int active = 0;
  for (int i = 0; i < n; i++) {
    struct ibv_context* ctx = ibv_open_device(list[i]);
    struct ibv_port_attr port;
    if (ctx && ibv_query_port(ctx, 1, &port) == 0 && port.state == IBV_PORT_ACTIVE) active++;
    if (ctx) ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  printf("%d devices, %d active\n", n, active);
  return n == want && active == want ? 0 : 1;
}

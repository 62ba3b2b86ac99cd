// cm_api_probe: a program linked against rdma-core's librdmacm (-lrdmacm, the
// distribution's at build time), as rdmacm-utils are. It makes the CM calls
// that are safe on any machine and prints one line per call:
//   library=PATH            the file whose rdma_create_event_channel it runs
//   NAME=RESULT ERRNO COUNT RESULT 0/-1, or 1 for a non-NULL pointer; ERRNO when
//                           it failed; COUNT where the call returns one
// Run directly it shows the real library's answers; run through
// `softverbs run` it shows softverbs' librdmacm.so.1's (tests/hw/cm_api_test.cpp).
#include <dlfcn.h>
#include <limits.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>

#include <cerrno>
#include <cstdio>

namespace {

// err is the errno of a failed call, 0 after a successful one.
void print(const char* name, long result, int err, int count = 0) {
  std::printf("%s=%ld %d %d\n", name, result, err, count);
}

}  // namespace

int main() {
  Dl_info info{};
  char path[PATH_MAX];
  if (dladdr(reinterpret_cast<void*>(&rdma_create_event_channel), &info) && info.dli_fname &&
      realpath(info.dli_fname, path))
    std::printf("library=%s\n", path);

  errno = 0;
  rdma_event_channel* ch = rdma_create_event_channel();
  print("create_event_channel", ch ? 1 : 0, ch ? 0 : errno);
  if (ch) rdma_destroy_event_channel(ch);

  rdma_cm_id* id = nullptr;
  errno = 0;
  int rc = rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP);
  print("create_id", rc, rc ? errno : 0);
  if (rc == 0) rdma_destroy_id(id);

  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  errno = 0;
  rc = rdma_getaddrinfo("127.0.0.1", "7471", &hints, &res);
  print("getaddrinfo", rc, rc ? errno : 0);
  if (rc == 0) rdma_freeaddrinfo(res);

  int num = -1;
  errno = 0;
  ibv_context** list = rdma_get_devices(&num);
  print("get_devices", list ? 1 : 0, list ? 0 : errno, num);
  if (list) rdma_free_devices(list);

  std::printf("event_str=%s\n", rdma_event_str(RDMA_CM_EVENT_ESTABLISHED));
  return 0;
}

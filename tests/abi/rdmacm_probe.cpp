// rdmacm_probe LIB: loads LIB (a soname or a path) with dlopen and prints the
// real paths of the files that define its rdma_create_event_channel and, in its
// dependencies, ibv_get_device_list: "rdmacm=PATH", "ibverbs=PATH", or
// "error=WHY". Used by tests/abi/rdmacm_export_test.cpp.
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdio>

namespace {

void print_origin(const char* key, void* sym) {
  Dl_info info{};
  char path[PATH_MAX];
  if (!sym || !dladdr(sym, &info) || !info.dli_fname || !realpath(info.dli_fname, path)) {
    std::printf("error=no %s\n", key);
    return;
  }
  std::printf("%s=%s\n", key, path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::printf("error=usage: rdmacm_probe LIB\n");
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::printf("error=%s\n", dlerror());
    return 1;
  }
  print_origin("rdmacm", dlsym(lib, "rdma_create_event_channel"));
  // A handle's lookup covers its dependencies: this is the libibverbs.so.1 the
  // loader chose for DT_NEEDED.
  print_origin("ibverbs", dlsym(lib, "ibv_get_device_list"));
  return 0;
}

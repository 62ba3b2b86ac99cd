// The hw provider's verbs that are more than a call to the real function (the
// rest are Forwarder's, hw/forward.cpp).
#include "hw/provider.hpp"

#include <cerrno>
#include <cstring>

#include "hw/context.hpp"
#include "hw/faults.hpp"
#include "hw/namespace.hpp"
#include "core/log.hpp"

namespace softverbs::hw {
namespace {

template <class T>
T* fail_null(int err) {
  errno = err;
  return nullptr;
}

}  // namespace

HwProvider& HwProvider::instance() {
  // Never destroyed: an atexit handler of the application may still release a
  // device list or close a context.
  static auto* provider = new HwProvider;
  return *provider;
}

// ---- devices ---------------------------------------------------------------

// A file under one of the real library's devices (its ibdev_path) is read by
// the real ibv_read_sysfs_file, which answers as a program linked against it
// would be answered: a kernel device's file, or what its provider serves (the
// live port counters of an emulated device behind the passthrough). Other
// directories are the next provider's.
int HwProvider::read_sysfs_attr(const char* dir, const char* file, std::string* value) {
  bool ours = false;
  {
    std::lock_guard lock(lists_mu_);
    for (const HeldList& held : lists_)
      for (ibv_device* d : held.devices) {
        const size_t n = std::strlen(d->ibdev_path);
        ours |= std::strncmp(dir, d->ibdev_path, n) == 0 && (dir[n] == '\0' || dir[n] == '/');
      }
  }
  Namespace* ns = ours ? Namespace::get() : nullptr;
  if (!ns) return ENODEV;
  char buf[4096];
  const int n = ns->call(ns->fn().read_sysfs_file, dir, file, buf, sizeof buf);
  if (n < 0) return errno ? errno : ENOENT;
  value->assign(buf, static_cast<size_t>(n));
  return 0;
}

std::vector<ibv_device*> HwProvider::get_devices() {
  KeepErrno keep;
  Namespace* ns = Namespace::get();
  if (!ns) return {};
  int num = 0;
  ibv_device** array = ns->call(ns->fn().get_device_list, &num);
  if (!array) {
    // rdma-core fails the list (ENOSYS) when the kernel has no RDMA support.
    std::call_once(logged_devices_,
                   [&] { SV_LOG(kDebug, "hw: %s lists no devices (%s)", ns->path().c_str(), std::strerror(errno)); });
    return {};
  }
  std::vector<ibv_device*> devices;
  for (int i = 0; array[i]; ++i) devices.push_back(array[i]);
  std::call_once(logged_devices_,
                 [&] { SV_LOG(kDebug, "hw: %s lists %zu device(s)", ns->path().c_str(), devices.size()); });
  if (devices.empty()) {
    ns->call(ns->fn().free_device_list, array);
    return {};
  }

  std::lock_guard lock(lists_mu_);
  for (HeldList& held : lists_) {
    if (held.devices == devices) {
      ++held.refs;
      ns->call(ns->fn().free_device_list, array);
      return devices;
    }
  }
  lists_.push_back(HeldList{array, devices, 1});
  return devices;
}

void HwProvider::release_devices(const std::vector<ibv_device*>& devices) {
  if (devices.empty()) return;
  ibv_device** array = nullptr;
  {
    std::lock_guard lock(lists_mu_);
    for (auto it = lists_.begin(); it != lists_.end(); ++it) {
      if (it->devices != devices) continue;
      if (--it->refs == 0) {
        array = it->array;
        lists_.erase(it);
      }
      break;
    }
  }
  // Only the real library may free its array (it came from the namespace's
  // malloc), and doing so drops its references on the devices.
  if (array) {
    KeepErrno keep;
    live().call(real().free_device_list, array);
  }
}

ibv_context* HwProvider::open_device(ibv_device* device) {
  start_fault_hooks();
  ibv_context* ctx = live().call(real().open_device, device);
  if (ctx) patch_context(ctx);
  return ctx;
}

ibv_context* HwProvider::import_device(int cmd_fd) {
  Namespace* ns = Namespace::get();
  if (!ns || !ns->fn().import_device) return fail_null<ibv_context>(EOPNOTSUPP);
  ibv_context* ctx = ns->call(ns->fn().import_device, cmd_fd);
  if (ctx) patch_context(ctx);
  return ctx;
}

int HwProvider::close_device(ibv_context* context) {
  SavedSlotsPtr saved = unpatch_context(context);
  int rc = live().call(real().close_device, context);
  if (rc != 0) {
    restore_context(context, std::move(saved));
  } else {
    forget_context(context);
  }
  return rc;
}

// ---- queries ---------------------------------------------------------------

int HwProvider::query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) {
  constexpr size_t kCompatSize = offsetof(ibv_port_attr, port_cap_flags2);
  // The exported IBVERBS_1.1 entry point is exactly the legacy-length query.
  if (attr_len == kCompatSize)
    return live().call(real().query_port, context, port_num, reinterpret_cast<_compat_ibv_port_attr*>(attr));
  // Any other length is what the context's own query_port slot takes (rdma-core's
  // __lib_query_port copies at most attr_len bytes).
  if (QueryPortFn fn = original_query_port(context)) return live().call(fn, context, port_num, attr, attr_len);
  if (attr_len < kCompatSize) return EINVAL;
  std::memset(attr, 0, attr_len);
  return live().call(real().query_port, context, port_num, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

// ---- async events and completion channels --------------------------------
// The channel and async fds are the real library's, so poll/epoll on them and
// blocking reads from other threads behave as with rdma-core.

int HwProvider::get_async_event(ibv_context* context, ibv_async_event* event) {
  // Events injected by the fault layer first; then the device's own, less those
  // an async event rule drops (acknowledged here, so destroy does not wait).
  for (;;) {
    if (take_injected_event(context, event)) return 0;
    int rc = live().call(real().get_async_event, context, event);
    if (rc != 0 || !drop_device_event(context, *event)) return rc;
    live().call(real().ack_async_event, event);
  }
}

void HwProvider::ack_async_event(ibv_async_event* event) {
  if (ack_injected_event(event)) return;
  live().call(real().ack_async_event, event);
}

// ---- memory --------------------------------------------------------------

ibv_mr* HwProvider::reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (real().reg_mr_iova2) return live().call(real().reg_mr_iova2, pd, addr, length, iova, access);
  // A library older than IBVERBS_1.8 can still register with iova == addr.
  if (iova != reinterpret_cast<uintptr_t>(addr)) return fail_null<ibv_mr>(EOPNOTSUPP);
  return live().call(real().reg_mr, pd, addr, length, static_cast<int>(access));
}

// ---- process-wide --------------------------------------------------------

int HwProvider::fork_init() {
  // Real devices DMA into the application's pages, so rdma-core's fork
  // protection matters here; it is usually asked for before the first device
  // list, which is why this may be what loads the library.
  Namespace* ns = Namespace::get();
  if (!ns) return 0;
  return ns->call(ns->fn().fork_init);
}

// ---- the control API -------------------------------------------------------

int HwProvider::qp_force_error(ibv_qp* qp) {
  // A real QP: moved to the error state through the passthrough, and the event
  // injected (a real device raises none for that).
  return force_qp_error(qp);
}

int HwProvider::raise_async_event(ibv_context* context, const ibv_async_event& event) {
  // Any port number: a real device's other contexts are not known, so the
  // event goes to this context only.
  inject_async_event(context, event);
  return 0;
}

}  // namespace softverbs::hw

softverbs::Provider& softverbs::hw_provider() { return hw::HwProvider::instance(); }

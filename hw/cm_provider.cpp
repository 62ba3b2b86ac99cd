#include "hw/cm_provider.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/env.hpp"
#include "core/log.hpp"
#include "hw/namespace.hpp"

#ifndef SV_HW_DEFAULT_LIBRDMACM
#define SV_HW_DEFAULT_LIBRDMACM "/usr/lib/x86_64-linux-gnu/librdmacm.so.1"
#endif

namespace softverbs::hw {
namespace {

// The one place the CM passthrough reads its configuration: the real
// librdmacm.so.1 (docs/configuration.md, SOFTVERBS_HW_LIBRDMACM).
std::string configured_librdmacm() {
  const char* env = env::hw_librdmacm();
  return env && *env ? env : SV_HW_DEFAULT_LIBRDMACM;
}

bool same_file(const char* a, const char* b) {
  struct stat sa {
  }, sb{};
  return ::stat(a, &sa) == 0 && ::stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace

HwCmProvider* HwCmProvider::get() {
  // Deliberately never deleted once loaded, as the namespace: ids and events
  // handed to the application stay valid until exit.
  static HwCmProvider* const provider = []() -> HwCmProvider* {
    KeepErrno keep;
    const std::string path = configured_librdmacm();
    if (path.front() != '/') {
      // As for libibverbs: a soname would be searched in LD_LIBRARY_PATH, where
      // softverbs' own librdmacm.so.1 is meant to come first.
      SV_LOG(kError, "SOFTVERBS_HW_LIBRDMACM=%s: not an absolute path; no hw CM provider", path.c_str());
      return nullptr;
    }
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      SV_LOG(kDebug, "hw: cannot use %s: %s; no hw CM provider", path.c_str(), std::strerror(errno));
      return nullptr;
    }
    // The real librdmacm must drive the real libibverbs, so it goes into that
    // library's namespace, and only there.
    Namespace* ns = Namespace::get();
    if (!ns) {
      SV_LOG(kDebug, "hw: cannot use %s: no real libibverbs.so.1 to load it beside; no hw CM provider", path.c_str());
      return nullptr;
    }
    std::string why;
    void* handle = ns->load_library(path, &why);
    if (!handle) {
      SV_LOG(kDebug, "hw: cannot use %s: %s; no hw CM provider", path.c_str(), why.c_str());
      return nullptr;
    }
    auto* cm = new HwCmProvider(*ns, path, handle);
    if (!cm->resolve(&why)) {
      SV_LOG(kDebug, "hw: cannot use %s: %s; no hw CM provider", path.c_str(), why.c_str());
      delete cm;
      dlclose(handle);
      return nullptr;
    }
    SV_LOG(kDebug, "hw: loaded %s beside %s", path.c_str(), ns->path().c_str());
    return cm;
  }();
  return provider;
}

bool HwCmProvider::resolve(std::string* why) {
  // dlvsym with the default version: the symbol a program linked against
  // rdma-core 44 binds to.
#define SV_HW_CM_RESOLVE(member, name, version, required, ...)                                    \
  fn_.member = reinterpret_cast<std::add_pointer_t<__VA_ARGS__>>(dlvsym(handle_, name, version)); \
  if (!fn_.member && (required)) {                                                                \
    *why = "no " name "@" version " in it (not rdma-core's librdmacm.so.1)";                      \
    return false;                                                                                 \
  }                                                                                               \
  if (!fn_.member) SV_LOG(kDebug, "hw: %s has no %s@%s; that call fails with ENOSYS", path_.c_str(), name, version);
  SV_HW_CM_FORWARDED(SV_HW_CM_RESOLVE)
#undef SV_HW_CM_RESOLVE

  // The functions must come from the file we were pointed at, not from
  // something it pulled in.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(fn_.create_event_channel), &info) && info.dli_fname &&
      !same_file(info.dli_fname, path_.c_str())) {
    *why = std::string("its rdma_create_event_channel comes from ") + info.dli_fname;
    return false;
  }
  // And it must use the namespace's libibverbs: its ids' contexts are then
  // devices the hw verbs provider lists. A librdmacm whose own dependency
  // resolved elsewhere would bring verbs objects nobody owns.
  void* its_list = dlvsym(handle_, "ibv_get_device_list", "IBVERBS_1.1");
  if (its_list != reinterpret_cast<void*>(ns_.fn().get_device_list)) {
    *why = "its libibverbs.so.1 is not " + ns_.path();
    return false;
  }
  return true;
}

template <class R, class... P, class... A>
R HwCmProvider::forward(R (*fn)(P...), A... args) {
  if (!fn) {
    // Only the optional (post-RDMACM_1.0) functions can be missing; none of
    // them returns void.
    errno = ENOSYS;
    if constexpr (std::is_pointer_v<R>) {
      return nullptr;
    } else if constexpr (!std::is_void_v<R>) {
      return -1;
    } else {
      return;
    }
  }
  return ns_.call(fn, args...);
}

// ---- event channels ----------------------------------------------------------
// The channel fd is the real /dev/infiniband/rdma_cm file: the application
// polls it as with rdma-core.

rdma_event_channel* HwCmProvider::create_event_channel() { return forward(fn_.create_event_channel); }

void HwCmProvider::destroy_event_channel(rdma_event_channel* channel) { forward(fn_.destroy_event_channel, channel); }

int HwCmProvider::get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  return forward(fn_.get_cm_event, channel, event);
}

int HwCmProvider::ack_cm_event(rdma_cm_event* event) { return forward(fn_.ack_cm_event, event); }

// ---- ids and endpoints ---------------------------------------------------------

int HwCmProvider::create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  return forward(fn_.create_id, channel, id, context, ps);
}

int HwCmProvider::destroy_id(rdma_cm_id* id) { return forward(fn_.destroy_id, id); }

int HwCmProvider::create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  return forward(fn_.create_ep, id, res, pd, qp_init_attr);
}

void HwCmProvider::destroy_ep(rdma_cm_id* id) { forward(fn_.destroy_ep, id); }

int HwCmProvider::migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  return forward(fn_.migrate_id, id, channel);
}

int HwCmProvider::set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  return forward(fn_.set_option, id, level, optname, optval, optlen);
}

// ---- addresses and routes --------------------------------------------------------

int HwCmProvider::bind_addr(rdma_cm_id* id, sockaddr* addr) { return forward(fn_.bind_addr, id, addr); }

int HwCmProvider::resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  return forward(fn_.resolve_addr, id, src_addr, dst_addr, timeout_ms);
}

int HwCmProvider::resolve_route(rdma_cm_id* id, int timeout_ms) { return forward(fn_.resolve_route, id, timeout_ms); }

int HwCmProvider::getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  return forward(fn_.getaddrinfo, node, service, hints, res);
}

// The list comes from the namespace's malloc: only the real library frees it.
void HwCmProvider::freeaddrinfo(rdma_addrinfo* res) { forward(fn_.freeaddrinfo, res); }

// ---- connections -----------------------------------------------------------------

int HwCmProvider::listen(rdma_cm_id* id, int backlog) { return forward(fn_.listen, id, backlog); }

int HwCmProvider::get_request(rdma_cm_id* listen, rdma_cm_id** id) { return forward(fn_.get_request, listen, id); }

int HwCmProvider::connect(rdma_cm_id* id, rdma_conn_param* conn_param) { return forward(fn_.connect, id, conn_param); }

int HwCmProvider::accept(rdma_cm_id* id, rdma_conn_param* conn_param) { return forward(fn_.accept, id, conn_param); }

int HwCmProvider::reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return forward(fn_.reject, id, private_data, private_data_len);
}

int HwCmProvider::reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return forward(fn_.reject_ece, id, private_data, private_data_len);
}

int HwCmProvider::establish(rdma_cm_id* id) { return forward(fn_.establish, id); }

int HwCmProvider::notify(rdma_cm_id* id, ibv_event_type event) { return forward(fn_.notify, id, event); }

int HwCmProvider::disconnect(rdma_cm_id* id) { return forward(fn_.disconnect, id); }

int HwCmProvider::set_local_ece(rdma_cm_id* id, ibv_ece* ece) { return forward(fn_.set_local_ece, id, ece); }

int HwCmProvider::get_remote_ece(rdma_cm_id* id, ibv_ece* ece) { return forward(fn_.get_remote_ece, id, ece); }

// ---- QPs and SRQs on an id -----------------------------------------------------

int HwCmProvider::init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  return forward(fn_.init_qp_attr, id, qp_attr, qp_attr_mask);
}

int HwCmProvider::create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* qp_init_attr) {
  return forward(fn_.create_qp_ex, id, qp_init_attr);
}

void HwCmProvider::destroy_qp(rdma_cm_id* id) { forward(fn_.destroy_qp, id); }

int HwCmProvider::create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  return forward(fn_.create_srq_ex, id, attr);
}

void HwCmProvider::destroy_srq(rdma_cm_id* id) { forward(fn_.destroy_srq, id); }

// ---- multicast -------------------------------------------------------------------

int HwCmProvider::join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr, void* context) {
  return forward(fn_.join_multicast_ex, id, mc_join_attr, context);
}

int HwCmProvider::leave_multicast(rdma_cm_id* id, sockaddr* addr) { return forward(fn_.leave_multicast, id, addr); }

// ---- devices -----------------------------------------------------------------------
// The contexts are the ones the real librdmacm opened on the real devices;
// the array is the namespace's and goes back to the real rdma_free_devices.

ibv_context** HwCmProvider::get_devices(int* num_devices) { return forward(fn_.get_devices, num_devices); }

void HwCmProvider::free_devices(ibv_context** list) { forward(fn_.free_devices, list); }

}  // namespace softverbs::hw

softverbs::CmProvider* softverbs::hw_cm_provider() { return hw::HwCmProvider::get(); }

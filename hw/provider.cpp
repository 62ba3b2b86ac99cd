#include "hw/provider.hpp"

#include <cerrno>
#include <cstring>

#include "hw/context.hpp"
#include "hw/faults.hpp"
#include "hw/namespace.hpp"
#include "core/log.hpp"

namespace softverbs::hw {
namespace {

// The namespace behind every object this provider returned. Objects exist only
// once the library is loaded, so for any verb on them it is there.
Namespace& live() { return *Namespace::current(); }
const RealFunctions& real() { return live().fn(); }

template <class T>
T* fail_null(int err) {
  errno = err;
  return nullptr;
}

// Keeps the caller's errno across an internal call whose own errno nobody asked
// for (listing devices to answer an ownership question, say).
class KeepErrno {
 public:
  KeepErrno() noexcept : saved_(errno) {}
  ~KeepErrno() { errno = saved_; }

 private:
  int saved_;
};

}  // namespace

HwProvider& HwProvider::instance() {
  // Never destroyed: an atexit handler of the application may still release a
  // device list or close a context.
  static auto* provider = new HwProvider;
  return *provider;
}

// ---- devices ---------------------------------------------------------------

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

__be64 HwProvider::get_device_guid(ibv_device* device) { return live().call(real().get_device_guid, device); }

int HwProvider::get_device_index(ibv_device* device) {
  if (!real().get_device_index) {
    errno = EOPNOTSUPP;
    return -1;
  }
  return live().call(real().get_device_index, device);
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

int HwProvider::query_device(ibv_context* context, ibv_device_attr* attr) {
  return live().call(real().query_device, context, attr);
}

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

int HwProvider::query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) {
  return live().call(real().query_gid, context, port_num, index, gid);
}

int HwProvider::query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                             uint32_t flags, size_t entry_size) {
  if (!real().query_gid_ex) return EOPNOTSUPP;
  return live().call(real().query_gid_ex, context, port_num, gid_index, entry, flags, entry_size);
}

ssize_t HwProvider::query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                                    size_t entry_size) {
  if (!real().query_gid_table) return -EOPNOTSUPP;
  return live().call(real().query_gid_table, context, entries, max_entries, flags, entry_size);
}

int HwProvider::query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, ibv_gid_type_sysfs* type) {
  if (real().query_gid_type) return live().call(real().query_gid_type, context, port_num, index, type);
  // ibv_query_gid_type lives in the private node, whose version follows the
  // provider ABI (IBVERBS_PRIVATE_34 in rdma-core 44). A real library of another
  // ABI still answers through the public _ibv_query_gid_ex, which is what
  // rdma-core's own implementation uses.
  if (!real().query_gid_ex) {
    errno = EOPNOTSUPP;
    return -1;
  }
  ibv_gid_entry entry{};
  int ret = live().call(real().query_gid_ex, context, port_num, index, &entry, 0u, sizeof entry);
  if (ret == ENODATA) {
    *type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1;  // rdma-core's answer for an empty GID
    return 0;
  }
  if (ret) {
    errno = ret;
    return -1;
  }
  *type = entry.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
  return 0;
}

int HwProvider::query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  return live().call(real().query_pkey, context, port_num, index, pkey);
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

ibv_comp_channel* HwProvider::create_comp_channel(ibv_context* context) {
  return live().call(real().create_comp_channel, context);
}

int HwProvider::destroy_comp_channel(ibv_comp_channel* channel) {
  return live().call(real().destroy_comp_channel, channel);
}

int HwProvider::get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  return live().call(real().get_cq_event, channel, cq, cq_context);
}

void HwProvider::ack_cq_events(ibv_cq* cq, unsigned int nevents) { live().call(real().ack_cq_events, cq, nevents); }

// ---- protection domains and memory ---------------------------------------

ibv_pd* HwProvider::alloc_pd(ibv_context* context) { return live().call(real().alloc_pd, context); }

int HwProvider::dealloc_pd(ibv_pd* pd) { return live().call(real().dealloc_pd, pd); }

ibv_pd* HwProvider::import_pd(ibv_context* context, uint32_t pd_handle) {
  if (!real().import_pd) return fail_null<ibv_pd>(EOPNOTSUPP);
  return live().call(real().import_pd, context, pd_handle);
}

void HwProvider::unimport_pd(ibv_pd* pd) {
  if (real().unimport_pd) live().call(real().unimport_pd, pd);
}

ibv_mr* HwProvider::reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  if (real().reg_mr_iova2) return live().call(real().reg_mr_iova2, pd, addr, length, iova, access);
  // A library older than IBVERBS_1.8 can still register with iova == addr.
  if (iova != reinterpret_cast<uintptr_t>(addr)) return fail_null<ibv_mr>(EOPNOTSUPP);
  return live().call(real().reg_mr, pd, addr, length, static_cast<int>(access));
}

ibv_mr* HwProvider::reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
  if (!real().reg_dmabuf_mr) return fail_null<ibv_mr>(EOPNOTSUPP);
  return live().call(real().reg_dmabuf_mr, pd, offset, length, iova, fd, access);
}

int HwProvider::rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  return live().call(real().rereg_mr, mr, flags, pd, addr, length, access);
}

int HwProvider::dereg_mr(ibv_mr* mr) { return live().call(real().dereg_mr, mr); }

ibv_mr* HwProvider::import_mr(ibv_pd* pd, uint32_t mr_handle) {
  if (!real().import_mr) return fail_null<ibv_mr>(EOPNOTSUPP);
  return live().call(real().import_mr, pd, mr_handle);
}

void HwProvider::unimport_mr(ibv_mr* mr) {
  if (real().unimport_mr) live().call(real().unimport_mr, mr);
}

ibv_dm* HwProvider::import_dm(ibv_context* context, uint32_t dm_handle) {
  if (!real().import_dm) return fail_null<ibv_dm>(EOPNOTSUPP);
  return live().call(real().import_dm, context, dm_handle);
}

void HwProvider::unimport_dm(ibv_dm* dm) {
  if (real().unimport_dm) live().call(real().unimport_dm, dm);
}

// ---- completion queues ---------------------------------------------------

ibv_cq* HwProvider::create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                              int comp_vector) {
  return live().call(real().create_cq, context, cqe, cq_context, channel, comp_vector);
}

int HwProvider::resize_cq(ibv_cq* cq, int cqe) { return live().call(real().resize_cq, cq, cqe); }

int HwProvider::destroy_cq(ibv_cq* cq) { return live().call(real().destroy_cq, cq); }

// ---- shared receive queues -----------------------------------------------

ibv_srq* HwProvider::create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  return live().call(real().create_srq, pd, attr);
}

int HwProvider::modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask) {
  return live().call(real().modify_srq, srq, attr, attr_mask);
}

int HwProvider::query_srq(ibv_srq* srq, ibv_srq_attr* attr) { return live().call(real().query_srq, srq, attr); }

int HwProvider::destroy_srq(ibv_srq* srq) { return live().call(real().destroy_srq, srq); }

// ---- queue pairs ---------------------------------------------------------

ibv_qp* HwProvider::create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) { return live().call(real().create_qp, pd, attr); }

int HwProvider::modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  return live().call(real().modify_qp, qp, attr, attr_mask);
}

int HwProvider::query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  return live().call(real().query_qp, qp, attr, attr_mask, init_attr);
}

int HwProvider::destroy_qp(ibv_qp* qp) { return live().call(real().destroy_qp, qp); }

ibv_qp_ex* HwProvider::qp_to_qp_ex(ibv_qp* qp) {
  if (!real().qp_to_qp_ex) return nullptr;
  return live().call(real().qp_to_qp_ex, qp);
}

int HwProvider::query_ece(ibv_qp* qp, ibv_ece* ece) {
  if (!real().query_ece) return EOPNOTSUPP;
  return live().call(real().query_ece, qp, ece);
}

int HwProvider::set_ece(ibv_qp* qp, ibv_ece* ece) {
  if (!real().set_ece) return EOPNOTSUPP;
  return live().call(real().set_ece, qp, ece);
}

int HwProvider::query_qp_data_in_order(ibv_qp* qp, ibv_wr_opcode op, uint32_t flags) {
  if (!real().query_qp_data_in_order) return 0;  // rdma-core's answer when the provider cannot tell
  return live().call(real().query_qp_data_in_order, qp, op, flags);
}

int HwProvider::attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  return live().call(real().attach_mcast, qp, gid, lid);
}

int HwProvider::detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  return live().call(real().detach_mcast, qp, gid, lid);
}

// ---- address handles -----------------------------------------------------

ibv_ah* HwProvider::create_ah(ibv_pd* pd, ibv_ah_attr* attr) { return live().call(real().create_ah, pd, attr); }

int HwProvider::destroy_ah(ibv_ah* ah) { return live().call(real().destroy_ah, ah); }

int HwProvider::init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                ibv_ah_attr* ah_attr) {
  return live().call(real().init_ah_from_wc, context, port_num, wc, grh, ah_attr);
}

int HwProvider::resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr, uint8_t eth_mac[6], uint16_t* vid) {
  return live().call(real().resolve_eth_l2_from_gid, context, attr, eth_mac, vid);
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

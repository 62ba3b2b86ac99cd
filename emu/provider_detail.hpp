// What the control verbs of the emulated provider share (emu/provider.cpp,
// emu/provider_qp.cpp): the kernel's object lookups and errno conventions.
#pragma once

#include <infiniband/verbs.h>
#include <pthread.h>

#include <cerrno>
#include <cstdint>

#include "emu/device/caps.hpp"
#include "emu/objects/objects.hpp"

namespace softverbs::emu::provider_detail {

inline bool port_ok(uint32_t port) { return port >= 1 && port <= caps::kPhysPortCnt; }

// A refusal the kernel makes: rdma-core returns the command's errno and leaves it
// in errno too (execute_ioctl returns errno after the failed ioctl), so callers
// that read errno after a destroy see it.
inline int kernel_error(int err) {
  errno = err;
  return err;
}

// Access flags rules of the verbs spec (and the kernel's ib_check_mr_access):
// remote write and remote atomic need local write.
// After a fatal error (the fault layer's device_fatal) the device takes no new
// work: creating resources and changing QPs fail with EIO, as commands to a
// failed ConnectX do; destroying and querying still work.
inline bool failed(ibv_context* context) { return Context::from(context)->device().fatal(); }

// The kernel's lookup of the object a command names by its number
// (HandleTable::check): 0, ENOENT or EINVAL. Commands that name objects through
// ioctl attributes (every destroy, create_qp, create_srq, rereg_mr in rdma-core 44)
// return that errno; the older write commands (reg_mr, modify_qp, query_qp,
// resize_cq, modify_srq, query_srq, create_ah, attach_mcast, detach_mcast) turn
// any failure into EINVAL (uobj_get_obj_read gives NULL).
inline int lookup(ibv_context* context, ObjectType type, const void* pub, uint32_t handle) {
  return Context::from(context)->handles.check(type, pub, handle);
}
inline int lookup_write(ibv_context* context, ObjectType type, const void* pub, uint32_t handle) {
  return lookup(context, type, pub, handle) ? EINVAL : 0;
}

inline int check_access(unsigned access) {
  if (access & ~(caps::kSupportedAccess | IBV_ACCESS_MW_BIND)) return EINVAL;  // ZERO_BASED, HUGETLB, undefined
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  return 0;
}

// Waits until every async event reported on an object has been acknowledged, as
// rdma-core's destroy functions do.
inline void wait_events_acked(pthread_mutex_t* mutex, pthread_cond_t* cond, const uint32_t* completed,
                       const uint32_t* reported) {
  pthread_mutex_lock(mutex);
  while (*completed != *reported) pthread_cond_wait(cond, mutex);
  pthread_mutex_unlock(mutex);
}

inline int check_ah_attr(Context& ctx, const ibv_ah_attr& attr) {
  Device& dev = ctx.device();
  if (!port_ok(attr.port_num)) return EINVAL;
  if (attr.static_rate > IBV_RATE_1200_GBPS || attr.static_rate == 1) return EINVAL;  // as modify_qp
  if (dev.link_layer() == LinkLayer::kEthernet) {
    // RoCE addresses by GID: an address vector without a GRH cannot be resolved.
    if (!attr.is_global) return EINVAL;
  } else if (!attr.is_global && (attr.dlid == 0 || attr.dlid >= 0xc000)) {
    return EINVAL;  // only unicast LIDs (multicast needs a GRH)
  }
  if (attr.is_global && attr.grh.sgid_index >= static_cast<uint32_t>(dev.gid_count())) return EINVAL;
  return 0;
}

}  // namespace softverbs::emu::provider_detail

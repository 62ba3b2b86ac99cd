// The provider-dispatched exports of librdmacm.so.1 (core/cm_provider.hpp):
// each finds the provider that owns its channel, id, event, address list or
// device array and forwards; calls that name no object ask the providers in
// order (dispatch.hpp). Around the call, the argument checks librdmacm 44 makes
// in the library itself (librdmacm/cma.c, addrinfo.c), so every provider gets
// the same answers for them; where rdma-core would follow a NULL or foreign
// pointer, EINVAL instead.
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

#include "abi/rdmacm/dispatch.hpp"

using softverbs::CmProvider;
using softverbs::abi::guarded;
namespace cm = softverbs::abi::cm;

namespace {

int fail(int err) {
  errno = err;
  return -1;
}

// Entries librdmacm begins with its device scan (ucma_init): without any CM
// they fail with ENODEV before looking at their arguments.
bool no_cm() {
  if (!cm::providers().empty()) return false;
  errno = ENODEV;
  return true;
}

// The arrays handed out by rdma_get_devices, with each provider's own array.
std::mutex g_devices_mu;
std::unordered_map<ibv_context**, std::vector<std::pair<CmProvider*, ibv_context**>>>& device_arrays() {
  static auto* map = new std::unordered_map<ibv_context**, std::vector<std::pair<CmProvider*, ibv_context**>>>;
  return *map;
}

}  // namespace

// The owner of obj as `p`, or the exported function fails with EINVAL.
#define SV_CM_OWNER_OR(obj, ret) \
  CmProvider* p = cm::owner(obj); \
  if (!p) {                       \
    errno = EINVAL;               \
    return ret;                   \
  }

// Forwards a method on an id that returns 0 or -1 with errno.
#define SV_CM_ON_ID(id, call)                \
  return guarded(-1, [&]() -> int {          \
    SV_CM_OWNER_OR(id, -1);                  \
    return p->call;                          \
  })

// ---- event channels ------------------------------------------------------------

SV_EXPORT struct rdma_event_channel* rdma_create_event_channel(void) {
  return guarded(static_cast<rdma_event_channel*>(nullptr), [&]() -> rdma_event_channel* {
    rdma_event_channel* channel = nullptr;
    CmProvider* p = nullptr;
    auto create = [&](CmProvider* c) {
      channel = c->create_event_channel();
      return channel ? 0 : -1;
    };
    if (cm::first_cm(create, &p) != 0) return nullptr;
    cm::note(p, channel);
    return channel;
  });
}

SV_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel* channel) {
  cm::guarded_void([&] {
    CmProvider* p = cm::owner(channel);
    if (!p) return;  // not ours: rdma-core would close and free whatever it points at
    cm::forget(channel);
    p->destroy_event_channel(channel);
  });
}

SV_EXPORT int rdma_get_cm_event(struct rdma_event_channel* channel, struct rdma_cm_event** event) {
  return guarded(-1, [&]() -> int {
    if (no_cm()) return -1;
    if (!event) return fail(EINVAL);
    SV_CM_OWNER_OR(channel, -1);
    const int rc = p->get_cm_event(channel, event);
    // A CONNECT_REQUEST brings a new id: from now on it is this provider's.
    if (rc == 0) cm::note(p, *event);
    return rc;
  });
}

SV_EXPORT int rdma_ack_cm_event(struct rdma_cm_event* event) {
  return guarded(-1, [&]() -> int {
    if (!event) return fail(EINVAL);
    SV_CM_OWNER_OR(event, -1);
    // Forgotten first: once acknowledged, its memory may come back as another
    // event, perhaps on another thread.
    cm::forget(event);
    const int rc = p->ack_cm_event(event);
    if (rc != 0) cm::note(p, event);
    return rc;
  });
}

// ---- ids and endpoints -------------------------------------------------------------

SV_EXPORT int rdma_create_id(struct rdma_event_channel* channel, struct rdma_cm_id** id, void* context,
                             enum rdma_port_space ps) {
  return guarded(-1, [&]() -> int {
    if (no_cm()) return -1;
    if (!id) return fail(EINVAL);
    CmProvider* p = nullptr;
    int rc;
    if (channel) {
      // An id lives on its channel's provider.
      p = cm::owner(channel);
      if (!p) return fail(EINVAL);
      rc = p->create_id(channel, id, context, ps);
    } else {
      rc = cm::first_cm([&](CmProvider* c) { return c->create_id(nullptr, id, context, ps); }, &p);
    }
    if (rc == 0) cm::note(p, *id);
    return rc;
  });
}

SV_EXPORT int rdma_destroy_id(struct rdma_cm_id* id) {
  return guarded(-1, [&]() -> int {
    SV_CM_OWNER_OR(id, -1);
    cm::forget(id);
    const int rc = p->destroy_id(id);
    if (rc != 0) cm::note(p, id);
    return rc;
  });
}

SV_EXPORT int rdma_create_ep(struct rdma_cm_id** id, struct rdma_addrinfo* res, struct ibv_pd* pd,
                             struct ibv_qp_init_attr* qp_init_attr) {
  return guarded(-1, [&]() -> int {
    if (no_cm()) return -1;
    if (!id || !res) return fail(EINVAL);
    // A list from rdma_getaddrinfo goes back to its provider; one the
    // application filled in itself to whichever CM takes it.
    CmProvider* p = cm::owner(res);
    int rc;
    if (p)
      rc = p->create_ep(id, res, pd, qp_init_attr);
    else
      rc = cm::first_cm([&](CmProvider* c) { return c->create_ep(id, res, pd, qp_init_attr); }, &p);
    if (rc == 0) cm::note(p, *id);
    return rc;
  });
}

SV_EXPORT void rdma_destroy_ep(struct rdma_cm_id* id) {
  cm::guarded_void([&] {
    CmProvider* p = cm::owner(id);
    if (!p) return;
    cm::forget(id);
    p->destroy_ep(id);
  });
}

SV_EXPORT int rdma_migrate_id(struct rdma_cm_id* id, struct rdma_event_channel* channel) {
  return guarded(-1, [&]() -> int {
    SV_CM_OWNER_OR(id, -1);
    // Ids never move between providers: the new channel must be the id's
    // provider's (NULL: the provider makes a private one).
    if (channel && cm::owner(channel) != p) return fail(EINVAL);
    const int rc = p->migrate_id(id, channel);
    if (rc == 0) cm::note(p, id);
    return rc;
  });
}

SV_EXPORT int rdma_set_option(struct rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  SV_CM_ON_ID(id, set_option(id, level, optname, optval, optlen));
}

// ---- addresses and routes ----------------------------------------------------------

SV_EXPORT int rdma_bind_addr(struct rdma_cm_id* id, struct sockaddr* addr) {
  return guarded(-1, [&]() -> int {
    if (!cm::addrlen(addr)) return fail(EINVAL);
    SV_CM_OWNER_OR(id, -1);
    return p->bind_addr(id, addr);
  });
}

SV_EXPORT int rdma_resolve_addr(struct rdma_cm_id* id, struct sockaddr* src_addr, struct sockaddr* dst_addr,
                                int timeout_ms) {
  return guarded(-1, [&]() -> int {
    if (!cm::addrlen(dst_addr)) return fail(EINVAL);
    if (src_addr && !cm::addrlen(src_addr)) return fail(EINVAL);
    SV_CM_OWNER_OR(id, -1);
    return p->resolve_addr(id, src_addr, dst_addr, timeout_ms);
  });
}

SV_EXPORT int rdma_resolve_route(struct rdma_cm_id* id, int timeout_ms) {
  SV_CM_ON_ID(id, resolve_route(id, timeout_ms));
}

SV_EXPORT int rdma_getaddrinfo(const char* node, const char* service, const struct rdma_addrinfo* hints,
                               struct rdma_addrinfo** res) {
  return guarded(-1, [&]() -> int {
    // The order of rdma-core's addrinfo.c: nothing to resolve, then the CM.
    if (!node && !service && !hints) return fail(EINVAL);
    if (no_cm()) return -1;
    if (!res) return fail(EINVAL);
    CmProvider* p = nullptr;
    const int rc = cm::first_cm([&](CmProvider* c) { return c->getaddrinfo(node, service, hints, res); }, &p);
    if (rc == 0) cm::note(p, *res);
    return rc;
  });
}

SV_EXPORT void rdma_freeaddrinfo(struct rdma_addrinfo* res) {
  // The list comes from its provider's allocator (the hw backend's is the
  // real library's libc): only that provider frees it. A list we did not make
  // is left alone.
  cm::guarded_void([&] {
    CmProvider* p = cm::owner(res);
    if (!p) return;
    cm::forget(res);
    p->freeaddrinfo(res);
  });
}

// ---- connections ---------------------------------------------------------------------

SV_EXPORT int rdma_listen(struct rdma_cm_id* id, int backlog) { SV_CM_ON_ID(id, listen(id, backlog)); }

SV_EXPORT int rdma_get_request(struct rdma_cm_id* listen, struct rdma_cm_id** id) {
  return guarded(-1, [&]() -> int {
    SV_CM_OWNER_OR(listen, -1);
    if (!id) return fail(EINVAL);
    const int rc = p->get_request(listen, id);
    if (rc == 0) cm::note(p, *id);
    return rc;
  });
}

SV_EXPORT int rdma_connect(struct rdma_cm_id* id, struct rdma_conn_param* conn_param) {
  SV_CM_ON_ID(id, connect(id, conn_param));
}

SV_EXPORT int rdma_accept(struct rdma_cm_id* id, struct rdma_conn_param* conn_param) {
  SV_CM_ON_ID(id, accept(id, conn_param));
}

SV_EXPORT int rdma_reject(struct rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  SV_CM_ON_ID(id, reject(id, private_data, private_data_len));
}

SV_EXPORT int rdma_reject_ece(struct rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  SV_CM_ON_ID(id, reject_ece(id, private_data, private_data_len));
}

SV_EXPORT int rdma_establish(struct rdma_cm_id* id) {
  return guarded(-1, [&]() -> int {
    SV_CM_OWNER_OR(id, -1);
    // cma.c: only for an id whose QP the application manages itself.
    if (id->qp) return fail(EINVAL);
    return p->establish(id);
  });
}

SV_EXPORT int rdma_notify(struct rdma_cm_id* id, enum ibv_event_type event) { SV_CM_ON_ID(id, notify(id, event)); }

SV_EXPORT int rdma_disconnect(struct rdma_cm_id* id) { SV_CM_ON_ID(id, disconnect(id)); }

// cma.c checks the ECE arguments before anything else, the id included.
SV_EXPORT int rdma_set_local_ece(struct rdma_cm_id* id, struct ibv_ece* ece) {
  return guarded(-1, [&]() -> int {
    if (!id || !ece || !ece->vendor_id || ece->comp_mask) return fail(EINVAL);
    SV_CM_OWNER_OR(id, -1);
    if (id->qp) return fail(EINVAL);
    return p->set_local_ece(id, ece);
  });
}

SV_EXPORT int rdma_get_remote_ece(struct rdma_cm_id* id, struct ibv_ece* ece) {
  return guarded(-1, [&]() -> int {
    if (!id || !ece) return fail(EINVAL);
    SV_CM_OWNER_OR(id, -1);
    if (id->qp) return fail(EINVAL);
    return p->get_remote_ece(id, ece);
  });
}

// ---- QPs and SRQs on an id -------------------------------------------------------------

SV_EXPORT int rdma_init_qp_attr(struct rdma_cm_id* id, struct ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  return guarded(-1, [&]() -> int {
    SV_CM_OWNER_OR(id, -1);
    if (!qp_attr || !qp_attr_mask) return fail(EINVAL);
    return p->init_qp_attr(id, qp_attr, qp_attr_mask);
  });
}

SV_EXPORT int rdma_create_qp_ex(struct rdma_cm_id* id, struct ibv_qp_init_attr_ex* qp_init_attr) {
  return guarded(-1, [&]() -> int {
    SV_CM_OWNER_OR(id, -1);
    // cma.c: one QP per id.
    if (id->qp || !qp_init_attr) return fail(EINVAL);
    return p->create_qp_ex(id, qp_init_attr);
  });
}

SV_EXPORT void rdma_destroy_qp(struct rdma_cm_id* id) {
  cm::guarded_void([&] {
    if (CmProvider* p = cm::owner(id)) p->destroy_qp(id);
  });
}

SV_EXPORT int rdma_create_srq_ex(struct rdma_cm_id* id, struct ibv_srq_init_attr_ex* attr) {
  return guarded(-1, [&]() -> int {
    SV_CM_OWNER_OR(id, -1);
    // cma.c: the SRQ type must be given.
    if (!attr || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE)) return fail(EINVAL);
    return p->create_srq_ex(id, attr);
  });
}

SV_EXPORT void rdma_destroy_srq(struct rdma_cm_id* id) {
  cm::guarded_void([&] {
    if (CmProvider* p = cm::owner(id)) p->destroy_srq(id);
  });
}

// ---- multicast -------------------------------------------------------------------------

SV_EXPORT int rdma_join_multicast_ex(struct rdma_cm_id* id, struct rdma_cm_join_mc_attr_ex* mc_join_attr,
                                     void* context) {
  return guarded(-1, [&]() -> int {
    // cma.c's order: unknown attribute bits, no address, no or unknown join flags.
    if (!mc_join_attr) return fail(EINVAL);
    if (mc_join_attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED) return fail(ENOTSUP);
    if (!(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS)) return fail(EINVAL);
    if (!(mc_join_attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) ||
        mc_join_attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
      return fail(EINVAL);
    if (!cm::addrlen(mc_join_attr->addr)) return fail(EINVAL);
    SV_CM_OWNER_OR(id, -1);
    return p->join_multicast_ex(id, mc_join_attr, context);
  });
}

SV_EXPORT int rdma_leave_multicast(struct rdma_cm_id* id, struct sockaddr* addr) {
  return guarded(-1, [&]() -> int {
    if (!cm::addrlen(addr)) return fail(EINVAL);
    SV_CM_OWNER_OR(id, -1);
    return p->leave_multicast(id, addr);
  });
}

// ---- devices ----------------------------------------------------------------------------
// One array for the application, made of each provider's array (as
// ibv_get_device_list merges the verbs providers' lists); rdma_free_devices
// hands each part back to its provider.

SV_EXPORT struct ibv_context** rdma_get_devices(int* num_devices) {
  if (num_devices) *num_devices = 0;
  return guarded(static_cast<ibv_context**>(nullptr), [&]() -> ibv_context** {
    std::vector<std::pair<CmProvider*, ibv_context**>> parts;
    std::vector<ibv_context*> all;
    int err = ENODEV;
    auto release = [&] {
      for (auto& [p, list] : parts) p->free_devices(list);
    };
    try {
      for (CmProvider* p : cm::providers()) {
        int n = 0;
        ibv_context** list = p->get_devices(&n);
        if (!list) {
          if (errno != ENODEV) err = errno;
          continue;
        }
        parts.emplace_back(p, list);
        for (int i = 0; list[i]; ++i) all.push_back(list[i]);
      }
      if (parts.empty()) {
        errno = err;
        return nullptr;
      }
      auto** merged = static_cast<ibv_context**>(std::calloc(all.size() + 1, sizeof(ibv_context*)));
      if (!merged) throw std::bad_alloc();
      std::copy(all.begin(), all.end(), merged);
      try {
        std::lock_guard lock(g_devices_mu);
        device_arrays()[merged] = std::move(parts);
      } catch (...) {
        std::free(merged);
        throw;
      }
      if (num_devices) *num_devices = static_cast<int>(all.size());
      return merged;
    } catch (...) {
      release();
      throw;
    }
  });
}

SV_EXPORT void rdma_free_devices(struct ibv_context** list) {
  if (!list) return;
  cm::guarded_void([&] {
    std::vector<std::pair<CmProvider*, ibv_context**>> parts;
    {
      std::lock_guard lock(g_devices_mu);
      auto it = device_arrays().find(list);
      if (it == device_arrays().end()) return;  // not an array of ours
      parts = std::move(it->second);
      device_arrays().erase(it);
    }
    for (auto& [p, own] : parts) p->free_devices(own);
    std::free(list);
  });
}

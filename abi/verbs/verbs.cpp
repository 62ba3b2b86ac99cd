// The exported verbs of libibverbs.so.1: find the provider that owns the object,
// forward, and keep rdma-core's library-level semantics (the parts the real
// library does itself, around the provider call).
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "abi/common/export.hpp"
#include "core/events.hpp"

using softverbs::event_element;
using softverbs::EventElement;
using softverbs::Provider;
using softverbs::abi::guarded;
using softverbs::abi::owner_of;

namespace softverbs::abi {
namespace {

std::shared_mutex g_owner_mu;
std::unordered_map<ibv_device*, Provider*>& owners() {
  static auto* map = new std::unordered_map<ibv_device*, Provider*>;
  return *map;
}

// The arrays handed out by ibv_get_device_list, with what each provider listed.
std::mutex g_lists_mu;
std::unordered_map<ibv_device**, std::vector<std::pair<Provider*, std::vector<ibv_device*>>>>& lists() {
  static auto* map = new std::unordered_map<ibv_device**, std::vector<std::pair<Provider*, std::vector<ibv_device*>>>>;
  return *map;
}

}  // namespace

Provider* owner_of(ibv_device* device) {
  if (!device) return nullptr;
  {
    std::shared_lock lock(g_owner_mu);
    auto it = owners().find(device);
    if (it != owners().end()) return it->second;
  }
  // A device the application got some other way (e.g. before any list, through a
  // provider's own API): ask each provider.
  for (Provider* p : providers()) {
    for (ibv_device* d : p->get_devices()) {
      if (d == device) {
        note_devices(p, {d});
        return p;
      }
    }
  }
  return nullptr;
}

void note_devices(Provider* provider, const std::vector<ibv_device*>& devices) {
  std::unique_lock lock(g_owner_mu);
  for (ibv_device* d : devices) owners()[d] = provider;
}

}  // namespace softverbs::abi

// Fails a verb whose object has no owner (a pointer this library never made).
#define SV_OWNER_OR(ptr, ret)  \
  Provider* p = owner_of(ptr); \
  if (!p) {                    \
    errno = EINVAL;            \
    return ret;                \
  }

// ---- devices ---------------------------------------------------------------

SV_EXPORT struct ibv_device** ibv_get_device_list(int* num_devices) {
  return guarded<>(static_cast<ibv_device**>(nullptr), [&]() -> ibv_device** {
    std::vector<std::pair<Provider*, std::vector<ibv_device*>>> parts;
    size_t total = 0;
    for (Provider* p : softverbs::providers()) {
      std::vector<ibv_device*> devs = p->get_devices();
      softverbs::abi::note_devices(p, devs);
      total += devs.size();
      parts.emplace_back(p, std::move(devs));
    }
    auto** list = static_cast<ibv_device**>(std::calloc(total + 1, sizeof(ibv_device*)));
    if (!list) {
      for (auto& [p, devs] : parts) p->release_devices(devs);
      errno = ENOMEM;
      return nullptr;
    }
    size_t i = 0;
    for (auto& [p, devs] : parts)
      for (ibv_device* d : devs) list[i++] = d;
    {
      std::lock_guard lock(softverbs::abi::g_lists_mu);
      softverbs::abi::lists()[list] = std::move(parts);
    }
    if (num_devices) *num_devices = static_cast<int>(total);
    return list;
  });
}

SV_EXPORT void ibv_free_device_list(struct ibv_device** list) {
  if (!list) return;
  std::vector<std::pair<Provider*, std::vector<ibv_device*>>> parts;
  {
    std::lock_guard lock(softverbs::abi::g_lists_mu);
    auto it = softverbs::abi::lists().find(list);
    if (it != softverbs::abi::lists().end()) {
      parts = std::move(it->second);
      softverbs::abi::lists().erase(it);
    }
  }
  for (auto& [p, devs] : parts) p->release_devices(devs);
  std::free(list);
}

SV_EXPORT const char* ibv_get_device_name(struct ibv_device* device) { return device->name; }

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device* device) {
  SV_OWNER_OR(device, 0);
  return guarded<>(__be64{0}, [&] { return p->get_device_guid(device); });
}

SV_EXPORT int ibv_get_device_index(struct ibv_device* device) {
  SV_OWNER_OR(device, -1);
  return guarded(-1, [&] { return p->get_device_index(device); });
}

SV_EXPORT struct ibv_context* ibv_open_device(struct ibv_device* device) {
  SV_OWNER_OR(device, nullptr);
  return guarded<>(static_cast<ibv_context*>(nullptr), [&] { return p->open_device(device); });
}

SV_EXPORT struct ibv_context* ibv_import_device(int cmd_fd) {
  // The fd names a context of one backend; ask them in order. A backend that
  // cannot import at all answers EOPNOTSUPP; the first other answer (the fd is
  // not one of its contexts: EINVAL, ...) is the one reported.
  int err = EOPNOTSUPP;
  for (Provider* p : softverbs::providers()) {
    ibv_context* ctx = guarded<>(static_cast<ibv_context*>(nullptr), [&] { return p->import_device(cmd_fd); });
    if (ctx) return ctx;
    if (err == EOPNOTSUPP) err = errno;
  }
  errno = err;
  return nullptr;
}

SV_EXPORT int ibv_close_device(struct ibv_context* context) {
  SV_OWNER_OR(context, -1);
  return guarded(-1, [&] { return p->close_device(context); });
}

// ---- queries ---------------------------------------------------------------

SV_EXPORT int ibv_query_device(struct ibv_context* context, struct ibv_device_attr* device_attr) {
  SV_OWNER_OR(context, EINVAL);
  return guarded(ENOMEM, [&] { return p->query_device(context, device_attr); });
}

#undef ibv_query_port
SV_EXPORT int ibv_query_port(struct ibv_context* context, uint8_t port_num, struct _compat_ibv_port_attr* port_attr) {
  SV_OWNER_OR(context, EINVAL);
  // The 1.1 entry point knows only the legacy 48-byte struct (rdma-core's
  // _compat_ibv_port_attr: struct ibv_port_attr without port_cap_flags2 and after).
  constexpr size_t kCompatSize = offsetof(ibv_port_attr, port_cap_flags2);
  static_assert(kCompatSize == 48);
  return guarded(ENOMEM, [&] {
    return p->query_port(context, port_num, reinterpret_cast<ibv_port_attr*>(port_attr), kCompatSize);
  });
}

SV_EXPORT int ibv_query_gid(struct ibv_context* context, uint8_t port_num, int index, union ibv_gid* gid) {
  SV_OWNER_OR(context, -1);
  return guarded(-1, [&] { return p->query_gid(context, port_num, index, gid); });
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context* context, uint32_t port_num, uint32_t gid_index,
                                struct ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  SV_OWNER_OR(context, EINVAL);
  return guarded(ENOMEM, [&] { return p->query_gid_ex(context, port_num, gid_index, entry, flags, entry_size); });
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context* context, struct ibv_gid_entry* entries, size_t max_entries,
                                       uint32_t flags, size_t entry_size) {
  SV_OWNER_OR(context, -EINVAL);
  return guarded(static_cast<ssize_t>(-ENOMEM),
                 [&] { return p->query_gid_table(context, entries, max_entries, flags, entry_size); });
}

SV_EXPORT int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num, unsigned int index,
                                 enum ibv_gid_type_sysfs* type) {
  SV_OWNER_OR(context, -1);
  return guarded(-1, [&] { return p->query_gid_type(context, port_num, index, type); });
}

SV_EXPORT int ibv_query_pkey(struct ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  SV_OWNER_OR(context, -1);
  return guarded(-1, [&] { return p->query_pkey(context, port_num, index, pkey); });
}

// Derived here, not by a provider, exactly as rdma-core 44's libibverbs/verbs.c
// does: the first index whose P_Key matches, or ibv_query_pkey's failure (-1 with
// errno) at the end of the table. Each step is one exported ibv_query_pkey, so
// the hw backend's real library answers it as its own ibv_get_pkey_index would.
SV_EXPORT int ibv_get_pkey_index(struct ibv_context* context, uint8_t port_num, __be16 pkey) {
  for (int i = 0;; ++i) {
    __be16 pkey_i;
    int ret = ibv_query_pkey(context, port_num, i, &pkey_i);
    if (ret < 0) return ret;
    if (pkey == pkey_i) return i;
  }
}

// ---- async events and completion channels --------------------------------

SV_EXPORT int ibv_get_async_event(struct ibv_context* context, struct ibv_async_event* event) {
  SV_OWNER_OR(context, -1);
  return guarded(-1, [&] { return p->get_async_event(context, event); });
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event* event) {
  ibv_context* ctx = nullptr;
  switch (event_element(event->event_type)) {
    case EventElement::cq:
      ctx = event->element.cq->context;
      break;
    case EventElement::srq:
      ctx = event->element.srq->context;
      break;
    case EventElement::wq:
      ctx = event->element.wq->context;
      break;
    case EventElement::qp:
      ctx = event->element.qp->context;
      break;
    default:
      return;  // port and device events carry no object to account
  }
  Provider* p = owner_of(ctx);
  if (p)
    guarded(0, [&] {
      p->ack_async_event(event);
      return 0;
    });
}

SV_EXPORT struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* context) {
  SV_OWNER_OR(context, nullptr);
  return guarded<>(static_cast<ibv_comp_channel*>(nullptr), [&] { return p->create_comp_channel(context); });
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel* channel) {
  SV_OWNER_OR(channel->context, -1);
  return guarded(-1, [&] { return p->destroy_comp_channel(channel); });
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel* channel, struct ibv_cq** cq, void** cq_context) {
  SV_OWNER_OR(channel->context, -1);
  return guarded(-1, [&] { return p->get_cq_event(channel, cq, cq_context); });
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int nevents) {
  Provider* p = owner_of(cq->context);
  if (p)
    guarded(0, [&] {
      p->ack_cq_events(cq, nevents);
      return 0;
    });
}

// ---- protection domains and memory ---------------------------------------

SV_EXPORT struct ibv_pd* ibv_alloc_pd(struct ibv_context* context) {
  SV_OWNER_OR(context, nullptr);
  return guarded<>(static_cast<ibv_pd*>(nullptr), [&] { return p->alloc_pd(context); });
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd* pd) {
  SV_OWNER_OR(pd->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->dealloc_pd(pd); });
}

SV_EXPORT struct ibv_pd* ibv_import_pd(struct ibv_context* context, uint32_t pd_handle) {
  SV_OWNER_OR(context, nullptr);
  return guarded<>(static_cast<ibv_pd*>(nullptr), [&] { return p->import_pd(context, pd_handle); });
}

SV_EXPORT void ibv_unimport_pd(struct ibv_pd* pd) {
  Provider* p = owner_of(pd->context);
  if (p)
    guarded(0, [&] {
      p->unimport_pd(pd);
      return 0;
    });
}

SV_EXPORT struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                          unsigned int access) {
  SV_OWNER_OR(pd->context, nullptr);
  return guarded<>(static_cast<ibv_mr*>(nullptr), [&] { return p->reg_mr_iova2(pd, addr, length, iova, access); });
}

#undef ibv_reg_mr
SV_EXPORT struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr), static_cast<unsigned>(access));
}

#undef ibv_reg_mr_iova
SV_EXPORT struct ibv_mr* ibv_reg_mr_iova(struct ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

SV_EXPORT struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                           int access) {
  SV_OWNER_OR(pd->context, nullptr);
  return guarded<>(static_cast<ibv_mr*>(nullptr),
                   [&] { return p->reg_dmabuf_mr(pd, offset, length, iova, fd, access); });
}

SV_EXPORT int ibv_rereg_mr(struct ibv_mr* mr, int flags, struct ibv_pd* pd, void* addr, size_t length, int access) {
  SV_OWNER_OR(mr->context, IBV_REREG_MR_ERR_INPUT);
  return guarded(static_cast<int>(IBV_REREG_MR_ERR_INPUT),
                 [&] { return p->rereg_mr(mr, flags, pd, addr, length, access); });
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr* mr) {
  SV_OWNER_OR(mr->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->dereg_mr(mr); });
}

SV_EXPORT struct ibv_mr* ibv_import_mr(struct ibv_pd* pd, uint32_t mr_handle) {
  SV_OWNER_OR(pd->context, nullptr);
  return guarded<>(static_cast<ibv_mr*>(nullptr), [&] { return p->import_mr(pd, mr_handle); });
}

SV_EXPORT void ibv_unimport_mr(struct ibv_mr* mr) {
  Provider* p = owner_of(mr->context);
  if (p)
    guarded(0, [&] {
      p->unimport_mr(mr);
      return 0;
    });
}

SV_EXPORT struct ibv_dm* ibv_import_dm(struct ibv_context* context, uint32_t dm_handle) {
  SV_OWNER_OR(context, nullptr);
  return guarded<>(static_cast<ibv_dm*>(nullptr), [&] { return p->import_dm(context, dm_handle); });
}

SV_EXPORT void ibv_unimport_dm(struct ibv_dm* dm) {
  Provider* p = owner_of(dm->context);
  if (p)
    guarded(0, [&] {
      p->unimport_dm(dm);
      return 0;
    });
}

// ---- completion queues ---------------------------------------------------

SV_EXPORT struct ibv_cq* ibv_create_cq(struct ibv_context* context, int cqe, void* cq_context,
                                       struct ibv_comp_channel* channel, int comp_vector) {
  SV_OWNER_OR(context, nullptr);
  return guarded<>(static_cast<ibv_cq*>(nullptr),
                   [&] { return p->create_cq(context, cqe, cq_context, channel, comp_vector); });
}

SV_EXPORT int ibv_resize_cq(struct ibv_cq* cq, int cqe) {
  SV_OWNER_OR(cq->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->resize_cq(cq, cqe); });
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq* cq) {
  SV_OWNER_OR(cq->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->destroy_cq(cq); });
}

// ---- shared receive queues -----------------------------------------------

SV_EXPORT struct ibv_srq* ibv_create_srq(struct ibv_pd* pd, struct ibv_srq_init_attr* srq_init_attr) {
  SV_OWNER_OR(pd->context, nullptr);
  return guarded<>(static_cast<ibv_srq*>(nullptr), [&] { return p->create_srq(pd, srq_init_attr); });
}

SV_EXPORT int ibv_modify_srq(struct ibv_srq* srq, struct ibv_srq_attr* srq_attr, int srq_attr_mask) {
  SV_OWNER_OR(srq->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->modify_srq(srq, srq_attr, srq_attr_mask); });
}

SV_EXPORT int ibv_query_srq(struct ibv_srq* srq, struct ibv_srq_attr* srq_attr) {
  SV_OWNER_OR(srq->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->query_srq(srq, srq_attr); });
}

SV_EXPORT int ibv_destroy_srq(struct ibv_srq* srq) {
  SV_OWNER_OR(srq->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->destroy_srq(srq); });
}

// ---- queue pairs ---------------------------------------------------------

SV_EXPORT struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* qp_init_attr) {
  SV_OWNER_OR(pd->context, nullptr);
  return guarded<>(static_cast<ibv_qp*>(nullptr), [&] { return p->create_qp(pd, qp_init_attr); });
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask) {
  SV_OWNER_OR(qp->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->modify_qp(qp, attr, attr_mask); });
}

SV_EXPORT int ibv_query_qp(struct ibv_qp* qp, struct ibv_qp_attr* attr, int attr_mask,
                           struct ibv_qp_init_attr* init_attr) {
  SV_OWNER_OR(qp->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->query_qp(qp, attr, attr_mask, init_attr); });
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp* qp) {
  SV_OWNER_OR(qp->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->destroy_qp(qp); });
}

SV_EXPORT struct ibv_qp_ex* ibv_qp_to_qp_ex(struct ibv_qp* qp) {
  Provider* p = owner_of(qp->context);
  return p ? guarded<>(static_cast<ibv_qp_ex*>(nullptr), [&] { return p->qp_to_qp_ex(qp); }) : nullptr;
}

SV_EXPORT int ibv_query_ece(struct ibv_qp* qp, struct ibv_ece* ece) {
  SV_OWNER_OR(qp->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->query_ece(qp, ece); });
}

SV_EXPORT int ibv_set_ece(struct ibv_qp* qp, struct ibv_ece* ece) {
  SV_OWNER_OR(qp->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->set_ece(qp, ece); });
}

SV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp* qp, enum ibv_wr_opcode op, uint32_t flags) {
  SV_OWNER_OR(qp->context, 0);
  return guarded(0, [&] { return p->query_qp_data_in_order(qp, op, flags); });
}

SV_EXPORT int ibv_attach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  SV_OWNER_OR(qp->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->attach_mcast(qp, gid, lid); });
}

SV_EXPORT int ibv_detach_mcast(struct ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  SV_OWNER_OR(qp->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->detach_mcast(qp, gid, lid); });
}

// ---- address handles -----------------------------------------------------

SV_EXPORT struct ibv_ah* ibv_create_ah(struct ibv_pd* pd, struct ibv_ah_attr* attr) {
  SV_OWNER_OR(pd->context, nullptr);
  return guarded<>(static_cast<ibv_ah*>(nullptr), [&] { return p->create_ah(pd, attr); });
}

SV_EXPORT int ibv_destroy_ah(struct ibv_ah* ah) {
  SV_OWNER_OR(ah->context, EINVAL);
  return guarded(ENOMEM, [&] { return p->destroy_ah(ah); });
}

SV_EXPORT int ibv_init_ah_from_wc(struct ibv_context* context, uint8_t port_num, struct ibv_wc* wc, struct ibv_grh* grh,
                                  struct ibv_ah_attr* ah_attr) {
  SV_OWNER_OR(context, -1);
  return guarded(-1, [&] { return p->init_ah_from_wc(context, port_num, wc, grh, ah_attr); });
}

SV_EXPORT struct ibv_ah* ibv_create_ah_from_wc(struct ibv_pd* pd, struct ibv_wc* wc, struct ibv_grh* grh,
                                               uint8_t port_num) {
  ibv_ah_attr ah_attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &ah_attr)) return nullptr;
  return ibv_create_ah(pd, &ah_attr);
}

SV_EXPORT int ibv_resolve_eth_l2_from_gid(struct ibv_context* context, struct ibv_ah_attr* attr, uint8_t eth_mac[6],
                                          uint16_t* vid) {
  SV_OWNER_OR(context, -EINVAL);
  return guarded(-ENOMEM, [&] { return p->resolve_eth_l2_from_gid(context, attr, eth_mac, vid); });
}

// ---- fork support ----------------------------------------------------------
// Emulated devices do no DMA: a forked child's copy-on-write pages are never
// reached by a device behind the parent's back, so fork protection is unneeded.
// Backends over real devices get the call too.

SV_EXPORT int ibv_fork_init(void) {
  for (Provider* p : softverbs::providers())
    if (int err = guarded(ENOMEM, [&] { return p->fork_init(); })) return err;
  return 0;
}

SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

SV_EXPORT int ibv_dontfork_range(void*, size_t) { return 0; }
SV_EXPORT int ibv_dofork_range(void*, size_t) { return 0; }

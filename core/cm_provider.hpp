// The connection-manager interface: the one seam between the exported librdmacm
// ABI (abi/rdmacm/, librdmacm.so.1) and the backends that run a connection
// manager (hw/ now: a passthrough to the real librdmacm; emu/cm/ later: an IB CM
// over QP1 MADs with address resolution over the emulated devices).
//
// Conventions, the same as Provider's (core/provider.hpp):
//  * Every method has the exact signature and return convention of the exported
//    librdmacm function it stands for (rdma-core 44, rdma/rdma_cma.h): most return
//    0 or -1 with errno set, pointer-returning ones NULL with errno set, the
//    void ones nothing. The ABI layer does not translate results.
//  * Objects are the public structs (rdma_event_channel, rdma_cm_id,
//    rdma_cm_event, rdma_addrinfo). A provider allocates them inside its own
//    objects and keeps its private state next to them; the application sees the
//    public part only. Contexts, PDs, CQs and QPs hung on an id (id->verbs,
//    id->qp, ...) are verbs objects of the Provider that owns the id's device.
//  * Routing: a provider owns what it returned (channels, ids, events, device
//    lists, addrinfo lists). The ABI layer records the owner of each when it is
//    returned and sends every later call on it there, including ids that first
//    appear in an event (a CONNECT_REQUEST's event->id) and releases
//    (freeaddrinfo, free_devices: the memory may come from another allocator,
//    the hw backend's private libc). Calls that name no object yet
//    (create_event_channel, create_id/create_ep with a NULL channel,
//    getaddrinfo, get_devices) go to the providers in order; ENODEV means "no
//    RDMA CM here" and the next is asked. A channel and all ids on it belong to
//    one provider: ids are not moved between providers.
//
// Which exported function is what (librdmacm 44's export list, abi/rdmacm/
// librdmacm.map):
//  * Provider-dispatched, one method each below: event channels, ids and
//    endpoints (create_ep/destroy_ep keep their QP attributes and private data in
//    the id), bind/resolve_addr/resolve_route, listen/get_request/connect/accept/
//    reject/reject_ece/establish/notify/disconnect, get/ack cm events,
//    init_qp_attr, create_qp_ex/destroy_qp and create_srq_ex/destroy_srq on an id
//    (the CQs, XRC domain and ECE they set up are the id's), join_multicast_ex/
//    leave_multicast, set_option, migrate_id, set_local_ece/get_remote_ece,
//    get_devices/free_devices (the CM's device table) and getaddrinfo/
//    freeaddrinfo (they need the CM's devices and address resolution, and the
//    list comes from the provider's allocator).
//  * Library-level, in abi/rdmacm over the methods below and the public verbs:
//    rdma_event_str (a table); rdma_get_src_port/rdma_get_dst_port (read
//    id->route.addr); rdma_create_qp, rdma_create_srq and rdma_join_multicast
//    (in librdmacm they do what rdma_create_qp_ex, rdma_create_srq_ex and
//    rdma_join_multicast_ex do with repacked arguments: an _ex attribute struct
//    filled from the plain one and from public id fields, a full-member join);
//    the rdma_verbs.h inlines (rdma_reg_msgs, rdma_post_send,
//    rdma_get_send_comp, ... never reach the library); rsockets (rsocket ...
//    riowrite: a library over the public rdma_cm and verbs API; the few
//    librdmacm internals it uses have public equivalents).
//
// The defaults are what librdmacm 44 does when the machine has no RDMA CM (no
// /dev/infiniband/rdma_cm, no RDMA device): every entry that needs the CM fails
// with ENODEV, the answer of its device scan (ucma_init). Measured:
// rdma_create_event_channel (NULL), rdma_create_id and rdma_getaddrinfo (-1),
// rdma_get_devices (NULL, *num_devices = 0), errno ENODEV each; rdma_create_ep
// and rdma_get_cm_event start with the same scan. A method on an object the
// provider returned but does not implement fails with ENOSYS, which is what
// librdmacm passes on from the kernel's rdma_cm for a command it lacks; the
// void ones do nothing.
#pragma once

#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstddef>
#include <vector>

namespace softverbs {

class CmProvider {
 public:
  virtual ~CmProvider() = default;

  // Short name used in logs ("emu", "hw").
  virtual const char* name() const noexcept = 0;

  // ---- event channels ------------------------------------------------------
  // The channel's fd is a real file descriptor the application may poll.
  virtual rdma_event_channel* create_event_channel() { return fail_null<rdma_event_channel>(ENODEV); }
  virtual void destroy_event_channel(rdma_event_channel* /*channel*/) {}
  virtual int get_cm_event(rdma_event_channel* /*channel*/, rdma_cm_event** /*event*/) { return fail(ENODEV); }
  virtual int ack_cm_event(rdma_cm_event* /*event*/) { return fail(ENOSYS); }

  // ---- ids and endpoints ---------------------------------------------------
  // A NULL channel makes a synchronous id (librdmacm creates a private channel).
  virtual int create_id(rdma_event_channel* /*channel*/, rdma_cm_id** /*id*/, void* /*context*/,
                        rdma_port_space /*ps*/) {
    return fail(ENODEV);
  }
  virtual int destroy_id(rdma_cm_id* /*id*/) { return fail(ENOSYS); }
  virtual int create_ep(rdma_cm_id** /*id*/, rdma_addrinfo* /*res*/, ibv_pd* /*pd*/,
                        ibv_qp_init_attr* /*qp_init_attr*/) {
    return fail(ENODEV);
  }
  virtual void destroy_ep(rdma_cm_id* /*id*/) {}
  virtual int migrate_id(rdma_cm_id* /*id*/, rdma_event_channel* /*channel*/) { return fail(ENOSYS); }
  virtual int set_option(rdma_cm_id* /*id*/, int /*level*/, int /*optname*/, void* /*optval*/, size_t /*optlen*/) {
    return fail(ENOSYS);
  }

  // ---- addresses and routes ------------------------------------------------
  virtual int bind_addr(rdma_cm_id* /*id*/, sockaddr* /*addr*/) { return fail(ENOSYS); }
  virtual int resolve_addr(rdma_cm_id* /*id*/, sockaddr* /*src_addr*/, sockaddr* /*dst_addr*/, int /*timeout_ms*/) {
    return fail(ENOSYS);
  }
  virtual int resolve_route(rdma_cm_id* /*id*/, int /*timeout_ms*/) { return fail(ENOSYS); }
  // rdma_getaddrinfo returns -1 with errno (not a getaddrinfo EAI_ code).
  virtual int getaddrinfo(const char* /*node*/, const char* /*service*/, const rdma_addrinfo* /*hints*/,
                          rdma_addrinfo** /*res*/) {
    return fail(ENODEV);
  }
  virtual void freeaddrinfo(rdma_addrinfo* /*res*/) {}

  // ---- connections ---------------------------------------------------------
  virtual int listen(rdma_cm_id* /*id*/, int /*backlog*/) { return fail(ENOSYS); }
  virtual int get_request(rdma_cm_id* /*listen*/, rdma_cm_id** /*id*/) { return fail(ENOSYS); }
  virtual int connect(rdma_cm_id* /*id*/, rdma_conn_param* /*conn_param*/) { return fail(ENOSYS); }
  virtual int accept(rdma_cm_id* /*id*/, rdma_conn_param* /*conn_param*/) { return fail(ENOSYS); }
  virtual int reject(rdma_cm_id* /*id*/, const void* /*private_data*/, uint8_t /*private_data_len*/) {
    return fail(ENOSYS);
  }
  virtual int reject_ece(rdma_cm_id* /*id*/, const void* /*private_data*/, uint8_t /*private_data_len*/) {
    return fail(ENOSYS);
  }
  virtual int establish(rdma_cm_id* /*id*/) { return fail(ENOSYS); }
  virtual int notify(rdma_cm_id* /*id*/, ibv_event_type /*event*/) { return fail(ENOSYS); }
  virtual int disconnect(rdma_cm_id* /*id*/) { return fail(ENOSYS); }
  virtual int set_local_ece(rdma_cm_id* /*id*/, ibv_ece* /*ece*/) { return fail(ENOSYS); }
  virtual int get_remote_ece(rdma_cm_id* /*id*/, ibv_ece* /*ece*/) { return fail(ENOSYS); }

  // ---- QPs and SRQs on an id -----------------------------------------------
  // The attributes the id's QP needs for a state (IBTA 12.9 / librdmacm's own
  // transitions), for applications that create and move the QP themselves.
  virtual int init_qp_attr(rdma_cm_id* /*id*/, ibv_qp_attr* /*qp_attr*/, int* /*qp_attr_mask*/) { return fail(ENOSYS); }
  virtual int create_qp_ex(rdma_cm_id* /*id*/, ibv_qp_init_attr_ex* /*qp_init_attr*/) { return fail(ENOSYS); }
  virtual void destroy_qp(rdma_cm_id* /*id*/) {}
  virtual int create_srq_ex(rdma_cm_id* /*id*/, ibv_srq_init_attr_ex* /*attr*/) { return fail(ENOSYS); }
  virtual void destroy_srq(rdma_cm_id* /*id*/) {}

  // ---- multicast -----------------------------------------------------------
  virtual int join_multicast_ex(rdma_cm_id* /*id*/, rdma_cm_join_mc_attr_ex* /*mc_join_attr*/, void* /*context*/) {
    return fail(ENOSYS);
  }
  virtual int leave_multicast(rdma_cm_id* /*id*/, sockaddr* /*addr*/) { return fail(ENOSYS); }

  // ---- devices -------------------------------------------------------------
  // The verbs contexts the CM has opened, NULL-terminated (the contexts belong
  // to the verbs Provider of their devices; the array to this provider).
  virtual ibv_context** get_devices(int* num_devices) {
    if (num_devices) *num_devices = 0;
    return fail_null<ibv_context*>(ENODEV);
  }
  virtual void free_devices(ibv_context** /*list*/) {}

 protected:
  static int fail(int err) noexcept {
    errno = err;
    return -1;
  }
  template <class T>
  static T* fail_null(int err) noexcept {
    errno = err;
    return nullptr;
  }
};

// The process-wide list of CM providers, in the order of providers() (the verbs
// providers SOFTVERBS_BACKEND selects): each verbs backend that has a connection
// manager contributes it. Loaded at the first call; empty when none is
// available, and the ABI layer then fails like librdmacm without an RDMA CM.
const std::vector<CmProvider*>& cm_providers();

// The backends' entry points. hw_cm_provider() is NULL when the real librdmacm
// cannot be used (the reason is logged at debug level); the first call loads it.
// emu_cm_provider() is the emulator's CM (emu/cm/), always available.
CmProvider* hw_cm_provider();
CmProvider* emu_cm_provider();

// The version of this interface as the two exported libraries share it: raised
// whenever a method of CmProvider is added, removed or changes its signature.
inline constexpr unsigned kCmProviderInterface = 1;

}  // namespace softverbs

// How librdmacm.so.1 reaches cm_providers(): the CM providers live inside
// libibverbs.so.1 beside the verbs providers whose devices they share, and
// librdmacm.so.1 (DT_NEEDED libibverbs.so.1) asks for them through this one
// function, exported by libibverbs.so.1 in the version node
// SOFTVERBS_PRIVATE_0.1 (abi/verbs/libibverbs.map, abi/verbs/cm_private.cpp).
// `interface` is the caller's kCmProviderInterface: a libibverbs.so.1 built with
// another CmProvider answers NULL, so a mismatched pair of libraries has no CM
// instead of calling through the wrong virtual table. Otherwise it returns the
// providers in order and their number in *count; their methods never throw.
extern "C" softverbs::CmProvider* const* softverbs_private_cm_providers(unsigned interface, size_t* count);

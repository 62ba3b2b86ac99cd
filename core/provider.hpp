// The provider interface: the one seam between the exported C ABI (abi/) and the
// backends that own devices and objects (emu/, hw/).
//
// Conventions, chosen so that a backend that forwards to the real rdma-core is a
// plain pass-through:
//  * Every method has the exact signature and return convention of the exported
//    rdma-core function it stands for (some return an errno value, some return -1
//    and set errno, pointer-returning ones return NULL and set errno). The ABI layer
//    does not translate results; it only finds the owner and contains exceptions.
//  * Objects are the public rdma-core structs (ibv_context, ibv_qp, ...). A provider
//    allocates them inside its own objects; the application only ever sees the
//    public part, whose layout is byte-identical to rdma-core 44's headers.
//  * The data path (post_send, post_recv, poll_cq, req_notify_cq, post_srq_recv, the
//    ibv_wr_* and ibv_cq_ex readers) never passes through here: rdma-core's inline
//    functions jump straight into the function pointers the provider placed in the
//    context and in the objects. So do the verbs_context extension slots
//    (query_device_ex, create_cq_ex, create_qp_ex, ...).
//  * A provider owns the devices it lists; the ABI layer routes a call on any object
//    to the provider that owns the object's device.
#pragma once

#include <infiniband/verbs.h>

#include "core/rdma_private.h"
#include "softverbs/faults.h"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace softverbs {

class Provider {
 public:
  virtual ~Provider() = default;

  // Short name used in logs and by SOFTVERBS_BACKEND ("emu", "hw").
  virtual const char* name() const noexcept = 0;

  // ---- devices -------------------------------------------------------------
  // Returns the devices this provider exposes now. The provider keeps them alive
  // until release_devices() is called with the same pointers.
  virtual std::vector<ibv_device*> get_devices() = 0;
  virtual void release_devices(const std::vector<ibv_device*>& devices) = 0;
  virtual __be64 get_device_guid(ibv_device* device) = 0;
  virtual int get_device_index(ibv_device* device) = 0;
  virtual ibv_context* open_device(ibv_device* device) = 0;
  virtual ibv_context* import_device(int cmd_fd) = 0;
  virtual int close_device(ibv_context* context) = 0;

  // ---- queries -------------------------------------------------------------
  virtual int query_device(ibv_context* context, ibv_device_attr* attr) = 0;
  // Fills the first attr_len bytes of *attr (the exported IBVERBS_1.1 entry point
  // passes the 48-byte legacy length, the inline ibv_query_port the full struct).
  virtual int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) = 0;
  virtual int query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) = 0;
  virtual int query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry,
                           uint32_t flags, size_t entry_size) = 0;
  virtual ssize_t query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags,
                                  size_t entry_size) = 0;
  virtual int query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                             ibv_gid_type_sysfs* type) = 0;
  virtual int query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) = 0;

  // ---- async events and completion channels --------------------------------
  virtual int get_async_event(ibv_context* context, ibv_async_event* event) = 0;
  virtual void ack_async_event(ibv_async_event* event) = 0;
  virtual ibv_comp_channel* create_comp_channel(ibv_context* context) = 0;
  virtual int destroy_comp_channel(ibv_comp_channel* channel) = 0;
  virtual int get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) = 0;
  virtual void ack_cq_events(ibv_cq* cq, unsigned int nevents) = 0;

  // ---- protection domains and memory ---------------------------------------
  virtual ibv_pd* alloc_pd(ibv_context* context) = 0;
  virtual int dealloc_pd(ibv_pd* pd) = 0;
  virtual ibv_pd* import_pd(ibv_context* context, uint32_t pd_handle) = 0;
  virtual void unimport_pd(ibv_pd* pd) = 0;
  virtual ibv_mr* reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) = 0;
  virtual ibv_mr* reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) = 0;
  virtual int rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) = 0;
  virtual int dereg_mr(ibv_mr* mr) = 0;
  virtual ibv_mr* import_mr(ibv_pd* pd, uint32_t mr_handle) = 0;
  virtual void unimport_mr(ibv_mr* mr) = 0;
  virtual ibv_dm* import_dm(ibv_context* context, uint32_t dm_handle) = 0;
  virtual void unimport_dm(ibv_dm* dm) = 0;

  // ---- completion queues ---------------------------------------------------
  virtual ibv_cq* create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                            int comp_vector) = 0;
  virtual int resize_cq(ibv_cq* cq, int cqe) = 0;
  virtual int destroy_cq(ibv_cq* cq) = 0;

  // ---- shared receive queues -----------------------------------------------
  virtual ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) = 0;
  virtual int modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask) = 0;
  virtual int query_srq(ibv_srq* srq, ibv_srq_attr* attr) = 0;
  virtual int destroy_srq(ibv_srq* srq) = 0;

  // ---- queue pairs ---------------------------------------------------------
  virtual ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) = 0;
  virtual int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = 0;
  virtual int query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) = 0;
  virtual int destroy_qp(ibv_qp* qp) = 0;
  virtual ibv_qp_ex* qp_to_qp_ex(ibv_qp* qp) = 0;
  virtual int query_ece(ibv_qp* qp, ibv_ece* ece) = 0;
  virtual int set_ece(ibv_qp* qp, ibv_ece* ece) = 0;
  virtual int query_qp_data_in_order(ibv_qp* qp, ibv_wr_opcode op, uint32_t flags) = 0;
  virtual int attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) = 0;
  virtual int detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) = 0;

  // ---- address handles -----------------------------------------------------
  virtual ibv_ah* create_ah(ibv_pd* pd, ibv_ah_attr* attr) = 0;
  virtual int destroy_ah(ibv_ah* ah) = 0;
  virtual int init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                              ibv_ah_attr* ah_attr) = 0;
  virtual int resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr, uint8_t eth_mac[6],
                                      uint16_t* vid) = 0;

  // ---- process-wide --------------------------------------------------------
  // Called from ibv_fork_init() after the ABI layer has done its own part.
  virtual int fork_init() = 0;

  // ---- the control API (include/softverbs/faults.h) -------------------------
  // Each returns 0 or an errno value. ENODEV means "not one of mine": the ABI
  // layer then asks the next provider, and a name no provider knows fails with
  // ENODEV. A backend overrides what it can do; the defaults do nothing.

  // Fills *out with the transport counters of the named device.
  virtual int device_counters(const char* /*device_name*/, softverbs_counters* /*out*/) { return ENODEV; }
  // Takes the named device's port down or brings it back up.
  virtual int port_set_state(const char* /*device_name*/, uint8_t /*port_num*/, bool /*active*/) { return ENODEV; }
  // Fails the named device (IBV_EVENT_DEVICE_FATAL).
  virtual int device_fatal(const char* /*device_name*/) { return ENODEV; }
  // Moves a QP of this provider to the error state with IBV_EVENT_QP_FATAL.
  virtual int qp_force_error(ibv_qp* /*qp*/) { return ENODEV; }
  // Raises an async event on a context of this provider. The ABI layer has
  // checked that the event's element belongs to the context.
  virtual int raise_async_event(ibv_context* /*context*/, const ibv_async_event& /*event*/) { return ENODEV; }
  // A device attribute as ibv_read_sysfs_file() would read it from `dir` (the
  // device's ibdev_path): 0 with *value filled, ENOENT for an unknown attribute,
  // ENODEV when `dir` is not one of this provider's devices (the real file is
  // then read).
  virtual int read_sysfs_attr(const char* /*dir*/, const char* /*file*/, std::string* /*value*/) { return ENODEV; }
};

// The process-wide list of providers, in the order their devices are listed.
// Selected by SOFTVERBS_BACKEND (emu, hw, or both; default emu).
const std::vector<Provider*>& providers();

// The backends' entry points (defined by emu/ and hw/; the ABI layer reaches the
// backends through these and the interface above, never through their headers).
Provider& emu_provider();
Provider& hw_provider();

}  // namespace softverbs

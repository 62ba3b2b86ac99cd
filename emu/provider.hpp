// The emulated provider (see core/provider.hpp for the conventions).
//
// It overrides the verbs of core/verbs.def that emulated devices offer; the rest
// keep the interface's defaults (EOPNOTSUPP in the verb's convention, as rdma-core
// answers for a provider without the op): importing device memory
// (import_dm/unimport_dm), dma-buf memory regions and the in-order placement
// query (0, "not guaranteed"). ibv_query_gid_type is derived from query_gid_ex by the
// interface, ibv_get_pkey_index from query_pkey by the ABI layer.
#pragma once

#include "core/provider.hpp"

namespace softverbs::emu {

class Qp;

class EmuProvider final : public Provider {
 public:
  static EmuProvider& instance();
  const char* name() const noexcept override { return "emu"; }

  std::vector<ibv_device*> get_devices() override;
  void release_devices(const std::vector<ibv_device*>& devices) override;
  __be64 get_device_guid(ibv_device* device) override;
  int get_device_index(ibv_device* device) override;
  ibv_context* open_device(ibv_device* device) override;
  // Within the process that made the context (emu/objects/import.hpp).
  ibv_context* import_device(int cmd_fd) override;
  ibv_pd* import_pd(ibv_context* context, uint32_t pd_handle) override;
  void unimport_pd(ibv_pd* pd) override;
  ibv_mr* import_mr(ibv_pd* pd, uint32_t mr_handle) override;
  void unimport_mr(ibv_mr* mr) override;
  int close_device(ibv_context* context) override;
  int query_device(ibv_context* context, ibv_device_attr* attr) override;
  int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) override;
  int query_gid(ibv_context* context, uint8_t port_num, int index, ibv_gid* gid) override;
  int query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry* entry, uint32_t flags, size_t entry_size) override;
  ssize_t query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, uint32_t flags, size_t entry_size) override;
  int query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) override;
  int get_async_event(ibv_context* context, ibv_async_event* event) override;
  void ack_async_event(ibv_async_event* event) override;
  ibv_comp_channel* create_comp_channel(ibv_context* context) override;
  int destroy_comp_channel(ibv_comp_channel* channel) override;
  int get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) override;
  void ack_cq_events(ibv_cq* cq, unsigned int nevents) override;
  ibv_pd* alloc_pd(ibv_context* context) override;
  int dealloc_pd(ibv_pd* pd) override;
  ibv_mr* reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) override;
  int rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) override;
  int dereg_mr(ibv_mr* mr) override;
  ibv_cq* create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) override;
  int resize_cq(ibv_cq* cq, int cqe) override;
  int destroy_cq(ibv_cq* cq) override;
  ibv_srq* create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) override;
  int modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int attr_mask) override;
  int query_srq(ibv_srq* srq, ibv_srq_attr* attr) override;
  int destroy_srq(ibv_srq* srq) override;
  ibv_qp* create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) override;
  int modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) override;
  int query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) override;
  int destroy_qp(ibv_qp* qp) override;
  // The QP's ibv_qp_ex if it was created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
  // else NULL (errno untouched), as rdma-core answers.
  ibv_qp_ex* qp_to_qp_ex(ibv_qp* qp) override;
  // The verbs_context create_qp_ex slot (emu/objects/ops.cpp): ibv_create_qp_ex
  // with send ops flags (the ibv_wr_* API, emu/qp/wr_batch.hpp). NULL and errno.
  ibv_qp* create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr);
  // ECE as mlx5 (emu/provider.cpp). The ABI layer does not repeat rdma-core's
  // own zero-vendor check in ibv_set_ece, so set_ece makes it.
  int query_ece(ibv_qp* qp, ibv_ece* ece) override;
  int set_ece(ibv_qp* qp, ibv_ece* ece) override;
  // UD multicast (emu/device/mcast.cpp), with the kernel's checks and errnos.
  int attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) override;
  int detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) override;
  ibv_ah* create_ah(ibv_pd* pd, ibv_ah_attr* attr) override;
  int destroy_ah(ibv_ah* ah) override;
  int init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) override;
  int resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr, uint8_t eth_mac[6], uint16_t* vid) override;
  // Nothing to do: emulated devices do no DMA.
  int fork_init() override;

  // The control API (emu/control.cpp).
  int device_counters(const char* device_name, softverbs_counters* out) override;
  int port_set_state(const char* device_name, uint8_t port_num, bool active) override;
  int device_fatal(const char* device_name) override;
  int qp_force_error(ibv_qp* qp) override;
  int raise_async_event(ibv_context* context, const ibv_async_event& event) override;
  int read_sysfs_attr(const char* dir, const char* file, std::string* value) override;

 private:
  // ibv_create_qp, and (extended) a QP with the ibv_wr_* API, whose send ops
  // flags the caller has checked.
  ibv_qp* create_qp_common(ibv_pd* pd, ibv_qp_init_attr* attr, bool extended);
  // The end of a QP whose last handle is gone (its number already freed).
  int destroy_qp_object(Qp& qp);
};

}  // namespace softverbs::emu

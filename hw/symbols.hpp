// The rdma-core functions the hw backend forwards to, each with the symbol
// version the real libibverbs.so.1 exports it under by default (the "@@" version
// in objdump -T; abi/verbs/libibverbs.map lists the same nodes). Looking them up with
// dlvsym and these versions gives exactly the implementation a program linked
// against rdma-core 44 would call, never a hidden 1.0 compatibility variant.
//
// Required entries exist in every rdma-core release (IBVERBS_1.0/1.1): a library
// without them is not rdma-core's libibverbs and is not used. The others arrived
// later; an older real library may lack them, and the verb then fails with
// EOPNOTSUPP instead of the whole backend refusing to load.
#pragma once

#include <infiniband/verbs.h>

#include <type_traits>

#include "core/rdma_private.h"

// X(member, exported name, version, required, function type)
#define SV_HW_FORWARDED(X)                                                                                             \
  X(get_device_list, "ibv_get_device_list", "IBVERBS_1.1", true, ibv_device**(int*))                                   \
  X(free_device_list, "ibv_free_device_list", "IBVERBS_1.1", true, void(ibv_device**))                                 \
  X(get_device_guid, "ibv_get_device_guid", "IBVERBS_1.1", true, __be64(ibv_device*))                                  \
  X(get_device_index, "ibv_get_device_index", "IBVERBS_1.9", false, int(ibv_device*))                                  \
  X(open_device, "ibv_open_device", "IBVERBS_1.1", true, ibv_context*(ibv_device*))                                    \
  X(import_device, "ibv_import_device", "IBVERBS_1.10", false, ibv_context*(int))                                      \
  X(close_device, "ibv_close_device", "IBVERBS_1.1", true, int(ibv_context*))                                          \
  X(query_device, "ibv_query_device", "IBVERBS_1.1", true, int(ibv_context*, ibv_device_attr*))                        \
  X(query_port, "ibv_query_port", "IBVERBS_1.1", true, int(ibv_context*, uint8_t, _compat_ibv_port_attr*))             \
  X(query_gid, "ibv_query_gid", "IBVERBS_1.1", true, int(ibv_context*, uint8_t, int, ibv_gid*))                        \
  X(query_gid_ex, "_ibv_query_gid_ex", "IBVERBS_1.11", false,                                                          \
    int(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t))                                           \
  X(query_gid_table, "_ibv_query_gid_table", "IBVERBS_1.11", false,                                                    \
    ssize_t(ibv_context*, ibv_gid_entry*, size_t, uint32_t, size_t))                                                   \
  X(query_gid_type, "ibv_query_gid_type", "IBVERBS_PRIVATE_34", false,                                                 \
    int(ibv_context*, uint8_t, unsigned int, ibv_gid_type_sysfs*))                                                     \
  X(query_pkey, "ibv_query_pkey", "IBVERBS_1.1", true, int(ibv_context*, uint8_t, int, __be16*))                       \
  X(get_async_event, "ibv_get_async_event", "IBVERBS_1.1", true, int(ibv_context*, ibv_async_event*))                  \
  X(ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1", true, void(ibv_async_event*))                               \
  X(create_comp_channel, "ibv_create_comp_channel", "IBVERBS_1.0", true, ibv_comp_channel*(ibv_context*))              \
  X(destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0", true, int(ibv_comp_channel*))                     \
  X(get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1", true, int(ibv_comp_channel*, ibv_cq**, void**))                   \
  X(ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1", true, void(ibv_cq*, unsigned int))                              \
  X(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1", true, ibv_pd*(ibv_context*))                                              \
  X(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1", true, int(ibv_pd*))                                                   \
  X(import_pd, "ibv_import_pd", "IBVERBS_1.10", false, ibv_pd*(ibv_context*, uint32_t))                                \
  X(unimport_pd, "ibv_unimport_pd", "IBVERBS_1.10", false, void(ibv_pd*))                                              \
  X(reg_mr, "ibv_reg_mr", "IBVERBS_1.1", true, ibv_mr*(ibv_pd*, void*, size_t, int))                                   \
  X(reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8", false, ibv_mr*(ibv_pd*, void*, size_t, uint64_t, unsigned int))   \
  X(reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", false, ibv_mr*(ibv_pd*, uint64_t, size_t, uint64_t, int, int)) \
  X(rereg_mr, "ibv_rereg_mr", "IBVERBS_1.1", true, int(ibv_mr*, int, ibv_pd*, void*, size_t, int))                     \
  X(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1", true, int(ibv_mr*))                                                       \
  X(import_mr, "ibv_import_mr", "IBVERBS_1.10", false, ibv_mr*(ibv_pd*, uint32_t))                                     \
  X(unimport_mr, "ibv_unimport_mr", "IBVERBS_1.10", false, void(ibv_mr*))                                              \
  X(import_dm, "ibv_import_dm", "IBVERBS_1.13", false, ibv_dm*(ibv_context*, uint32_t))                                \
  X(unimport_dm, "ibv_unimport_dm", "IBVERBS_1.13", false, void(ibv_dm*))                                              \
  X(create_cq, "ibv_create_cq", "IBVERBS_1.1", true, ibv_cq*(ibv_context*, int, void*, ibv_comp_channel*, int))        \
  X(resize_cq, "ibv_resize_cq", "IBVERBS_1.1", true, int(ibv_cq*, int))                                                \
  X(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1", true, int(ibv_cq*))                                                   \
  X(create_srq, "ibv_create_srq", "IBVERBS_1.1", true, ibv_srq*(ibv_pd*, ibv_srq_init_attr*))                          \
  X(modify_srq, "ibv_modify_srq", "IBVERBS_1.1", true, int(ibv_srq*, ibv_srq_attr*, int))                              \
  X(query_srq, "ibv_query_srq", "IBVERBS_1.1", true, int(ibv_srq*, ibv_srq_attr*))                                     \
  X(destroy_srq, "ibv_destroy_srq", "IBVERBS_1.1", true, int(ibv_srq*))                                                \
  X(create_qp, "ibv_create_qp", "IBVERBS_1.1", true, ibv_qp*(ibv_pd*, ibv_qp_init_attr*))                              \
  X(modify_qp, "ibv_modify_qp", "IBVERBS_1.1", true, int(ibv_qp*, ibv_qp_attr*, int))                                  \
  X(query_qp, "ibv_query_qp", "IBVERBS_1.1", true, int(ibv_qp*, ibv_qp_attr*, int, ibv_qp_init_attr*))                 \
  X(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1", true, int(ibv_qp*))                                                   \
  X(qp_to_qp_ex, "ibv_qp_to_qp_ex", "IBVERBS_1.6", false, ibv_qp_ex*(ibv_qp*))                                         \
  X(query_ece, "ibv_query_ece", "IBVERBS_1.10", false, int(ibv_qp*, ibv_ece*))                                         \
  X(set_ece, "ibv_set_ece", "IBVERBS_1.10", false, int(ibv_qp*, ibv_ece*))                                             \
  X(query_qp_data_in_order, "ibv_query_qp_data_in_order", "IBVERBS_1.14", false,                                       \
    int(ibv_qp*, ibv_wr_opcode, uint32_t))                                                                             \
  X(attach_mcast, "ibv_attach_mcast", "IBVERBS_1.1", true, int(ibv_qp*, const ibv_gid*, uint16_t))                     \
  X(detach_mcast, "ibv_detach_mcast", "IBVERBS_1.1", true, int(ibv_qp*, const ibv_gid*, uint16_t))                     \
  X(create_ah, "ibv_create_ah", "IBVERBS_1.1", true, ibv_ah*(ibv_pd*, ibv_ah_attr*))                                   \
  X(destroy_ah, "ibv_destroy_ah", "IBVERBS_1.1", true, int(ibv_ah*))                                                   \
  X(init_ah_from_wc, "ibv_init_ah_from_wc", "IBVERBS_1.1", true,                                                       \
    int(ibv_context*, uint8_t, ibv_wc*, ibv_grh*, ibv_ah_attr*))                                                       \
  X(resolve_eth_l2_from_gid, "ibv_resolve_eth_l2_from_gid", "IBVERBS_1.1", true,                                       \
    int(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*))                                                              \
  X(fork_init, "ibv_fork_init", "IBVERBS_1.1", true, int())

namespace softverbs::hw {

struct ForwardedSymbol {
  const char* name;
  const char* version;
  bool required;
};

// The table above as data, for diagnostics and for the test that checks it
// against abi/verbs/libibverbs.map.
inline constexpr ForwardedSymbol kForwardedSymbols[] = {
#define SV_HW_ROW(member, name, version, required, ...) {name, version, required},
    SV_HW_FORWARDED(SV_HW_ROW)
#undef SV_HW_ROW
};

// One function pointer per row, typed as the real function is.
struct RealFunctions {
#define SV_HW_MEMBER(member, name, version, required, ...) std::add_pointer_t<__VA_ARGS__> member = nullptr;
  SV_HW_FORWARDED(SV_HW_MEMBER)
#undef SV_HW_MEMBER
};

}  // namespace softverbs::hw

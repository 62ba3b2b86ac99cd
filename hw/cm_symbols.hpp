// The librdmacm functions the hw CM passthrough forwards to, each with the
// symbol version the real librdmacm.so.1 exports it under by default (objdump -T
// of rdma-core 44's library; abi/rdmacm/librdmacm.map lists the same nodes).
// One row per provider-dispatched method of CmProvider (core/cm_provider.hpp).
//
// Required entries are in RDMACM_1.0, which every rdma-core librdmacm exports: a
// library without them is not rdma-core's librdmacm and is not used. The others
// arrived later (1.1: join_multicast_ex, 1.2: establish/init_qp_attr, 1.3: ECE);
// an older real library may lack them, and the call then fails with ENOSYS.
#pragma once

#include <rdma/rdma_cma.h>

#include <type_traits>

// X(member, exported name, version, required, function type)
#define SV_HW_CM_FORWARDED(X)                                                                                        \
  X(create_event_channel, "rdma_create_event_channel", "RDMACM_1.0", true, rdma_event_channel*())                    \
  X(destroy_event_channel, "rdma_destroy_event_channel", "RDMACM_1.0", true, void(rdma_event_channel*))              \
  X(get_cm_event, "rdma_get_cm_event", "RDMACM_1.0", true, int(rdma_event_channel*, rdma_cm_event**))                \
  X(ack_cm_event, "rdma_ack_cm_event", "RDMACM_1.0", true, int(rdma_cm_event*))                                      \
  X(create_id, "rdma_create_id", "RDMACM_1.0", true, int(rdma_event_channel*, rdma_cm_id**, void*, rdma_port_space)) \
  X(destroy_id, "rdma_destroy_id", "RDMACM_1.0", true, int(rdma_cm_id*))                                             \
  X(create_ep, "rdma_create_ep", "RDMACM_1.0", true, int(rdma_cm_id**, rdma_addrinfo*, ibv_pd*, ibv_qp_init_attr*))  \
  X(destroy_ep, "rdma_destroy_ep", "RDMACM_1.0", true, void(rdma_cm_id*))                                            \
  X(migrate_id, "rdma_migrate_id", "RDMACM_1.0", true, int(rdma_cm_id*, rdma_event_channel*))                        \
  X(set_option, "rdma_set_option", "RDMACM_1.0", true, int(rdma_cm_id*, int, int, void*, size_t))                    \
  X(bind_addr, "rdma_bind_addr", "RDMACM_1.0", true, int(rdma_cm_id*, sockaddr*))                                    \
  X(resolve_addr, "rdma_resolve_addr", "RDMACM_1.0", true, int(rdma_cm_id*, sockaddr*, sockaddr*, int))              \
  X(resolve_route, "rdma_resolve_route", "RDMACM_1.0", true, int(rdma_cm_id*, int))                                  \
  X(getaddrinfo, "rdma_getaddrinfo", "RDMACM_1.0", true,                                                             \
    int(const char*, const char*, const rdma_addrinfo*, rdma_addrinfo**))                                            \
  X(freeaddrinfo, "rdma_freeaddrinfo", "RDMACM_1.0", true, void(rdma_addrinfo*))                                     \
  X(listen, "rdma_listen", "RDMACM_1.0", true, int(rdma_cm_id*, int))                                                \
  X(get_request, "rdma_get_request", "RDMACM_1.0", true, int(rdma_cm_id*, rdma_cm_id**))                             \
  X(connect, "rdma_connect", "RDMACM_1.0", true, int(rdma_cm_id*, rdma_conn_param*))                                 \
  X(accept, "rdma_accept", "RDMACM_1.0", true, int(rdma_cm_id*, rdma_conn_param*))                                   \
  X(reject, "rdma_reject", "RDMACM_1.0", true, int(rdma_cm_id*, const void*, uint8_t))                               \
  X(reject_ece, "rdma_reject_ece", "RDMACM_1.3", false, int(rdma_cm_id*, const void*, uint8_t))                      \
  X(establish, "rdma_establish", "RDMACM_1.2", false, int(rdma_cm_id*))                                              \
  X(notify, "rdma_notify", "RDMACM_1.0", true, int(rdma_cm_id*, ibv_event_type))                                     \
  X(disconnect, "rdma_disconnect", "RDMACM_1.0", true, int(rdma_cm_id*))                                             \
  X(set_local_ece, "rdma_set_local_ece", "RDMACM_1.3", false, int(rdma_cm_id*, ibv_ece*))                            \
  X(get_remote_ece, "rdma_get_remote_ece", "RDMACM_1.3", false, int(rdma_cm_id*, ibv_ece*))                          \
  X(init_qp_attr, "rdma_init_qp_attr", "RDMACM_1.2", false, int(rdma_cm_id*, ibv_qp_attr*, int*))                    \
  X(create_qp_ex, "rdma_create_qp_ex", "RDMACM_1.0", true, int(rdma_cm_id*, ibv_qp_init_attr_ex*))                   \
  X(destroy_qp, "rdma_destroy_qp", "RDMACM_1.0", true, void(rdma_cm_id*))                                            \
  X(create_srq_ex, "rdma_create_srq_ex", "RDMACM_1.0", true, int(rdma_cm_id*, ibv_srq_init_attr_ex*))                \
  X(destroy_srq, "rdma_destroy_srq", "RDMACM_1.0", true, void(rdma_cm_id*))                                          \
  X(join_multicast_ex, "rdma_join_multicast_ex", "RDMACM_1.1", false,                                                \
    int(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*))                                                               \
  X(leave_multicast, "rdma_leave_multicast", "RDMACM_1.0", true, int(rdma_cm_id*, sockaddr*))                        \
  X(get_devices, "rdma_get_devices", "RDMACM_1.0", true, ibv_context**(int*))                                        \
  X(free_devices, "rdma_free_devices", "RDMACM_1.0", true, void(ibv_context**))

namespace softverbs::hw {

struct CmForwardedSymbol {
  const char* name;
  const char* version;
  bool required;
};

// The table above as data, for diagnostics and for the test that checks it
// against abi/rdmacm/librdmacm.map.
inline constexpr CmForwardedSymbol kCmForwardedSymbols[] = {
#define SV_HW_CM_ROW(member, name, version, required, ...) {name, version, required},
    SV_HW_CM_FORWARDED(SV_HW_CM_ROW)
#undef SV_HW_CM_ROW
};

// One function pointer per row, typed as the real function is.
struct RealCmFunctions {
#define SV_HW_CM_MEMBER(member, name, version, required, ...) std::add_pointer_t<__VA_ARGS__> member = nullptr;
  SV_HW_CM_FORWARDED(SV_HW_CM_MEMBER)
#undef SV_HW_CM_MEMBER
};

}  // namespace softverbs::hw

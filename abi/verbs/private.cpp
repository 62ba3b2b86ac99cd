// IBVERBS_PRIVATE_34: rdma-core's interface to its own providers. It must exist so
// that Debian's libmlx5/libefa (DT_NEEDED by perftest and pyverbs) load against
// this library; they only reach it for devices of their own, which an emulated
// device never is. The command functions therefore fail with EOPNOTSUPP.
#include <cstdarg>
#include <cstdint>

#include "abi/common/export.hpp"

// The one data object of the node: a bool in .bss, like rdma-core's. A function
// of that name would be written to by libmlx5's constructor path and crash.
extern "C" {
__attribute__((visibility("default"))) bool verbs_allow_disassociate_destroy;
}

SV_EXPORT void verbs_register_driver_34(const void* ops) {
  // A real provider library loaded into this process announces itself; there is
  // no kernel device for it to drive, so it is noted and otherwise left alone.
  SV_LOG(kDebug, "provider driver table %p registered (not used by emulated devices)", ops);
}

SV_EXPORT void* _verbs_init_and_alloc_context(void*, int, size_t, void*, uint32_t) {
  errno = EOPNOTSUPP;
  return nullptr;
}

SV_EXPORT struct ibv_context* verbs_open_device(struct ibv_device*, void*) {
  errno = EOPNOTSUPP;
  return nullptr;
}

SV_EXPORT void verbs_uninit_context(void*) {}
SV_EXPORT void verbs_set_ops(void*, const void*) {}

// rdma-core's verbs_init_cq: the library-side initialisation of a provider's CQ.
SV_EXPORT void verbs_init_cq(struct ibv_cq* cq, struct ibv_context* context, struct ibv_comp_channel* channel,
                             void* cq_context) {
  cq->context = context;
  cq->channel = channel;
  if (channel) {
    pthread_mutex_lock(&context->mutex);
    ++channel->refcnt;
    pthread_mutex_unlock(&context->mutex);
  }
  cq->cq_context = cq_context;
  cq->comp_events_completed = 0;
  cq->async_events_completed = 0;
  pthread_mutex_init(&cq->mutex, nullptr);
  pthread_cond_init(&cq->cond, nullptr);
}

SV_EXPORT void __verbs_log(void*, uint32_t level, const char* fmt, ...) {
  if (!softverbs::log_enabled(softverbs::LogLevel::kDebug)) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  softverbs::log(softverbs::LogLevel::kDebug, "provider log (level %u): %s", level, buf);
}

SV_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void*) { return num_attrs; }

SV_EXPORT int execute_ioctl(struct ibv_context*, void*) { return EOPNOTSUPP; }

SV_EXPORT int ibv_read_ibdev_sysfs_file(char*, size_t, void*, const char*, ...) {
  errno = EOPNOTSUPP;
  return -1;
}

// The kernel command wrappers: each returns an errno value in rdma-core.
#define SV_CMD_STUB(name) \
  SV_EXPORT int name(...) { return EOPNOTSUPP; }

SV_CMD_STUB(ibv_cmd_advise_mr)
SV_CMD_STUB(ibv_cmd_alloc_dm)
SV_CMD_STUB(ibv_cmd_alloc_mw)
SV_CMD_STUB(ibv_cmd_alloc_pd)
SV_CMD_STUB(ibv_cmd_attach_mcast)
SV_CMD_STUB(ibv_cmd_close_xrcd)
SV_CMD_STUB(ibv_cmd_create_ah)
SV_CMD_STUB(ibv_cmd_create_counters)
SV_CMD_STUB(ibv_cmd_create_cq)
SV_CMD_STUB(ibv_cmd_create_cq_ex)
SV_CMD_STUB(ibv_cmd_create_flow)
SV_CMD_STUB(ibv_cmd_create_flow_action_esp)
SV_CMD_STUB(ibv_cmd_create_qp)
SV_CMD_STUB(ibv_cmd_create_qp_ex)
SV_CMD_STUB(ibv_cmd_create_qp_ex2)
SV_CMD_STUB(ibv_cmd_create_rwq_ind_table)
SV_CMD_STUB(ibv_cmd_create_srq)
SV_CMD_STUB(ibv_cmd_create_srq_ex)
SV_CMD_STUB(ibv_cmd_create_wq)
SV_CMD_STUB(ibv_cmd_dealloc_mw)
SV_CMD_STUB(ibv_cmd_dealloc_pd)
SV_CMD_STUB(ibv_cmd_dereg_mr)
SV_CMD_STUB(ibv_cmd_destroy_ah)
SV_CMD_STUB(ibv_cmd_destroy_counters)
SV_CMD_STUB(ibv_cmd_destroy_cq)
SV_CMD_STUB(ibv_cmd_destroy_flow)
SV_CMD_STUB(ibv_cmd_destroy_flow_action)
SV_CMD_STUB(ibv_cmd_destroy_qp)
SV_CMD_STUB(ibv_cmd_destroy_rwq_ind_table)
SV_CMD_STUB(ibv_cmd_destroy_srq)
SV_CMD_STUB(ibv_cmd_destroy_wq)
SV_CMD_STUB(ibv_cmd_detach_mcast)
SV_CMD_STUB(ibv_cmd_free_dm)
SV_CMD_STUB(ibv_cmd_get_context)
SV_CMD_STUB(ibv_cmd_modify_cq)
SV_CMD_STUB(ibv_cmd_modify_flow_action_esp)
SV_CMD_STUB(ibv_cmd_modify_qp)
SV_CMD_STUB(ibv_cmd_modify_qp_ex)
SV_CMD_STUB(ibv_cmd_modify_srq)
SV_CMD_STUB(ibv_cmd_modify_wq)
SV_CMD_STUB(ibv_cmd_open_qp)
SV_CMD_STUB(ibv_cmd_open_xrcd)
SV_CMD_STUB(ibv_cmd_poll_cq)
SV_CMD_STUB(ibv_cmd_post_recv)
SV_CMD_STUB(ibv_cmd_post_send)
SV_CMD_STUB(ibv_cmd_post_srq_recv)
SV_CMD_STUB(ibv_cmd_query_context)
SV_CMD_STUB(ibv_cmd_query_device_any)
SV_CMD_STUB(ibv_cmd_query_mr)
SV_CMD_STUB(ibv_cmd_query_port)
SV_CMD_STUB(ibv_cmd_query_qp)
SV_CMD_STUB(ibv_cmd_query_srq)
SV_CMD_STUB(ibv_cmd_read_counters)
SV_CMD_STUB(ibv_cmd_reg_dm_mr)
SV_CMD_STUB(ibv_cmd_reg_dmabuf_mr)
SV_CMD_STUB(ibv_cmd_reg_mr)
SV_CMD_STUB(ibv_cmd_req_notify_cq)
SV_CMD_STUB(ibv_cmd_rereg_mr)
SV_CMD_STUB(ibv_cmd_resize_cq)

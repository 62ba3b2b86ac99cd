// The function pointers rdma-core's inline verbs jump through (ops.hpp).
#include "emu/objects/ops.hpp"

#include <dlfcn.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/objects/domain.hpp"
#include "emu/objects/objects.hpp"
#include "emu/objects/trace.hpp"
#include "emu/provider.hpp"
#include "emu/qp/qp.hpp"

namespace softverbs::emu {
namespace {

// Completion-queue entry fields an extended CQ can report: mlx5's
// CREATE_CQ_SUPPORTED_WC_FLAGS. Each has a reader that returns what the device
// knows: the completion time, and for the customer VLAN, the flow tag and the
// tag-matching info zero, as the device strips no VLAN, steers no flows and
// matches no tags.
constexpr uint64_t kSupportedWcFlags = uint64_t{IBV_WC_STANDARD_FLAGS} | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                       IBV_WC_EX_WITH_CVLAN | IBV_WC_EX_WITH_FLOW_TAG | IBV_WC_EX_WITH_TM_INFO |
                                       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
// mlx5's CREATE_CQ_SUPPORTED_FLAGS.
constexpr uint32_t kSupportedCqFlags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
// The ibv_qp_init_attr_ex comp_mask bits mlx5 knows (MLX5_CREATE_QP_SUP_COMP_MASK),
// and the creation flags libibverbs passes on (CREATE_QP_EX_SUP_CREATE_FLAGS).
constexpr uint32_t kMlx5QpCompMask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
                                     IBV_QP_INIT_ATTR_MAX_TSO_HEADER | IBV_QP_INIT_ATTR_IND_TABLE |
                                     IBV_QP_INIT_ATTR_RX_HASH | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
constexpr uint32_t kKnownQpCreateFlags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB | IBV_QP_CREATE_SCATTER_FCS |
                                         IBV_QP_CREATE_CVLAN_STRIPPING | IBV_QP_CREATE_SOURCE_QPN |
                                         IBV_QP_CREATE_PCI_WRITE_END_PADDING;
// Timestamps are nanoseconds: the "HCA core clock" runs at 1 GHz (in kHz below).
constexpr uint64_t kHcaCoreClockKhz = 1000000;

// ---- live ibv_context_ops slots -------------------------------------------

// Posting and polling tell the scheduler whether the calling thread works or
// waits (Scheduler::note_busy, idle_poll): under virtual time an empty poll is
// where engine work runs and the clock moves on (docs/simulation.md); the real
// scheduler ignores both.
int op_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Qp* q = Qp::from(qp);
  q->device().scheduler().note_busy();
  return q->post_send(wr, bad_wr);
}
int op_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Qp* q = Qp::from(qp);
  q->device().scheduler().note_busy();
  return q->post_recv(wr, bad_wr);
}
int op_post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Srq* s = Srq::from(srq);
  s->context().device().scheduler().note_busy();
  return s->post_recv(wr, bad_wr);
}
int op_poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  Cq* c = Cq::from(cq);
  Device& dev = c->context().device();
  // Polling drives the protocol inline: whatever arrived for this device is
  // processed by the polling thread, with no wake-up of another thread.
  dev.progress(false);
  const int got = c->poll(n, wc);
  if (got == 0 && n > 0)
    dev.scheduler().idle_poll();
  else if (got > 0)
    dev.scheduler().note_busy();
  return got;
}
int op_req_notify_cq(ibv_cq* cq, int solicited_only) {
  Cq* c = Cq::from(cq);
  // Armed to block, maybe in a poll() of the channel's fd that the library
  // never sees: nothing this thread polled may wait for its next poll.
  c->context().device().scheduler().note_may_block();
  return c->arm(solicited_only);
}

// ---- verbs_context slots ----------------------------------------------------

int op_query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) {
  return query_port(context, port_num, attr, attr_len);
}

ibv_cq_ex* op_create_cq_ex_unguarded(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  if (Context::from(context)->device().fatal()) {
    errno = EIO;
    return nullptr;
  }
  if (attr->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD)) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->wc_flags & ~kSupportedWcFlags) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // A device without completion timestamps (the personality's [device_ex])
  // refuses a CQ that asks for them, as rdma-core's rxe provider does.
  constexpr uint64_t kTimestampFlags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  if ((attr->wc_flags & kTimestampFlags) && !personality().completion_timestamps) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  const uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
  if (flags & ~kSupportedCqFlags) {
    errno = EINVAL;  // as ConnectX
    return nullptr;
  }
  if (attr->cqe > static_cast<uint32_t>(personality().max_cqe)) {
    errno = EINVAL;
    return nullptr;
  }
  // mlx5_create_cq: IBV_CQ_INIT_ATTR_MASK_PD names a parent domain (a plain PD
  // is EINVAL), whose allocator then holds the ring.
  ParentDomain* domain = nullptr;
  if (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
    domain = parent_domain_of(attr->parent_domain);
    if (!domain || &domain->pd().context().handles != &Context::from(context)->handles) {
      errno = EINVAL;
      return nullptr;
    }
  }
  ibv_cq_ex* cq = create_cq(*Context::from(context), static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                            static_cast<int>(attr->comp_vector), attr->wc_flags, domain);
  if (cq && (flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN)) Cq::from(cq)->set_ignore_overrun();
  return cq;
}

// Reached from the application's inline ibv_create_cq_ex: no exception may
// leave it.
ibv_cq_ex* op_create_cq_ex(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  return guarded([&] { return op_create_cq_ex_unguarded(context, attr); });
}

// Reached from the application's inline ibv_create_qp_ex for any comp_mask but
// the PD-only one: no exception may leave it.
ibv_qp* op_create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  return guarded([&] { return EmuProvider::instance().create_qp_ex(context, attr); });
}

// ibv_query_rt_values_ex: the raw clock is the one completion timestamps are
// read from (IBV_WC_EX_WITH_COMPLETION_TIMESTAMP), in cycles of the 1 GHz core
// clock query_device_ex reports; as mlx5, the cycles go in tv_nsec.
int op_query_rt_values(ibv_context* context, ibv_values_ex* values) {
  uint32_t done = 0;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = static_cast<long>(to_ns(Context::from(context)->device().clock().wall_now()));
    done |= IBV_VALUES_MASK_RAW_CLOCK;
  }
  values->comp_mask = done;
  return 0;
}

// ---- ibv_cq_ex readers ------------------------------------------------------

int cqx_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr->comp_mask) return EINVAL;
  Device& dev = Cq::from(cq)->context().device();
  dev.progress(false);
  const int ret = Cq::from(cq)->start_poll();
  if (ret == ENOENT)
    dev.scheduler().idle_poll();
  else
    dev.scheduler().note_busy();
  return ret;
}
int cqx_next_poll(ibv_cq_ex* cq) { return Cq::from(cq)->next_poll(); }
void cqx_end_poll(ibv_cq_ex* cq) { Cq::from(cq)->end_poll(); }
ibv_wc_opcode cqx_read_opcode(ibv_cq_ex* cq) { return Cq::from(cq)->current().opcode; }
uint32_t cqx_read_vendor_err(ibv_cq_ex* cq) { return Cq::from(cq)->current().vendor_err; }
uint32_t cqx_read_byte_len(ibv_cq_ex* cq) { return Cq::from(cq)->current().byte_len; }
__be32 cqx_read_imm_data(ibv_cq_ex* cq) { return Cq::from(cq)->current().imm_data; }
uint32_t cqx_read_qp_num(ibv_cq_ex* cq) { return Cq::from(cq)->current().qp_num; }
uint32_t cqx_read_src_qp(ibv_cq_ex* cq) { return Cq::from(cq)->current().src_qp; }
unsigned int cqx_read_wc_flags(ibv_cq_ex* cq) { return Cq::from(cq)->current().wc_flags; }
uint32_t cqx_read_slid(ibv_cq_ex* cq) { return Cq::from(cq)->current().slid; }
uint8_t cqx_read_sl(ibv_cq_ex* cq) { return Cq::from(cq)->current().sl; }
uint8_t cqx_read_dlid_path_bits(ibv_cq_ex* cq) { return Cq::from(cq)->current().dlid_path_bits; }
uint64_t cqx_read_completion_ts(ibv_cq_ex* cq) { return Cq::from(cq)->current_timestamp_ns(); }
uint64_t cqx_read_completion_wallclock_ns(ibv_cq_ex* cq) { return Cq::from(cq)->current_timestamp_ns(); }
uint16_t cqx_read_cvlan(ibv_cq_ex*) { return 0; }
uint32_t cqx_read_flow_tag(ibv_cq_ex*) { return 0; }
void cqx_read_tm_info(ibv_cq_ex*, ibv_wc_tm_info* tm_info) { *tm_info = ibv_wc_tm_info{}; }

}  // namespace

// ibv_create_qp_ex's checks, in the order ConnectX's stack makes them: mlx5's
// comp_mask, mlx5's source-QPN rule, libibverbs' known creation flags, then the
// kernel's check_creation_flags (uverbs_std_types_qp.c: creation flags only on
// UD and raw packet QPs, FCS scatter and VLAN stripping only on raw packet QPs)
// and what mlx5_ib does with the rest on this device. 0 or the errno.
int check_create_qp_ex(const ibv_qp_init_attr_ex& attr) {
  const uint32_t mask = attr.comp_mask;
  // mlx5 returns NULL for a bit it does not know without setting errno; EINVAL
  // makes the answer deterministic.
  if (mask & ~kMlx5QpCompMask) return EINVAL;
  if ((mask & IBV_QP_INIT_ATTR_MAX_TSO_HEADER) && attr.qp_type != IBV_QPT_RAW_PACKET) return EINVAL;
  // The device has no RSS.
  if (mask & (IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH)) return EOPNOTSUPP;
  // The kernel needs the XRC domain of an XRC_RECV QP and the PD of any other
  // (an XRCD given to another type is ignored).
  if (attr.qp_type == IBV_QPT_XRC_RECV) {
    if (!(mask & IBV_QP_INIT_ATTR_XRCD) || !attr.xrcd) return EINVAL;
  } else if (!(mask & IBV_QP_INIT_ATTR_PD) || !attr.pd) {
    return EINVAL;
  }
  if (!(mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) || attr.create_flags == 0) return 0;
  const uint32_t flags = attr.create_flags;
  if ((flags & IBV_QP_CREATE_SOURCE_QPN) && attr.qp_type != IBV_QPT_UD) return EINVAL;
  if (flags & ~kKnownQpCreateFlags) return EINVAL;
  // The source QPN travels in an attribute of its own: the kernel's check sees the rest.
  const uint32_t kernel_flags = flags & ~static_cast<uint32_t>(IBV_QP_CREATE_SOURCE_QPN);
  if (kernel_flags && attr.qp_type != IBV_QPT_UD) return EINVAL;
  if (kernel_flags & (IBV_QP_CREATE_SCATTER_FCS | IBV_QP_CREATE_CVLAN_STRIPPING)) return EINVAL;
  // A UD QP: no underlay QPN on this device; multicast loopback blocking is
  // kept (emu/device/mcast.cpp); end-of-write padding is a PCIe hint with
  // nothing to pad here.
  if (flags & IBV_QP_CREATE_SOURCE_QPN) return EOPNOTSUPP;
  return 0;
}

int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len) {
  if (port_num < 1 || port_num > caps::kPhysPortCnt) return EINVAL;
  ibv_port_attr full;
  Context::from(context)->device().fill_port_attr(&full);
  std::memcpy(attr, &full, attr_len < sizeof full ? attr_len : sizeof full);
  return 0;
}

int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                    size_t attr_size) {
  if (input && input->comp_mask) return EINVAL;
  if (attr_size < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex full{};
  Context::from(context)->device().fill_device_attr(&full.orig_attr);
  const Personality& persona = personality();
  if (persona.completion_timestamps) {
    full.completion_timestamp_mask = UINT64_MAX;
    full.hca_core_clock = kHcaCoreClockKhz;
  }
  full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
  full.phys_port_cnt_ex = caps::kPhysPortCnt;
  full.max_dm_size = persona.max_dm_size;
  if (persona.odp) {
    full.odp_caps.general_caps = caps::kOdpGeneralCaps;
    full.odp_caps.per_transport_caps.rc_odp_caps = caps::kOdpRcCaps;
    full.odp_caps.per_transport_caps.uc_odp_caps = caps::kOdpUcCaps;
    full.odp_caps.per_transport_caps.ud_odp_caps = caps::kOdpUdCaps;
  }
  // Write no more than the caller's struct holds (older binaries pass a smaller one).
  std::memcpy(attr, &full, attr_size < sizeof full ? attr_size : sizeof full);
  return 0;
}

ibv_cq_ex* create_cq(Context& ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector,
                     uint64_t wc_flags, ParentDomain* domain) {
  if (cqe < caps::kMinCqe || cqe > personality().max_cqe || comp_vector < 0 || comp_vector >= caps::kNumCompVectors) {
    errno = EINVAL;
    return nullptr;
  }
  CompChannel* ch = nullptr;
  if (channel) {
    ch = CompChannel::from(channel);
    if (&ch->context() != &ctx) {
      errno = EINVAL;
      return nullptr;
    }
  }
  Charge charge = ctx.device().charge(ObjectType::cq);
  if (!charge) {
    errno = ENOMEM;  // max_cq CQs exist
    return nullptr;
  }
  auto cq = std::make_unique<Cq>(ctx, cqe, cq_context, ch, wc_flags, domain);
  cq->charge = std::move(charge);
  cq->ibv()->handle = ctx.handles.add(ObjectType::cq, cq->ibv());
  trace_object(ctx.device(), "create_cq", cq->ibv()->handle);
  if (channel) {
    pthread_mutex_lock(&ctx.ibv()->mutex);
    ++channel->refcnt;
    pthread_mutex_unlock(&ctx.ibv()->mutex);
  }
  ctx.users.get();
  if (domain) domain->users.get();
  return cq.release()->ibv_ex();
}

void install_context_ops(verbs_context* vctx) {
  ibv_context_ops& ops = vctx->context.ops;
  ops.post_send = op_post_send;
  ops.post_recv = op_post_recv;
  ops.post_srq_recv = op_post_srq_recv;
  ops.poll_cq = op_poll_cq;
  ops.req_notify_cq = op_req_notify_cq;
  ops.alloc_mw = op_alloc_mw;
  ops.dealloc_mw = op_dealloc_mw;
  ops.bind_mw = op_bind_mw;
  vctx->query_port = op_query_port;
  vctx->query_device_ex = query_device_ex;
  vctx->create_cq_ex = op_create_cq_ex;
  vctx->create_qp_ex = op_create_qp_ex;
  vctx->query_rt_values = op_query_rt_values;
  install_dm_ops(vctx);
  install_odp_ops(vctx);
  install_domain_ops(vctx);
  vctx->open_xrcd = op_open_xrcd;
  vctx->close_xrcd = op_close_xrcd;
  vctx->create_srq_ex = op_create_srq_ex;
  vctx->get_srq_num = op_get_srq_num;
  vctx->open_qp = op_open_qp;
  // Binaries built against libibverbs 1.1.x reach these compatibility slots.
  vctx->context.ops._compat_query_port = reinterpret_cast<decltype(ops._compat_query_port)>(
      dlsym(RTLD_DEFAULT, "ibv_query_port"));
  vctx->context.ops._compat_query_device = reinterpret_cast<decltype(ops._compat_query_device)>(
      dlsym(RTLD_DEFAULT, "ibv_query_device"));
}

void install_cq_ex_ops(ibv_cq_ex* cq) {
  cq->start_poll = cqx_start_poll;
  cq->next_poll = cqx_next_poll;
  cq->end_poll = cqx_end_poll;
  cq->read_opcode = cqx_read_opcode;
  cq->read_vendor_err = cqx_read_vendor_err;
  cq->read_byte_len = cqx_read_byte_len;
  cq->read_imm_data = cqx_read_imm_data;
  cq->read_qp_num = cqx_read_qp_num;
  cq->read_src_qp = cqx_read_src_qp;
  cq->read_wc_flags = cqx_read_wc_flags;
  cq->read_slid = cqx_read_slid;
  cq->read_sl = cqx_read_sl;
  cq->read_dlid_path_bits = cqx_read_dlid_path_bits;
  cq->read_completion_ts = cqx_read_completion_ts;
  cq->read_completion_wallclock_ns = cqx_read_completion_wallclock_ns;
  cq->read_cvlan = cqx_read_cvlan;
  cq->read_flow_tag = cqx_read_flow_tag;
  cq->read_tm_info = cqx_read_tm_info;
}

}  // namespace softverbs::emu

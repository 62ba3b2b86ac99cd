// The emulated provider: the queue pair verbs (create, modify, query, destroy,
// multicast attach) of emulated devices.
#include "emu/provider.hpp"

#include <arpa/inet.h>
#include <netinet/ip.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/device/identity.hpp"
#include "emu/memory/user_range.hpp"
#include "emu/objects/domain.hpp"
#include "emu/objects/import.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "emu/objects/ops.hpp"
#include "emu/objects/trace.hpp"
#include "emu/provider_detail.hpp"
#include "core/events.hpp"

namespace softverbs::emu {

using namespace provider_detail;

// ---- queue pairs ---------------------------------------------------------

ibv_qp* EmuProvider::create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) { return create_qp_common(pd, attr, false); }

// ibv_create_qp_ex beyond the PD-only form (which rdma-core's inline verb sends to
// ibv_create_qp): creation flags as check_create_qp_ex allows them, and
// IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (the ibv_wr_* API). The send ops
// are checked as mlx5 checks them (mlx5_qp_fill_wr_pfns): a bit its QP type does
// not take, TSO and atomic write included, gives EOPNOTSUPP.
ibv_qp* EmuProvider::create_qp_ex(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  if (int err = check_create_qp_ex(*attr)) return fail<ibv_qp>(err);  // RSS, creation flags, ...
  if (attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV) return create_xrc_qp(context, attr);
  if (attr->pd->context != context) return fail<ibv_qp>(EINVAL);
  const bool extended = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  const uint64_t supported = supported_send_ops(attr->qp_type);
  if (extended && supported && (attr->send_ops_flags & ~supported)) return fail<ibv_qp>(EOPNOTSUPP);
  // ibv_qp_init_attr_ex starts with the fields of ibv_qp_init_attr, as
  // rdma-core's own cast in ibv_create_qp_ex relies on.
  auto* base = reinterpret_cast<ibv_qp_init_attr*>(attr);
  ibv_qp* qp = create_qp_common(attr->pd, base, extended);
  // check_create_qp_ex let this flag through on UD QPs only.
  if (qp && (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
      (attr->create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB))
    Qp::from(qp)->set_block_self_mcast();
  return qp;
}

ibv_qp* EmuProvider::create_qp_common(ibv_pd* pd, ibv_qp_init_attr* attr, bool extended) {
  if (failed(pd->context)) return fail<ibv_qp>(EIO);
  Pd* p = Pd::from(pd);
  // The context the PD was reached through: an imported context shares the
  // objects (and their numbers) of the one it imports.
  Context& ctx = *Context::from(pd->context);
  switch (attr->qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_UD:
      break;
    case IBV_QPT_XRC_SEND: {
      // rdma-core's ibv_create_qp_ex sends a PD-only XRC_SEND creation here.
      ibv_qp_init_attr_ex ex{};
      std::memcpy(&ex, attr, sizeof *attr);
      ex.comp_mask = IBV_QP_INIT_ATTR_PD;
      ex.pd = pd;
      ibv_qp* qp = create_xrc_qp(pd->context, &ex);
      if (qp) attr->cap = ex.cap;
      return qp;
    }
    case IBV_QPT_XRC_RECV:
      return fail<ibv_qp>(EINVAL);  // it needs an XRC domain, which this form cannot name
    default:
      return fail<ibv_qp>(EOPNOTSUPP);
  }
  if (!attr->send_cq || !attr->recv_cq) return fail<ibv_qp>(EINVAL);
  auto same_file = [&ctx](ibv_context* other) { return &Context::from(other)->handles == &ctx.handles; };
  if (!same_file(attr->send_cq->context) || !same_file(attr->recv_cq->context)) return fail<ibv_qp>(EINVAL);
  if (attr->srq && !same_file(attr->srq->context)) return fail<ibv_qp>(EINVAL);
  // The kernel finds the PD, the CQs and the SRQ by their numbers.
  if (int err = lookup(pd->context, ObjectType::pd, pd, pd->handle)) return fail<ibv_qp>(err);
  for (ibv_cq* cq : {attr->send_cq, attr->recv_cq})
    if (int err = lookup(pd->context, ObjectType::cq, cq, cq->handle)) return fail<ibv_qp>(err);
  if (attr->srq)
    if (int err = lookup(pd->context, ObjectType::srq, attr->srq, attr->srq->handle)) return fail<ibv_qp>(err);
  ibv_qp_cap& cap = attr->cap;
  const Personality& persona = personality();
  if (cap.max_send_wr > static_cast<uint32_t>(persona.max_qp_wr) ||
      cap.max_send_sge > static_cast<uint32_t>(persona.max_sge) || cap.max_inline_data > persona.max_inline_data)
    return fail<ibv_qp>(EINVAL);
  if (!attr->srq && (cap.max_recv_wr > static_cast<uint32_t>(persona.max_qp_wr) ||
                     cap.max_recv_sge > static_cast<uint32_t>(persona.max_sge)))
    return fail<ibv_qp>(EINVAL);

  Charge charge = ctx.device().charge(ObjectType::qp);
  if (!charge) return fail<ibv_qp>(ENOMEM);  // max_qp QPs exist
  // A parent domain's allocator holds the queues (mlx5_create_qp).
  ParentDomain* domain = parent_domain_of(pd);
  // rxe's queues hold 2^n - 1 work requests while it reports the depth asked
  // for (docs/simulation.md, "Vendor personalities"); ConnectX-like queues hold
  // and report exactly the depth asked for.
  ibv_qp_init_attr sized = *attr;
  if (persona.queue_sizes_as_requested) {
    sized.cap.max_send_wr = rxe_like_depth(cap.max_send_wr);
    if (!attr->srq) sized.cap.max_recv_wr = rxe_like_depth(cap.max_recv_wr);
  }
  // The send queue's inline room is sized as ConnectX and rxe size it
  // (caps::granted_inline_data); the caller's attr changes only on success.
  sized.cap.max_inline_data = caps::granted_inline_data(cap, persona.max_inline_data);
  auto qp = std::make_unique<Qp>(*p, sized, domain);
  qp->charge = std::move(charge);
  if (extended) qp->make_extended();
  qp->ibv()->pd = pd;  // the parent domain, when given one
  publish_qp(ctx, *qp);
  const ibv_qp_cap asked = cap;
  cap = qp->cap();  // the actual capabilities
  // rxe reports the depths asked for, not those of its queues.
  if (persona.queue_sizes_as_requested) {
    cap.max_send_wr = asked.max_send_wr;
    if (!attr->srq) cap.max_recv_wr = asked.max_recv_wr;
  }
  p->users.get();
  if (domain) domain->users.get();
  trace_object(ctx.device(), "create_qp", qp->qpn());
  Cq::from(attr->send_cq)->users.get();
  Cq::from(attr->recv_cq)->users.get();
  if (attr->srq) Srq::from(attr->srq)->users.get();
  return qp.release()->ibv();
}

ibv_qp_ex* EmuProvider::qp_to_qp_ex(ibv_qp* qp) {
  Qp* q = Qp::from(qp);
  return q->batch() ? q->ibv_ex() : nullptr;
}

int EmuProvider::modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  if (int err = lookup_write(qp->context, ObjectType::qp, qp, qp->handle)) return kernel_error(err);
  if (failed(qp->context)) return EIO;
  Qp* q = Qp::from(qp);
  int err = q->modify(attr, attr_mask);
  // A handle of ibv_open_qp has a struct of its own: its state follows its
  // own modifies, as rdma-core's ibv_modify_qp keeps qp->state.
  if (!err && qp != q->ibv()) qp->state = q->state();
  return err;
}

int EmuProvider::query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  if (int err = lookup_write(qp->context, ObjectType::qp, qp, qp->handle)) return kernel_error(err);
  Qp* q = Qp::from(qp);
  int err = q->query(attr, attr_mask, init_attr);
  // rdma-core's ibv_cmd_query_qp takes these from the caller's own struct: a
  // handle of ibv_open_qp answers its own context pointer and no CQs.
  if (!err && qp != q->ibv()) {
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
  }
  return err;
}

int EmuProvider::destroy_qp(ibv_qp* qp) {
  if (int err = lookup(qp->context, ObjectType::qp, qp, qp->handle)) return kernel_error(err);
  Qp* q = Qp::from(qp);
  if (q->type() == IBV_QPT_XRC_RECV) {
    // One of possibly several handles (ibv_open_qp): the QP goes with the last.
    if (qp == q->ibv()) {
      // The creator's handle, which the QP's async events go to: none reaches
      // it any more, and those reported are acknowledged before ibv_destroy_qp
      // returns. Done before the release, after which another thread's
      // destroy of the last opened handle may delete the QP.
      q->detach_events();
      q->context().forget_async_events(qp);
      wait_events_acked(&qp->mutex, &qp->cond, &qp->events_completed, &q->events.reported);
    }
    Qp* last = release_xrc_recv_handle(qp);
    return last ? destroy_qp_object(*last) : 0;
  }
  // The kernel refuses to destroy a QP still attached to a multicast group.
  if (q->context().device().mcast_attached(q->qpn())) return kernel_error(EBUSY);
  q->context().handles.remove(qp->handle);
  return destroy_qp_object(*q);
}

int EmuProvider::destroy_qp_object(Qp& qp_obj) {
  Qp* q = &qp_obj;
  ibv_qp* qp = q->ibv();
  Context& ctx = q->context();
  trace_object(ctx.device(), "destroy_qp", q->qpn());
  ctx.device().unregister_qp(q->qpn());
  q->shutdown();
  ctx.forget_async_events(qp);
  wait_events_acked(&qp->mutex, &qp->cond, &qp->events_completed, &q->events.reported);
  Pd& pd = q->pd();
  Cq* scq = q->send_cq();
  // An XRC_RECV QP's receive CQ is that of the SRQ it last delivered into: not its own.
  Cq* rcq = q->type() == IBV_QPT_XRC_RECV ? nullptr : q->recv_cq();
  Srq* srq = q->srq();
  Xrcd* xrcd = q->xrcd();
  ParentDomain* domain = q->domain();
  delete q;
  if (domain) domain->users.put();
  if (scq) scq->users.put();  // an XRC_RECV QP has no CQs
  if (rcq) rcq->users.put();
  if (srq) srq->users.put();
  if (xrcd) xrcd->users.put();
  pd.users.put();
  return 0;
}

// The checks of the kernel's ib_attach_mcast/ib_detach_mcast: a multicast GID
// (ff00::/8, or an IPv4-mapped class D address), a UD QP, and on an InfiniBand
// port a multicast LID (0xC000..0xFFFE); RoCE ignores the LID (Annex A16/A17).
static int check_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  if (!gid || qp->qp_type != IBV_QPT_UD) return EINVAL;
  const uint8_t* g = gid->raw;
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const bool mgid = g[0] == 0xff || (std::memcmp(g, v4mapped, 12) == 0 && (g[12] & 0xf0) == 0xe0);
  if (!mgid) return EINVAL;
  Device& dev = Qp::from(qp)->context().device();
  if (dev.link_layer() == LinkLayer::kInfiniBand && (lid < 0xC000 || lid == 0xFFFF)) return EINVAL;
  return 0;
}

int EmuProvider::attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  if (failed(qp->context)) return EIO;
  if (int err = lookup_write(qp->context, ObjectType::qp, qp, qp->handle)) return err;
  if (int err = check_mcast(qp, gid, lid)) return err;
  Qp* q = Qp::from(qp);
  return q->context().device().attach_mcast(q->qpn(), *gid, lid);
}

int EmuProvider::detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  // uverbs looks the pair up in the QP's list first: not attached is EINVAL.
  if (!gid) return EINVAL;
  if (int err = lookup_write(qp->context, ObjectType::qp, qp, qp->handle)) return err;
  Qp* q = Qp::from(qp);
  return q->context().device().detach_mcast(q->qpn(), *gid, lid);
}

}  // namespace softverbs::emu

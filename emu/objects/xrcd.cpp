// XRC domains (ibv_open_xrcd/ibv_close_xrcd), XRC SRQs (ibv_create_srq_ex with
// IBV_SRQT_XRC) and SRQ numbers (ibv_get_srq_num): the verbs_context slots
// rdma-core's inline verbs call, and the per-device table of SRQ numbers the
// XRC responder resolves an XRCETH with (IBTA 9.5, 14.2.4).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <pthread.h>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "emu/objects/domain.hpp"
#include "emu/objects/objects.hpp"
#include "emu/objects/ops.hpp"
#include "emu/objects/trace.hpp"
#include "emu/provider.hpp"
#include "emu/qp/qp.hpp"
#include "emu/qp/wr_batch.hpp"
#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"

namespace softverbs::emu {
namespace {

// Domains opened on a file, by (device, inode): later opens of the same file
// on the same device find the same domain while any handle on it lives (the
// kernel's xrcd_table). Weak, so the last close forgets the domain.
struct DomainKey {
  int device_index;
  dev_t dev;
  ino_t ino;
  friend bool operator<(const DomainKey& a, const DomainKey& b) {
    return std::tie(a.device_index, a.dev, a.ino) < std::tie(b.device_index, b.dev, b.ino);
  }
};
std::mutex g_domains_mu;
std::map<DomainKey, std::weak_ptr<XrcDomain>> g_domains;

// SRQ numbers per device. 24 bits on the wire (XRCETH); 0 is never handed out
// so that a zeroed XRCETH names no SRQ.
struct SrqTable {
  uint32_t next = 1;
  std::unordered_map<uint32_t, Srq*> srqs;
};
std::mutex g_srq_mu;
std::map<const Device*, SrqTable> g_srqs;
constexpr uint32_t kSrqnMask = 0xFFFFFF;

// ibv_open_xrcd as mlx5 over the kernel does it (ibv_cmd_open_xrcd,
// ib_uverbs_open_xrcd): comp_mask must name the fd and the oflags; an fd names
// the file whose domain is shared (by its inode), -1 asks for a private domain
// whatever the oflags say; without O_CREAT the file's domain must exist
// (EAGAIN), with O_EXCL it must not (EINVAL: the kernel's answers, where
// open(2) would say ENOENT and EEXIST).
ibv_xrcd* open_xrcd_unguarded(ibv_context* context, ibv_xrcd_init_attr* attr) {
  Context* ctx = Context::from(context);
  if (ctx->device().fatal()) return fail<ibv_xrcd>(EIO);
  if (attr->comp_mask >= IBV_XRCD_INIT_ATTR_RESERVED) return fail<ibv_xrcd>(EOPNOTSUPP);
  if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS))
    return fail<ibv_xrcd>(EINVAL);
  std::shared_ptr<XrcDomain> domain;
  if (attr->fd == -1) {
    domain = std::make_shared<XrcDomain>();
    domain->device_index = ctx->device().index();
  } else {
    // Any other negative number is a bad descriptor, as fdget finds it.
    struct stat st {};
    if (fstat(attr->fd, &st) != 0) return fail<ibv_xrcd>(EBADF);
    const DomainKey key{ctx->device().index(), st.st_dev, st.st_ino};
    std::lock_guard lock(g_domains_mu);
    auto it = g_domains.find(key);
    if (it != g_domains.end()) domain = it->second.lock();
    if (domain && (attr->oflags & O_EXCL)) return fail<ibv_xrcd>(EINVAL);
    if (!domain) {
      if (!(attr->oflags & O_CREAT)) return fail<ibv_xrcd>(EAGAIN);
      domain = std::make_shared<XrcDomain>();
      domain->device_index = key.device_index;
      domain->dev = key.dev;
      domain->ino = key.ino;
      domain->anonymous = false;
      g_domains[key] = domain;
    }
  }
  auto xrcd = std::make_unique<Xrcd>(*ctx, std::move(domain));
  xrcd->number = ctx->handles.add(ObjectType::xrcd, xrcd->ibv());
  ctx->users.get();
  return xrcd.release()->ibv();
}

// ibv_close_xrcd: EBUSY while XRC SRQs created through this handle exist.
int close_xrcd(ibv_xrcd* xrcd) {
  Context& ctx = *Context::from(xrcd->context);
  if (int err = ctx.handles.check(ObjectType::xrcd, xrcd, Xrcd::from(xrcd)->number)) return err;
  Xrcd* x = Xrcd::from(xrcd);
  if (x->users.busy()) return EBUSY;
  ctx.handles.remove(x->number);
  {
    // Drop the table entry with the last handle on the domain.
    std::lock_guard lock(g_domains_mu);
    const std::shared_ptr<XrcDomain>& d = x->domain();
    if (!d->anonymous && d.use_count() == 1) g_domains.erase(DomainKey{d->device_index, d->dev, d->ino});
    delete x;
  }
  ctx.users.put();
  return 0;
}

// ibv_create_srq_ex beyond the basic form (which rdma-core's inline verb sends
// to ibv_create_srq): an XRC SRQ needs its domain, its CQ and its PD (mlx5's
// and the kernel's checks: EINVAL otherwise); tag-matching SRQs are not
// offered (EOPNOTSUPP).
ibv_srq* create_srq_ex_unguarded(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  Context* ctx = Context::from(context);
  if (ctx->device().fatal()) return fail<ibv_srq>(EIO);
  const uint32_t mask = attr->comp_mask;
  if (mask >= IBV_SRQ_INIT_ATTR_RESERVED) return fail<ibv_srq>(EINVAL);
  const ibv_srq_type type = (mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
  if (type == IBV_SRQT_TM) return fail<ibv_srq>(EOPNOTSUPP);
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) return fail<ibv_srq>(EINVAL);
  if (!(mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd || attr->pd->context != context) return fail<ibv_srq>(EINVAL);
  Xrcd* xrcd = nullptr;
  Cq* cq = nullptr;
  if (type == IBV_SRQT_XRC) {
    if (!(mask & IBV_SRQ_INIT_ATTR_XRCD) || !(mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->xrcd || !attr->cq)
      return fail<ibv_srq>(EINVAL);
    if (attr->xrcd->context != context || attr->cq->context != context) return fail<ibv_srq>(EINVAL);
    xrcd = Xrcd::from(attr->xrcd);
    if (int err = ctx->handles.check(ObjectType::xrcd, attr->xrcd, xrcd->number)) return fail<ibv_srq>(err);
    if (int err = ctx->handles.check(ObjectType::cq, attr->cq, attr->cq->handle)) return fail<ibv_srq>(err);
    cq = Cq::from(attr->cq);
  }
  // ibv_srq_init_attr_ex begins with the fields of ibv_srq_init_attr (rdma-core
  // casts it the same way); the basic creation makes the checks they share.
  ibv_srq* srq = EmuProvider::instance().create_srq(attr->pd, reinterpret_cast<ibv_srq_init_attr*>(attr));
  if (!srq || type == IBV_SRQT_BASIC) return srq;
  Srq* s = Srq::from(srq);
  s->xrcd = xrcd;
  s->cq = cq;
  xrcd->users.get();
  cq->users.get();
  return srq;
}

int get_srq_num(ibv_srq* srq, uint32_t* srq_num) {
  Srq* s = Srq::from(srq);
  if (int err = s->context().handles.check(ObjectType::srq, srq, srq->handle)) return err;
  *srq_num = s->srqn;
  return 0;
}

// The XRC QPs (IBTA 14.2.4.3): an XRC_SEND (initiator) QP has a send queue
// and a send CQ on its PD and no receive side (its receive CQ is ignored); an
// XRC_RECV (target) QP has neither queue nor CQ, only its domain, and
// delivers into the XRC SRQs its requests name. The ibv_wr_* API is offered
// on XRC_SEND with mlx5's operations (the RC set, plus ibv_wr_set_xrc_srqn);
// an XRC_RECV QP has no send queue (EOPNOTSUPP, as mlx5_qp_fill_wr_pfns).
ibv_qp* create_xrc_qp_unguarded(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  Context* ctx = Context::from(context);
  if (ctx->device().fatal()) return fail<ibv_qp>(EIO);
  const bool extended = attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (extended && (attr->qp_type != IBV_QPT_XRC_SEND || (attr->send_ops_flags & ~supported_send_ops(attr->qp_type))))
    return fail<ibv_qp>(EOPNOTSUPP);
  ibv_qp_init_attr base{};
  base.qp_context = attr->qp_context;
  base.qp_type = attr->qp_type;
  base.sq_sig_all = attr->sq_sig_all;
  Charge charge = ctx->device().charge(ObjectType::qp);
  if (!charge) return fail<ibv_qp>(ENOMEM);  // max_qp QPs exist
  std::unique_ptr<Qp> qp;
  Pd* pd = nullptr;
  Xrcd* xrcd = nullptr;
  Cq* scq = nullptr;
  ParentDomain* domain = nullptr;
  if (attr->qp_type == IBV_QPT_XRC_SEND) {
    if (attr->pd->context != context || !attr->send_cq || attr->send_cq->context != context)
      return fail<ibv_qp>(EINVAL);
    if (int err = ctx->handles.check(ObjectType::pd, attr->pd, attr->pd->handle)) return fail<ibv_qp>(err);
    if (int err = ctx->handles.check(ObjectType::cq, attr->send_cq, attr->send_cq->handle)) return fail<ibv_qp>(err);
    const ibv_qp_cap& cap = attr->cap;
    if (cap.max_send_wr > static_cast<uint32_t>(personality().max_qp_wr) ||
        cap.max_send_sge > static_cast<uint32_t>(personality().max_sge) || cap.max_inline_data > personality().max_inline_data)
      return fail<ibv_qp>(EINVAL);
    base.cap = cap;
    base.cap.max_recv_wr = base.cap.max_recv_sge = 0;
    // Inline room at least as large as the SGEs' descriptors, as for every
    // send queue (caps::granted_inline_data); what is granted is written back.
    base.cap.max_inline_data = caps::granted_inline_data(cap, personality().max_inline_data);
    // Inside, the send CQ stands in for the receive CQ the QP does not have.
    base.send_cq = base.recv_cq = attr->send_cq;
    pd = Pd::from(attr->pd);
    scq = Cq::from(attr->send_cq);
    // A parent domain's allocator holds the send queue, as for any QP.
    domain = parent_domain_of(attr->pd);
    qp = std::make_unique<Qp>(*pd, base, domain);
    qp->ibv()->pd = attr->pd;
    if (extended) qp->make_extended();
    qp->ibv()->recv_cq = attr->recv_cq;  // as given: rdma-core keeps what the caller passed
  } else {
    if (attr->xrcd->context != context) return fail<ibv_qp>(EINVAL);
    xrcd = Xrcd::from(attr->xrcd);
    if (int err = ctx->handles.check(ObjectType::xrcd, attr->xrcd, xrcd->number)) return fail<ibv_qp>(err);
    pd = &xrcd->qp_pd();
    qp = std::make_unique<Qp>(*pd, base);
    qp->set_xrcd(xrcd);
    // What the caller passed, as rdma-core's set_qp copies it (librdmacm then
    // takes it as the id's PD); NULL when none.
    qp->ibv()->pd = (attr->comp_mask & IBV_QP_INIT_ATTR_PD) ? attr->pd : nullptr;
  }
  qp->charge = std::move(charge);
  publish_qp(*ctx, *qp);
  if (xrcd) {
    // The domain finds it by number for ibv_open_qp; this is its first handle.
    XrcDomain& d = *xrcd->domain();
    std::lock_guard lock(d.mu);
    d.tgt_qps[qp->qpn()] = XrcDomain::TgtQp{qp.get(), 1};
  }
  attr->cap = qp->cap();
  trace_object(ctx->device(), "create_qp", qp->qpn());
  pd->users.get();
  if (scq) {
    scq->users.get();  // as send CQ and as the stand-in receive CQ: destroy_qp puts both
    scq->users.get();
  }
  if (xrcd) xrcd->users.get();
  if (domain) domain->users.get();
  return qp.release()->ibv();
}

// A handle ibv_open_qp gives on an XRC_RECV QP: a public struct of its own in
// the opener's context (its number, its qp_context) whose owner is the shared
// QP itself, so that every verb finding the QP through the struct (query,
// modify) acts on the one QP, as the kernel's opened ib_qp forwards to its
// real_qp. The Handle comes first: the struct's address is the object's.
struct OpenedQp {
  Handle<ibv_qp_ex, Qp> handle;
  Xrcd* via = nullptr;  // the domain handle it was opened through (one of its users)
};
static_assert(std::is_standard_layout_v<OpenedQp>);

// ibv_open_qp as mlx5 over the kernel does it: rdma-core's ibv_cmd_open_qp
// wants the XRCD, the number and the type in comp_mask (EINVAL; an unknown bit
// EOPNOTSUPP); ib_uverbs_open_qp finds the XRCD by its number in this context
// and ib_open_qp wants an XRC target QP of that number in the domain: EINVAL
// for each. Only XRC_RECV QPs can be opened (IBTA 14.2.4.3: other QPs belong
// to one consumer).
ibv_qp* open_qp_unguarded(ibv_context* context, ibv_qp_open_attr* attr) {
  Context* ctx = Context::from(context);
  if (ctx->device().fatal()) return fail<ibv_qp>(EIO);
  if (attr->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED) return fail<ibv_qp>(EOPNOTSUPP);
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_TYPE;
  if ((attr->comp_mask & kNeeded) != kNeeded) return fail<ibv_qp>(EINVAL);
  if (!attr->xrcd || attr->xrcd->context != context) return fail<ibv_qp>(EINVAL);
  Xrcd* via = Xrcd::from(attr->xrcd);
  if (ctx->handles.check(ObjectType::xrcd, attr->xrcd, via->number)) return fail<ibv_qp>(EINVAL);
  if (attr->qp_type != IBV_QPT_XRC_RECV) return fail<ibv_qp>(EINVAL);
  auto opened = std::make_unique<OpenedQp>();
  XrcDomain& d = *via->domain();
  std::lock_guard lock(d.mu);
  auto it = d.tgt_qps.find(attr->qp_num);
  if (it == d.tgt_qps.end()) return fail<ibv_qp>(EINVAL);
  Qp* shared = it->second.qp;
  ibv_qp& pub = opened->handle.pub.qp_base;
  pub.context = context;
  pub.qp_context = attr->qp_context;
  pub.qp_num = shared->qpn();
  pub.qp_type = IBV_QPT_XRC_RECV;
  pub.state = shared->state();
  pthread_mutex_init(&pub.mutex, nullptr);
  pthread_cond_init(&pub.cond, nullptr);
  opened->handle.owner = shared;
  opened->via = via;
  pub.handle = ctx->handles.add(ObjectType::qp, &pub);
  ++it->second.handles;
  via->users.get();
  return &opened.release()->handle.pub.qp_base;
}

}  // namespace

// Reached from ibv_create_qp (behind the ABI's barrier) and from the inline
// ibv_create_qp_ex (op_create_qp_ex's): both turn an exception into ENOMEM/EIO.
ibv_qp* create_xrc_qp(ibv_context* context, ibv_qp_init_attr_ex* attr) { return create_xrc_qp_unguarded(context, attr); }

ibv_qp* op_open_qp(ibv_context* context, ibv_qp_open_attr* attr) {
  return guarded([&] { return open_qp_unguarded(context, attr); });
}

// The creator's handle may go first: its number is freed, but the QP keeps
// its public struct, its context and its creator's domain handle (whose
// ibv_close_xrcd answers EBUSY meanwhile) until the last opened handle goes.
// No async event reaches an opened handle: they go to the creator's context.
Qp* release_xrc_recv_handle(ibv_qp* handle) {
  Qp* q = Qp::from(handle);
  XrcDomain& d = *q->xrcd()->domain();
  Context& ctx = *Context::from(handle->context);
  std::lock_guard lock(d.mu);
  ctx.handles.remove(handle->handle);
  if (handle != q->ibv()) {
    auto* opened = reinterpret_cast<OpenedQp*>(handle);
    Xrcd* via = opened->via;
    pthread_mutex_destroy(&handle->mutex);
    pthread_cond_destroy(&handle->cond);
    delete opened;
    via->users.put();
  }
  auto it = d.tgt_qps.find(q->qpn());
  if (it == d.tgt_qps.end() || --it->second.handles > 0) return nullptr;
  d.tgt_qps.erase(it);
  return q;
}

Xrcd::Xrcd(Context& ctx, std::shared_ptr<XrcDomain> domain) : ctx_(ctx), domain_(std::move(domain)), qp_pd_(ctx) {
  handle_.owner = this;
  handle_.pub.context = ctx.ibv();
}

uint32_t register_srq(const Device& dev, Srq* srq) {
  std::lock_guard lock(g_srq_mu);
  SrqTable& t = g_srqs[&dev];
  // Numbers wrap within 24 bits, skipping 0 and those in use.
  for (;;) {
    const uint32_t n = t.next;
    t.next = (t.next & kSrqnMask) + 1 > kSrqnMask ? 1 : t.next + 1;
    if (!t.srqs.count(n)) {
      t.srqs[n] = srq;
      return n;
    }
  }
}

bool unregister_srq_if_unused(const Device& dev, Srq* srq) {
  std::lock_guard lock(g_srq_mu);
  if (srq->users.busy()) return false;
  auto it = g_srqs.find(&dev);
  if (it == g_srqs.end()) return true;
  it->second.srqs.erase(srq->srqn);
  if (it->second.srqs.empty()) g_srqs.erase(it);
  return true;
}

Srq* acquire_srq(const Device& dev, uint32_t srqn) {
  std::lock_guard lock(g_srq_mu);
  auto it = g_srqs.find(&dev);
  if (it == g_srqs.end()) return nullptr;
  auto s = it->second.srqs.find(srqn);
  if (s == it->second.srqs.end()) return nullptr;
  s->second->users.get();
  return s->second;
}

ibv_xrcd* op_open_xrcd(ibv_context* context, ibv_xrcd_init_attr* attr) {
  return guarded([&] { return open_xrcd_unguarded(context, attr); });
}

// rdma-core's ibv_close_xrcd returns the errno value (and leaves it in errno).
int op_close_xrcd(ibv_xrcd* xrcd) {
  int err = close_xrcd(xrcd);
  if (err) errno = err;
  return err;
}

ibv_srq* op_create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  return guarded([&] { return create_srq_ex_unguarded(context, attr); });
}

int op_get_srq_num(ibv_srq* srq, uint32_t* srq_num) { return get_srq_num(srq, srq_num); }

}  // namespace softverbs::emu

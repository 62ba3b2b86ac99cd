// XRC domains (ibv_open_xrcd/ibv_close_xrcd), XRC SRQs (ibv_create_srq_ex with
// IBV_SRQT_XRC) and SRQ numbers (ibv_get_srq_num): the verbs_context slots
// rdma-core's inline verbs call, and the per-device table of SRQ numbers the
// XRC responder resolves an XRCETH with (IBTA 9.5, 14.2.4).
#include <sys/stat.h>

#include <cerrno>
#include <fcntl.h>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "emu/objects/objects.hpp"
#include "emu/objects/ops.hpp"
#include "emu/provider.hpp"
#include "emu/qp/qp.hpp"
#include "emu/device/caps.hpp"

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
// the file whose domain is shared, -1 asks for a private domain; without
// O_CREAT the file's domain must exist, with O_EXCL it must not (EINVAL).
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
    struct stat st {};
    if (fstat(attr->fd, &st) != 0) return fail<ibv_xrcd>(EBADF);
    const DomainKey key{ctx->device().index(), st.st_dev, st.st_ino};
    std::lock_guard lock(g_domains_mu);
    auto it = g_domains.find(key);
    if (it != g_domains.end()) domain = it->second.lock();
    if (domain && (attr->oflags & O_EXCL)) return fail<ibv_xrcd>(EINVAL);
    if (!domain) {
      if (!(attr->oflags & O_CREAT)) return fail<ibv_xrcd>(EINVAL);
      domain = std::make_shared<XrcDomain>(XrcDomain{key.device_index, key.dev, key.ino, false});
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
// delivers into the XRC SRQs its requests name. The ibv_wr_* API is not
// offered on either (EOPNOTSUPP).
ibv_qp* create_xrc_qp_unguarded(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  Context* ctx = Context::from(context);
  if (ctx->device().fatal()) return fail<ibv_qp>(EIO);
  if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) return fail<ibv_qp>(EOPNOTSUPP);
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
  if (attr->qp_type == IBV_QPT_XRC_SEND) {
    if (attr->pd->context != context || !attr->send_cq || attr->send_cq->context != context)
      return fail<ibv_qp>(EINVAL);
    if (int err = ctx->handles.check(ObjectType::pd, attr->pd, attr->pd->handle)) return fail<ibv_qp>(err);
    if (int err = ctx->handles.check(ObjectType::cq, attr->send_cq, attr->send_cq->handle)) return fail<ibv_qp>(err);
    const ibv_qp_cap& cap = attr->cap;
    if (cap.max_send_wr > static_cast<uint32_t>(caps::kMaxQpWr) ||
        cap.max_send_sge > static_cast<uint32_t>(caps::kMaxSge) || cap.max_inline_data > caps::kMaxInlineData)
      return fail<ibv_qp>(EINVAL);
    base.cap = cap;
    base.cap.max_recv_wr = base.cap.max_recv_sge = 0;
    // Inside, the send CQ stands in for the receive CQ the QP does not have.
    base.send_cq = base.recv_cq = attr->send_cq;
    pd = Pd::from(attr->pd);
    scq = Cq::from(attr->send_cq);
    qp = std::make_unique<Qp>(*pd, base);
    qp->ibv()->recv_cq = attr->recv_cq;  // as given: rdma-core keeps what the caller passed
  } else {
    if (attr->xrcd->context != context) return fail<ibv_qp>(EINVAL);
    xrcd = Xrcd::from(attr->xrcd);
    if (int err = ctx->handles.check(ObjectType::xrcd, attr->xrcd, xrcd->number)) return fail<ibv_qp>(err);
    pd = &xrcd->qp_pd();
    qp = std::make_unique<Qp>(*pd, base);
    qp->set_xrcd(xrcd);
    qp->ibv()->pd = nullptr;
  }
  qp->charge = std::move(charge);
  publish_qp(*ctx, *qp);
  attr->cap = qp->cap();
  pd->users.get();
  if (scq) {
    scq->users.get();  // as send CQ and as the stand-in receive CQ: destroy_qp puts both
    scq->users.get();
  }
  if (xrcd) xrcd->users.get();
  return qp.release()->ibv();
}

}  // namespace

// Reached from ibv_create_qp (behind the ABI's barrier) and from the inline
// ibv_create_qp_ex (op_create_qp_ex's): both turn an exception into ENOMEM/EIO.
ibv_qp* create_xrc_qp(ibv_context* context, ibv_qp_init_attr_ex* attr) { return create_xrc_qp_unguarded(context, attr); }

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
  try {
    return open_xrcd_unguarded(context, attr);
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
  } catch (...) {
    errno = EIO;
  }
  return nullptr;
}

// rdma-core's ibv_close_xrcd returns the errno value (and leaves it in errno).
int op_close_xrcd(ibv_xrcd* xrcd) {
  int err = close_xrcd(xrcd);
  if (err) errno = err;
  return err;
}

ibv_srq* op_create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  try {
    return create_srq_ex_unguarded(context, attr);
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
  } catch (...) {
    errno = EIO;
  }
  return nullptr;
}

int op_get_srq_num(ibv_srq* srq, uint32_t* srq_num) { return get_srq_num(srq, srq_num); }

}  // namespace softverbs::emu

// Memory windows as objects (IBTA 10.6.7): ibv_alloc_mw, ibv_dealloc_mw and
// ibv_bind_mw, reached through the context's ops slots (rdma-core inlines
// them). Binding itself is a work request the QP's requester executes
// (emu/memory/window.hpp): ibv_bind_mw posts one for a type 1 window.
//
// Object numbers (emu/objects/handle.hpp): in rdma-core 44 ibv_alloc_mw is a
// write command naming the PD (any bad number: EINVAL) and ibv_dealloc_mw an
// ioctl naming the window (ENOENT for a free number, EINVAL for another
// type's). Binding is no command at all: the provider posts it in user space,
// so ibv_bind_mw and IBV_WR_BIND_MW read no number, as the rest of the data path.
#include <cerrno>
#include <memory>
#include <mutex>
#include <new>

#include "emu/memory/window.hpp"
#include "emu/objects/ops.hpp"
#include "emu/qp/qp.hpp"

namespace softverbs::emu {

Mw::Mw(Pd& pd, ibv_mw_type type) : pd_(pd) {
  handle_.owner = this;
  ibv_mw& m = handle_.pub;
  m.context = pd.context().ibv();
  m.pd = pd.ibv();
  m.type = type;
}

namespace {

ibv_mw* alloc_mw_unguarded(ibv_pd* pd, ibv_mw_type type) {
  Pd* p = Pd::from(pd);
  Context& ctx = p->context();
  Device& dev = ctx.device();
  // The write command finds its PD by number (uobj_get_obj_read): EINVAL.
  if (ctx.handles.check(ObjectType::pd, pd, pd->handle)) {
    errno = EINVAL;
    return nullptr;
  }
  if (dev.fatal()) {
    errno = EIO;
    return nullptr;
  }
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
    errno = EINVAL;
    return nullptr;
  }
  Charge charge = dev.charge(ObjectType::mw);
  if (!charge) {
    errno = ENOMEM;  // max_mw windows exist
    return nullptr;
  }
  auto mw = std::make_unique<Mw>(*p, type);
  mw->charge = std::move(charge);
  mw->ibv()->pd = pd;  // a parent domain stays what the window names
  const uint32_t handle = ctx.handles.add(ObjectType::mw, mw->ibv());
  uint32_t index;
  try {
    index = dev.register_mw(mw.get());
  } catch (...) {
    ctx.handles.remove(handle);
    throw;
  }
  // A type 1 window is valid (unbound) from the start, a type 2 one free; both
  // start with key byte 0, so the first ibv_inc_rkey gives 1.
  mw->rkey = window_rkey(index, 0);
  mw->ibv()->rkey = mw->rkey;
  // The window's object number; its key index stays in its rkey.
  mw->ibv()->handle = handle;
  p->users.get();
  return mw.release()->ibv();
}

}  // namespace

// Reached from the application's inline verbs: no exception may leave them.
ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  return guarded([&] { return alloc_mw_unguarded(pd, type); });
}

int op_dealloc_mw(ibv_mw* mw) {
  Mw* m = Mw::from(mw);
  Pd& pd = m->pd();
  Context& ctx = pd.context();
  Device& dev = ctx.device();
  // The destroy ioctl finds the window by its number; rdma-core leaves the
  // command's errno in errno too.
  if (int err = ctx.handles.check(ObjectType::mw, mw, mw->handle)) {
    errno = err;
    return err;
  }
  {
    // A bound window may be deallocated: its binding ends (the region may then
    // be deregistered) and its rkey stops working at once, as on rxe and mlx5.
    std::unique_lock lock(dev.mr_lock());
    unbind_window(*m);
    dev.unregister_mw(m->rkey >> 8);  // the key index: the rkey's key byte changes, it does not
  }
  ctx.handles.remove(mw->handle);
  delete m;
  pd.users.put();
  return 0;
}

int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind) {
  // ibv_bind_mw (inline) has checked the type, the PDs and that a missing region
  // comes with no range. A type 1 window is never zero-based (o10-36.2.2); mlx5
  // refuses that here, before posting.
  if (mw_bind->bind_info.mw_access_flags & IBV_ACCESS_ZERO_BASED) return EINVAL;
  if (qp->context != mw->context) return EINVAL;
  return guarded([&]() -> int {
    // The bind is a work request on the QP, with the window's next key byte.
    ibv_send_wr wr{};
    wr.wr_id = mw_bind->wr_id;
    wr.send_flags = mw_bind->send_flags;
    wr.opcode = IBV_WR_BIND_MW;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info = mw_bind->bind_info;
    ibv_send_wr* bad = nullptr;
    if (int err = Qp::from(qp)->post_send(&wr, &bad, true)) return err;
    // The application's copy of the rkey changes when the bind is posted, as on
    // mlx5: the work request's completion says whether it took effect.
    mw->rkey = wr.bind_mw.rkey;
    return 0;
  });
}

}  // namespace softverbs::emu

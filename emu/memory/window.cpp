// Memory windows: binding, invalidation and remote access through a window's
// rkey (IBTA 10.6.7). The rules are those of the spec's compliance statements,
// cited where each is checked; rxe (rxe_mw.c) is the software model followed
// where the spec leaves room.
#include "emu/memory/window.hpp"

namespace softverbs::emu {
namespace {

constexpr unsigned kRemoteRights = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

void release(Mw& mw) {
  if (mw.mr) --mw.mr->bound_windows;
  mw.mr = nullptr;
  mw.addr = 0;
  mw.length = 0;
  mw.access = 0;
  mw.zero_based = false;
  mw.qpn = 0;
}

// The region-side rules of a bind with a non-zero length.
bool region_allows(const Mw& mw, const BindRequest& req) {
  const Mr& mr = *req.mr;
  if (mr.pd() != &mw.pd()) return false;
  // C10-73: the region must have been registered with the right to bind windows.
  if (!(mr.access() & IBV_ACCESS_MW_BIND)) return false;
  // C10-74: a window that can be written remotely needs a locally writable region.
  if ((req.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(mr.access() & IBV_ACCESS_LOCAL_WRITE))
    return false;
  // C10-75: the window lies inside the region (for a zero-based window too: its
  // offsets start at addr).
  return mr.covers(req.addr, req.length);
}

}  // namespace

bool bind_window(const Pd& qp_pd, uint32_t qpn, const BindRequest& req) {
  Mw& mw = *req.mw;
  const bool zero_based = (req.access & IBV_ACCESS_ZERO_BASED) != 0;
  if (mw.type() == IBV_MW_TYPE_1) {
    // o10-36.2.2: a type 1 window is never zero-based.
    if (zero_based) return false;
  } else {
    // o10-37.2.30: a type 2 window is bound only when free; C10-72: by a QP of
    // its own PD; o10-37.2.40: to a region, with a length (it is freed by
    // invalidation, not by a bind of length 0).
    if (mw.mr || &mw.pd() != &qp_pd || !req.mr || req.length == 0) return false;
  }
  if (req.length && (!req.mr || !region_allows(mw, req))) return false;
  release(mw);
  mw.rkey = rebound_rkey(mw.rkey, req.rkey);
  if (req.length) {
    mw.mr = req.mr;
    ++req.mr->bound_windows;
    mw.addr = req.addr;
    mw.length = req.length;
    mw.access = req.access & kRemoteRights;
    mw.zero_based = zero_based;
    // Type 2B: the window is usable only through the QP that bound it.
    if (mw.type() == IBV_MW_TYPE_2) mw.qpn = qpn;
  }
  return true;
}

bool invalidate_window(Device& dev, const Pd& pd, uint32_t qpn, uint32_t rkey, Invalidation how) {
  Mw* mw = dev.find_mw_locked(rkey);
  // The rkey must be the window's current one, and only a bound type 2 window
  // can be invalidated (o10-37.2.26: not a type 1).
  if (!mw || mw->rkey != rkey || mw->type() != IBV_MW_TYPE_2 || !mw->mr) return false;
  // Remotely, the window must belong to the responder: its PD, its QP (type 2B).
  if (how == Invalidation::remote && (&mw->pd() != &pd || mw->qpn != qpn)) return false;
  release(*mw);
  return true;
}

void unbind_window(Mw& mw) { release(mw); }

uint8_t* window_access(Device& dev, const Pd& pd, uint32_t qpn, uint32_t rkey, uint64_t va, uint64_t len,
                       unsigned access) {
  Mw* mw = dev.find_mw_locked(rkey);
  if (!mw || mw->rkey != rkey || !mw->mr || &mw->pd() != &pd) return nullptr;
  if (mw->type() == IBV_MW_TYPE_2 && mw->qpn != qpn) return nullptr;
  if (!(mw->access & access)) return nullptr;
  // The offset into the window: a zero-based window is addressed from 0.
  uint64_t off = va;
  if (!mw->zero_based) {
    if (va < mw->addr) return nullptr;
    off = va - mw->addr;
  }
  if (off > mw->length || len > mw->length - off) return nullptr;
  const uint64_t iova = mw->addr + off;
  // The region's translation may have changed (ibv_rereg_mr) since the bind.
  if (!mw->mr->covers(iova, len)) return nullptr;
  return mw->mr->host_addr(iova);
}

}  // namespace softverbs::emu

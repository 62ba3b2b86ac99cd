// On-demand paging: ibv_advise_mr on an emulated device. The emulator never
// pins memory, so an ODP region (IBV_ACCESS_ON_DEMAND, explicit or implicit)
// is reached as any region is; what ODP adds is that its pages need not be
// mapped at registration, and the transport checks each access against the
// process's mappings (emu/memory/sge.cpp). Prefetch advice therefore has
// nothing to fault in: it checks what the kernel checks and succeeds.
#include <cerrno>
#include <mutex>
#include <new>
#include <shared_mutex>

#include "emu/memory/user_range.hpp"
#include "emu/objects/objects.hpp"
#include "emu/objects/ops.hpp"

namespace softverbs::emu {
namespace {

// ib_uverbs_advise_mr and mlx5_ib_advise_mr (rdma-core 44 passes the call to
// the kernel unchanged): flags beyond FLUSH and unknown advice are
// EOPNOTSUPP, an empty list EINVAL; every lkey must name an ODP region of the
// PD (writable for PREFETCH_WRITE), else ENOENT. With FLUSH the prefetch is
// synchronous and faults the pages in: a range outside the region, or not
// mapped, is EFAULT.
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
  if (flags & ~static_cast<uint32_t>(IBV_ADVISE_MR_FLAG_FLUSH)) return EOPNOTSUPP;
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if (num_sge == 0 || !sg_list) return EINVAL;
  Context& ctx = *Context::from(pd->context);
  if (int err = ctx.handles.check(ObjectType::pd, pd, pd->handle)) return err;
  Device& dev = ctx.device();
  const bool write = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
  std::shared_lock lock(dev.mr_lock());
  for (uint32_t i = 0; i < num_sge; ++i) {
    const ibv_sge& s = sg_list[i];
    Mr* mr = dev.find_mr_locked(s.lkey);
    if (!mr || mr->pd() != Pd::from(pd) || !(mr->access() & IBV_ACCESS_ON_DEMAND)) return ENOENT;
    if (write && !(mr->access() & IBV_ACCESS_LOCAL_WRITE)) return ENOENT;
    if (!(flags & IBV_ADVISE_MR_FLAG_FLUSH) || advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) continue;
    if (!mr->covers(s.addr, s.length)) return EFAULT;
    if (check_user_range(mr->host_addr(s.addr), s.length, write)) return EFAULT;
  }
  return 0;
}

// Reached from the application's inline ibv_advise_mr: no exception may leave it.
int op_advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
  return guarded([&] { return advise_mr(pd, advice, flags, sg_list, num_sge); });
}

}  // namespace

void install_odp_ops(verbs_context* vctx) { vctx->advise_mr = op_advise_mr; }

}  // namespace softverbs::emu

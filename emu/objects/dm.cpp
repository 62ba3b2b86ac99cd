// Device memory: ibv_alloc_dm, ibv_free_dm, ibv_memcpy_to_dm/from_dm and
// ibv_reg_dm_mr on an emulated device, with the limits and errnos of ConnectX
// (mlx5 provider and mlx5_ib MEMIC allocation, rdma-core 44). The memory is a
// buffer the device owns; a region on it is zero-based, so the transport's key
// checks (emu/memory/sge.cpp) resolve its offsets into that buffer.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/objects/objects.hpp"
#include "emu/objects/ops.hpp"

namespace softverbs::emu {

// ---- the device's allocator --------------------------------------------------

uint8_t* Device::dm_memory() {
  std::lock_guard lock(mu_);
  if (!dm_mem_) dm_mem_ = std::make_unique<uint8_t[]>(caps::kMaxDmSize);  // zero-filled
  return dm_mem_.get();
}

uint64_t Device::alloc_dm_range(uint64_t size, uint32_t log_align) {
  std::lock_guard lock(mu_);
  const uint64_t align = std::max<uint64_t>(uint64_t{1} << log_align, caps::kDmUnit);
  // First fit between the used ranges, in offset order.
  uint64_t at = 0;
  for (auto [off, len] : dm_used_) {
    if (off >= at && off - at >= size) break;
    at = std::max(at, (off + len + align - 1) & ~(align - 1));
  }
  if (at > caps::kMaxDmSize || caps::kMaxDmSize - at < size) return UINT64_MAX;
  dm_used_.emplace(at, size);
  return at;
}

void Device::free_dm_range(uint64_t offset) {
  std::lock_guard lock(mu_);
  dm_used_.erase(offset);
}

// ---- the DM object ---------------------------------------------------------------

namespace {

// The ibv_dm memcpy ops (mlx5_access_dm): the range must lie inside the DM
// (EFAULT otherwise) and, as the hardware copies 4-byte words, offset and
// length must be multiples of 4 (EINVAL).
int check_dm_access(ibv_dm* dm, uint64_t offset, size_t length) {
  Dm* d = Dm::from(dm);
  if (offset > d->length() || length > d->length() - offset) return EFAULT;
  if ((offset | length) & 3) return EINVAL;
  return 0;
}

int memcpy_to_dm(ibv_dm* dm, uint64_t dm_offset, const void* host_addr, size_t length) {
  if (int err = check_dm_access(dm, dm_offset, length)) return err;
  if (length) std::memcpy(Dm::from(dm)->memory() + dm_offset, host_addr, length);
  return 0;
}

int memcpy_from_dm(void* host_addr, ibv_dm* dm, uint64_t dm_offset, size_t length) {
  if (int err = check_dm_access(dm, dm_offset, length)) return err;
  if (length) std::memcpy(host_addr, Dm::from(dm)->memory() + dm_offset, length);
  return 0;
}

}  // namespace

Dm::Dm(Context& ctx, uint64_t offset, uint64_t length) : ctx_(ctx), offset_(offset), length_(length) {
  handle_.owner = this;
  ibv_dm& d = handle_.pub;
  d.context = ctx.ibv();
  d.memcpy_to_dm = memcpy_to_dm;
  d.memcpy_from_dm = memcpy_from_dm;
  d.comp_mask = 0;
}

Dm::~Dm() { ctx_.device().free_dm_range(offset_); }

uint8_t* Dm::memory() const { return ctx_.device().dm_memory() + offset_; }

// ---- the verbs_context slots -------------------------------------------------------

namespace {

// The access flags mlx5 and mlx5_ib accept on a MEMIC region
// (MLX5_DM_ALLOWED_ACCESS, OPTIONAL_RANGE being a hint).
constexpr unsigned kDmAllowedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;

ibv_dm* alloc_dm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  Context& ctx = *Context::from(context);
  if (ctx.device().fatal()) return fail<ibv_dm>(EIO);
  // mlx5: unknown comp_mask bits, then the device's max_dm_size.
  if (attr->comp_mask) return fail<ibv_dm>(EINVAL);
  // A personality without device memory has no ibv_alloc_dm at all (rxe).
  if (personality().max_dm_size == 0) return fail<ibv_dm>(EOPNOTSUPP);
  if (attr->length > personality().max_dm_size) return fail<ibv_dm>(EINVAL);
  // mlx5_ib: the length rounded up to the allocation unit must not be 0, and the
  // alignment is bounded; a full device memory is ENOMEM.
  const uint64_t size = (attr->length + caps::kDmUnit - 1) & ~(caps::kDmUnit - 1);
  if (size == 0 || attr->log_align_req > caps::kDmMaxLogAlign) return fail<ibv_dm>(EINVAL);
  const uint64_t offset = ctx.device().alloc_dm_range(size, attr->log_align_req);
  if (offset == UINT64_MAX) return fail<ibv_dm>(ENOMEM);
  auto dm = std::make_unique<Dm>(ctx, offset, attr->length);
  std::memset(dm->memory(), 0, size);  // no data of an earlier DM shows through
  dm->ibv()->handle = ctx.handles.add(ObjectType::dm, dm->ibv());
  ctx.users.get();
  return dm.release()->ibv();
}

int free_dm(ibv_dm* dm) {
  Context& ctx = *Context::from(dm->context);
  if (int err = ctx.handles.check(ObjectType::dm, dm, dm->handle)) return errno = err;
  Dm* d = Dm::from(dm);
  if (d->users.busy()) return errno = EBUSY;  // a region still uses it (the kernel's usecnt)
  ctx.handles.remove(dm->handle);
  delete d;
  ctx.users.put();
  return 0;
}

ibv_mr* reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned access) {
  access &= ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE);
  // mlx5's allowed flags, then libibverbs: a DM region is always zero-based.
  if ((access & ~kDmAllowedAccess) || !(access & IBV_ACCESS_ZERO_BASED)) return fail<ibv_mr>(EINVAL);
  Context& ctx = *Context::from(pd->context);
  if (ctx.device().fatal()) return fail<ibv_mr>(EIO);
  if (int err = ctx.handles.check(ObjectType::pd, pd, pd->handle)) return fail<ibv_mr>(err);
  if (dm->context != pd->context) return fail<ibv_mr>(EINVAL);
  if (int err = ctx.handles.check(ObjectType::dm, dm, dm->handle)) return fail<ibv_mr>(err);
  // The kernel: ib_check_mr_access, and the range must lie inside the DM.
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE))
    return fail<ibv_mr>(EINVAL);
  Dm* d = Dm::from(dm);
  if (offset > d->length() || length > d->length() - offset) return fail<ibv_mr>(EINVAL);
  auto mr = std::make_unique<Mr>(*Pd::from(pd), nullptr, length, 0, access);
  mr->set_dm(d, d->memory() + offset);
  ibv_mr* pub = publish_mr(std::move(mr));
  if (pub) d->users.get();
  return pub;
}

ibv_dm* op_alloc_dm(ibv_context* context, ibv_alloc_dm_attr* attr) {
  return guarded([&] { return alloc_dm(context, attr); });
}
int op_free_dm(ibv_dm* dm) {
  return guarded([&] { return free_dm(dm); });
}
ibv_mr* op_reg_dm_mr(ibv_pd* pd, ibv_dm* dm, uint64_t offset, size_t length, unsigned access) {
  return guarded([&] { return reg_dm_mr(pd, dm, offset, length, access); });
}

}  // namespace

void install_dm_ops(verbs_context* vctx) {
  vctx->alloc_dm = op_alloc_dm;
  vctx->free_dm = op_free_dm;
  vctx->reg_dm_mr = op_reg_dm_mr;
}

}  // namespace softverbs::emu

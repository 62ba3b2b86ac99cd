// Protection domains, memory regions and address handles: the objects, and
// how a region becomes live (publish_mr).
#include "emu/device/personality.hpp"
#include "emu/objects/objects.hpp"

namespace softverbs::emu {

ibv_mr* publish_mr(std::unique_ptr<Mr> mr) {
  Pd* p = mr->pd();
  Context& ctx = p->context();
  mr->charge = ctx.device().charge(ObjectType::mr);
  if (!mr->charge) return fail<ibv_mr>(ENOMEM);  // max_mr regions exist
  const uint32_t handle = ctx.handles.add(ObjectType::mr, mr->ibv());
  try {
    const uint32_t key = ctx.device().register_mr(mr.get());
    mr->ibv()->lkey = key;
    // rxe hands a region without remote access rkey 0 (the personality's [mr]).
    constexpr unsigned kRemote = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    mr->ibv()->rkey = personality().local_only_rkey_zero && !(mr->access() & kRemote) ? 0 : key;
  } catch (...) {
    ctx.handles.remove(handle);
    throw;
  }
  mr->ibv()->handle = handle;
  p->users.get();
  return mr.release()->ibv();
}

Pd::Pd(Context& ctx) : ctx_(ctx) {
  handle_.owner = this;
  handle_.pub.context = ctx.ibv();
  handle_.pub.handle = 0;
}

Mr::Mr(Pd& pd, void* addr, size_t length, uint64_t iova, unsigned access) : pd_(&pd), iova_(iova), access_(access) {
  handle_.owner = this;
  ibv_mr& m = handle_.pub;
  m.context = pd.context().ibv();
  m.pd = pd.ibv();
  m.addr = addr;
  m.length = length;
}

void Mr::set_translation(void* addr, size_t length, uint64_t iova) {
  handle_.pub.addr = addr;
  handle_.pub.length = length;
  iova_ = iova;
}

bool Mr::covers(uint64_t iova, uint64_t len) const {
  uint64_t length = handle_.pub.length;
  if (iova < iova_) return false;
  uint64_t off = iova - iova_;
  return off <= length && len <= length - off;
}

uint8_t* Mr::host_addr(uint64_t iova) const {
  uint8_t* base = dm_host_ ? dm_host_ : static_cast<uint8_t*>(handle_.pub.addr);
  return base + (iova - iova_);
}

Ah::Ah(Pd& pd, const ibv_ah_attr& attr) : pd_(pd), attr_(attr) {
  handle_.owner = this;
  handle_.pub.context = pd.context().ibv();
  handle_.pub.pd = pd.ibv();
  handle_.pub.handle = 0;
}

}  // namespace softverbs::emu

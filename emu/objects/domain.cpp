// Thread domains, parent domains and queue buffers (domain.hpp, queue_buffer.hpp):
// ibv_alloc_td, ibv_dealloc_td and ibv_alloc_parent_domain with the checks and
// errnos of ConnectX's provider (rdma-core 44 mlx5_alloc_td, mlx5_dealloc_td,
// mlx5_alloc_parent_domain), and the allocator calls of its queue buffers
// (mlx5_alloc_buf_custom, mlx5_alloc_dbrec).
#include "emu/objects/domain.hpp"

#include <infiniband/mlx5dv.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <set>

#include "emu/objects/ops.hpp"

namespace softverbs::emu {

uint64_t resource_type_qp() { return MLX5DV_RES_TYPE_QP; }
uint64_t resource_type_srq() { return MLX5DV_RES_TYPE_SRQ; }
uint64_t resource_type_cq() { return MLX5DV_RES_TYPE_CQ; }
uint64_t resource_type_dbr() { return MLX5DV_RES_TYPE_DBR; }

// ---- queue buffers -------------------------------------------------------------

QueueBuffer::QueueBuffer(ParentDomain* domain, size_t size, size_t alignment, uint64_t resource_type,
                         bool heap_fallback)
    : size_(size), alignment_(alignment), type_(resource_type) {
  if (domain && domain->custom_alloc()) {
    void* p = domain->alloc(size, alignment, resource_type);
    if (p != IBV_ALLOCATOR_USE_DEFAULT) {
      // NULL is a refusal, except for an empty buffer (mlx5 accepts it then).
      if (!p && size) throw std::bad_alloc();
      domain_ = domain;
      data_ = p;
      custom_ = true;
      return;
    }
  }
  if (!heap_fallback) {
    size_ = 0;  // empty, as QueueBuffer()
    return;
  }
  // The allocator zero-fills what it returns (its contract); the heap's is
  // zero-filled here.
  data_ = ::operator new(size ? size : 1, std::align_val_t(alignment));
  std::memset(data_, 0, size);
}

QueueBuffer QueueBuffer::custom_only(ParentDomain* domain, size_t size, size_t alignment, uint64_t resource_type) {
  if (!domain || !domain->custom_alloc()) return QueueBuffer();
  return QueueBuffer(domain, size, alignment, resource_type, false);
}

QueueBuffer& QueueBuffer::operator=(QueueBuffer&& other) noexcept {
  if (this != &other) {
    release();
    domain_ = other.domain_;
    data_ = other.data_;
    size_ = other.size_;
    alignment_ = other.alignment_;
    type_ = other.type_;
    custom_ = other.custom_;
    other.data_ = nullptr;
    other.custom_ = false;
  }
  return *this;
}

void QueueBuffer::release() noexcept {
  if (custom_) {
    domain_->free(data_, type_);
  } else if (data_) {
    ::operator delete(data_, std::align_val_t(alignment_));
  }
  data_ = nullptr;
  custom_ = false;
}

// ---- the objects -------------------------------------------------------------------

namespace {

// The thread domains alive in the process, so that ibv_dealloc_td of a struct
// that is not one (or no longer) is refused instead of followed.
std::mutex g_td_mu;
std::set<const ibv_td*> g_tds;

bool td_known(const ibv_td* td) {
  std::lock_guard lock(g_td_mu);
  return g_tds.count(td) != 0;
}

}  // namespace

Td::Td(Context& ctx) : ctx_(ctx) {
  handle_.owner = this;
  handle_.pub.context = ctx.ibv();
}

ParentDomain::ParentDomain(Pd& pd, Td* td, const ibv_parent_domain_init_attr& attr) : pd_(pd), td_(td) {
  handle_.owner = &pd;
  // ibv_initialize_parent_domain: the PD's context and number.
  handle_.pub.context = pd.ibv()->context;
  handle_.pub.handle = pd.ibv()->handle;
  if (attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) {
    alloc_ = attr.alloc;
    free_ = attr.free;
  }
  if (attr.comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT) pd_context_ = attr.pd_context;
}

void* ParentDomain::alloc(size_t size, size_t alignment, uint64_t resource_type) {
  return alloc_(ibv(), pd_context_, size, alignment, resource_type);
}

void ParentDomain::free(void* ptr, uint64_t resource_type) { free_(ibv(), pd_context_, ptr, resource_type); }

ParentDomain* parent_domain_of(ibv_pd* pd) {
  if (!pd || !pd->context) return nullptr;
  HandleTable::Alias a;
  if (!Context::from(pd->context)->handles.find_alias(pd, &a) || a.kind != HandleTable::AliasKind::parent_domain)
    return nullptr;
  return static_cast<ParentDomain*>(a.object);
}

int dealloc_parent_domain(ParentDomain* domain) {
  // mlx5_dealloc_parent_domain: refused while QPs, CQs or SRQs use it.
  if (domain->users.busy()) return EBUSY;
  Pd& pd = domain->pd();
  Context& ctx = pd.context();
  ctx.handles.remove_alias(domain->ibv());
  if (Td* td = domain->td()) td->users.put();
  delete domain;
  pd.users.put();
  ctx.users.put();
  return 0;
}

namespace {

ibv_td* alloc_td(ibv_context* context, ibv_td_init_attr* attr) {
  if (!attr || attr->comp_mask) return fail<ibv_td>(EINVAL);
  Context* ctx = Context::from(context);
  if (ctx->device().fatal()) return fail<ibv_td>(EIO);
  auto td = std::make_unique<Td>(*ctx);
  {
    std::lock_guard lock(g_td_mu);
    g_tds.insert(td->ibv());
  }
  ctx->users.get();
  return td.release()->ibv();
}

int dealloc_td(ibv_td* td) {
  Td* t = nullptr;
  {
    std::lock_guard lock(g_td_mu);
    if (!g_tds.count(td)) return EINVAL;
    t = Td::from(td);
    if (t->users.busy()) return EBUSY;  // a parent domain holds it (mlx5_dealloc_td)
    g_tds.erase(td);
  }
  Context& ctx = t->context();
  delete t;
  ctx.users.put();
  return 0;
}

ibv_pd* alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  // ibv_check_alloc_parent_domain, then mlx5's comp_mask check.
  if (!attr || !attr->pd) return fail<ibv_pd>(EINVAL);
  if (attr->comp_mask & ~static_cast<uint32_t>(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS |
                                               IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT))
    return fail<ibv_pd>(EINVAL);
  Context* ctx = Context::from(context);
  if (ctx->device().fatal()) return fail<ibv_pd>(EIO);
  // The PD must be a protection domain of this context (mlx5 trusts the
  // caller; a parent domain of a parent domain, or a foreign PD, is refused
  // here rather than followed).
  if (attr->pd->context != context || parent_domain_of(attr->pd) ||
      ctx->handles.check(ObjectType::pd, attr->pd, attr->pd->handle))
    return fail<ibv_pd>(EINVAL);
  Td* td = nullptr;
  if (attr->td) {
    if (attr->td->context != context || !td_known(attr->td)) return fail<ibv_pd>(EINVAL);
    td = Td::from(attr->td);
  }
  Pd* pd = Pd::from(attr->pd);
  auto domain = std::make_unique<ParentDomain>(*pd, td, *attr);
  ctx->handles.add_alias(domain->ibv(), HandleTable::Alias{attr->pd, HandleTable::AliasKind::parent_domain,
                                                           domain.get()});
  pd->users.get();
  if (td) td->users.get();
  ctx->users.get();
  return domain.release()->ibv();
}

ibv_td* op_alloc_td(ibv_context* context, ibv_td_init_attr* attr) {
  return guarded([&] { return alloc_td(context, attr); });
}
int op_dealloc_td(ibv_td* td) {
  return guarded([&] { return dealloc_td(td); });
}
ibv_pd* op_alloc_parent_domain(ibv_context* context, ibv_parent_domain_init_attr* attr) {
  return guarded([&] { return alloc_parent_domain(context, attr); });
}

}  // namespace

void install_domain_ops(verbs_context* vctx) {
  vctx->alloc_td = op_alloc_td;
  vctx->dealloc_td = op_dealloc_td;
  vctx->alloc_parent_domain = op_alloc_parent_domain;
}

}  // namespace softverbs::emu

#include "hw/context.hpp"

#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <type_traits>
#include <unordered_map>

#include "hw/namespace.hpp"

namespace softverbs::hw {

// A byte copy of the context's verbs_context as the real library left it: the
// trampolines read their original function from here.
struct SavedSlots {
  verbs_context vctx;
};

void SavedSlotsDeleter::operator()(SavedSlots* saved) const noexcept { delete saved; }

namespace {

static_assert(offsetof(verbs_context, context) == 320 && sizeof(verbs_context) == 648,
              "verbs_context must have rdma-core 44's layout");

std::shared_mutex g_mu;
DataPathOps g_hooks;  // under g_mu; all NULL: the data path is the real library's
bool g_hooked = false;

void install_hooks_locked(ibv_context* ctx, const SavedSlots& saved) {
  const ibv_context_ops& orig = saved.vctx.context.ops;
  ibv_context_ops& ops = ctx->ops;
  if (g_hooked) {
    if (orig.post_send) ops.post_send = g_hooks.post_send;
    if (orig.post_recv) ops.post_recv = g_hooks.post_recv;
    if (orig.poll_cq) ops.poll_cq = g_hooks.poll_cq;
  } else {
    ops.post_send = orig.post_send;
    ops.post_recv = orig.post_recv;
    ops.poll_cq = orig.poll_cq;
  }
}
std::unordered_map<ibv_context*, SavedSlotsPtr>& saved_slots() {
  // Never destroyed: a trampoline may run during exit, after static destructors.
  static auto* map = new std::unordered_map<ibv_context*, SavedSlotsPtr>;
  return *map;
}

// The context an object belongs to: every object a slot takes first carries
// `context` (ibv_flow at +8, the rest first), and the creation slots take the
// context itself.
inline ibv_context* context_of(ibv_context* ctx) { return ctx; }
template <class T>
requires requires(T* obj) {
  { obj->context } -> std::convertible_to<ibv_context*>;
}
inline ibv_context* context_of(T* obj) { return obj ? obj->context : nullptr; }

template <class First, class... Rest>
ibv_context* context_of_args(First first, Rest...) {
  return context_of(first);
}

// The original slot value, read under the shared lock (NULL for a context that
// is not, or no longer, known: only a call racing with ibv_close_device on the
// same context gets there).
template <class S, class F>
F original(ibv_context* ctx, F S::*slot) {
  std::shared_lock lock(g_mu);
  auto it = saved_slots().find(ctx);
  if (it == saved_slots().end()) return nullptr;
  if constexpr (std::is_same_v<S, verbs_context>)
    return it->second->vctx.*slot;
  else
    return it->second->vctx.context.ops.*slot;
}

template <auto Slot>
struct Trampoline;

template <class S, class R, class... A, R (*S::*Slot)(A...)>
struct Trampoline<Slot> {
  static R call(A... args) {
    ibv_context* ctx = context_of_args(args...);
    R (*fn)(A...) = ctx ? original(ctx, Slot) : nullptr;
    Namespace* ns = Namespace::current();
    if (!fn || !ns) {
      errno = EINVAL;
      if constexpr (std::is_pointer_v<R>)
        return nullptr;
      else
        return EINVAL;
    }
    return ns->call(fn, args...);
  }
};

// A slot the inline verb would use: set, and inside the size the context declares
// (verbs_get_ctx_op's rule).
template <class F>
bool slot_visible(const verbs_context* vctx, F verbs_context::*slot) {
  const auto offset =
      static_cast<size_t>(reinterpret_cast<const char*>(&(vctx->*slot)) - reinterpret_cast<const char*>(vctx));
  return vctx->sz >= sizeof(verbs_context) - offset && vctx->*slot != nullptr;
}

template <auto Slot>
void wrap_vctx(verbs_context* vctx) {
  if (slot_visible(vctx, Slot)) vctx->*Slot = &Trampoline<Slot>::call;
}

template <auto Slot>
void wrap_ops(ibv_context_ops* ops) {
  if (ops->*Slot) ops->*Slot = &Trampoline<Slot>::call;
}

}  // namespace

void patch_context(ibv_context* ctx) noexcept {
  if (!ctx || ctx->abi_compat != __VERBS_ABI_IS_EXTENDED) return;  // a pre-extension context has no slots
  verbs_context* vctx = verbs_get_ctx(ctx);
  const auto real_create_flow = reinterpret_cast<void (*)(void)>(vctx->ibv_create_flow);
  const auto real_destroy_flow = reinterpret_cast<void (*)(void)>(vctx->ibv_destroy_flow);
  try {
    auto saved = SavedSlotsPtr(new SavedSlots);
    std::memcpy(static_cast<void*>(&saved->vctx), vctx, sizeof *vctx);
    std::unique_lock lock(g_mu);
    if (g_hooked) install_hooks_locked(ctx, *saved);
    saved_slots()[ctx] = std::move(saved);
  } catch (...) {
    // Out of memory. The context stays fully usable, unwrapped: only the errno
    // of a failing inline control verb would not reach the application.
    return;
  }

  // Every verbs_context slot that reports failure through errno or is used on
  // the control path. post_srq_ops (tag-matching posts) is data path.
  wrap_vctx<&verbs_context::query_port>(vctx);
  wrap_vctx<&verbs_context::advise_mr>(vctx);
  wrap_vctx<&verbs_context::alloc_null_mr>(vctx);
  wrap_vctx<&verbs_context::read_counters>(vctx);
  wrap_vctx<&verbs_context::attach_counters_point_flow>(vctx);
  wrap_vctx<&verbs_context::create_counters>(vctx);
  wrap_vctx<&verbs_context::destroy_counters>(vctx);
  wrap_vctx<&verbs_context::reg_dm_mr>(vctx);
  wrap_vctx<&verbs_context::alloc_dm>(vctx);
  wrap_vctx<&verbs_context::free_dm>(vctx);
  wrap_vctx<&verbs_context::modify_flow_action_esp>(vctx);
  wrap_vctx<&verbs_context::destroy_flow_action>(vctx);
  wrap_vctx<&verbs_context::create_flow_action_esp>(vctx);
  wrap_vctx<&verbs_context::modify_qp_rate_limit>(vctx);
  wrap_vctx<&verbs_context::alloc_parent_domain>(vctx);
  wrap_vctx<&verbs_context::dealloc_td>(vctx);
  wrap_vctx<&verbs_context::alloc_td>(vctx);
  wrap_vctx<&verbs_context::modify_cq>(vctx);
  wrap_vctx<&verbs_context::destroy_rwq_ind_table>(vctx);
  wrap_vctx<&verbs_context::create_rwq_ind_table>(vctx);
  wrap_vctx<&verbs_context::destroy_wq>(vctx);
  wrap_vctx<&verbs_context::modify_wq>(vctx);
  wrap_vctx<&verbs_context::create_wq>(vctx);
  wrap_vctx<&verbs_context::query_rt_values>(vctx);
  wrap_vctx<&verbs_context::create_cq_ex>(vctx);
  wrap_vctx<&verbs_context::query_device_ex>(vctx);
  wrap_vctx<&verbs_context::ibv_destroy_flow>(vctx);
  wrap_vctx<&verbs_context::ibv_create_flow>(vctx);
  wrap_vctx<&verbs_context::open_qp>(vctx);
  wrap_vctx<&verbs_context::create_qp_ex>(vctx);
  wrap_vctx<&verbs_context::get_srq_num>(vctx);
  wrap_vctx<&verbs_context::create_srq_ex>(vctx);
  wrap_vctx<&verbs_context::open_xrcd>(vctx);
  wrap_vctx<&verbs_context::close_xrcd>(vctx);

  // rdma-core mirrors the flow slots into the placeholders that libibverbs
  // 1.1.8-era inline code called; keep the mirror pointing where the slot does.
  if (real_create_flow && vctx->ABI_placeholder1 == real_create_flow)
    vctx->ABI_placeholder1 = reinterpret_cast<void (*)(void)>(vctx->ibv_create_flow);
  if (real_destroy_flow && vctx->ABI_placeholder2 == real_destroy_flow)
    vctx->ABI_placeholder2 = reinterpret_cast<void (*)(void)>(vctx->ibv_destroy_flow);

  // Memory windows: allocation and deallocation are control path and report
  // through errno; binding is a post (ibv_bind_mw) and stays direct.
  wrap_ops<&ibv_context_ops::alloc_mw>(&ctx->ops);
  wrap_ops<&ibv_context_ops::dealloc_mw>(&ctx->ops);
}

SavedSlotsPtr unpatch_context(ibv_context* ctx) {
  std::unique_lock lock(g_mu);
  auto it = saved_slots().find(ctx);
  if (it == saved_slots().end()) return nullptr;
  SavedSlotsPtr saved = std::move(it->second);
  saved_slots().erase(it);
  return saved;
}

void restore_context(ibv_context* ctx, SavedSlotsPtr saved) {
  if (!saved) return;
  std::unique_lock lock(g_mu);
  saved_slots()[ctx] = std::move(saved);
}

QueryPortFn original_query_port(ibv_context* ctx) { return original(ctx, &verbs_context::query_port); }

DataPathOps original_data_path(ibv_context* ctx) {
  std::shared_lock lock(g_mu);
  auto it = saved_slots().find(ctx);
  if (it == saved_slots().end()) return {};
  const ibv_context_ops& ops = it->second->vctx.context.ops;
  return DataPathOps{ops.post_send, ops.post_recv, ops.poll_cq};
}

void set_data_path_hooks(const DataPathOps* hooks) {
  std::unique_lock lock(g_mu);
  g_hooked = hooks != nullptr;
  g_hooks = hooks ? *hooks : DataPathOps{};
  // A pointer-sized store: a thread inside the old function finishes there, the
  // next call takes the new one.
  for (auto& [ctx, saved] : saved_slots()) install_hooks_locked(ctx, *saved);
}

}  // namespace softverbs::hw

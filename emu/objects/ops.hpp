// The function pointers rdma-core's inline verbs jump through: the live
// ibv_context_ops slots, the verbs_context extension slots and the ibv_cq_ex
// readers. Installed on every emulated context and extended CQ.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <new>
#include <type_traits>

namespace softverbs::emu {

class Context;
class Cq;
class ParentDomain;
class Qp;

// The slots above are reached from the application's inline verbs, with no
// barrier of the ABI layer around them: no exception may leave them. Runs f and
// turns std::bad_alloc into ENOMEM and anything else into EIO, in errno and in
// the result (NULL for a verb that returns an object, the errno for one that
// returns an int).
template <class F>
auto guarded(F f) noexcept -> decltype(f()) {
  using R = decltype(f());
  int err;
  try {
    return f();
  } catch (const std::bad_alloc&) {
    err = ENOMEM;
  } catch (...) {
    err = EIO;
  }
  errno = err;
  if constexpr (std::is_pointer_v<R>) {
    return nullptr;
  } else {
    return err;
  }
}

void install_context_ops(verbs_context* vctx);
void install_cq_ex_ops(ibv_cq_ex* cq);

// Shared by ibv_create_cq and ibv_create_cq_ex: validates against the device
// limits and creates the CQ. NULL and errno on failure.
// domain: the parent domain whose allocator holds the ring (ibv_create_cq_ex
// with IBV_CQ_INIT_ATTR_MASK_PD), which the CQ holds a use of.
ibv_cq_ex* create_cq(Context& ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector,
                     uint64_t wc_flags, ParentDomain* domain = nullptr);

int query_device_ex(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                    size_t attr_size);
int query_port(ibv_context* context, uint8_t port_num, ibv_port_attr* attr, size_t attr_len);

// ibv_create_qp_ex's comp_mask and creation flags as ConnectX's stack checks
// them (emu/objects/ops.cpp): 0 or the errno.
int check_create_qp_ex(const ibv_qp_init_attr_ex& attr);

// The XRC slots (emu/objects/xrcd.cpp): ibv_open_xrcd, ibv_close_xrcd,
// ibv_create_srq_ex (beyond the basic form) and ibv_get_srq_num.
ibv_xrcd* op_open_xrcd(ibv_context* context, ibv_xrcd_init_attr* attr);
int op_close_xrcd(ibv_xrcd* xrcd);
ibv_srq* op_create_srq_ex(ibv_context* context, ibv_srq_init_attr_ex* attr);
int op_get_srq_num(ibv_srq* srq, uint32_t* srq_num);

// ibv_create_qp_ex of an XRC_SEND or XRC_RECV QP, after check_create_qp_ex
// (emu/objects/xrcd.cpp). NULL and errno on failure.
ibv_qp* create_xrc_qp(ibv_context* context, ibv_qp_init_attr_ex* attr);
// The open_qp slot (ibv_open_qp): another handle on an XRC_RECV QP of a domain.
ibv_qp* op_open_qp(ibv_context* context, ibv_qp_open_attr* attr);
// ibv_destroy_qp of one handle on an XRC_RECV QP (the creator's or an opened
// one), after its number was checked: the handle's number is freed (an opened
// handle is deleted); answers the QP when that was its last handle, for the
// caller to destroy, else null.
Qp* release_xrc_recv_handle(ibv_qp* handle);

// The memory window slots of ibv_context_ops (emu/objects/mw.cpp).
ibv_mw* op_alloc_mw(ibv_pd* pd, ibv_mw_type type);
int op_dealloc_mw(ibv_mw* mw);
int op_bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind);

// The device memory slots of verbs_context: alloc_dm, free_dm, reg_dm_mr
// (emu/objects/dm.cpp).
void install_dm_ops(verbs_context* vctx);
// The advise_mr slot of verbs_context (emu/objects/odp.cpp).
void install_odp_ops(verbs_context* vctx);
// The thread and parent domain slots of verbs_context: alloc_td, dealloc_td,
// alloc_parent_domain (emu/objects/domain.cpp).
void install_domain_ops(verbs_context* vctx);

}  // namespace softverbs::emu

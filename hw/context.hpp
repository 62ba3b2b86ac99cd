// The control-path slots of real contexts, rerouted through errno-copying
// trampolines.
//
// rdma-core's inline verbs (ibv_create_cq_ex, ibv_create_qp_ex, ibv_open_xrcd,
// ibv_alloc_dm, ...) call the verbs_context slots directly, without passing
// through any exported function we could forward. The real functions behind those
// slots report failure through the namespace's errno, which the application never
// sees. So after a real context is opened, each such slot is replaced by a
// trampoline that calls the saved original inside a Namespace::Call.
//
// The data path is left alone: ops.post_send/post_recv/poll_cq/req_notify_cq/
// post_srq_recv, bind_mw, post_srq_ops and the function pointers inside
// ibv_cq_ex, ibv_qp_ex, ibv_wq and ibv_dm return their errors as values, and the
// application reaches the real provider through them with no extra hop.
#pragma once

#include <infiniband/verbs.h>

#include <memory>

namespace softverbs::hw {

// Saves ctx's slots and installs the trampolines (a real context fresh from
// ibv_open_device or ibv_import_device, not yet visible to the application).
void patch_context(ibv_context* ctx) noexcept;

// The saved original slots of one context.
struct SavedSlots;
struct SavedSlotsDeleter {
  void operator()(SavedSlots* saved) const noexcept;
};
using SavedSlotsPtr = std::unique_ptr<SavedSlots, SavedSlotsDeleter>;

// Forgets ctx's saved slots before it is closed (NULL if ctx was unknown);
// restore_context() puts them back if the close fails. Taking them out first
// means a context the real library allocates at the same address right after
// the close cannot meet a stale entry.
SavedSlotsPtr unpatch_context(ibv_context* ctx);
void restore_context(ibv_context* ctx, SavedSlotsPtr saved);

// The data-path functions of a context's ops that the fault layer can hook.
struct DataPathOps {
  int (*post_send)(ibv_qp*, ibv_send_wr*, ibv_send_wr**) = nullptr;
  int (*post_recv)(ibv_qp*, ibv_recv_wr*, ibv_recv_wr**) = nullptr;
  int (*poll_cq)(ibv_cq*, int, ibv_wc*) = nullptr;
};
// The real library's own data-path functions of a patched context (all NULL for
// an unknown one).
DataPathOps original_data_path(ibv_context* ctx);
// Points the data path of every patched context, and of those opened later, at
// `hooks` (which call original_data_path()); nullptr puts the originals back.
// Only done while verb fault rules exist: otherwise the data path is untouched.
void set_data_path_hooks(const DataPathOps* hooks);

// The original (real library's) query_port slot of a patched context, or NULL.
using QueryPortFn = int (*)(ibv_context*, uint8_t, ibv_port_attr*, size_t);
QueryPortFn original_query_port(ibv_context* ctx);

}  // namespace softverbs::hw

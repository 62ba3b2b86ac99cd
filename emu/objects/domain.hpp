// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)),
// as ConnectX's provider has them.
//
// A parent domain stands for its protection domain wherever a PD is taken: its
// public ibv_pd carries the PD's context and number (rdma-core's
// ibv_initialize_parent_domain), the context's HandleTable knows it as an alias
// of the PD, and its Handle's owner is the PD itself, so every verb that checks
// protection (regions, windows, address handles, the transport's key checks)
// sees the PD. QPs, CQs and SRQs created on it take their queue buffers from
// its allocator (QueueBuffer) and hold a use of it. A thread domain changes no
// behaviour: every object stays safe for concurrent use, which ibv_alloc_td(3)
// allows ("by default all verbs objects are safe for multi-threaded access").
#pragma once

#include <infiniband/verbs.h>

#include "emu/objects/handle.hpp"
#include "emu/objects/objects.hpp"

namespace softverbs::emu {

class Td {
 public:
  explicit Td(Context& ctx);
  ibv_td* ibv() { return &handle_.pub; }
  static Td* from(ibv_td* td) { return Handle<ibv_td, Td>::owner_of(td); }
  Context& context() { return ctx_; }
  UseCount users;  // parent domains using it: ibv_dealloc_td refuses with EBUSY

 private:
  Handle<ibv_td, Td> handle_;
  Context& ctx_;
};

class ParentDomain {
 public:
  ParentDomain(Pd& pd, Td* td, const ibv_parent_domain_init_attr& attr);
  ibv_pd* ibv() { return &handle_.pub; }
  Pd& pd() { return pd_; }
  Td* td() { return td_; }
  // mlx5_is_custom_alloc: both callbacks given.
  bool custom_alloc() const { return alloc_ && free_; }
  // The application's callbacks, with this domain and its pd_context.
  void* alloc(size_t size, size_t alignment, uint64_t resource_type);
  void free(void* ptr, uint64_t resource_type);

  UseCount users;  // QPs, CQs and SRQs created on it: ibv_dealloc_pd refuses with EBUSY

 private:
  Handle<ibv_pd, Pd> handle_;  // owner: the protection domain it stands for
  Pd& pd_;
  Td* td_;
  void* (*alloc_)(ibv_pd*, void*, size_t, size_t, uint64_t) = nullptr;
  void (*free_)(ibv_pd*, void*, void*, uint64_t) = nullptr;
  void* pd_context_ = nullptr;
};

// The parent domain pd is, or null for a protection domain (or a struct the
// context does not know).
ParentDomain* parent_domain_of(ibv_pd* pd);
// ibv_dealloc_pd of a parent domain: 0 or EBUSY.
int dealloc_parent_domain(ParentDomain* domain);

// The resource types the allocator is called with: ConnectX's
// (MLX5DV_RES_TYPE_*: RDMA_DRIVER_MLX5 in the upper 32 bits), so allocators
// written for mlx5 need no change.
uint64_t resource_type_qp();
uint64_t resource_type_srq();
uint64_t resource_type_cq();
uint64_t resource_type_dbr();
// The alignment ConnectX asks for a queue buffer (its page size) and for a
// doorbell record.
inline constexpr size_t kQueueAlign = 4096;
inline constexpr size_t kDoorbellSize = 8;

}  // namespace softverbs::emu

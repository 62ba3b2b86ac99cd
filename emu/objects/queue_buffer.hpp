// The memory a queue lives in: a QP's send and receive rings, an SRQ's ring, a
// CQ's ring, and the doorbell record ConnectX allocates beside each. It comes
// from the heap, or from the allocator of the parent domain the queue was
// created on (ibv_alloc_parent_domain(3), emu/objects/domain.hpp), which the
// engine then really keeps the queue in.
#pragma once

#include <cstddef>
#include <cstdint>

namespace softverbs::emu {

class ParentDomain;

class QueueBuffer {
 public:
  QueueBuffer() = default;
  // size bytes (zero-filled) aligned to alignment, for a resource of that type
  // (MLX5DV_RES_TYPE_*): from domain's allocator when it has one, else (or when
  // the allocator answers IBV_ALLOCATOR_USE_DEFAULT) from the heap. Throws
  // std::bad_alloc when the allocator returns NULL: the verb fails with
  // ENOMEM, as mlx5's does.
  QueueBuffer(ParentDomain* domain, size_t size, size_t alignment, uint64_t resource_type)
      : QueueBuffer(domain, size, alignment, resource_type, true) {}
  // The allocator's memory only: empty (data() NULL) when domain has no
  // allocator or it answers IBV_ALLOCATOR_USE_DEFAULT, so that a work queue
  // allocates its own ring at its first post (emu/qp/wq.hpp).
  static QueueBuffer custom_only(ParentDomain* domain, size_t size, size_t alignment, uint64_t resource_type);
  ~QueueBuffer() { release(); }
  QueueBuffer(QueueBuffer&& other) noexcept { *this = static_cast<QueueBuffer&&>(other); }
  QueueBuffer& operator=(QueueBuffer&& other) noexcept;
  QueueBuffer(const QueueBuffer&) = delete;
  QueueBuffer& operator=(const QueueBuffer&) = delete;

  uint8_t* data() const { return static_cast<uint8_t*>(data_); }
  size_t size() const { return size_; }
  // Whether the parent domain's allocator provided the memory.
  bool custom() const { return custom_; }

 private:
  // heap_fallback false: when the allocator is absent or answers
  // IBV_ALLOCATOR_USE_DEFAULT, the buffer stays empty and nothing is allocated
  // (custom_only), so the allocator is asked once and no heap ring is built.
  QueueBuffer(ParentDomain* domain, size_t size, size_t alignment, uint64_t resource_type, bool heap_fallback);
  void release() noexcept;

  ParentDomain* domain_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  size_t alignment_ = 0;
  uint64_t type_ = 0;
  bool custom_ = false;
};

}  // namespace softverbs::emu

// A context's object numbers (handle.hpp): the kernel's per-file object table.
#include "emu/objects/handle.hpp"

#include <algorithm>
#include <cerrno>
#include <functional>

namespace softverbs::emu {

uint32_t HandleTable::add(ObjectType type, const void* pub) {
  std::lock_guard lock(mu_);
  uint32_t h;
  if (!free_.empty()) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<>{});
    h = free_.back();
    free_.pop_back();
  } else {
    h = static_cast<uint32_t>(entries_.size());
    entries_.emplace_back();  // may throw: nothing changed
    if (free_.capacity() < entries_.capacity()) {
      try {
        free_.reserve(entries_.capacity());
      } catch (...) {
        entries_.pop_back();
        throw;
      }
    }
  }
  entries_[h] = Entry{pub, type};
  return h;
}

void HandleTable::remove(uint32_t handle) noexcept {
  std::lock_guard lock(mu_);
  if (handle >= entries_.size() || !entries_[handle].pub) return;
  entries_[handle] = Entry{};
  free_.push_back(handle);  // within the capacity add() reserved
  std::push_heap(free_.begin(), free_.end(), std::greater<>{});
}

int HandleTable::check(ObjectType type, const void* pub, uint32_t handle) const {
  std::lock_guard lock(mu_);
  if (handle >= entries_.size() || !entries_[handle].pub) return ENOENT;
  const Entry& e = entries_[handle];
  if (e.type != type || e.pub != pub) return EINVAL;
  return 0;
}

}  // namespace softverbs::emu

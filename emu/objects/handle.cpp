// A context's object numbers (handle.hpp): the kernel's per-file object table.
#include "emu/objects/handle.hpp"

#include <cerrno>

namespace softverbs::emu {

uint32_t HandleTable::add(ObjectType type, const void* pub) {
  std::lock_guard lock(mu_);
  uint32_t h;
  if (!free_.empty()) {
    h = *free_.begin();
    free_.erase(free_.begin());
  } else {
    h = static_cast<uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  entries_[h] = Entry{pub, type};
  return h;
}

void HandleTable::remove(uint32_t handle) {
  std::lock_guard lock(mu_);
  if (handle >= entries_.size() || !entries_[handle].pub) return;
  entries_[handle] = Entry{};
  free_.insert(handle);
}

int HandleTable::check(ObjectType type, const void* pub, uint32_t handle) const {
  std::lock_guard lock(mu_);
  if (handle >= entries_.size() || !entries_[handle].pub) return ENOENT;
  const Entry& e = entries_[handle];
  if (e.type != type || e.pub != pub) return EINVAL;
  return 0;
}

}  // namespace softverbs::emu

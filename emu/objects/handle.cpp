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
  // Aliases of the object lose it: one that outlives it is refused, even once
  // its number or its memory is reused, but stays known until it is released.
  const void* gone = entries_[handle].pub;
  for (auto& [pub, a] : aliases_)
    if (a.target == gone) a.target = nullptr;
  entries_[handle] = Entry{};
  free_.push_back(handle);  // within the capacity add() reserved
  std::push_heap(free_.begin(), free_.end(), std::greater<>{});
}

int HandleTable::check(ObjectType type, const void* pub, uint32_t handle) const {
  std::lock_guard lock(mu_);
  if (handle >= entries_.size() || !entries_[handle].pub) return ENOENT;
  const Entry& e = entries_[handle];
  if (e.type != type) return EINVAL;
  if (e.pub == pub) return 0;
  auto a = aliases_.find(pub);
  return a != aliases_.end() && a->second.target == e.pub ? 0 : EINVAL;
}

void HandleTable::add_alias(const void* alias, const Alias& what) {
  std::lock_guard lock(mu_);
  aliases_[alias] = what;
}

void HandleTable::remove_alias(const void* alias) {
  std::lock_guard lock(mu_);
  aliases_.erase(alias);
}

bool HandleTable::find_alias(const void* alias, Alias* out) const {
  std::lock_guard lock(mu_);
  auto a = aliases_.find(alias);
  if (a == aliases_.end()) return false;
  *out = a->second;
  return true;
}

const void* HandleTable::find(ObjectType type, uint32_t handle) const {
  std::lock_guard lock(mu_);
  if (handle >= entries_.size() || !entries_[handle].pub || entries_[handle].type != type) return nullptr;
  return entries_[handle].pub;
}

}  // namespace softverbs::emu

// How emulated objects carry the public rdma-core structs, and the object
// numbers those structs hold in their `handle` field.
//
// The application holds pointers to the public structs (ibv_qp, ibv_cq, ...). Each
// emulated object keeps its public struct inside a Handle: the public struct first,
// then a back pointer to the owning C++ object. A Handle is standard-layout, so a
// pointer to it is a pointer to its first member and back; the C++ object around it
// is free to hold any members it needs.
//
// Each context numbers its objects as the kernel's uverbs file does (HandleTable),
// and the verbs the kernel would serve look the object up by its number before
// they touch it, so a destroyed or garbled struct is refused with the kernel's
// errno instead of being acted on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace softverbs::emu {

template <class Pub, class Owner>
struct Handle {
  Pub pub{};
  Owner* owner = nullptr;

  static Owner* owner_of(const void* pub) noexcept {
    return pub ? static_cast<const Handle*>(pub)->owner : nullptr;
  }
};

// For a public struct embedded inside a larger public struct (ibv_context inside
// verbs_context, ibv_qp inside ibv_qp_ex), the outer one is the Handle's Pub and
// the inner one is reached by the offset of the member.
template <class Outer, class Inner>
Outer* outer_of(Inner* inner, std::size_t member_offset) noexcept {
  return reinterpret_cast<Outer*>(reinterpret_cast<char*>(inner) - member_offset);
}

// The kinds of objects the kernel keeps in a context's object table.
enum class ObjectType : uint8_t { pd, mr, cq, srq, qp, ah, mw, dm, xrcd };

// A context's object numbers: the kernel's per-file uverbs table (an xarray
// allocating the lowest free number, shared by every object type;
// rdma_core.c alloc_begin_idr_uobject). A verb the kernel serves finds its
// object by the number in the public struct's `handle` (rdma_lookup_get_uobject).
class HandleTable {
 public:
  // Gives pub the lowest free number: O(log n). May throw std::bad_alloc, with
  // nothing changed.
  uint32_t add(ObjectType type, const void* pub);
  // The number is free again (the object is destroyed). Never allocates, so a
  // destroy verb cannot fail for want of memory.
  void remove(uint32_t handle) noexcept;
  // Whether pub's `handle` names pub, of that type: 0, ENOENT when no object has
  // that number, EINVAL when an object of another type has it (as the kernel
  // answers both), and EINVAL too when another object of the same type has it,
  // where the kernel would act on that other object.
  int check(ObjectType type, const void* pub, uint32_t handle) const;

  // A public struct may also stand for an object it is not: a parent domain
  // for its protection domain (ibv_alloc_parent_domain: rdma-core gives it the
  // PD's number), an imported PD or MR for the object it names
  // (ibv_import_pd/mr). check() accepts such an alias for its target.
  enum class AliasKind : uint8_t { parent_domain, imported };
  struct Alias {
    const void* target = nullptr;
    AliasKind kind = AliasKind::imported;
    void* object = nullptr;  // what the alias is (the ParentDomain, the imported struct)
  };
  void add_alias(const void* alias, const Alias& what);
  void remove_alias(const void* alias);
  // What alias is, while it is known (its target is null once the object is gone).
  bool find_alias(const void* alias, Alias* out) const;
  // The live public struct of that number and type, or null.
  const void* find(ObjectType type, uint32_t handle) const;

 private:
  struct Entry {
    const void* pub = nullptr;  // null: free
    ObjectType type = ObjectType::pd;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;  // indexed by number
  // The free numbers below entries_.size(), a min-heap (4 bytes each, where a
  // tree node would take 40); its capacity follows entries_' so remove() never
  // allocates.
  std::vector<uint32_t> free_;
  std::unordered_map<const void*, Alias> aliases_;  // by the alias's public struct
};

}  // namespace softverbs::emu

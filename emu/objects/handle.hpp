// How emulated objects carry the public rdma-core structs.
//
// The application holds pointers to the public structs (ibv_qp, ibv_cq, ...). Each
// emulated object keeps its public struct inside a Handle: the public struct first,
// then a back pointer to the owning C++ object. A Handle is standard-layout, so a
// pointer to it is a pointer to its first member and back; the C++ object around it
// is free to hold any members it needs.
#pragma once

#include <cstddef>
#include <type_traits>

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

}  // namespace softverbs::emu

// Memory windows (IBTA 10.6.7): the rules of binding and invalidating a window
// and the checks of a window's rkey on remote access. The requester binds and
// invalidates (IBV_WR_BIND_MW, IBV_WR_LOCAL_INV), the responder invalidates
// (SEND with Invalidate) and resolves rkeys (check_rkey in sge.hpp). Callers
// hold the device's mr_lock(): exclusively to change a binding, shared to look.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "emu/objects/objects.hpp"

namespace softverbs::emu {

// A window's rkey is its 24-bit key index and an 8-bit key byte; the consumer
// chooses the key byte at every bind (IBTA 10.6.7.2.1, ibv_inc_rkey for type 1),
// the index never changes.
constexpr uint32_t kKeyByteMask = 0xff;
constexpr uint32_t window_rkey(uint32_t index, uint32_t key_byte) {
  return (index << 8) | (key_byte & kKeyByteMask);
}
constexpr uint32_t rebound_rkey(uint32_t current, uint32_t requested) {
  return (current & ~kKeyByteMask) | (requested & kKeyByteMask);
}

// One bind, as a work request carries it.
struct BindRequest {
  Mw* mw = nullptr;
  uint32_t rkey = 0;  // its key byte becomes the window's
  Mr* mr = nullptr;   // null with length 0: unbind (type 1)
  uint64_t addr = 0;
  uint64_t length = 0;
  unsigned access = 0;  // IBV_ACCESS_* of the window, IBV_ACCESS_ZERO_BASED included
};

// Binds a window on a QP of PD qp_pd and number qpn. False, with nothing
// changed, when the bind breaks a rule of IBTA 10.6.7.2 (the work request then
// completes with IBV_WC_MW_BIND_ERR). mr_lock() held exclusively.
bool bind_window(const Pd& qp_pd, uint32_t qpn, const BindRequest& req);

// Invalidates the type 2 window whose current rkey is `rkey`. A local
// invalidation (IBV_WR_LOCAL_INV) takes any such window of the device; a remote
// one (SEND with Invalidate) only a window of the responder QP's PD bound to
// that QP. False when there is no such window (a region's rkey is never
// invalidatable). mr_lock() held exclusively.
enum class Invalidation { local, remote };
bool invalidate_window(Device& dev, const Pd& pd, uint32_t qpn, uint32_t rkey, Invalidation how);

// Ends a window's binding, if any (deallocation). mr_lock() held exclusively.
void unbind_window(Mw& mw);

// The host address of [va, va+len) through the window rkey names, if it lets
// QP qpn of PD pd perform `access` there: the window is bound with that rkey,
// to that PD, to that QP (type 2B), grants the access, and holds the range.
// nullptr otherwise (or when no window has the rkey's index).
uint8_t* window_access(Device& dev, const Pd& pd, uint32_t qpn, uint32_t rkey, uint64_t va, uint64_t len,
                       unsigned access);

}  // namespace softverbs::emu

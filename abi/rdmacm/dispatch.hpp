// Routing for librdmacm.so.1 (core/cm_provider.hpp, "Routing"): the CM
// providers of this process, which one owns each object handed to the
// application, and the rule for calls that name no object yet.
#pragma once

#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cerrno>
#include <vector>

#include "abi/common/export.hpp"
#include "core/cm_provider.hpp"

namespace softverbs::abi::cm {

// The CM providers inside libibverbs.so.1, in order (softverbs_private_cm_providers),
// read once. Empty when there is none, or when libibverbs.so.1 comes from another
// build (it then refuses the interface version).
const std::vector<CmProvider*>& providers();

// Who owns what. Each lookup of a pointer this library never handed out (or
// handed out and saw released) answers NULL; the exported function then fails
// with EINVAL, where rdma-core would follow the pointer.
CmProvider* owner(const rdma_event_channel* channel);
CmProvider* owner(const rdma_cm_id* id);
CmProvider* owner(const rdma_cm_event* event);
CmProvider* owner(const rdma_addrinfo* res);

// Records what a provider returned. An id brings its channel along (a
// synchronous id's private channel is the provider's too); an event brings the
// ids it carries (a CONNECT_REQUEST's new id, the listen id).
void note(CmProvider* p, rdma_event_channel* channel);
void note(CmProvider* p, rdma_cm_id* id);
void note(CmProvider* p, rdma_cm_event* event);
void note(CmProvider* p, rdma_addrinfo* res);
void forget(const rdma_event_channel* channel);
void forget(const rdma_cm_id* id);
void forget(const rdma_cm_event* event);
void forget(const rdma_addrinfo* res);

// Calls that name no object (create_event_channel, create_id with no channel,
// create_ep on a list we did not make, getaddrinfo): each provider in order,
// until one succeeds or fails with something other than ENODEV ("no RDMA CM
// here"). With no provider, or when all answer ENODEV, the answer is ENODEV, as
// librdmacm 44 gives on a machine without an RDMA CM. `call(p)` returns 0 or -1
// with errno; on success `*winner` is the provider that answered.
template <class Call>
int first_cm(Call&& call, CmProvider** winner) {
  for (CmProvider* p : providers()) {
    const int rc = call(p);
    if (rc == 0) {
      *winner = p;
      return 0;
    }
    if (errno != ENODEV) return rc;
  }
  errno = ENODEV;
  return -1;
}

// For the void exports: an exception (only std::bad_alloc or a lock failure
// can happen here) is dropped, as they have no way to report one.
template <class Fn>
void guarded_void(Fn&& fn) noexcept {
  try {
    fn();
  } catch (...) {
  }
}

// The length of a CM address, as librdmacm's ucma_addrlen: 0 for NULL and for
// a family the CM does not know (AF_IB is accepted here; a provider without it
// refuses it itself).
int addrlen(const sockaddr* addr);

}  // namespace softverbs::abi::cm

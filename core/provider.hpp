// The provider interface: the one seam between the exported C ABI (abi/) and the
// backends that own devices and objects (emu/, hw/).
//
// Conventions, chosen so that a backend that forwards to the real rdma-core is a
// plain pass-through:
//  * The verbs are listed once, in core/verbs.def. Every verb method has the exact
//    signature and return convention of the exported rdma-core function it stands
//    for (some return an errno value, some return -1 and set errno, pointer-returning
//    ones return NULL and set errno). The ABI layer does not translate results; it
//    only finds the owner and contains exceptions.
//  * Objects are the public rdma-core structs (ibv_context, ibv_qp, ...). A provider
//    allocates them inside its own objects; the application only ever sees the
//    public part, whose layout is byte-identical to rdma-core 44's headers.
//  * The data path (post_send, post_recv, poll_cq, req_notify_cq, post_srq_recv, the
//    ibv_wr_* and ibv_cq_ex readers) never passes through here: rdma-core's inline
//    functions jump straight into the function pointers the provider placed in the
//    context and in the objects. So do the verbs_context extension slots
//    (query_device_ex, create_cq_ex, create_qp_ex, ...).
//  * A provider owns the devices it lists; the ABI layer routes a call on any object
//    to the provider that owns the object's device.
#pragma once

#include <infiniband/verbs.h>

#include "core/rdma_private.h"
#include "core/verbs.hpp"
#include "softverbs/faults.h"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace softverbs {

class Provider {
 public:
  virtual ~Provider() = default;

  // Short name used in logs and by SOFTVERBS_BACKEND ("emu", "hw").
  virtual const char* name() const noexcept = 0;

  // ---- device lists ----------------------------------------------------------
  // Not one verb each: ibv_get_device_list joins every provider's devices.
  // Returns the devices this provider exposes now. The provider keeps them alive
  // until release_devices() is called with the same pointers.
  virtual std::vector<ibv_device*> get_devices() = 0;
  virtual void release_devices(const std::vector<ibv_device*>& devices) = 0;

  // ---- the verbs: one method per row of core/verbs.def ------------------------
  // Generated from core/verbs.def: `virtual <returns> <name>(<parameters>)`, the
  // signature of the exported function of the row. A backend overrides what it
  // offers; the default fails as rdma-core does for a verb its provider lacks
  // (unsupported<>() in core/verbs.hpp). SV_VERB_DERIVED rows' defaults compute
  // the answer from other verbs instead (core/provider.cpp).
#define SV_VERB(name, symbol, version, need, fails, ret, params, args) \
  virtual ret name params {                                            \
    unused args;                                                       \
    return unsupported<Fails::fails, ret>();                           \
  }
#define SV_VERB_DERIVED(name, symbol, version, need, fails, ret, params, args) virtual ret name params;
#include "core/verbs.def"

  // ---- the control API (include/softverbs/faults.h) --------------------------
  // Not verbs of rdma-core: hand-written, not in core/verbs.def.
  // Each returns 0 or an errno value. ENODEV means "not one of mine": the ABI
  // layer then asks the next provider, and a name no provider knows fails with
  // ENODEV. A backend overrides what it can do; the defaults do nothing.

  // Fills *out with the transport counters of the named device.
  virtual int device_counters(const char* /*device_name*/, softverbs_counters* /*out*/) { return ENODEV; }
  // Takes the named device's port down or brings it back up.
  virtual int port_set_state(const char* /*device_name*/, uint8_t /*port_num*/, bool /*active*/) { return ENODEV; }
  // Fails the named device (IBV_EVENT_DEVICE_FATAL).
  virtual int device_fatal(const char* /*device_name*/) { return ENODEV; }
  // Moves a QP of this provider to the error state with IBV_EVENT_QP_FATAL.
  virtual int qp_force_error(ibv_qp* /*qp*/) { return ENODEV; }
  // Raises an async event on a context of this provider. The ABI layer has
  // checked that the event's element belongs to the context.
  virtual int raise_async_event(ibv_context* /*context*/, const ibv_async_event& /*event*/) { return ENODEV; }
  // A device attribute as ibv_read_sysfs_file() would read it from `dir` (the
  // device's ibdev_path): 0 with *value filled, ENOENT for an unknown attribute,
  // ENODEV when `dir` is not one of this provider's devices (the real file is
  // then read).
  virtual int read_sysfs_attr(const char* /*dir*/, const char* /*file*/, std::string* /*value*/) { return ENODEV; }
};

// The process-wide list of providers, in the order their devices are listed.
// Selected by SOFTVERBS_BACKEND (emu, hw, or both; default emu).
const std::vector<Provider*>& providers();

// The backends' entry points (defined by emu/ and hw/; the ABI layer reaches the
// backends through these and the interface above, never through their headers).
Provider& emu_provider();
Provider& hw_provider();

}  // namespace softverbs

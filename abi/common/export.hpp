// Shared by the ABI translation units: export macro, ownership dispatch and the
// exception barrier every exported function runs behind.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <new>

#include "core/log.hpp"
#include "core/provider.hpp"

#define SV_EXPORT extern "C" __attribute__((visibility("default")))

namespace softverbs::abi {

// The provider that listed this device, or NULL for a pointer no provider owns.
Provider* owner_of(ibv_device* device);
inline Provider* owner_of(ibv_context* context) { return context ? owner_of(context->device) : nullptr; }

// Records which provider listed which devices (ibv_get_device_list).
void note_devices(Provider* provider, const std::vector<ibv_device*>& devices);

// No exception may cross the C ABI: a failure inside a provider becomes the
// errno-style failure of the verb (ENOMEM for allocation failure).
template <class Fn, class R>
R guarded(R on_error, Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    errno = ENOMEM;
  } catch (const std::system_error& e) {
    errno = e.code().value();
  } catch (...) {
    errno = EIO;
  }
  return on_error;
}

}  // namespace softverbs::abi

// The softverbs control API (include/softverbs/faults.h), node SOFTVERBS_0.1.
// Fault scenarios go to the fault engine (core/fault_control.hpp); device, port,
// QP and event controls to the provider that owns the object or the name.
#include <cstring>
#include <string>

#include "abi/common/export.hpp"
#include "core/events.hpp"
#include "core/fault_control.hpp"
#include "softverbs/faults.h"

namespace {

using softverbs::fault_control;
using softverbs::Provider;

int report(bool ok, const std::string& error, char* err, size_t err_len) {
  if (ok) return 0;
  if (err && err_len) {
    std::strncpy(err, error.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  errno = EINVAL;
  return -1;
}

int result(int rc) {
  if (rc == 0) return 0;
  errno = rc;
  return -1;
}

// Asks each provider in turn until one knows the device name (ENODEV: none).
template <class Fn>
int by_device_name(const char* name, Fn&& fn) {
  if (!name) return result(ENODEV);
  for (Provider* p : softverbs::providers()) {
    int rc = fn(*p);
    if (rc != ENODEV) return result(rc);
  }
  return result(ENODEV);
}

}  // namespace

SV_EXPORT int softverbs_faults_load(const char* toml_text, char* err, size_t err_len) {
  return softverbs::abi::guarded(-1, [&] {
    std::string error;
    bool ok = toml_text && fault_control().load(toml_text, &error);
    return report(ok, toml_text ? error : "no scenario text", err, err_len);
  });
}

SV_EXPORT int softverbs_faults_load_file(const char* path, char* err, size_t err_len) {
  return softverbs::abi::guarded(-1, [&] {
    std::string error;
    bool ok = path && fault_control().load_file(path, &error);
    return report(ok, path ? error : "no path", err, err_len);
  });
}

SV_EXPORT void softverbs_faults_clear(void) { fault_control().clear(); }

SV_EXPORT void softverbs_faults_seed(uint64_t seed) { fault_control().set_seed(seed); }

SV_EXPORT int softverbs_faults_log(const char* path) {
  return softverbs::abi::guarded(-1, [&] { return fault_control().set_log(path ? path : "") ? 0 : -1; });
}

SV_EXPORT uint64_t softverbs_fault_hits(const char* rule_name) {
  return rule_name ? fault_control().hits(rule_name) : 0;
}

SV_EXPORT int softverbs_device_counters(const char* device_name, struct softverbs_counters* out, size_t size) {
  return softverbs::abi::guarded(-1, [&] {
    softverbs_counters v{};
    int rc = by_device_name(device_name, [&](Provider& p) { return p.device_counters(device_name, &v); });
    if (rc == 0 && out) std::memcpy(out, &v, size < sizeof v ? size : sizeof v);
    return rc;
  });
}

SV_EXPORT int softverbs_port_set_state(const char* device_name, uint8_t port_num, int active) {
  return softverbs::abi::guarded(-1, [&] {
    return by_device_name(device_name,
                          [&](Provider& p) { return p.port_set_state(device_name, port_num, active != 0); });
  });
}

SV_EXPORT int softverbs_device_fatal(const char* device_name) {
  return softverbs::abi::guarded(-1, [&] {
    return by_device_name(device_name, [&](Provider& p) { return p.device_fatal(device_name); });
  });
}

SV_EXPORT int softverbs_qp_force_error(struct ibv_qp* qp) {
  return softverbs::abi::guarded(-1, [&] {
    Provider* owner = qp ? softverbs::abi::owner_of(qp->context) : nullptr;
    return result(owner ? owner->qp_force_error(qp) : ENODEV);
  });
}

SV_EXPORT int softverbs_raise_async_event(struct ibv_context* context, const struct ibv_async_event* ev) {
  return softverbs::abi::guarded(-1, [&] {
    Provider* owner = softverbs::abi::owner_of(context);
    if (!owner) return result(ENODEV);
    if (!ev) return result(EINVAL);
    // The element must belong to the context; what each backend can raise on a
    // port, the device or a work queue it checks itself.
    switch (softverbs::event_element(ev->event_type)) {
      case softverbs::EventElement::cq:
        if (!ev->element.cq || ev->element.cq->context != context) return result(EINVAL);
        break;
      case softverbs::EventElement::qp:
        if (!ev->element.qp || ev->element.qp->context != context) return result(EINVAL);
        break;
      case softverbs::EventElement::srq:
        if (!ev->element.srq || ev->element.srq->context != context) return result(EINVAL);
        break;
      case softverbs::EventElement::port:
        if (ev->element.port_num < 1) return result(EINVAL);
        break;
      case softverbs::EventElement::device:
        if (ev->event_type != IBV_EVENT_DEVICE_FATAL) return result(EINVAL);
        break;
      case softverbs::EventElement::wq:
        if (!ev->element.wq || ev->element.wq->context != context) return result(EINVAL);
        break;
    }
    return result(owner->raise_async_event(context, *ev));
  });
}

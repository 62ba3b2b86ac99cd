// The softverbs control API (include/softverbs/faults.h), node SOFTVERBS_0.1.
#include <algorithm>
#include <cstring>
#include <string>

#include "abi/export.hpp"
#include "emu/objects.hpp"
#include "emu/provider.hpp"
#include "hw/faults.hpp"
#include "hw/provider.hpp"
#include "softverbs/events.hpp"
#include "softverbs/faults.h"
#include "transport/faults.hpp"

namespace {

// The emulated device of that name, if the emu backend serves this process
// (with SOFTVERBS_BACKEND=hw there are no emulated devices to act on).
softverbs::emu::Device* emu_device(const char* name) {
  if (!name) return nullptr;
  for (softverbs::emu::Device* d : softverbs::abi::emu_devices())
    if (d->name() == name) return d;
  return nullptr;
}

int report(bool ok, const std::string& error, char* err, size_t err_len) {
  if (ok) return 0;
  if (err && err_len) {
    std::strncpy(err, error.c_str(), err_len - 1);
    err[err_len - 1] = '\0';
  }
  errno = EINVAL;
  return -1;
}

}  // namespace

SV_EXPORT int softverbs_faults_load(const char* toml_text, char* err, size_t err_len) {
  return softverbs::abi::guarded(-1, [&] {
    std::string error;
    bool ok = toml_text && softverbs::transport::FaultEngine::instance().load(toml_text, &error);
    return report(ok, toml_text ? error : "no scenario text", err, err_len);
  });
}

SV_EXPORT int softverbs_faults_load_file(const char* path, char* err, size_t err_len) {
  return softverbs::abi::guarded(-1, [&] {
    std::string error;
    bool ok = path && softverbs::transport::FaultEngine::instance().load_file(path, &error);
    return report(ok, path ? error : "no path", err, err_len);
  });
}

SV_EXPORT void softverbs_faults_clear(void) { softverbs::transport::FaultEngine::instance().clear(); }

SV_EXPORT void softverbs_faults_seed(uint64_t seed) { softverbs::transport::FaultEngine::instance().set_seed(seed); }

SV_EXPORT int softverbs_faults_log(const char* path) {
  return softverbs::abi::guarded(-1, [&] {
    if (softverbs::transport::FaultEngine::instance().set_log(path ? path : "")) return 0;
    return -1;
  });
}

SV_EXPORT uint64_t softverbs_fault_hits(const char* rule_name) {
  return rule_name ? softverbs::transport::FaultEngine::instance().hits(rule_name) : 0;
}

SV_EXPORT int softverbs_device_counters(const char* device_name, struct softverbs_counters* out, size_t size) {
  if (softverbs::emu::Device* d = emu_device(device_name)) {
    const auto& c = d->counters();
    softverbs_counters v{c.tx_packets.load(),         c.rx_packets.load(),      c.rx_icrc_errors.load(),
                         c.rx_malformed.load(),       c.rx_unknown_qp.load(),   c.rx_dropped.load(),
                         c.retransmits.load(),        c.timeouts.load(),        c.naks_sent.load(),
                         c.naks_received.load(),      c.rnr_naks_sent.load(),   c.rnr_naks_received.load(),
                         c.duplicates.load(),         c.faults_dropped.load(),  c.faults_duplicated.load(),
                         c.faults_corrupted.load(),   c.faults_delayed.load(),  c.faults_reordered.load(),
                         c.faults_naks_forged.load(), c.port_down_drops.load(), c.faults_verbs.load()};
    std::memcpy(out, &v, size < sizeof v ? size : sizeof v);
    return 0;
  }
  errno = ENODEV;
  return -1;
}

namespace {

// The emulated context a verbs context belongs to, or nullptr (another backend).
softverbs::emu::Context* emu_context(ibv_context* context) {
  if (!context || softverbs::abi::owner_of(context) != &softverbs::emu::EmuProvider::instance()) return nullptr;
  return softverbs::emu::Context::from(context);
}

int fail_errno(int e) {
  errno = e;
  return -1;
}

}  // namespace

SV_EXPORT int softverbs_port_set_state(const char* device_name, uint8_t port_num, int active) {
  return softverbs::abi::guarded(-1, [&] {
    softverbs::emu::Device* d = emu_device(device_name);
    if (!d) return fail_errno(ENODEV);
    if (port_num != 1) return fail_errno(EINVAL);
    if (active && d->fatal()) return fail_errno(EIO);
    d->set_port_active(active != 0);
    return 0;
  });
}

SV_EXPORT int softverbs_device_fatal(const char* device_name) {
  return softverbs::abi::guarded(-1, [&] {
    softverbs::emu::Device* d = emu_device(device_name);
    if (!d) return fail_errno(ENODEV);
    d->make_fatal();
    return 0;
  });
}

static bool on_hw(ibv_context* context) {
  return context && softverbs::abi::owner_of(context) == &softverbs::hw::HwProvider::instance();
}

SV_EXPORT int softverbs_qp_force_error(struct ibv_qp* qp) {
  return softverbs::abi::guarded(-1, [&] {
    if (qp && on_hw(qp->context)) {
      // A real QP: moved to the error state through the passthrough, and the
      // event injected (a real device raises none for that).
      int rc = softverbs::hw::force_qp_error(qp);
      return rc ? fail_errno(rc) : 0;
    }
    if (!qp || !emu_context(qp->context)) return fail_errno(ENODEV);
    softverbs::emu::Qp::from(qp)->force_error(true);
    return 0;
  });
}

SV_EXPORT int softverbs_raise_async_event(struct ibv_context* context, const struct ibv_async_event* ev) {
  return softverbs::abi::guarded(-1, [&] {
    softverbs::emu::Context* ctx = emu_context(context);
    const bool hw = on_hw(context);
    if (!ctx && !hw) return fail_errno(ENODEV);
    if (!ev) return fail_errno(EINVAL);
    switch (softverbs::event_element(ev->event_type)) {
      case softverbs::EventElement::cq:
        if (!ev->element.cq || ev->element.cq->context != context) return fail_errno(EINVAL);
        break;
      case softverbs::EventElement::qp:
        if (!ev->element.qp || ev->element.qp->context != context) return fail_errno(EINVAL);
        break;
      case softverbs::EventElement::srq:
        if (!ev->element.srq || ev->element.srq->context != context) return fail_errno(EINVAL);
        break;
      case softverbs::EventElement::port:
        if (ev->element.port_num < 1) return fail_errno(EINVAL);
        if (hw) break;  // a real device's other contexts are not known: this one only
        if (ev->element.port_num != 1) return fail_errno(EINVAL);
        ctx->device().post_device_event(ev->event_type, 1);
        return 0;
      case softverbs::EventElement::device:
        if (ev->event_type != IBV_EVENT_DEVICE_FATAL) return fail_errno(EINVAL);
        if (hw) break;
        ctx->device().post_device_event(ev->event_type, 0);
        return 0;
      case softverbs::EventElement::wq:
        if (hw && ev->element.wq && ev->element.wq->context == context) break;
        return fail_errno(EINVAL);  // emulated devices have no work queue objects
    }
    if (hw) {
      softverbs::hw::inject_async_event(context, *ev);
    } else {
      ctx->post_async_event(*ev);
    }
    return 0;
  });
}

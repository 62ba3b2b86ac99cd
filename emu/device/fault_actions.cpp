// The emulated devices' side of the verb-level and timed fault rules
// (the fault engine decides, this carries the decisions out): failing posts,
// QPs moved to the error state, ports taken down and up, async events raised,
// devices failing.
#include "emu/device/fault_actions.hpp"
#include "emu/device/gsi.hpp"

#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "core/events.hpp"
#include "core/log.hpp"
#include "faults/scenario.hpp"

namespace softverbs::emu {
namespace {

using faults::FaultAction;
using faults::FaultDecision;

// Raises `type` with the element it needs: the QP (QP events), its send CQ (CQ
// events), its SRQ (SRQ events), the port or the device. False when the element
// does not exist (an SRQ event for a QP without an SRQ, a QP event without a QP).
bool raise_event(Device& dev, Qp* qp, int type, uint8_t port) {
  ibv_async_event ev{};
  ev.event_type = static_cast<ibv_event_type>(type);
  switch (event_element(ev.event_type)) {
    case EventElement::qp:
      if (!qp) return false;
      ev.element.qp = qp->ibv();
      qp->context().post_async_event(ev);
      return true;
    case EventElement::cq:
      if (!qp) return false;
      ev.element.cq = qp->send_cq()->ibv();
      qp->send_cq()->context().post_async_event(ev);
      return true;
    case EventElement::srq:
      if (!qp || !qp->srq()) return false;
      ev.element.srq = qp->srq()->ibv();
      qp->srq()->context().post_async_event(ev);
      return true;
    case EventElement::wq:
      return false;  // no work queue objects
    case EventElement::port:
      dev.post_device_event(ev.event_type, port);
      return true;
    case EventElement::device:
      dev.post_device_event(ev.event_type, 0);
      return true;
  }
  return false;
}

// Carries out a decision whose QP, if it needs one, is named by number: the QP
// is looked up and kept alive while the action runs (it may be gone by now).
void apply_fault_by_qpn(Device& dev, const FaultDecision& d) {
  if (d.action == FaultAction::qp_error || (d.action == FaultAction::event && d.qpn)) {
    dev.with_qp(d.qpn.value_or(0), [&](Qp* qp) { apply_fault(dev, d, qp); });
  } else {
    apply_fault(dev, d, nullptr);
  }
}

}  // namespace

void apply_fault(Device& dev, const FaultDecision& d, Qp* qp) {
  dev.counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
  switch (d.action) {
    case FaultAction::qp_error:
      if (qp) {
        qp->force_error(true);
      } else if (d.qpn && !dev.fail_qp(*d.qpn)) {
        SV_LOG(kInfo, "fault rule %zu: device %s has no QP 0x%06x", d.rule, dev.name().c_str(), *d.qpn);
      }
      break;
    case FaultAction::port_down:
      dev.set_port_active(false);
      if (d.duration_ms) {
        dev.scheduler().after(std::chrono::milliseconds(d.duration_ms), [&dev] {
          if (!dev.fatal()) dev.set_port_active(true);
        });
      }
      break;
    case FaultAction::port_up:
      if (!dev.fatal()) dev.set_port_active(true);
      break;
    case FaultAction::event: {
      Qp* target = qp;
      if (!target && d.qpn) target = dev.find_qp(*d.qpn);
      if (!raise_event(dev, target, d.event, d.port))
        SV_LOG(kInfo, "fault rule %zu: event %s needs an element the rule does not give", d.rule,
               faults::event_name(d.event).c_str());
      break;
    }
    case FaultAction::device_fatal:
      dev.make_fatal();
      break;
    case FaultAction::failover:
      // Nothing changes for the verbs (a bond keeps its address and GIDs);
      // the connection manager tells its ids, as Linux's does on a bonding failover.
      if (GsiAgent* agent = dev.gsi_agent()) agent->link_failed_over(dev);
      break;
    default:
      break;
  }
}

void apply_fault_later(Device& dev, const FaultDecision& d) {
  // Devices live for the whole process; QPs are named by number and looked up
  // again when the action runs.
  dev.scheduler().post([&dev, d] { apply_fault_by_qpn(dev, d); });
}

int post_fault(Qp& qp, faults::VerbPoint verb, std::optional<int> opcode) {
  FaultDecision d =
      qp.device().verb_filter().decide(faults::VerbFacts{verb, qp.device().name(), qp.qpn(), opcode, std::nullopt});
  if (!d.fired) return 0;
  if (d.action == FaultAction::fail) {
    qp.device().counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
    return d.error;
  }
  apply_fault(qp.device(), d, &qp);
  return 0;
}

void apply_timed_fault(const std::vector<Device*>& devices, const FaultDecision& d) {
  for (Device* dev : devices)
    if (d.device.empty() || d.device == dev->name()) apply_fault_by_qpn(*dev, d);
}

// ---------------------------------------------------------------------------
// Device state.

void Device::add_context(Context* ctx) {
  std::lock_guard lock(mu_);
  contexts_.push_back(ctx);
}

void Device::remove_context(Context* ctx) {
  std::lock_guard lock(mu_);
  std::erase(contexts_, ctx);
}

void Device::post_device_event(ibv_event_type type, uint8_t port) {
  ibv_async_event ev{};
  ev.event_type = type;
  ev.element.port_num = port;
  std::lock_guard lock(mu_);
  for (Context* ctx : contexts_) ctx->post_async_event(ev);
}

bool Device::set_port_active(bool up) {
  if (port_active_.exchange(up) == up) return false;
  if (!up) counters_.link_downed.fetch_add(1, std::memory_order_relaxed);
  SV_LOG(kInfo, "device %s: port 1 %s", name().c_str(), up ? "active" : "down");
  post_device_event(up ? IBV_EVENT_PORT_ACTIVE : IBV_EVENT_PORT_ERR, 1);
  return true;
}

void Device::with_qp(uint32_t qpn, const std::function<void(Qp*)>& f) {
  // The receive lock keeps the QP from being destroyed meanwhile (unregister_qp).
  std::lock_guard rx(rx_mu_);
  if (Qp* qp = find_qp(qpn)) f(qp);
}

bool Device::fail_qp(uint32_t qpn) {
  bool found = false;
  with_qp(qpn, [&](Qp* qp) {
    qp->force_error(true);
    found = true;
  });
  return found;
}

void Device::make_fatal() {
  if (fatal_.exchange(true)) return;
  SV_LOG(kInfo, "device %s: fatal error", name().c_str());
  port_active_.store(false);
  post_device_event(IBV_EVENT_DEVICE_FATAL, 0);
  // Every QP fails; its outstanding work is flushed, as mlx5 does on an internal
  // error. No per-QP event: the device event stands for all.
  std::lock_guard rx(rx_mu_);
  std::vector<uint32_t> qpns;
  {
    std::lock_guard lock(mu_);
    for (auto& [qpn, qp] : qps_) qpns.push_back(qpn);
  }
  for (uint32_t qpn : qpns)
    if (Qp* qp = find_qp(qpn)) qp->force_error(false);
  if (GsiAgent* agent = gsi_agent_.load(std::memory_order_acquire)) agent->device_failed(*this);
}

}  // namespace softverbs::emu

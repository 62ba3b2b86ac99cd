// Carrying out the fault layer's verb-level and timed decisions on emulated
// devices (emu/device/fault_actions.cpp).
#pragma once

#include <optional>
#include <vector>

#include "core/clock.hpp"
#include "faults/rule.hpp"

namespace softverbs::emu {

class Device;
class Qp;

// Carries out a side-effect action (qp_error, port_down, port_up, event,
// device_fatal). `qp` is the QP the rule matched, if any. Must not be called with
// a QP's lock held.
void apply_fault(Device& dev, const faults::FaultDecision& d, Qp* qp);
// The same, from the device's scheduler: for decisions taken under a QP's lock.
void apply_fault_later(Device& dev, const faults::FaultDecision& d);
// The post_send / post_recv rules for one work request: the errno the post must
// fail with, or 0 (side-effect actions are carried out here). Called without the
// QP's lock.
int post_fault(Qp& qp, faults::VerbPoint verb, std::optional<int> opcode);
// Carries out a timed rule's decision on the devices it names (all of them when
// it names none). The fault engine calls it on the progress thread.
void apply_timed_fault(const std::vector<Device*>& devices, const faults::FaultDecision& d);

}  // namespace softverbs::emu

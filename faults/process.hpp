// The process's fault engine: the one every backend of this process consults
// and the control API (include/softverbs/faults.h) loads. It is assembled here,
// and only here, from the environment (docs/configuration.md):
// SOFTVERBS_FAULTS (a scenario file), SOFTVERBS_FAULT_SEED, SOFTVERBS_FAULT_LOG.
// Backends include this header only where they assemble their own parts; the
// rest of their code sees the engine as a PacketFilter or a VerbFilter.
#pragma once

#include "core/clock.hpp"
#include "faults/engine.hpp"

namespace softverbs::faults {

// Built on first use on process_scheduler() and its clock; lives until
// exit. Empty (no rules) when the variables are unset.
FaultEngine& process_engine();

// The scheduler the process's engine runs its timed rules on: the one that
// drives the emulated devices (real or virtual time, SOFTVERBS_CLOCK). Defined
// by the module that owns it (fabric/scheduler.cpp).
Scheduler& process_scheduler();

}  // namespace softverbs::faults

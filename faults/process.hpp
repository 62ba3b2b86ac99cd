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

// Built on first use with the real clock and process_scheduler(); lives until
// exit. Empty (no rules) when the variables are unset.
FaultEngine& process_engine();

// The scheduler the process's engine runs its timed rules on: the thread that
// drives the emulated devices. Defined by the module that owns that thread (the
// emulated devices' progress engine).
Scheduler& process_scheduler();

}  // namespace softverbs::faults

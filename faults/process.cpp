// The process's fault engine, assembled from the environment (faults/process.hpp),
// and the control API's view of it (core/fault_control.hpp).
#include "faults/process.hpp"

#include <cstdlib>
#include <string>

#include "core/env.hpp"
#include "core/log.hpp"

namespace softverbs::faults {

FaultEngine& process_engine() {
  static FaultEngine* engine = [] {
    // Never destroyed: backends and pending timed rules may use it until exit.
    auto* e = new FaultEngine(process_scheduler().clock(), process_scheduler());
    if (const char* seed = env::fault_seed(); seed && *seed)
      e->set_seed(std::strtoull(seed, nullptr, 0));
    if (const char* log = env::fault_log(); log && *log) e->set_log(log);
    if (const char* path = env::faults(); path && *path) {
      std::string error;
      if (!e->load_file(path, &error)) SV_LOG(kError, "SOFTVERBS_FAULTS=%s: %s; no faults", path, error.c_str());
    }
    return e;
  }();
  return *engine;
}

}  // namespace softverbs::faults

softverbs::FaultControl& softverbs::fault_control() { return faults::process_engine(); }

// The fault engine (docs/faults.md): holds the rules of the loaded scenarios and
// decides, for each packet, verb call, completion or async event that passes it,
// whether a rule fires. Each rule draws from its own random stream, seeded from
// the scenario seed and the rule's position, so the same seed and the same
// traffic give the same decisions, and adding a rule does not change the
// decisions of the others. It only decides; the backends carry decisions out.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/fault_control.hpp"
#include "faults/filter.hpp"
#include "faults/rule.hpp"

namespace softverbs::faults {

// Runs timed rules: the emulated devices register one, which schedules a call of
// FaultEngine::fire_timed(index, generation) at_ms after it is handed the rule.
using TimedScheduler = std::function<void(size_t index, uint64_t generation, uint32_t at_ms)>;

class FaultEngine final : public FaultControl, public PacketFilter, public VerbFilter {
 public:
  // The process-wide engine, loaded on first use from SOFTVERBS_FAULTS (a scenario
  // file) and SOFTVERBS_FAULT_SEED; empty when neither is set.
  static FaultEngine& instance();

  // Parses a scenario in TOML (docs/faults.md) and adds its rules. A `seed` key
  // replaces the seed. Returns false and fills *error on a malformed scenario, in
  // which case nothing is added.
  bool load(std::string_view toml_text, std::string* error) override;
  bool load_file(const std::string& path, std::string* error) override;
  void clear() override;
  void set_seed(uint64_t seed) override;
  // Where decisions are logged, one line each ("" stops logging).
  bool set_log(const std::string& path) override;

  // Cheap check for the common case of no rules.
  bool active() const override { return active_.load(std::memory_order_relaxed); }
  bool verbs_active() const override { return verbs_active_.load(std::memory_order_relaxed); }
  FaultDecision decide(const PacketFacts& facts) override;
  FaultDecision decide(const VerbFacts& facts) override;
  // A timed rule's moment has come: its decision, unless the rules were cleared
  // since it was scheduled.
  FaultDecision fire_timed(size_t index, uint64_t generation);
  // Timed rules already loaded are handed over at once; later ones as they load.
  void set_timed_scheduler(TimedScheduler scheduler);
  void add_verbs_listener(std::function<void(bool active)> listener) override;

  // How many times the named rule fired (0 if there is none).
  uint64_t hits(std::string_view rule_name) override;
  size_t rule_count();

 private:
  struct State {
    FaultRule rule;
    uint64_t matches = 0;
    uint64_t fired = 0;
    std::mt19937_64 rng;
  };
  void reseed_locked();
  void update_flags_locked();
  bool fire_locked(State& s);
  void log_locked(const State& s, const char* what);

  std::mutex mu_;
  std::atomic<bool> active_{false};
  std::atomic<bool> verbs_active_{false};
  uint64_t generation_ = 0;  // bumped by clear(): pending timed rules lapse
  TimedScheduler scheduler_;
  std::vector<std::function<void(bool)>> verbs_listeners_;
  void notify_verbs_listeners(bool was_active);
  uint64_t seed_ = 1;
  std::vector<State> rules_;
  std::FILE* log_ = nullptr;
};

}  // namespace softverbs::faults

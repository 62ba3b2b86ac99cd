// The fault engine (docs/faults.md): holds the rules of the loaded scenarios and
// decides, for each packet, verb call, completion or async event that passes it,
// whether a rule fires. Each rule draws from its own random stream, seeded from
// the scenario seed and the rule's position, so the same seed and the same
// traffic give the same decisions, and adding a rule does not change the
// decisions of the others. It only decides; the backends carry decisions out.
//
// The engine is built with the clock and scheduler it runs on (core/clock.hpp):
// timed rules are scheduled on it, so a test or a simulated fabric drives them
// with its own time. The process's engine is assembled in faults/process.cpp;
// backends see it only through PacketFilter, VerbFilter (faults/filter.hpp) and
// FaultControl (core/fault_control.hpp).
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

#include "core/clock.hpp"
#include "core/fault_control.hpp"
#include "faults/filter.hpp"
#include "faults/rule.hpp"

namespace softverbs::faults {

// Carries out a decision the engine takes on its own (a timed rule's): the
// emulated devices register one that takes ports and devices down, fails QPs and
// raises events. Called on the scheduler's thread, outside the engine's lock.
using FaultActor = std::function<void(const FaultDecision&)>;

class FaultEngine final : public FaultControl, public PacketFilter, public VerbFilter {
 public:
  // No rules, seed 1, no log. The clock and the scheduler must outlive the
  // engine, and the engine the tasks it gave the scheduler.
  FaultEngine(const Clock& clock, Scheduler& scheduler);
  ~FaultEngine() override;
  FaultEngine(const FaultEngine&) = delete;
  FaultEngine& operator=(const FaultEngine&) = delete;

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
  using PacketFilter::active;
  bool verbs_active() const override { return verbs_active_.load(std::memory_order_relaxed); }
  FaultDecision decide(const PacketFacts& facts) override;
  FaultDecision decide(const VerbFacts& facts) override;
  void add_verbs_listener(std::function<void(bool active)> listener) override;
  // Registers an actor for timed rules. Timed rules wait for the first actor (with
  // none, nothing would carry them out): those already loaded are scheduled then,
  // at_ms from that moment; later ones at_ms from their load.
  void add_actor(FaultActor actor);

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
  // A timed rule waiting for its moment: its position and the generation it was
  // loaded in.
  struct Pending {
    size_t index;
    uint64_t generation;
    uint32_t at_ms;
  };
  void reseed_locked();
  void update_flags_locked();
  bool fire_locked(State& s);
  void log_locked(const State& s, const char* what);
  void schedule(const std::vector<Pending>& timed);
  // A timed rule's moment has come: its decision, unless the rules were cleared
  // since it was scheduled (or it already fired).
  FaultDecision fire_timed(size_t index, uint64_t generation);
  void notify_verbs_listeners(bool was_active);

  const Clock& clock_;
  Scheduler& scheduler_;
  std::mutex mu_;
  std::atomic<bool> verbs_active_{false};
  uint64_t generation_ = 0;  // bumped by clear(): pending timed rules lapse
  std::vector<FaultActor> actors_;
  std::vector<std::function<void(bool)>> verbs_listeners_;
  uint64_t seed_ = 1;
  std::vector<State> rules_;
  std::FILE* log_ = nullptr;
};

}  // namespace softverbs::faults

// The fault layer: rules that match packets between the QP engine and the wire
// and act on them (design.md §4, docs/faults.md).
//
// A rule matches on the device, the direction, the BTH (destination QP, opcode or
// opcode class, PSN range) and fires on the nth match, on every nth, or with a
// probability, at most `count` times. Each rule draws from its own random stream,
// seeded from the scenario seed and the rule's position, so the same seed and the
// same traffic give the same decisions, and adding a rule does not change the
// decisions of the others.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "transport/packet.hpp"

namespace softverbs::transport {

enum class Direction : uint8_t { any, tx, rx };

enum class FaultAction : uint8_t {
  drop,       // the packet is lost
  duplicate,  // the packet is delivered twice
  corrupt,    // one byte is flipped: the receiver's ICRC check drops it
  delay,      // the packet is delivered delay_us later
  reorder,    // the packet is held back and delivered after the next packet
  nak,        // rx only: the packet is replaced by a NAK with `syndrome` for its PSN
};

// Opcode classes a rule can name instead of one opcode.
enum class PacketClass : uint8_t { any, send, write, read_request, read_response, ack, nak, rnr_nak, atomic, atomic_ack };

struct FaultRule {
  std::string name;
  // match
  Direction direction = Direction::any;
  std::string device;                  // empty: any
  std::optional<uint32_t> qpn;         // BTH destination QP
  std::optional<uint8_t> opcode;       // BTH opcode
  PacketClass packet_class = PacketClass::any;
  std::optional<uint32_t> psn_first;   // inclusive PSN range
  std::optional<uint32_t> psn_last;
  // when
  uint64_t nth = 0;          // fire on the nth match only (1-based); 0: not used
  uint64_t every = 0;        // fire on every nth match; 0: not used
  double probability = 1.0;  // fire with this probability (after nth/every)
  uint64_t count = 0;        // fire at most this many times; 0: unlimited
  // what
  FaultAction action = FaultAction::drop;
  uint32_t delay_us = 0;
  uint8_t syndrome = 0x60;  // for nak: AETH syndrome (0x60 PSN sequence error ...)
};

// What a packet passing the layer looks like to the rules.
struct PacketFacts {
  Direction direction;
  std::string_view device;
  const PacketView* pkt;
};

struct FaultDecision {
  bool fired = false;
  FaultAction action = FaultAction::drop;
  uint32_t delay_us = 0;
  uint8_t syndrome = 0;
  size_t rule = 0;
};

class FaultEngine {
 public:
  // The process-wide engine, loaded on first use from SOFTVERBS_FAULTS (a scenario
  // file) and SOFTVERBS_FAULT_SEED; empty when neither is set.
  static FaultEngine& instance();

  // Parses a scenario in TOML (docs/faults.md) and adds its rules. A `seed` key
  // replaces the seed. Returns false and fills *error on a malformed scenario, in
  // which case nothing is added.
  bool load(std::string_view toml_text, std::string* error);
  bool load_file(const std::string& path, std::string* error);
  void clear();
  void set_seed(uint64_t seed);
  // Where decisions are logged, one line each ("" stops logging).
  bool set_log(const std::string& path);

  // Cheap check for the common case of no rules.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  FaultDecision decide(const PacketFacts& facts);

  // How many times the named rule fired (0 if there is none).
  uint64_t hits(std::string_view rule_name);
  size_t rule_count();

 private:
  struct State {
    FaultRule rule;
    uint64_t matches = 0;
    uint64_t fired = 0;
    std::mt19937_64 rng;
  };
  void reseed_locked();

  std::mutex mu_;
  std::atomic<bool> active_{false};
  uint64_t seed_ = 1;
  std::vector<State> rules_;
  std::FILE* log_ = nullptr;
};

std::string_view to_string(FaultAction a) noexcept;

}  // namespace softverbs::transport

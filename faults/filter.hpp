// What the backends see of the fault engine: two small interfaces, one for the
// packet path (consulted per packet by the link's fault layer) and one for the
// verb path (consulted per post, completion and async event). The engine
// (faults/engine.hpp) implements both; a backend holds a reference to the one it
// needs and never names the engine.
#pragma once

#include <atomic>
#include <functional>

#include "faults/rule.hpp"

namespace softverbs::faults {

class PacketFilter {
 public:
  virtual ~PacketFilter() = default;
  // Cheap check for the common case of no packet rules: an inline load of a
  // flag the implementation keeps (set_active), not a virtual call, as the
  // in-process fast path asks it several times per packet.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Whether a packet rule may match packets going that way (tx or rx): a link
  // may decide on a packet's headers alone when only rules of the other
  // direction are loaded (fabric::FaultyLink).
  bool watches(Direction d) const {
    return (d == Direction::rx ? watches_rx_ : watches_tx_).load(std::memory_order_relaxed);
  }
  // Whether a rule fires for this packet, and what it asks for.
  virtual FaultDecision decide(const PacketFacts& facts) = 0;

 protected:
  void set_active(bool tx, bool rx) {
    watches_tx_.store(tx, std::memory_order_relaxed);
    watches_rx_.store(rx, std::memory_order_relaxed);
    active_.store(tx || rx, std::memory_order_relaxed);
  }

 private:
  std::atomic<bool> active_{false};
  std::atomic<bool> watches_tx_{false};
  std::atomic<bool> watches_rx_{false};
};

class VerbFilter {
 public:
  virtual ~VerbFilter() = default;
  // Cheap check for the common case of no verb rules.
  virtual bool verbs_active() const = 0;
  virtual FaultDecision decide(const VerbFacts& facts) = 0;
  // Called (outside the engine's lock) whenever verbs_active() changes, e.g. so
  // that a backend can put its verb hooks in place only while verb rules exist.
  virtual void add_verbs_listener(std::function<void(bool active)> listener) = 0;
};

}  // namespace softverbs::faults

// The fault engine: rule matching, per-rule random streams, timed rules, the
// decision log (faults/engine.hpp).
#include "faults/engine.hpp"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>

#include "faults/scenario.hpp"
#include "wire/cm_mad.hpp"
#include "wire/psn.hpp"

namespace softverbs::faults {
namespace {

using namespace wire;

bool class_matches(PacketClass c, const PacketView& p) {
  const OpClass oc = p.op->op_class;
  switch (c) {
    case PacketClass::any:
      return true;
    case PacketClass::send:
      return oc == OpClass::send;
    case PacketClass::write:
      return oc == OpClass::rdma_write;
    case PacketClass::read_request:
      return oc == OpClass::rdma_read_request;
    case PacketClass::read_response:
      return oc == OpClass::rdma_read_response;
    case PacketClass::ack:
      return oc == OpClass::ack && p.aeth.is_ack();
    case PacketClass::nak:
      return oc == OpClass::ack && p.aeth.is_nak();
    case PacketClass::rnr_nak:
      return oc == OpClass::ack && p.aeth.is_rnr_nak();
    case PacketClass::atomic:
      return oc == OpClass::atomic;
    case PacketClass::atomic_ack:
      return oc == OpClass::atomic_ack;
  }
  return false;
}

}  // namespace

FaultEngine::FaultEngine(const Clock& clock, Scheduler& scheduler) : clock_(clock), scheduler_(scheduler) {}

FaultEngine::~FaultEngine() {
  if (log_) std::fclose(log_);
}

bool FaultEngine::load_file(const std::string& path, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return load(ss.str(), error);
}

bool FaultEngine::load(std::string_view text, std::string* error) {
  size_t base;
  {
    std::lock_guard lock(mu_);
    base = rules_.size();
  }
  Scenario scenario;
  if (!parse_scenario(text, base, &scenario, error)) return false;
  const std::optional<uint64_t> seed = scenario.seed;
  std::vector<FaultRule>& rules = scenario.rules;
  std::vector<Pending> timed;
  const bool was_active = verbs_active();
  {
    std::lock_guard lock(mu_);
    if (seed) seed_ = *seed;
    for (FaultRule& r : rules) {
      if (r.target == RuleTarget::timed && !actors_.empty()) timed.push_back({rules_.size(), generation_, r.at_ms});
      rules_.push_back(State{std::move(r), 0, 0, {}});
    }
    reseed_locked();
    update_flags_locked();
  }
  schedule(timed);
  notify_verbs_listeners(was_active);
  return true;
}

void FaultEngine::clear() {
  const bool was_active = verbs_active();
  {
    std::lock_guard lock(mu_);
    rules_.clear();
    ++generation_;
    update_flags_locked();
  }
  notify_verbs_listeners(was_active);
}

void FaultEngine::add_verbs_listener(std::function<void(bool)> listener) {
  std::lock_guard lock(mu_);
  verbs_listeners_.push_back(std::move(listener));
}

void FaultEngine::notify_verbs_listeners(bool was_active) {
  const bool now = verbs_active();
  if (now == was_active) return;
  std::vector<std::function<void(bool)>> listeners;
  {
    std::lock_guard lock(mu_);
    listeners = verbs_listeners_;
  }
  for (auto& l : listeners) l(now);
}

void FaultEngine::update_flags_locked() {
  bool tx = false, rx = false, verbs = false;
  for (const State& s : rules_) {
    const bool packet = s.rule.target == RuleTarget::packet;
    tx |= packet && s.rule.direction != Direction::rx;
    rx |= packet && s.rule.direction != Direction::tx;
    verbs |= s.rule.target == RuleTarget::verb;
  }
  set_active(tx, rx);
  verbs_active_.store(verbs, std::memory_order_relaxed);
}

void FaultEngine::add_actor(FaultActor actor) {
  std::vector<Pending> timed;
  {
    std::lock_guard lock(mu_);
    if (actors_.empty()) {
      for (size_t i = 0; i < rules_.size(); ++i)
        if (rules_[i].rule.target == RuleTarget::timed && rules_[i].fired == 0)
          timed.push_back({i, generation_, rules_[i].rule.at_ms});
    }
    actors_.push_back(std::move(actor));
  }
  schedule(timed);
}

void FaultEngine::schedule(const std::vector<Pending>& timed) {
  // Each rule gets its own task; the generation it carries makes it lapse if
  // clear() runs before its moment.
  for (const Pending& p : timed) {
    scheduler_.at(clock_.now() + std::chrono::milliseconds(p.at_ms), [this, p] {
      const FaultDecision d = fire_timed(p.index, p.generation);
      if (!d.fired) return;
      std::vector<FaultActor> actors;
      {
        std::lock_guard lock(mu_);
        actors = actors_;
      }
      for (const FaultActor& a : actors) a(d);
    });
  }
}

void FaultEngine::set_seed(uint64_t seed) {
  std::lock_guard lock(mu_);
  seed_ = seed;
  reseed_locked();
}

void FaultEngine::reseed_locked() {
  // Each rule's stream depends on the seed and its position only.
  for (size_t i = 0; i < rules_.size(); ++i) {
    std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32), static_cast<uint32_t>(i)};
    rules_[i].rng.seed(seq);
  }
}

bool FaultEngine::set_log(const std::string& path) {
  std::lock_guard lock(mu_);
  if (log_) std::fclose(log_);
  log_ = nullptr;
  if (path.empty()) return true;
  log_ = std::fopen(path.c_str(), "ae");
  return log_ != nullptr;
}

namespace {

FaultDecision decision_of(const FaultRule& r, size_t index) {
  FaultDecision d;
  d.fired = true;
  d.action = r.action;
  d.delay_us = r.delay_us;
  d.syndrome = r.syndrome;
  d.reason = r.reason;
  d.rule = index;
  d.error = r.error;
  d.wc_status = r.wc_status;
  d.event = r.event;
  d.port = r.port;
  d.duration_ms = r.duration_ms;
  d.device = r.device;
  d.qpn = r.qpn;
  return d;
}

const char* verb_name(VerbPoint v) {
  switch (v) {
    case VerbPoint::post_send:
      return "post_send";
    case VerbPoint::post_recv:
      return "post_recv";
    case VerbPoint::completion:
      return "completion";
    case VerbPoint::async_event:
      return "async_event";
  }
  return "?";
}

}  // namespace

bool FaultEngine::fire_locked(State& s) {
  // The count limit, then nth / every, then the probability.
  const FaultRule& r = s.rule;
  if (r.count && s.fired >= r.count) return false;
  ++s.matches;
  if (r.nth && s.matches != r.nth) return false;
  if (r.every && s.matches % r.every != 0) return false;
  if (r.probability < 1.0 && std::uniform_real_distribution<double>(0.0, 1.0)(s.rng) >= r.probability) return false;
  ++s.fired;
  return true;
}

void FaultEngine::log_locked(const State& s, const char* what) {
  if (!log_) return;
  std::fprintf(log_, "%s rule=%s action=%.*s\n", what, s.rule.name.c_str(),
               static_cast<int>(to_string(s.rule.action).size()), to_string(s.rule.action).data());
  std::fflush(log_);
}

FaultDecision FaultEngine::decide(const PacketFacts& f) {
  FaultDecision d;
  if (!active()) return d;
  const PacketView& p = *f.pkt;
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < rules_.size(); ++i) {
    State& s = rules_[i];
    const FaultRule& r = s.rule;
    if (r.target != RuleTarget::packet) continue;
    if (r.direction != Direction::any && r.direction != f.direction) continue;
    if (!r.device.empty() && r.device != f.device) continue;
    if (r.qpn && *r.qpn != p.bth.dest_qp) continue;
    if (r.opcode && *r.opcode != p.bth.opcode) continue;
    if (!class_matches(r.packet_class, p)) continue;
    if (r.cm && wire::cm::cm_attribute(p) != r.cm) continue;
    if (r.psn_first && (psn_lt(p.bth.psn, *r.psn_first) || psn_gt(p.bth.psn, *r.psn_last))) continue;
    if (r.mig_req && *r.mig_req != p.bth.migreq) continue;
    if (!fire_locked(s)) continue;
    if (log_) {
      char what[180];
      const std::string_view msg = r.cm ? wire::cm::to_string(*r.cm) : std::string_view();
      std::snprintf(what, sizeof what, "%s %.*s qpn=0x%06x psn=%u opcode=%.*s%s%.*s",
                    f.direction == Direction::tx ? "tx" : "rx", static_cast<int>(f.device.size()), f.device.data(),
                    p.bth.dest_qp, p.bth.psn, static_cast<int>(p.op->name.size()), p.op->name.data(),
                    r.cm ? " cm=" : "", static_cast<int>(msg.size()), msg.data());
      log_locked(s, what);
    }
    return decision_of(r, i);  // the first rule that fires decides
  }
  return d;
}

FaultDecision FaultEngine::decide(const VerbFacts& f) {
  FaultDecision d;
  if (!verbs_active()) return d;
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < rules_.size(); ++i) {
    State& s = rules_[i];
    const FaultRule& r = s.rule;
    if (r.target != RuleTarget::verb || r.verb != f.verb) continue;
    if (!r.device.empty() && r.device != f.device) continue;
    if (r.qpn && (!f.qpn || *r.qpn != *f.qpn)) continue;
    if (r.verb_opcode && (!f.opcode || *r.verb_opcode != *f.opcode)) continue;
    if (r.match_event && (!f.event || *r.match_event != *f.event)) continue;
    if (!fire_locked(s)) continue;
    if (log_) {
      char what[160];
      std::snprintf(what, sizeof what, "%s %.*s qpn=0x%06x opcode=%d event=%d", verb_name(f.verb),
                    static_cast<int>(f.device.size()), f.device.data(), f.qpn.value_or(0), f.opcode.value_or(-1),
                    f.event.value_or(-1));
      log_locked(s, what);
    }
    FaultDecision out = decision_of(r, i);
    out.device = std::string(f.device);
    if (f.qpn) out.qpn = f.qpn;
    return out;
  }
  return d;
}

FaultDecision FaultEngine::fire_timed(size_t index, uint64_t generation) {
  std::lock_guard lock(mu_);
  if (generation != generation_ || index >= rules_.size()) return {};
  State& s = rules_[index];
  if (s.rule.target != RuleTarget::timed || s.fired) return {};
  ++s.matches;
  ++s.fired;
  if (log_) {
    char what[96];
    std::snprintf(what, sizeof what, "timed at_ms=%u device=%s", s.rule.at_ms,
                  s.rule.device.empty() ? "*" : s.rule.device.c_str());
    log_locked(s, what);
  }
  return decision_of(s.rule, index);
}

uint64_t FaultEngine::hits(std::string_view rule_name) {
  std::lock_guard lock(mu_);
  uint64_t n = 0;
  for (const State& s : rules_)
    if (s.rule.name == rule_name) n += s.fired;
  return n;
}

size_t FaultEngine::rule_count() {
  std::lock_guard lock(mu_);
  return rules_.size();
}

}  // namespace softverbs::faults

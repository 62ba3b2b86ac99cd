#include "transport/faults.hpp"

#define TOML_HEADER_ONLY 1
#include <toml++/toml.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "softverbs/log.hpp"
#include "transport/psn.hpp"

namespace softverbs::transport {
namespace {

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

std::optional<PacketClass> parse_class(std::string_view s) {
  if (s == "send") return PacketClass::send;
  if (s == "write") return PacketClass::write;
  if (s == "read_request") return PacketClass::read_request;
  if (s == "read_response") return PacketClass::read_response;
  if (s == "ack") return PacketClass::ack;
  if (s == "nak") return PacketClass::nak;
  if (s == "rnr_nak") return PacketClass::rnr_nak;
  if (s == "atomic") return PacketClass::atomic;
  if (s == "atomic_ack") return PacketClass::atomic_ack;
  return std::nullopt;
}

std::optional<FaultAction> parse_action(std::string_view s) {
  if (s == "drop") return FaultAction::drop;
  if (s == "duplicate") return FaultAction::duplicate;
  if (s == "corrupt") return FaultAction::corrupt;
  if (s == "delay") return FaultAction::delay;
  if (s == "reorder") return FaultAction::reorder;
  if (s == "nak") return FaultAction::nak;
  return std::nullopt;
}

std::optional<uint8_t> parse_syndrome(std::string_view s) {
  if (s == "psn_sequence_error") return 0x60;
  if (s == "invalid_request") return 0x61;
  if (s == "remote_access_error") return 0x62;
  if (s == "remote_operational_error") return 0x63;
  if (s == "invalid_rd_request") return 0x64;
  return std::nullopt;
}

std::optional<uint8_t> opcode_by_name(std::string_view name) {
  for (unsigned op = 0; op < 256; ++op) {
    const OpcodeInfo& info = opcode_info(static_cast<uint8_t>(op));
    if (info.valid && info.name == name) return info.opcode;
  }
  return std::nullopt;
}

// Reads an integer key in [0, max]; false with a message if it is there but wrong.
template <class T>
bool get_uint(const toml::table& t, const char* key, T* out, uint64_t max, std::string* error,
              const std::string& where) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  auto v = n->value<int64_t>();
  if (!v || *v < 0 || static_cast<uint64_t>(*v) > max) {
    *error = where + ": '" + key + "' must be an integer from 0 to " + std::to_string(max);
    return false;
  }
  *out = static_cast<T>(*v);
  return true;
}

bool parse_rule(const toml::table& t, size_t index, FaultRule* r, std::string* error) {
  const std::string where = "rule " + std::to_string(index + 1);
  static const char* const known[] = {"name",  "direction",   "device", "qpn",   "opcode",   "class",
                                      "psn",   "nth",         "every",  "probability", "count", "action",
                                      "delay_ms", "delay_us", "syndrome"};
  for (auto&& [k, v] : t) {
    bool ok = false;
    for (const char* name : known) ok |= k.str() == name;
    if (!ok) {
      *error = where + ": unknown key '" + std::string(k.str()) + "'";
      return false;
    }
  }
  r->name = t["name"].value_or(std::string("rule") + std::to_string(index + 1));
  if (auto d = t["direction"].value<std::string>()) {
    if (*d == "tx") r->direction = Direction::tx;
    else if (*d == "rx") r->direction = Direction::rx;
    else if (*d == "any") r->direction = Direction::any;
    else {
      *error = where + ": direction must be tx, rx or any";
      return false;
    }
  }
  r->device = t["device"].value_or(std::string());
  uint32_t qpn = 0;
  if (t.contains("qpn")) {
    if (!get_uint(t, "qpn", &qpn, 0xffffff, error, where)) return false;
    r->qpn = qpn;
  }
  if (const toml::node* n = t.get("opcode")) {
    if (auto s = n->value<std::string>()) {
      r->opcode = opcode_by_name(*s);
      if (!r->opcode) {
        *error = where + ": unknown opcode '" + *s + "' (use the BTH names, e.g. RC_SEND_ONLY)";
        return false;
      }
    } else {
      uint32_t op = 0;
      if (!get_uint(t, "opcode", &op, 0xff, error, where)) return false;
      r->opcode = static_cast<uint8_t>(op);
    }
  }
  if (auto c = t["class"].value<std::string>()) {
    auto pc = parse_class(*c);
    if (!pc) {
      *error = where + ": unknown class '" + *c + "'";
      return false;
    }
    r->packet_class = *pc;
  }
  if (const toml::node* n = t.get("psn")) {
    const toml::array* a = n->as_array();
    auto lo = a && a->size() == 2 ? (*a)[0].value<int64_t>() : std::nullopt;
    auto hi = a && a->size() == 2 ? (*a)[1].value<int64_t>() : std::nullopt;
    if (!lo || !hi || *lo < 0 || *hi < 0 || *lo > 0xffffff || *hi > 0xffffff) {
      *error = where + ": psn must be [first, last], 24-bit PSNs";
      return false;
    }
    r->psn_first = static_cast<uint32_t>(*lo);
    r->psn_last = static_cast<uint32_t>(*hi);
  }
  if (!get_uint(t, "nth", &r->nth, UINT32_MAX, error, where)) return false;
  if (!get_uint(t, "every", &r->every, UINT32_MAX, error, where)) return false;
  if (!get_uint(t, "count", &r->count, UINT32_MAX, error, where)) return false;
  if (const toml::node* n = t.get("probability")) {
    auto p = n->value<double>();
    if (!p || *p < 0.0 || *p > 1.0) {
      *error = where + ": probability must be a number from 0 to 1";
      return false;
    }
    r->probability = *p;
  }
  auto a = t["action"].value<std::string>();
  if (!a) {
    *error = where + ": 'action' is required (drop, duplicate, corrupt, delay, reorder, nak)";
    return false;
  }
  auto act = parse_action(*a);
  if (!act) {
    *error = where + ": unknown action '" + *a + "'";
    return false;
  }
  r->action = *act;
  uint32_t ms = 0;
  if (!get_uint(t, "delay_ms", &ms, 60000, error, where)) return false;
  if (!get_uint(t, "delay_us", &r->delay_us, 60000000, error, where)) return false;
  if (ms) r->delay_us = ms * 1000;
  if (r->action == FaultAction::delay && r->delay_us == 0) {
    *error = where + ": action delay needs delay_ms or delay_us";
    return false;
  }
  if (const toml::node* n = t.get("syndrome")) {
    if (auto s = n->value<std::string>()) {
      auto syn = parse_syndrome(*s);
      if (!syn) {
        *error = where + ": unknown syndrome '" + *s + "'";
        return false;
      }
      r->syndrome = *syn;
    } else {
      uint32_t syn = 0;
      if (!get_uint(t, "syndrome", &syn, 0x7f, error, where)) return false;
      r->syndrome = static_cast<uint8_t>(syn);
    }
  }
  if (r->action == FaultAction::nak && r->direction != Direction::rx) {
    *error = where + ": action nak applies to received packets: set direction = \"rx\"";
    return false;
  }
  return true;
}

}  // namespace

std::string_view to_string(FaultAction a) noexcept {
  switch (a) {
    case FaultAction::drop:
      return "drop";
    case FaultAction::duplicate:
      return "duplicate";
    case FaultAction::corrupt:
      return "corrupt";
    case FaultAction::delay:
      return "delay";
    case FaultAction::reorder:
      return "reorder";
    case FaultAction::nak:
      return "nak";
  }
  return "?";
}

FaultEngine& FaultEngine::instance() {
  static FaultEngine* engine = [] {
    auto* e = new FaultEngine;  // lives until exit
    if (const char* seed = std::getenv("SOFTVERBS_FAULT_SEED"); seed && *seed)
      e->set_seed(std::strtoull(seed, nullptr, 0));
    if (const char* log = std::getenv("SOFTVERBS_FAULT_LOG"); log && *log) e->set_log(log);
    if (const char* path = std::getenv("SOFTVERBS_FAULTS"); path && *path) {
      std::string error;
      if (!e->load_file(path, &error)) SV_LOG(kError, "SOFTVERBS_FAULTS=%s: %s; no faults", path, error.c_str());
    }
    return e;
  }();
  return *engine;
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
  toml::table doc;
  try {
    doc = toml::parse(text);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "line " << e.source().begin.line << ": " << e.description();
    *error = os.str();
    return false;
  }
  for (auto&& [k, v] : doc) {
    if (k.str() != "seed" && k.str() != "rule") {
      *error = "unknown top-level key '" + std::string(k.str()) + "' (seed, rule)";
      return false;
    }
  }
  std::optional<uint64_t> seed;
  if (const toml::node* n = doc.get("seed")) {
    auto v = n->value<int64_t>();
    if (!v || *v < 0) {
      *error = "seed must be a non-negative integer";
      return false;
    }
    seed = static_cast<uint64_t>(*v);
  }
  std::vector<FaultRule> rules;
  if (const toml::node* n = doc.get("rule")) {
    const toml::array* arr = n->as_array();
    if (!arr) {
      *error = "rules are written as [[rule]] tables";
      return false;
    }
    std::lock_guard lock(mu_);
    size_t base = rules_.size();
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::table* t = (*arr)[i].as_table();
      if (!t) {
        *error = "rules are written as [[rule]] tables";
        return false;
      }
      FaultRule r;
      if (!parse_rule(*t, base + i, &r, error)) return false;
      rules.push_back(std::move(r));
    }
  }
  std::lock_guard lock(mu_);
  if (seed) seed_ = *seed;
  for (FaultRule& r : rules) rules_.push_back(State{std::move(r), 0, 0, {}});
  reseed_locked();
  active_.store(!rules_.empty(), std::memory_order_relaxed);
  return true;
}

void FaultEngine::clear() {
  std::lock_guard lock(mu_);
  rules_.clear();
  active_.store(false, std::memory_order_relaxed);
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

FaultDecision FaultEngine::decide(const PacketFacts& f) {
  FaultDecision d;
  if (!active()) return d;
  const PacketView& p = *f.pkt;
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < rules_.size(); ++i) {
    State& s = rules_[i];
    const FaultRule& r = s.rule;
    if (r.direction != Direction::any && r.direction != f.direction) continue;
    if (!r.device.empty() && r.device != f.device) continue;
    if (r.qpn && *r.qpn != p.bth.dest_qp) continue;
    if (r.opcode && *r.opcode != p.bth.opcode) continue;
    if (!class_matches(r.packet_class, p)) continue;
    if (r.psn_first && (psn_lt(p.bth.psn, *r.psn_first) || psn_gt(p.bth.psn, *r.psn_last))) continue;
    if (r.count && s.fired >= r.count) continue;
    ++s.matches;
    if (r.nth && s.matches != r.nth) continue;
    if (r.every && s.matches % r.every != 0) continue;
    if (r.probability < 1.0 && std::uniform_real_distribution<double>(0.0, 1.0)(s.rng) >= r.probability) continue;
    ++s.fired;
    d = FaultDecision{true, r.action, r.delay_us, r.syndrome, i};
    if (log_) {
      std::fprintf(log_, "%s %.*s qpn=0x%06x psn=%u opcode=%.*s rule=%s action=%.*s\n",
                   f.direction == Direction::tx ? "tx" : "rx", static_cast<int>(f.device.size()),
                   f.device.data(), p.bth.dest_qp, p.bth.psn, static_cast<int>(p.op->name.size()),
                   p.op->name.data(), r.name.c_str(), static_cast<int>(to_string(r.action).size()),
                   to_string(r.action).data());
      std::fflush(log_);
    }
    return d;  // the first rule that fires decides
  }
  return d;
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

}  // namespace softverbs::transport

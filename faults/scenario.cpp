#include "faults/scenario.hpp"

#define TOML_HEADER_ONLY 1
#include <infiniband/verbs.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "wire/cm_mad.hpp"
#include "wire/opcode.hpp"
#include "wire/psn.hpp"

namespace softverbs::faults {
namespace {

using namespace wire;

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

// The CM messages a `cm` key can name, as the codec names them (wire/cm_mad.hpp).
constexpr cm::Attr kCmMessages[] = {cm::Attr::kReq,  cm::Attr::kMra,     cm::Attr::kRej,
                                    cm::Attr::kRep,  cm::Attr::kRtu,     cm::Attr::kDreq,
                                    cm::Attr::kDrep, cm::Attr::kSidrReq, cm::Attr::kSidrRep};

std::optional<cm::Attr> parse_cm_message(std::string_view s) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  for (cm::Attr a : kCmMessages) {
    const std::string_view name = cm::to_string(a);
    if (name.size() == s.size() &&
        std::equal(name.begin(), name.end(), s.begin(), [&](char x, char y) { return lower(x) == lower(y); }))
      return a;
  }
  return std::nullopt;
}

std::string cm_message_names() {
  std::string s;
  for (cm::Attr a : kCmMessages) s += (s.empty() ? "" : ", ") + std::string(cm::to_string(a));
  return s;
}

std::optional<FaultAction> parse_action(std::string_view s) {
  if (s == "drop") return FaultAction::drop;
  if (s == "duplicate") return FaultAction::duplicate;
  if (s == "corrupt") return FaultAction::corrupt;
  if (s == "delay") return FaultAction::delay;
  if (s == "reorder") return FaultAction::reorder;
  if (s == "nak") return FaultAction::nak;
  if (s == "reject") return FaultAction::reject;
  if (s == "fail") return FaultAction::fail;
  if (s == "status") return FaultAction::status;
  if (s == "qp_error") return FaultAction::qp_error;
  if (s == "port_down") return FaultAction::port_down;
  if (s == "port_up") return FaultAction::port_up;
  if (s == "event") return FaultAction::event;
  if (s == "device_fatal") return FaultAction::device_fatal;
  if (s == "failover") return FaultAction::failover;
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

struct Named {
  const char* name;
  int value;
};

#define SV_NAMED(x) \
  { #x, x }
constexpr Named kWrOpcodes[] = {
    SV_NAMED(IBV_WR_RDMA_WRITE),
    SV_NAMED(IBV_WR_RDMA_WRITE_WITH_IMM),
    SV_NAMED(IBV_WR_SEND),
    SV_NAMED(IBV_WR_SEND_WITH_IMM),
    SV_NAMED(IBV_WR_RDMA_READ),
    SV_NAMED(IBV_WR_ATOMIC_CMP_AND_SWP),
    SV_NAMED(IBV_WR_ATOMIC_FETCH_AND_ADD),
    SV_NAMED(IBV_WR_LOCAL_INV),
    SV_NAMED(IBV_WR_BIND_MW),
    SV_NAMED(IBV_WR_SEND_WITH_INV),
    SV_NAMED(IBV_WR_TSO),
};
constexpr Named kWcOpcodes[] = {
    SV_NAMED(IBV_WC_SEND),      SV_NAMED(IBV_WC_RDMA_WRITE),
    SV_NAMED(IBV_WC_RDMA_READ), SV_NAMED(IBV_WC_COMP_SWAP),
    SV_NAMED(IBV_WC_FETCH_ADD), SV_NAMED(IBV_WC_BIND_MW),
    SV_NAMED(IBV_WC_LOCAL_INV), SV_NAMED(IBV_WC_TSO),
    SV_NAMED(IBV_WC_RECV),      SV_NAMED(IBV_WC_RECV_RDMA_WITH_IMM),
};
constexpr Named kWcStatuses[] = {
    SV_NAMED(IBV_WC_SUCCESS),
    SV_NAMED(IBV_WC_LOC_LEN_ERR),
    SV_NAMED(IBV_WC_LOC_QP_OP_ERR),
    SV_NAMED(IBV_WC_LOC_EEC_OP_ERR),
    SV_NAMED(IBV_WC_LOC_PROT_ERR),
    SV_NAMED(IBV_WC_WR_FLUSH_ERR),
    SV_NAMED(IBV_WC_MW_BIND_ERR),
    SV_NAMED(IBV_WC_BAD_RESP_ERR),
    SV_NAMED(IBV_WC_LOC_ACCESS_ERR),
    SV_NAMED(IBV_WC_REM_INV_REQ_ERR),
    SV_NAMED(IBV_WC_REM_ACCESS_ERR),
    SV_NAMED(IBV_WC_REM_OP_ERR),
    SV_NAMED(IBV_WC_RETRY_EXC_ERR),
    SV_NAMED(IBV_WC_RNR_RETRY_EXC_ERR),
    SV_NAMED(IBV_WC_LOC_RDD_VIOL_ERR),
    SV_NAMED(IBV_WC_REM_INV_RD_REQ_ERR),
    SV_NAMED(IBV_WC_REM_ABORT_ERR),
    SV_NAMED(IBV_WC_INV_EECN_ERR),
    SV_NAMED(IBV_WC_INV_EEC_STATE_ERR),
    SV_NAMED(IBV_WC_FATAL_ERR),
    SV_NAMED(IBV_WC_RESP_TIMEOUT_ERR),
    SV_NAMED(IBV_WC_GENERAL_ERR),
    SV_NAMED(IBV_WC_TM_ERR),
    SV_NAMED(IBV_WC_TM_RNDV_INCOMPLETE),
};
constexpr Named kEvents[] = {
    SV_NAMED(IBV_EVENT_CQ_ERR),
    SV_NAMED(IBV_EVENT_QP_FATAL),
    SV_NAMED(IBV_EVENT_QP_REQ_ERR),
    SV_NAMED(IBV_EVENT_QP_ACCESS_ERR),
    SV_NAMED(IBV_EVENT_COMM_EST),
    SV_NAMED(IBV_EVENT_SQ_DRAINED),
    SV_NAMED(IBV_EVENT_PATH_MIG),
    SV_NAMED(IBV_EVENT_PATH_MIG_ERR),
    SV_NAMED(IBV_EVENT_DEVICE_FATAL),
    SV_NAMED(IBV_EVENT_PORT_ACTIVE),
    SV_NAMED(IBV_EVENT_PORT_ERR),
    SV_NAMED(IBV_EVENT_LID_CHANGE),
    SV_NAMED(IBV_EVENT_PKEY_CHANGE),
    SV_NAMED(IBV_EVENT_SM_CHANGE),
    SV_NAMED(IBV_EVENT_SRQ_ERR),
    SV_NAMED(IBV_EVENT_SRQ_LIMIT_REACHED),
    SV_NAMED(IBV_EVENT_QP_LAST_WQE_REACHED),
    SV_NAMED(IBV_EVENT_CLIENT_REREGISTER),
    SV_NAMED(IBV_EVENT_GID_CHANGE),
    SV_NAMED(IBV_EVENT_WQ_FATAL),
};
constexpr Named kErrnos[] = {
    SV_NAMED(EPERM),     SV_NAMED(ENOENT),     SV_NAMED(EINTR),    SV_NAMED(EIO),    SV_NAMED(EAGAIN),
    SV_NAMED(ENOMEM),    SV_NAMED(EACCES),     SV_NAMED(EFAULT),   SV_NAMED(EBUSY),  SV_NAMED(EEXIST),
    SV_NAMED(ENODEV),    SV_NAMED(EINVAL),     SV_NAMED(ENOSPC),   SV_NAMED(ENOSYS), SV_NAMED(EOPNOTSUPP),
    SV_NAMED(ETIMEDOUT), SV_NAMED(ECONNRESET), SV_NAMED(ENETDOWN), SV_NAMED(EPROTO),
};
#undef SV_NAMED

template <size_t N>
std::optional<int> lookup(const Named (&table)[N], std::string_view name) {
  for (const Named& n : table)
    if (name == n.name) return n.value;
  return std::nullopt;
}

template <size_t N>
std::string names_of(const Named (&table)[N]) {
  std::string s;
  for (const Named& n : table) s += (s.empty() ? "" : ", ") + std::string(n.name);
  return s;
}

// A key whose value is a name from `table` (or a plain integer): false with a
// message if it is there but wrong.
template <size_t N>
bool get_named(const toml::table& t, const char* key, const Named (&table)[N], std::optional<int>* out,
               std::string* error, const std::string& where) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  if (auto s = n->value<std::string>()) {
    *out = lookup(table, *s);
    if (!*out) {
      *error = where + ": unknown " + key + " '" + *s + "' (" + names_of(table) + ")";
      return false;
    }
    return true;
  }
  if (auto v = n->value<int64_t>(); v && *v >= 0 && *v <= 0xffff) {
    *out = static_cast<int>(*v);
    return true;
  }
  *error = where + ": '" + key + "' must be a name or a non-negative integer";
  return false;
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

bool is_packet_action(FaultAction a) {
  return a == FaultAction::drop || a == FaultAction::duplicate || a == FaultAction::corrupt ||
         a == FaultAction::delay || a == FaultAction::reorder || a == FaultAction::nak || a == FaultAction::reject;
}

// Which actions a rule of each kind may take (docs/faults.md, "Actions").
bool action_allowed(const FaultRule& r) {
  const FaultAction a = r.action;
  const bool side_effect = a == FaultAction::qp_error || a == FaultAction::port_down || a == FaultAction::port_up ||
                           a == FaultAction::event || a == FaultAction::device_fatal || a == FaultAction::failover;
  switch (r.target) {
    case RuleTarget::packet:
      return is_packet_action(a);
    case RuleTarget::timed:
      return side_effect;
    case RuleTarget::verb:
      switch (r.verb) {
        case VerbPoint::post_send:
        case VerbPoint::post_recv:
          return a == FaultAction::fail || side_effect;
        case VerbPoint::completion:
          return a == FaultAction::drop || a == FaultAction::delay || a == FaultAction::status || side_effect;
        case VerbPoint::async_event:
          // An event rule that raises events could feed itself.
          return a == FaultAction::drop || (side_effect && a != FaultAction::event);
      }
  }
  return false;
}

// Fails when the rule has any of `keys`, which do not apply to its kind.
bool forbid(const toml::table& t, std::initializer_list<const char*> keys, const char* kind, std::string* error,
            const std::string& where) {
  for (const char* k : keys) {
    if (t.contains(k)) {
      *error = where + ": '" + k + "' does not apply to " + kind;
      return false;
    }
  }
  return true;
}

// What the rule watches: a moment (timed), a verb, or packets.
bool parse_trigger(const toml::table& t, FaultRule* r, std::string* error, const std::string& where) {
  if (t.contains("at_ms")) {
    r->target = RuleTarget::timed;
    if (!get_uint(t, "at_ms", &r->at_ms, 86400000, error, where)) return false;
    if (!forbid(
            t,
            {"verb", "direction", "opcode", "class", "cm", "psn", "mig_req", "nth", "every", "probability", "count",
             "on_event"},
            "a timed rule (at_ms)", error, where))
      return false;
  } else if (const toml::node* n = t.get("verb")) {
    r->target = RuleTarget::verb;
    auto v = n->value<std::string>();
    if (v && *v == "post_send")
      r->verb = VerbPoint::post_send;
    else if (v && *v == "post_recv")
      r->verb = VerbPoint::post_recv;
    else if (v && *v == "completion")
      r->verb = VerbPoint::completion;
    else if (v && *v == "async_event")
      r->verb = VerbPoint::async_event;
    else {
      *error = where + ": verb must be post_send, post_recv, completion or async_event";
      return false;
    }
    if (!forbid(t, {"direction", "class", "cm", "psn", "mig_req", "syndrome", "reason"}, "a verb rule", error, where))
      return false;
    if (r->verb != VerbPoint::async_event && !forbid(t, {"on_event"}, "this verb", error, where)) return false;
    if (r->verb == VerbPoint::post_send) {
      if (!get_named(t, "opcode", kWrOpcodes, &r->verb_opcode, error, where)) return false;
    } else if (r->verb == VerbPoint::completion) {
      if (!get_named(t, "opcode", kWcOpcodes, &r->verb_opcode, error, where)) return false;
    } else if (!forbid(t, {"opcode"}, "this verb", error, where)) {
      return false;
    }
    if (!get_named(t, "on_event", kEvents, &r->match_event, error, where)) return false;
  } else {
    if (!forbid(t, {"on_event", "errno", "status", "event", "port", "duration_ms"}, "a packet rule", error, where))
      return false;
  }

  return true;
}

// Which packets, QPs and occurrences the rule matches.
bool parse_match(const toml::table& t, FaultRule* r, std::string* error, const std::string& where) {
  r->device = t["device"].value_or(std::string());
  if (auto d = t["direction"].value<std::string>()) {
    if (*d == "tx")
      r->direction = Direction::tx;
    else if (*d == "rx")
      r->direction = Direction::rx;
    else if (*d == "any")
      r->direction = Direction::any;
    else {
      *error = where + ": direction must be tx, rx or any";
      return false;
    }
  }
  uint32_t qpn = 0;
  if (t.contains("qpn")) {
    if (!get_uint(t, "qpn", &qpn, 0xffffff, error, where)) return false;
    r->qpn = qpn;
  }
  if (r->target == RuleTarget::packet) {
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
  }
  if (auto c = t["class"].value<std::string>()) {
    auto pc = parse_class(*c);
    if (!pc) {
      *error = where + ": unknown class '" + *c + "'";
      return false;
    }
    r->packet_class = *pc;
  }
  if (const toml::node* n = t.get("cm")) {
    auto name = n->value<std::string>();
    r->cm = name ? parse_cm_message(*name) : std::nullopt;
    if (!r->cm) {
      *error =
          where + ": cm must name a CM message (" + cm_message_names() + ")" + (name ? ", not '" + *name + "'" : "");
      return false;
    }
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
  if (const toml::node* n = t.get("mig_req")) {
    // The BTH MigReq bit: 0 on the primary path of a connection with path
    // migration armed, 1 once migrated (IBTA 17.2.8).
    auto b = n->is_boolean() ? n->value<bool>() : std::nullopt;
    if (!b) {
      *error = where + ": mig_req must be true or false";
      return false;
    }
    r->mig_req = *b;
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

  return true;
}

// What the rule does, and the parameters of that action.
bool parse_action(const toml::table& t, FaultRule* r, std::string* error, const std::string& where) {
  auto a = t["action"].value<std::string>();
  if (!a) {
    *error = where +
             ": 'action' is required (drop, duplicate, corrupt, delay, reorder, nak, reject, fail, status, qp_error, "
             "port_down, port_up, event, device_fatal, failover)";
    return false;
  }
  auto act = parse_action(*a);
  if (!act) {
    *error = where + ": unknown action '" + *a + "'";
    return false;
  }
  r->action = *act;
  if (!action_allowed(*r)) {
    const char* kind = r->target == RuleTarget::packet  ? "a packet rule"
                       : r->target == RuleTarget::timed ? "a timed rule"
                                                        : "this verb";
    *error = where + ": action " + *a + " does not apply to " + kind + " (docs/faults.md lists what does)";
    return false;
  }
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
  if (r->action == FaultAction::nak && r->cm) {
    *error = where + ": action nak does not apply to CM MADs (they travel on UD, which has no NAKs)";
    return false;
  }
  if (!get_uint(t, "reason", &r->reason, 0xffff, error, where)) return false;
  if (r->action == FaultAction::reject &&
      (!r->cm || (*r->cm != wire::cm::Attr::kReq && *r->cm != wire::cm::Attr::kSidrReq))) {
    *error = where + ": action reject answers a connection request: set cm = \"REQ\" or \"SIDR_REQ\"";
    return false;
  }
  if (r->action == FaultAction::reject && r->direction != Direction::rx) {
    *error = where + ": action reject applies to received MADs: set direction = \"rx\"";
    return false;
  }
  if (r->action == FaultAction::nak && r->direction != Direction::rx) {
    *error = where + ": action nak applies to received packets: set direction = \"rx\"";
    return false;
  }
  std::optional<int> v;
  if (!get_named(t, "errno", kErrnos, &v, error, where)) return false;
  if (v) r->error = *v;
  if (r->action == FaultAction::fail && r->error == 0) {
    *error = where + ": action fail needs errno (e.g. \"ENOMEM\")";
    return false;
  }
  v.reset();
  if (!get_named(t, "status", kWcStatuses, &v, error, where)) return false;
  if (v) r->wc_status = *v;
  if (r->action == FaultAction::status && !v) {
    *error = where + ": action status needs status (e.g. \"IBV_WC_REM_ABORT_ERR\")";
    return false;
  }
  v.reset();
  if (!get_named(t, "event", kEvents, &v, error, where)) return false;
  if (v) r->event = *v;
  if (r->action == FaultAction::event && !v) {
    *error = where + ": action event needs event (e.g. \"IBV_EVENT_LID_CHANGE\")";
    return false;
  }
  uint32_t port = 1;
  if (!get_uint(t, "port", &port, 255, error, where)) return false;
  if (port != 1) {
    *error = where + ": emulated devices have one port: port must be 1";
    return false;
  }
  r->port = static_cast<uint8_t>(port);
  if (!get_uint(t, "duration_ms", &r->duration_ms, 86400000, error, where)) return false;
  if (r->action == FaultAction::qp_error && r->target == RuleTarget::timed && !r->qpn) {
    *error = where + ": a timed qp_error needs qpn (and device)";
    return false;
  }
  return true;
}

bool parse_rule(const toml::table& t, size_t index, FaultRule* r, std::string* error) {
  const std::string where = "rule " + std::to_string(index + 1);
  static const char* const known[] = {"name",     "direction", "device",   "qpn",         "opcode",      "class",
                                      "psn",      "nth",       "every",    "probability", "count",       "action",
                                      "delay_ms", "delay_us",  "syndrome", "verb",        "at_ms",       "on_event",
                                      "errno",    "status",    "event",    "port",        "duration_ms", "cm", "reason",
                                      "mig_req"};
  for (auto&& [k, v] : t) {
    bool ok = false;
    for (const char* name : known) ok |= k.str() == name;
    if (!ok) {
      *error = where + ": unknown key '" + std::string(k.str()) + "'";
      return false;
    }
  }
  r->name = t["name"].value_or(std::string("rule") + std::to_string(index + 1));

  return parse_trigger(t, r, error, where) && parse_match(t, r, error, where) && parse_action(t, r, error, where);
}

}  // namespace

namespace {

template <size_t N>
std::string name_in(const Named (&table)[N], int value) {
  for (const Named& n : table)
    if (n.value == value) return std::string(n.name);
  return std::to_string(value);
}

}  // namespace

std::string event_name(int event) { return name_in(kEvents, event); }
std::string wr_opcode_name(int opcode) { return name_in(kWrOpcodes, opcode); }
std::string wc_opcode_name(int opcode) { return name_in(kWcOpcodes, opcode); }
std::string wc_status_name(int status) { return name_in(kWcStatuses, status); }
std::string errno_name(int error) { return name_in(kErrnos, error); }

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
    case FaultAction::reject:
      return "reject";
    case FaultAction::fail:
      return "fail";
    case FaultAction::status:
      return "status";
    case FaultAction::qp_error:
      return "qp_error";
    case FaultAction::port_down:
      return "port_down";
    case FaultAction::port_up:
      return "port_up";
    case FaultAction::event:
      return "event";
    case FaultAction::device_fatal:
      return "device_fatal";
    case FaultAction::failover:
      return "failover";
  }
  return "?";
}

std::optional<int> errno_by_name(std::string_view name) { return lookup(kErrnos, name); }

bool parse_scenario(std::string_view text, size_t first_index, Scenario* out, std::string* error) {
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
  Scenario s;
  if (const toml::node* n = doc.get("seed")) {
    auto v = n->value<int64_t>();
    if (!v || *v < 0) {
      *error = "seed must be a non-negative integer";
      return false;
    }
    s.seed = static_cast<uint64_t>(*v);
  }
  if (const toml::node* n = doc.get("rule")) {
    const toml::array* arr = n->as_array();
    if (!arr) {
      *error = "rules are written as [[rule]] tables";
      return false;
    }
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::table* t = (*arr)[i].as_table();
      if (!t) {
        *error = "rules are written as [[rule]] tables";
        return false;
      }
      FaultRule r;
      if (!parse_rule(*t, first_index + i, &r, error)) return false;
      s.rules.push_back(std::move(r));
    }
  }
  *out = std::move(s);
  return true;
}

}  // namespace softverbs::faults

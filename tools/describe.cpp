// Fault rules, devices and bound RoCEv2 ports in words, for the launcher's
// `faults check` and `devices` commands (docs/configuration.md, "Launcher").
#include "tools/describe.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <sstream>

#include "faults/scenario.hpp"
#include "wire/cm_mad.hpp"

namespace softverbs::tools {
namespace {

std::string_view class_name(faults::PacketClass c) {
  using faults::PacketClass;
  switch (c) {
    case PacketClass::any:
      return "any";
    case PacketClass::send:
      return "send";
    case PacketClass::write:
      return "write";
    case PacketClass::read_request:
      return "read_request";
    case PacketClass::read_response:
      return "read_response";
    case PacketClass::ack:
      return "ack";
    case PacketClass::nak:
      return "nak";
    case PacketClass::rnr_nak:
      return "rnr_nak";
    case PacketClass::atomic:
      return "atomic";
    case PacketClass::atomic_ack:
      return "atomic_ack";
  }
  return "?";
}

std::string_view verb_name(faults::VerbPoint v) {
  switch (v) {
    case faults::VerbPoint::post_send:
      return "post_send";
    case faults::VerbPoint::post_recv:
      return "post_recv";
    case faults::VerbPoint::completion:
      return "completions";
    case faults::VerbPoint::async_event:
      return "async events";
  }
  return "?";
}

std::string device_words(const faults::FaultRule& r) {
  return r.device.empty() ? "any device" : "device " + r.device;
}

std::string hex(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

// What the rule watches: "packets of any device, any direction, class send".
std::string match_words(const faults::FaultRule& r) {
  using faults::RuleTarget;
  std::string s;
  if (r.target == RuleTarget::timed) return "a timer, " + std::to_string(r.at_ms) + " ms after loading, for " +
                                            device_words(r);
  if (r.target == RuleTarget::packet) {
    s = "packets of " + device_words(r) + ", ";
    s += r.direction == faults::Direction::tx   ? "sent (tx)"
         : r.direction == faults::Direction::rx ? "received (rx)"
                                                : "any direction";
    if (r.opcode) s += ", opcode " + hex(*r.opcode);
    if (r.packet_class != faults::PacketClass::any) s += ", class " + std::string(class_name(r.packet_class));
    if (r.cm) s += ", CM " + std::string(wire::cm::to_string(*r.cm)) + " MADs (UD SEND ONLY to QP 1, class 0x07)";
    if (r.qpn) s += ", destination QP " + hex(*r.qpn);
    if (r.psn_first) s += ", PSN " + std::to_string(*r.psn_first) + ".." + std::to_string(r.psn_last.value_or(*r.psn_first));
    if (r.mig_req) s += *r.mig_req ? ", MigReq 1 (migrated)" : ", MigReq 0 (path migration armed)";
    return s;
  }
  s = std::string(verb_name(r.verb)) + " of " + device_words(r);
  if (r.qpn) s += ", QP " + hex(*r.qpn);
  if (r.verb_opcode) {
    s += ", opcode ";
    s += r.verb == faults::VerbPoint::completion ? faults::wc_opcode_name(*r.verb_opcode)
                                                 : faults::wr_opcode_name(*r.verb_opcode);
  }
  if (r.match_event) s += ", event " + faults::event_name(*r.match_event);
  return s;
}

// When it fires among the matches: "on the 3rd match", "with probability 0.01".
std::string when_words(const faults::FaultRule& r) {
  std::vector<std::string> parts;
  if (r.nth) parts.push_back("on match number " + std::to_string(r.nth));
  if (r.every) parts.push_back("on every " + std::to_string(r.every) + "th match");
  if (r.probability != 1.0) {
    std::ostringstream p;
    p << "with probability " << r.probability;
    parts.push_back(p.str());
  }
  if (r.count) parts.push_back("at most " + std::to_string(r.count) + " times");
  if (parts.empty()) return r.target == faults::RuleTarget::timed ? "once" : "on every match";
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : ", ") + p;
  return s;
}

std::string action_words(const faults::FaultRule& r) {
  using faults::FaultAction;
  std::string s(faults::to_string(r.action));
  switch (r.action) {
    case FaultAction::delay:
      return s + " by " + std::to_string(r.delay_us) + " us";
    case FaultAction::nak:
      return s + " with syndrome " + hex(r.syndrome);
    case FaultAction::reject:
      return s + " with reason " + std::to_string(r.reason);
    case FaultAction::fail:
      return s + " with " + faults::errno_name(r.error);
    case FaultAction::status:
      return s + " " + faults::wc_status_name(r.wc_status);
    case FaultAction::event:
      return s + " " + faults::event_name(r.event) + " on port " + std::to_string(r.port);
    case FaultAction::port_down:
      return s + " on port " + std::to_string(r.port) +
             (r.duration_ms ? ", up again after " + std::to_string(r.duration_ms) + " ms" : ", staying down");
    case FaultAction::port_up:
      return s + " on port " + std::to_string(r.port);
    default:
      return s;
  }
}

}  // namespace

std::string describe_rule(const faults::FaultRule& rule) {
  return "rule " + rule.name + ": on " + match_words(rule) + ", " + when_words(rule) + ": " + action_words(rule);
}

std::string to_string(in_addr addr) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &addr, buf, sizeof buf);
  return buf;
}

std::string_view to_string(emu::LinkLayer link_layer) {
  return link_layer == emu::LinkLayer::kInfiniBand ? "InfiniBand" : "Ethernet (RoCEv2)";
}

int mtu_bytes(ibv_mtu mtu) { return 128 << static_cast<int>(mtu); }

}  // namespace softverbs::tools

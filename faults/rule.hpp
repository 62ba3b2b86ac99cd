// The fault layer (docs/faults.md): rules that act on packets
// between the QP engine and the wire, on verb calls, completions and async events,
// or at a given time.
//
// A packet rule matches on the device, the direction, the BTH (destination QP,
// opcode or opcode class, PSN range, MigReq bit) and, for the GMPs on QP 1, the CM message
// their MAD carries; a verb rule on the device, the QP, the work
// request or completion opcode, the event type. Either fires on the nth match, on
// every nth, or with a probability, at most `count` times. Each rule draws from
// its own random stream, seeded from the scenario seed and the rule's position, so
// the same seed and the same traffic give the same decisions, and adding a rule
// does not change the decisions of the others. The layer only decides; the
// emulated devices carry the decisions out.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "wire/cm_mad.hpp"
#include "wire/packet.hpp"

namespace softverbs::faults {

using wire::PacketView;

enum class Direction : uint8_t { any, tx, rx };

enum class FaultAction : uint8_t {
  // packets
  drop,       // the packet is lost (verbs: the completion or async event is lost)
  duplicate,  // the packet is delivered twice
  corrupt,    // one byte is flipped: the receiver's ICRC check drops it
  delay,      // the packet is delivered delay_us later (verbs: the completion)
  reorder,    // the packet is held back and delivered after the next packet
  nak,        // rx only: the packet is replaced by a NAK with `syndrome` for its PSN
  reject,     // rx only, CM REQ/SIDR_REQ: answered with a REJ `reason` (SIDR: status rejected) instead
  // verbs
  fail,          // post_send/post_recv: the call fails with `error`
  status,        // completion: delivered with `wc_status` instead
  qp_error,      // the QP moves to the error state (IBV_EVENT_QP_FATAL)
  port_down,     // the port goes down (IBV_EVENT_PORT_ERR), up again after duration_ms
  port_up,       // the port comes back (IBV_EVENT_PORT_ACTIVE)
  event,         // the async event `event` is raised
  device_fatal,  // the device fails (IBV_EVENT_DEVICE_FATAL)
  failover,      // the device's link fails over (a bond): rdma_cm ids on it get ADDR_CHANGE
};

// What a rule watches: packets on the wire, calls and completions of the verbs,
// or nothing (a timed rule fires once, at_ms after it is loaded).
enum class RuleTarget : uint8_t { packet, verb, timed };
enum class VerbPoint : uint8_t { post_send, post_recv, completion, async_event };

// Opcode classes a rule can name instead of one opcode.
enum class PacketClass : uint8_t {
  any,
  send,
  write,
  read_request,
  read_response,
  ack,
  nak,
  rnr_nak,
  atomic,
  atomic_ack
};

struct FaultRule {
  std::string name;
  // match
  Direction direction = Direction::any;
  std::string device;             // empty: any
  std::optional<uint32_t> qpn;    // BTH destination QP
  std::optional<uint8_t> opcode;  // BTH opcode
  PacketClass packet_class = PacketClass::any;
  std::optional<wire::cm::Attr> cm;  // only GMPs to QP 1 carrying this CM message
  std::optional<uint32_t> psn_first;  // inclusive PSN range
  std::optional<uint32_t> psn_last;
  std::optional<bool> mig_req;        // BTH MigReq bit
  // when
  uint64_t nth = 0;          // fire on the nth match only (1-based); 0: not used
  uint64_t every = 0;        // fire on every nth match; 0: not used
  double probability = 1.0;  // fire with this probability (after nth/every)
  uint64_t count = 0;        // fire at most this many times; 0: unlimited
  RuleTarget target = RuleTarget::packet;
  VerbPoint verb = VerbPoint::post_send;
  std::optional<int> verb_opcode;  // post_send: ibv_wr_opcode; completion: ibv_wc_opcode
  std::optional<int> match_event;  // async_event: ibv_event_type
  uint32_t at_ms = 0;              // timed rules
  // what
  FaultAction action = FaultAction::drop;
  uint32_t delay_us = 0;
  uint8_t syndrome = 0x60;   // for nak: AETH syndrome (0x60 PSN sequence error ...)
  uint16_t reason = 28;      // for reject: the REJ reason (28: consumer defined)
  int error = 0;             // fail: the errno
  int wc_status = 0;         // status: an ibv_wc_status
  int event = 0;             // event: an ibv_event_type
  uint8_t port = 1;          // port_down, port_up, port events
  uint32_t duration_ms = 0;  // port_down: 0 keeps the port down
};

// What a packet passing the layer looks like to the rules.
struct PacketFacts {
  Direction direction;
  std::string_view device;
  const PacketView* pkt;
};

// A verb call, completion or async event passing the layer.
struct VerbFacts {
  VerbPoint verb;
  std::string_view device;
  std::optional<uint32_t> qpn;
  std::optional<int> opcode;  // ibv_wr_opcode (post_send) or ibv_wc_opcode (completion)
  std::optional<int> event;   // ibv_event_type (async_event)
};

struct FaultDecision {
  bool fired = false;
  FaultAction action = FaultAction::drop;
  uint32_t delay_us = 0;
  uint8_t syndrome = 0;
  uint16_t reason = 0;
  size_t rule = 0;
  int error = 0;
  int wc_status = 0;
  int event = 0;
  uint8_t port = 1;
  uint32_t duration_ms = 0;
  std::string device;  // timed rules: the device named by the rule ("" = every one)
  std::optional<uint32_t> qpn;
};

std::string_view to_string(FaultAction a) noexcept;
// Names used in scenarios and logs (errno and verbs enumerator names).
std::optional<int> errno_by_name(std::string_view name);

}  // namespace softverbs::faults

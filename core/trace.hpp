// The correlated trace (SOFTVERBS_TRACE=FILE, docs/simulation.md "The trace"):
// verb calls, work requests, packets, transport and CM timers, completions and
// events, written as Chrome trace event JSON that Perfetto and chrome://tracing
// open, with one track per device (pid) and QP (tid).
//
// Every hook first asks on(), which costs one predictable branch once the
// variable has been read; the recorder itself (one mutex, one buffered writer)
// is only reached when tracing. Nothing run-dependent goes into the file
// (no process ids, pointers, thread ids or calendar dates): timestamps are the
// engine Clock's, relative to the first record, devices appear by name and
// tracks are numbered in order of first appearance, so a single-threaded
// program on a virtual clock writes the same bytes on every run.
//
// The hooks take plain values (names, numbers), so that core/ knows nothing of
// the modules that call it; each module passes its own names.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/clock.hpp"

namespace softverbs::trace {

namespace detail {
// 0: SOFTVERBS_TRACE not read yet; 1: off; 2: on.
extern std::atomic<int> g_state;
bool start() noexcept;
}  // namespace detail

// Whether tracing is on (reads SOFTVERBS_TRACE at the first call).
inline bool on() noexcept {
  const int s = detail::g_state.load(std::memory_order_acquire);  // a plain load on x86
  if (s == 1) [[likely]]
    return false;
  return s == 2 || detail::start();
}

// ---- work requests: the flow of one WR from its post to its completion -----

// A work request was posted (verb: "post_send", "post_recv", "post_srq_recv";
// qpn: the QP's number, or the SRQ's for post_srq_recv). Returns the WR's trace
// id, which the WQE carries to its start and completion records (never 0).
uint64_t wr_posted(const Clock& clock, std::string_view dev, std::string_view verb, uint32_t qpn, uint64_t wr_id,
                   std::string_view opcode, uint64_t length) noexcept;
// The requester sent the first packet of WR `id`: its packets carry PSNs
// first_psn..last_psn (reads: of their responses) to the peer's QP dqpn.
void wr_started(const Clock& clock, std::string_view dev, uint32_t qpn, uint64_t id, uint32_t first_psn,
                uint32_t last_psn, uint32_t dqpn) noexcept;
// WR `id` completed (or was flushed) with a work completion; id 0 for a
// completion with no traced post (posted before tracing started). An
// unsignaled send that succeeded has no completion: it is recorded as
// "retired" (signaled false), which ends its flow all the same. fault: what a
// completion rule of the fault layer did to it ("drop", "delay", "status").
void completion(const Clock& clock, std::string_view dev, uint32_t qpn, uint64_t id, uint64_t wr_id,
                std::string_view status, std::string_view opcode, uint32_t byte_len, bool signaled = true,
                std::string_view fault = "none") noexcept;

// ---- verbs -----------------------------------------------------------------

// An object was created or destroyed (verb: "create_qp", "destroy_cq", ...;
// num: its number (QPN, SRQN, CQ handle, lkey for an MR), 0 if it has none).
void object(const Clock& clock, std::string_view dev, std::string_view verb, uint32_t num) noexcept;
// ibv_modify_qp moved QP qpn from `from` to `to` (state names, "RTS"); dqpn is
// the connected peer's QP (0 if none), which places sent packets on qpn's track.
void modify_qp(const Clock& clock, std::string_view dev, uint32_t qpn, std::string_view from, std::string_view to,
               uint32_t dqpn) noexcept;

// ---- packets ---------------------------------------------------------------

struct Packet {
  std::string_view dir;     // "tx" (sent by dev) or "rx" (received by dev)
  std::string_view opcode;  // "RC_SEND_ONLY", ...
  uint32_t psn = 0;
  uint32_t dqpn = 0;    // the BTH's destination QP
  uint32_t sqpn = 0;    // a datagram's source QP (its DETH), 0 for other packets
  uint32_t length = 0;  // bytes, BTH to ICRC
  std::string_view fault = "none";  // the fault layer's action on it ("drop", ...)
  uint64_t frame = 0;               // its frame number in SOFTVERBS_PCAP (1-based), 0 if not captured
};
void packet(const Clock& clock, std::string_view dev, const Packet& p) noexcept;

// A hand-over on the calling thread between two layers of a device's link:
// the layer that knows a packet's device and fault decision leaves them here
// and the layer below, which captures the packet, takes them and writes the
// record with the capture's frame number, before the packet can reach its
// receiver (so a packet's "tx" record always comes before its "rx"). On the
// receive side the capture leaves the frame for the fault layer above.
struct Pending {
  const std::string* dev = nullptr;  // null: nothing pending
  std::string_view fault = "none";
  uint64_t frame = 0;
};
void set_pending(const Pending& p) noexcept;
Pending take_pending() noexcept;

// ---- timers and events -----------------------------------------------------

// A timer of QP qpn (0: the device's, e.g. a CM timer) changed:
// which: "ack_timeout", "rnr_wait", "cm_retry", "cm_timewait"; what: "armed"
// (in: nanoseconds until it is due), "fired", "cancelled".
void timer(const Clock& clock, std::string_view dev, uint32_t qpn, std::string_view which, std::string_view what,
           int64_t in_ns = 0) noexcept;
// An asynchronous event ("IBV_EVENT_QP_FATAL", about QP qpn or 0) or a CM
// event ("RDMA_CM_EVENT_ESTABLISHED"); kind is "async" or "cm".
void event(const Clock& clock, std::string_view dev, std::string_view kind, std::string_view name,
           uint32_t qpn = 0, int status = 0) noexcept;

// Writes what is buffered; the file is complete JSON after every flush. Called
// by ibv_close_device and at exit.
void flush() noexcept;

// The name of an ibv_wr_opcode / ibv_wc_opcode / ibv_qp_state, for the hooks.
std::string_view wr_opcode_name(int opcode) noexcept;
std::string_view wc_opcode_name(int opcode) noexcept;
std::string_view qp_state_name(int state) noexcept;
// The name of an rdma_cm_event_type ("RDMA_CM_EVENT_ESTABLISHED").
std::string_view cm_event_name(int event) noexcept;

}  // namespace softverbs::trace

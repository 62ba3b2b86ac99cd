// The responder (IBTA 9.7.5, 9.8.3): its state, the steps it takes for each
// request (after the Linux rxe driver's rxe_resp.c), and the one table from a
// request error to the NAK it answers with, the status of the receive WQE in
// progress and the affiliated asynchronous event. The logic is in responder.cpp.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <vector>

#include "core/spread_shared_mutex.hpp"
#include "emu/qp/wq.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::emu {

class Mr;

struct ResponderState {
  uint32_t epsn = 0;  // expected PSN
  uint32_t msn = 0;
  uint8_t prev_opcode = wire::kNoPrevOpcode;  // of the last in-sequence request packet
  bool nak_sent = false;  // a sequence or RNR NAK is outstanding: stay silent until in order
  bool uc_drop = false;   // UC: drop packets until the next message starts
  bool comm_established = false;
  // The receive WQE a SEND (or RDMA WRITE with immediate) is placed into.
  struct Receiving {
    bool active = false;
    RecvWqe wqe;
    std::vector<Sge> sges;
    uint64_t offset = 0;
  } rcv;
  // The RDMA WRITE under way: where its next packet goes.
  struct Writing {
    uint64_t va = 0;
    uint32_t rkey = 0;
    uint64_t remaining = 0;
    uint64_t total = 0;
  } wr;
  struct Resource {  // a served read or atomic, kept to answer duplicates
    bool atomic = false;
    uint32_t first_psn = 0, last_psn = 0;
    uint64_t va = 0, len = 0;
    uint32_t rkey = 0;
    uint64_t orig = 0;  // atomic: the value returned
  };
  // At most max(max_dest_rd_atomic, kMinResources) entries, oldest first. A
  // vector, not a deque: an idle QP's empty deque would still hold its first
  // 512-byte block.
  std::vector<Resource> resources;
};

// What the responder does next with a request. Qp::responder_locked runs one
// function per step, each named after its check, until `done`. The steps from
// err_op_seq on are errors: resp_error_row() says what each one answers.
enum class RespStep : uint8_t {
  check_op_valid,   // an opcode of this QP's transport service?
  establish,        // the first packet in RTR establishes communication
  check_psn,        // in sequence, a duplicate, or ahead?
  duplicate,        // answer a duplicate again without executing it
  nak_psn,          // ahead of the expected PSN: one sequence NAK
  check_op_seq,     // FIRST, MIDDLE..., LAST in order?
  check_rkey,       // the first packet's RETH or AtomicETH: length, alignment, R_Key
  check_resources,  // a receive WQE for what needs one
  rnr,              // none posted: RNR NAK (RC), drop (UC)
  check_length,     // the packet's payload against the MTU and the message
  execute,          // place the data, serve the read or atomic
  acknowledge,      // advance the expected PSN; ACK when asked
  drop,             // silently dropped
  done,
  // Errors.
  err_op_seq,            // opcode out of sequence
  err_invalid_request,   // malformed request
  err_length,            // the message does not fit the receive WQE
  err_local_protection,  // the receive WQE's buffers cannot be written
  err_remote_access,     // R_Key, range or access rights refused
};

// One request error: the NAK an RC responder answers with (IBTA 9.7.5.2), the
// status of the receive WQE in progress, the affiliated asynchronous event
// (IBTA 10.8.3.3, 11.6.3), and what a UC responder drops instead (IBTA 9.8.3,
// class D: the rest of the message, or everything until a message starts).
struct RespErrorRow {
  RespStep step;
  wire::NakCode nak;
  ibv_wc_status recv_status;
  ibv_event_type event;
  bool uc_drop_until_first;
};

// IBTA 9.7.5.2 (NAK codes), 10.8.3.3 and 11.6.3 (the responder's QP reports
// the error as an affiliated asynchronous event and goes to the error state).
// Columns: step, NAK code, status of the receive WQE in progress, async event,
// whether UC drops everything until the next message starts.
inline constexpr RespErrorRow kRespErrors[] = {
    {RespStep::err_op_seq, wire::NakCode::invalid_request,  //
     IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR, true},
    {RespStep::err_invalid_request, wire::NakCode::invalid_request,  //
     IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR, false},
    {RespStep::err_length, wire::NakCode::invalid_request,  //
     IBV_WC_LOC_LEN_ERR, IBV_EVENT_QP_REQ_ERR, false},
    {RespStep::err_local_protection, wire::NakCode::remote_operational_error,  //
     IBV_WC_LOC_PROT_ERR, IBV_EVENT_QP_REQ_ERR, false},
    {RespStep::err_remote_access, wire::NakCode::remote_access_error,  //
     IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR, false},
};

// The row of an error step; nullptr for a step that is not an error.
constexpr const RespErrorRow* resp_error_row(RespStep step) noexcept {
  for (const RespErrorRow& e : kRespErrors)
    if (e.step == step) return &e;
  return nullptr;
}

constexpr std::string_view to_string(RespStep step) noexcept {
  switch (step) {
    case RespStep::check_op_valid: return "check_op_valid";
    case RespStep::establish: return "establish";
    case RespStep::check_psn: return "check_psn";
    case RespStep::duplicate: return "duplicate";
    case RespStep::nak_psn: return "nak_psn";
    case RespStep::check_op_seq: return "check_op_seq";
    case RespStep::check_rkey: return "check_rkey";
    case RespStep::check_resources: return "check_resources";
    case RespStep::rnr: return "rnr";
    case RespStep::check_length: return "check_length";
    case RespStep::execute: return "execute";
    case RespStep::acknowledge: return "acknowledge";
    case RespStep::drop: return "drop";
    case RespStep::done: return "done";
    case RespStep::err_op_seq: return "err_op_seq";
    case RespStep::err_invalid_request: return "err_invalid_request";
    case RespStep::err_length: return "err_length";
    case RespStep::err_local_protection: return "err_local_protection";
    case RespStep::err_remote_access: return "err_remote_access";
  }
  return "unknown";
}

// One request on its way through the steps.
struct RespContext {
  const wire::PacketView& pkt;
  const wire::OpcodeInfo& op;
  in_addr src;
  uint32_t psn;
  bool rc;  // reliable: RC or XRC_RECV (else UC)
  // Held from check_rkey while the request uses registered memory, so a
  // concurrent deregistration waits; released before completions and NAKs.
  std::shared_lock<SpreadSharedMutex> mr_lock{};
  uint8_t* atomic_target = nullptr;  // the atomic's target in host memory, from check_rkey
};

}  // namespace softverbs::emu

// The completer (IBTA 9.7.5.1, 9.9): its state, the steps it takes for each
// response (after the Linux rxe driver's rxe_comp.c), and the table from a NAK
// code to the status of the failed send completion. The logic is in
// completer.cpp.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string_view>
#include <utility>

#include "emu/qp/wq.hpp"
#include "wire/headers.hpp"
#include "wire/packet.hpp"

namespace softverbs::emu {

struct CompleterState {
  uint32_t unacked_psn = 0;              // oldest PSN not acknowledged
  uint32_t gap_rewind_psn = 0xffffffff;  // the read-response gap already asked again for
  uint32_t retry_left = 0;               // transport retries left (retry_cnt)
  uint32_t rnr_retry_left = 0;           // RNR retries left (rnr_retry)
  // Send queue position (WorkQueue::head_position) up to which every WQE is
  // acknowledged: where Qp::first_unacked_locked resumes its search.
  uint64_t acked_end = 0;
  // A response asked for the local ACK timer to be re-armed: the requester_locked
  // that follows every response (Qp::receive_locked) does it, once for the
  // response and the packets it lets go out (one clock read).
  bool rearm = false;
};

// What the completer does next with a response. Qp::completer_locked runs one
// function per step until `done`.
enum class CompStep : uint8_t {
  get_ack,      // a response for an RC QP?
  check_psn,    // a ghost or a duplicate?
  check_ack,    // which kind of response
  ack,          // an ACK: retire what it covers
  rnr_nak,      // an RNR NAK: acknowledges what precedes it ...
  rnr_retry,    // ... and sends again after the RNR timer
  seq_nak,      // a PSN sequence error NAK ...
  retry,        // ... makes the requester go back to it
  error_nak,    // any other NAK: the request failed at the responder
  read_resp,    // a read or atomic response: which WQE it answers
  do_read,      // place read response data
  do_atomic,    // place the atomic's original value
  update,       // reset the retry counts on progress, retire, rearm the timer
  error,        // fail a WQE with a status (and move the QP to the error state)
  done,
};

// The status of the send completion a NAK fails (IBTA 9.7.5.2.3 .. 9.7.5.2.6).
inline constexpr std::pair<wire::NakCode, ibv_wc_status> kNakStatus[] = {
    {wire::NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR},
    {wire::NakCode::remote_access_error, IBV_WC_REM_ACCESS_ERR},
    {wire::NakCode::remote_operational_error, IBV_WC_REM_OP_ERR},
    {wire::NakCode::invalid_rd_request, IBV_WC_REM_INV_RD_REQ_ERR},
};

// The status of the send completion failed by a NAK of this code;
// IBV_WC_BAD_RESP_ERR for a code the table lacks.
constexpr ibv_wc_status status_of_nak(wire::NakCode code) noexcept {
  for (const auto& [nak, status] : kNakStatus)
    if (nak == code) return status;
  return IBV_WC_BAD_RESP_ERR;
}

constexpr std::string_view to_string(CompStep step) noexcept {
  switch (step) {
    case CompStep::get_ack: return "get_ack";
    case CompStep::check_psn: return "check_psn";
    case CompStep::check_ack: return "check_ack";
    case CompStep::ack: return "ack";
    case CompStep::rnr_nak: return "rnr_nak";
    case CompStep::rnr_retry: return "rnr_retry";
    case CompStep::seq_nak: return "seq_nak";
    case CompStep::retry: return "retry";
    case CompStep::error_nak: return "error_nak";
    case CompStep::read_resp: return "read_resp";
    case CompStep::do_read: return "do_read";
    case CompStep::do_atomic: return "do_atomic";
    case CompStep::update: return "update";
    case CompStep::error: return "error";
    case CompStep::done: return "done";
  }
  return "unknown";
}

// One response on its way through the steps.
struct CompContext {
  const wire::PacketView& pkt;
  bool progressed = false;  // something was acknowledged: the retry counts start again
  bool rewind = false;      // an ACK past a lost read response: ask for the rest again
  // The read or atomic a response answers (and its index in the send queue).
  SendWqe* wqe = nullptr;
  uint32_t index = 0;
  // error: the status to fail with, and the WQE (nullptr: the oldest unacknowledged).
  ibv_wc_status status = IBV_WC_SUCCESS;
  SendWqe* failed = nullptr;
};

}  // namespace softverbs::emu

// The requester's state (IBTA 9.7.4): where in the send queue transmission is,
// and the PSNs it has assigned. The requester's logic is in requester.cpp; the
// completer (completer.hpp) retires what the requester has sent.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace softverbs::emu {

struct RequesterState {
  // The WQE being sent (counted from the send queue's head) and how many of its
  // bytes have gone out.
  uint32_t tx_index = 0;
  uint64_t tx_offset = 0;
  uint32_t psn = 0;           // the next PSN to send (goes back on a retry)
  uint32_t sent_end_psn = 0;  // one past the highest PSN ever sent
  bool rnr_waiting = false;   // an RNR NAK paused sending until the RNR timer
  // A packet from the peer QP arrived since the last local ACK timeout: the
  // timeout then does not count against the retry count (see Qp::on_timer).
  bool heard_from_peer = false;
  // A local error met at a WQE while earlier ones were unacknowledged, held
  // back until they are (personality completions.local_error "in_order"):
  // the WQE's send queue position (WorkQueue::head_position based) and its
  // status; IBV_WC_SUCCESS when none is held. The requester sends nothing
  // from that WQE on.
  uint64_t held_error_pos = 0;
  ibv_wc_status held_error = IBV_WC_SUCCESS;
};

}  // namespace softverbs::emu

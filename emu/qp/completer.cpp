// The completer: acknowledgements, NAKs, read responses and atomic responses
// retire send work requests in order and produce their completions (IBTA
// 9.7.5.1, 9.9).
#include <cstring>

#include "emu/device/fault_actions.hpp"
#include "emu/memory/sge.hpp"
#include "emu/objects/objects.hpp"
#include "fabric/timer.hpp"
#include "core/log.hpp"
#include "wire/psn.hpp"

namespace softverbs::emu {
namespace {

using namespace wire;

ibv_wc_status status_of_nak(NakCode code) {
  switch (code) {
    case NakCode::invalid_request:
      return IBV_WC_REM_INV_REQ_ERR;
    case NakCode::remote_access_error:
      return IBV_WC_REM_ACCESS_ERR;
    case NakCode::remote_operational_error:
      return IBV_WC_REM_OP_ERR;
    case NakCode::invalid_rd_request:
      return IBV_WC_REM_INV_RD_REQ_ERR;
    default:
      return IBV_WC_BAD_RESP_ERR;
  }
}

}  // namespace

void Qp::push_completion_locked(Cq* cq, ibv_wc wc, bool solicited) {
  // After a forced error completion, until the QP is in the error state, the
  // completions that follow are flushed, as they would be behind a real one.
  if (error_pending_ && wc.status == IBV_WC_SUCCESS) wc.status = IBV_WC_WR_FLUSH_ERR;
  faults::VerbFilter& engine = device().verb_filter();
  if (engine.verbs_active()) {
    faults::FaultDecision d = engine.decide(faults::VerbFacts{faults::VerbPoint::completion, device().name(),
                                                                    qpn(), static_cast<int>(wc.opcode), std::nullopt});
    if (d.fired) {
      switch (d.action) {
        case faults::FaultAction::drop:
          device().counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
          return;
        case faults::FaultAction::delay:
          device().counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
          cq->push_later(wc, solicited, d.delay_us);
          return;
        case faults::FaultAction::status:
          device().counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
          if (wc.status == IBV_WC_SUCCESS && d.wc_status != IBV_WC_SUCCESS) request_error_locked(false);
          wc.status = static_cast<ibv_wc_status>(d.wc_status);
          break;
        default:
          apply_fault_later(device(), d);
          break;
      }
    }
  }
  if (!cq->push(wc, solicited)) {
    // The CQ overran and is in error now (IBV_EVENT_CQ_ERR, raised by the CQ):
    // this completion is lost, so the QP cannot go on either. As on ConnectX, a
    // QP that fails to write a completion suffers a catastrophic error: it moves
    // to the error state with IBV_EVENT_QP_FATAL.
    if (attr_.qp_state != IBV_QPS_ERR) request_error_locked(true);
  }
}

void Qp::request_error_locked(bool event) {
  // Entering the error state flushes the queues, which may be what the caller is
  // iterating over: it happens from the QP's timer, right away.
  if (error_pending_) return;
  error_pending_ = true;
  error_event_ = event;
  if (!timer_) timer_ = std::make_shared<EngineTimer>(device().scheduler(), [this] { on_timer(); });
  timer_->arm_at(device().clock().now());
}

void Qp::error_locked(bool event) {
  error_pending_ = false;
  if (attr_.qp_state == IBV_QPS_RESET || attr_.qp_state == IBV_QPS_ERR) return;
  enter_error_locked();
  if (event) {
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = IBV_EVENT_QP_FATAL;
    context().post_async_event(ev);
  }
}

void Qp::force_error(bool event) {
  std::lock_guard lock(mu_);
  error_locked(event);
}

void Qp::post_send_completion_locked(const SendWqe& w, ibv_wc_status status) {
  const bool signaled = sq_sig_all_ || (w.send_flags & IBV_SEND_SIGNALED);
  if (status == IBV_WC_SUCCESS && !signaled) return;
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode_of(w.opcode);
  wc.qp_num = qpn();
  // mlx5 and rxe flag the requester's completion of an operation with immediate.
  if (w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wc.wc_flags = IBV_WC_WITH_IMM;
  if (w.opcode == IBV_WR_RDMA_READ) wc.byte_len = static_cast<uint32_t>(w.total_length);
  if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) wc.byte_len = 8;
  if (status != IBV_WC_SUCCESS) wc.vendor_err = 0;
  push_completion_locked(send_cq_, wc, false);
}

void Qp::retire_acked_locked() {
  while (!sq_.empty() && sq_.front().acked) {
    post_send_completion_locked(sq_.front(), IBV_WC_SUCCESS);
    sq_.pop();
    if (tx_index_ > 0) --tx_index_;
  }
  check_drained_locked();
}

void Qp::check_drained_locked() {
  // The drain (RTS->SQD) ends when no message is under way and everything sent
  // is acknowledged; the application asked to be told with en_sqd_async_notify.
  if (attr_.qp_state != IBV_QPS_SQD || !attr_.sq_draining) return;
  if (tx_offset_ != 0 || unacked_psn_ != sent_end_psn_) return;
  for (uint32_t i = 0; i < tx_index_ && i < sq_.size(); ++i)
    if (!sq_.at(i).acked) return;
  attr_.sq_draining = 0;
  if (attr_.en_sqd_async_notify) {
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = IBV_EVENT_SQ_DRAINED;
    context().post_async_event(ev);
  }
}

void Qp::complete_send_error_locked(SendWqe& w, ibv_wc_status status) {
  // A work queue completes in order, each request exactly once (IBTA 10.8.3):
  // acknowledged requests before the failing one succeed, those still in flight
  // are flushed, then the failing one reports the error.
  uint32_t index = 0;
  while (index < sq_.size() && &sq_.at(index) != &w) ++index;
  for (uint32_t i = 0; i < index; ++i) {
    post_send_completion_locked(sq_.front(), sq_.front().acked ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR);
    sq_.pop();
  }
  if (!sq_.empty()) {
    post_send_completion_locked(sq_.front(), status);
    sq_.pop();
  }
  tx_index_ = 0;
  tx_offset_ = 0;
  // IBTA 10.8.3.3: a completion error moves the QP to the error state, which
  // flushes what remains.
  enter_error_locked();
}

void Qp::completer_locked(const PacketView& pkt) {
  if (type_ != IBV_QPT_RC) return;
  const uint32_t psn = pkt.bth.psn;
  // Responses for PSNs never sent, or for requests already acknowledged, are
  // ghosts or duplicates (a late or repeated ACK or NAK): ignore them (IBTA 9.9.2.1).
  // Ghosts are judged against the highest PSN ever sent: after a go-back the next
  // PSN to send is lower, but the responder may legitimately acknowledge up to the
  // highest one it has seen.
  if (psn_ge(psn, sent_end_psn_) || psn_lt(psn, unacked_psn_)) {
    device().counters().duplicates.fetch_add(1, std::memory_order_relaxed);
    SV_LOG(kDebug, "qp 0x%06x: ignored %.*s psn %u (unacked %u, next %u)", qpn(), static_cast<int>(pkt.op->name.size()),
           pkt.op->name.data(), psn, unacked_psn_, sent_end_psn_);
    return;
  }
  bool progressed = false;
  bool rewind = false;

  // Everything before `upto` is acknowledged: send and write requests retire.
  auto ack_through = [&](uint32_t upto_exclusive) {
    for (uint32_t i = 0; i < sq_.size(); ++i) {
      SendWqe& w = sq_.at(i);
      if (w.acked) continue;
      if (!w.started) break;
      if (w.opcode == IBV_WR_RDMA_READ || w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
          w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        // An acknowledgement cannot complete a read or atomic: only its responses
        // can. One that covers PSNs past the first missing response means those
        // responses were lost (the responder has moved on): acknowledgement
        // stops there, and the rest of the read is requested again (IBTA
        // 9.7.5.1.6, as rxe and ConnectX retry it).
        const uint32_t missing = psn_gt(unacked_psn_, w.first_psn) ? unacked_psn_ : w.first_psn;
        if (psn_gt(upto_exclusive, missing)) {
          upto_exclusive = missing;
          if (gap_rewind_psn_ != missing) {
            gap_rewind_psn_ = missing;
            rewind = true;
          }
        }
        break;
      }
      if (psn_ge(w.last_psn, upto_exclusive)) break;
      w.acked = true;
      progressed = true;
    }
    if (psn_gt(upto_exclusive, unacked_psn_)) {
      unacked_psn_ = upto_exclusive;
      progressed = true;
    }
  };

  switch (pkt.op->op_class) {
    case OpClass::ack: {
      const Aeth& a = pkt.aeth;
      if (a.is_ack()) {
        ack_through(psn_add(psn, 1));
      } else if (a.is_rnr_nak()) {
        device().counters().rnr_naks_received.fetch_add(1, std::memory_order_relaxed);
        ack_through(psn);
        if (attr_.rnr_retry != 7) {  // 7 means retry forever (IBTA 9.7.5.2.8)
          if (rnr_retry_left_ == 0) {
            for (uint32_t i = 0; i < sq_.size(); ++i) {
              SendWqe& w = sq_.at(i);
              if (!w.acked) {
                complete_send_error_locked(w, IBV_WC_RNR_RETRY_EXC_ERR);
                return;
              }
            }
            return;
          }
          --rnr_retry_left_;
        }
        retransmit_from_locked(psn);
        rnr_waiting_ = true;
        rnr_until_ = device().clock().now() + std::chrono::microseconds(rnr_timer_us(a.rnr_timer()));
        arm_timer_locked();
        retire_acked_locked();
        return;
      } else if (a.is_nak()) {
        device().counters().naks_received.fetch_add(1, std::memory_order_relaxed);
        // A sequence NAK past a read or atomic still waiting for its response
        // says the responder executed it: the response was lost (again). Ask
        // for it again with every such NAK, not only the first time its gap was
        // seen, or the NAKs would spend the retries while the response never
        // comes back.
        if (a.nak_code() == NakCode::psn_sequence_error) gap_rewind_psn_ = 0xffffffff;
        ack_through(psn);
        if (a.nak_code() == NakCode::psn_sequence_error) {
          // Already resending from there (after an RNR NAK, a timeout or an
          // earlier NAK for the same gap): this NAK brings no news.
          if (rnr_waiting_ || psn_le(req_psn_, psn)) break;
          if (retry_left_ == 0) {
            for (uint32_t i = 0; i < sq_.size(); ++i) {
              SendWqe& w = sq_.at(i);
              if (!w.acked) {
                complete_send_error_locked(w, IBV_WC_RETRY_EXC_ERR);
                return;
              }
            }
            return;
          }
          --retry_left_;
          retransmit_from_locked(psn);
        } else {
          // The request at `psn` failed at the responder.
          for (uint32_t i = 0; i < sq_.size(); ++i) {
            SendWqe& w = sq_.at(i);
            if (w.acked) continue;
            complete_send_error_locked(w, status_of_nak(a.nak_code()));
            return;
          }
          return;
        }
      }
      break;
    }
    case OpClass::rdma_read_response:
    case OpClass::atomic_ack: {
      // Responses arrive in PSN order; a gap means some were lost: ask again
      // from the first missing one (IBTA 9.7.5.1.6).
      if (psn != unacked_psn_) {
        // Once per gap: the responses after the missing one are all dropped.
        if (psn_gt(psn, unacked_psn_) && gap_rewind_psn_ != unacked_psn_) {
          gap_rewind_psn_ = unacked_psn_;
          retransmit_from_locked(unacked_psn_);
        }
        break;
      }
      SendWqe* read = nullptr;
      uint32_t index = 0;
      for (uint32_t i = 0; i < sq_.size(); ++i) {
        SendWqe& w = sq_.at(i);
        if (w.acked) continue;
        if (w.opcode == IBV_WR_RDMA_READ || w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
            w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
          read = &w;
          index = i;
          break;
        }
        // A response implicitly acknowledges the sends and writes before it.
        if (w.started && psn_lt(w.last_psn, psn)) {
          w.acked = true;
          continue;
        }
        break;
      }
      const bool want_atomic = pkt.op->op_class == OpClass::atomic_ack;
      if (!read || psn_lt(psn, read->first_psn) || (want_atomic != (read->opcode != IBV_WR_RDMA_READ))) {
        // Not the response this requester waits for (IBTA C9-?? "bad response").
        complete_send_error_locked(read ? *read : sq_.front(), IBV_WC_BAD_RESP_ERR);
        return;
      }
      std::shared_lock mr_lock(device().mr_lock());
      std::vector<std::span<uint8_t>> spans;
      if (want_atomic) {
        uint64_t orig = pkt.atomic_ack_eth.orig;
        if (!resolve_sges(device(), pd_, sq_.sges_at(index), read->num_sge, 0, 8, IBV_ACCESS_LOCAL_WRITE, spans)) {
          mr_lock.unlock();
          complete_send_error_locked(*read, IBV_WC_LOC_PROT_ERR);
          return;
        }
        scatter(spans, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&orig), 8));
        read->acked = true;
      } else {
        const uint32_t mtu = mtu_bytes();
        uint64_t offset = static_cast<uint64_t>(psn_diff(psn, read->first_psn)) * mtu;
        uint64_t len = pkt.payload.size();
        const bool last = pkt.op->position == Position::last || pkt.op->position == Position::only;
        const bool chunk_end = last;
        if (offset + len > read->total_length || (!chunk_end && len != mtu)) {
          mr_lock.unlock();
          complete_send_error_locked(*read, IBV_WC_BAD_RESP_ERR);
          return;
        }
        if (len && !resolve_sges(device(), pd_, sq_.sges_at(index), read->num_sge, offset, len, IBV_ACCESS_LOCAL_WRITE,
                                 spans)) {
          mr_lock.unlock();
          complete_send_error_locked(*read, IBV_WC_LOC_PROT_ERR);
          return;
        }
        scatter(spans, pkt.payload);
        read->resp_bytes = offset + len;
        if (psn == read->last_psn) read->acked = true;
      }
      unacked_psn_ = psn_add(psn, 1);
      progressed = true;
      break;
    }
    default:
      return;
  }

  if (progressed) {
    retry_left_ = attr_.retry_cnt;
    rnr_retry_left_ = attr_.rnr_retry;
  }
  if (rewind) retransmit_from_locked(unacked_psn_);
  // An acknowledgement past the retry's resend point: resume sending after it.
  if (psn_gt(unacked_psn_, req_psn_)) retransmit_from_locked(unacked_psn_);
  retire_acked_locked();
  arm_timer_locked();
}

}  // namespace softverbs::emu

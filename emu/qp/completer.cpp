// The completer: acknowledgements, NAKs, read responses and atomic responses
// retire send work requests in order and produce their completions (IBTA
// 9.7.5.1, 9.9). Each response goes through the steps of completer.hpp.
#include <algorithm>
#include <cstring>

#include "emu/device/fault_actions.hpp"
#include "emu/device/personality.hpp"
#include "emu/qp/qp.hpp"
#include "emu/memory/sge.hpp"
#include "emu/objects/objects.hpp"
#include "fabric/timer.hpp"
#include "core/log.hpp"
#include "core/trace.hpp"
#include "faults/scenario.hpp"
#include "wire/psn.hpp"

namespace softverbs::emu {
namespace {

using namespace wire;

}  // namespace

void Qp::push_completion_locked(Cq* cq, ibv_wc wc, bool solicited, uint64_t trace_id) {
  if (!cq) return;  // an XRC_RECV QP between SRQs: nothing to complete
  // After a forced error completion, until the QP is in the error state, the
  // completions that follow are flushed, as they would be behind a real one.
  if (error_pending_ && wc.status == IBV_WC_SUCCESS) wc.status = IBV_WC_WR_FLUSH_ERR;
  // The trace records the completion as the application gets it, and what a
  // completion rule did to it.
  auto traced = [&](std::string_view fault) {
    if (trace::on())
      trace::completion(device().clock(), device().name(), qpn(), trace_id, wc.wr_id, faults::wc_status_name(wc.status),
                        trace::wc_opcode_name(wc.opcode), wc.byte_len, true, fault);
  };
  std::string_view fault = "none";
  faults::VerbFilter& engine = device().verb_filter();
  if (engine.verbs_active()) {
    faults::FaultDecision d = engine.decide(faults::VerbFacts{faults::VerbPoint::completion, device().name(),
                                                                    qpn(), static_cast<int>(wc.opcode), std::nullopt});
    if (d.fired) {
      switch (d.action) {
        case faults::FaultAction::drop:
          device().counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
          traced("drop");
          return;
        case faults::FaultAction::delay:
          device().counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
          traced("delay");
          cq->push_later(wc, solicited, d.delay_us);
          return;
        case faults::FaultAction::status:
          device().counters().faults_verbs.fetch_add(1, std::memory_order_relaxed);
          if (wc.status == IBV_WC_SUCCESS && d.wc_status != IBV_WC_SUCCESS) request_error_locked(false);
          wc.status = static_cast<ibv_wc_status>(d.wc_status);
          fault = "status";
          break;
        default:
          apply_fault_later(device(), d);
          break;
      }
    }
  }
  traced(fault);
  // rxe's rdma_recvs: receive work requests completed successfully.
  if (wc.status == IBV_WC_SUCCESS && (wc.opcode & IBV_WC_RECV))
    device().counters().recvs_completed.fetch_add(1, std::memory_order_relaxed);
  if (!cq->push(wc, solicited)) {
    // The CQ overran and is in error now (IBV_EVENT_CQ_ERR, raised by the CQ):
    // this completion is lost, so the QP cannot go on either. As on ConnectX, a
    // QP that fails to write a completion suffers a catastrophic error: it moves
    // to the error state with IBV_EVENT_QP_FATAL.
    if (attr_.qp_state != IBV_QPS_ERR) request_error_locked(true);
  }
}

void Qp::push_send_batch_locked(const ibv_wc* wcs, size_t n) {
  // As push_completion_locked does for each: an overrun loses this completion
  // and the rest (the CQ takes no more), and fails the QP.
  if (send_cq_->push_n(wcs, n, false) < n && attr_.qp_state != IBV_QPS_ERR) request_error_locked(true);
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
  ibv_wc wc;
  if (send_wc_locked(w, status, &wc)) push_completion_locked(send_cq_, wc, false, w.trace_id);
}

bool Qp::send_wc_locked(const SendWqe& w, ibv_wc_status status, ibv_wc* out, bool count_success) {
  // The hw counters (rxe's rdma_sends, retry_exceeded_err, retry_rnr_exceeded_err)
  // count every send work request that ends so, signaled or not.
  Device::Counters& counters = device().counters();
  if (status == IBV_WC_SUCCESS && count_success) counters.sends_completed.fetch_add(1, std::memory_order_relaxed);
  if (status == IBV_WC_RETRY_EXC_ERR) counters.retry_exceeded.fetch_add(1, std::memory_order_relaxed);
  if (status == IBV_WC_RNR_RETRY_EXC_ERR) counters.rnr_retry_exceeded.fetch_add(1, std::memory_order_relaxed);
  const bool signaled = sq_sig_all_ || (w.send_flags & IBV_SEND_SIGNALED);
  if (status == IBV_WC_SUCCESS && !signaled) {
    if (trace::on())
      trace::completion(device().clock(), device().name(), qpn(), w.trace_id, w.wr_id, "IBV_WC_SUCCESS",
                        trace::wc_opcode_name(wc_opcode_of(w.opcode)), 0, false);
    return false;
  }
  ibv_wc& wc = *out;
  wc = ibv_wc{};
  wc.wr_id = w.wr_id;
  wc.status = status;
  wc.opcode = wc_opcode_of(w.opcode);
  wc.qp_num = qpn();
  // mlx5 and rxe flag the requester's completion of an operation with immediate.
  if (w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) wc.wc_flags = IBV_WC_WITH_IMM;
  if (w.opcode == IBV_WR_RDMA_READ) wc.byte_len = static_cast<uint32_t>(w.total_length);
  if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) wc.byte_len = 8;
  if (status != IBV_WC_SUCCESS) wc.vendor_err = 0;
  return true;
}

uint32_t Qp::first_unacked_locked() {
  // Positions before the remembered one are acknowledged: acknowledgement flags
  // are only ever set on a WQE in the queue, and positions never repeat
  // (WorkQueue::clear). So the search resumes there, and every WQE is passed
  // over once in its life: amortised O(1) per call.
  const uint64_t head = sq_.head_position();
  uint32_t i = comp_.acked_end > head ? static_cast<uint32_t>(comp_.acked_end - head) : 0;
  while (i < sq_.size() && sq_.at(i).acked) ++i;
  comp_.acked_end = head + i;
  return i;
}

uint64_t Qp::rd_before_locked(uint32_t index) { return index < sq_.size() ? sq_.at(index).rd_before : rd_posted_; }

void Qp::retire_acked_locked() {
  // A run of acknowledged WQEs (one coalesced ACK retires a posted list) goes
  // to the send CQ under one CQ lock, when nothing looks at each completion on
  // its way (push_completion_locked: no trace, no completion fault rule, no
  // forced error pending): the same entries in the same order.
  // The run's successful WQEs are counted (sends_completed) once, before
  // their completions are pushed, not one counter update per WQE.
  constexpr size_t kBatch = 32;
  ibv_wc batch[kBatch];
  size_t n = 0;
  uint64_t succeeded = 0;
  const bool batched = send_cq_ && !error_pending_ && !trace::on() && !device().verb_filter().verbs_active();
  auto push_batch = [&] {
    device().counters().sends_completed.fetch_add(succeeded, std::memory_order_relaxed);
    succeeded = 0;
    if (n) push_send_batch_locked(batch, n);
    n = 0;
  };
  while (!sq_.empty() && sq_.front().acked) {
    if (!batched) {
      post_send_completion_locked(sq_.front(), IBV_WC_SUCCESS);
    } else {
      ++succeeded;
      if (send_wc_locked(sq_.front(), IBV_WC_SUCCESS, &batch[n], false) && ++n == kBatch) push_batch();
    }
    sq_.pop();
    if (req_.tx_index > 0) --req_.tx_index;
  }
  if (succeeded || n) push_batch();
  release_held_error_locked();
  check_drained_locked();
}

void Qp::fail_local_locked(SendWqe& w, ibv_wc_status status) {
  // ConnectX fails the WQE at once, flushing the earlier ones still in flight;
  // rxe completes those first, as their acknowledgements arrive, and only then
  // reports the error (the personality's completions.local_error).
  const uint32_t index = req_.tx_index;
  if (!personality().local_error_in_order || !requester_reliable() || index >= sq_.size() || &sq_.at(index) != &w ||
      first_unacked_locked() >= index) {
    fail_send_locked(&w, status);
    return;
  }
  req_.held_error_pos = sq_.head_position() + index;
  req_.held_error = status;
}

void Qp::release_held_error_locked() {
  // Everything before the held WQE acknowledged (and retired): it fails now,
  // exactly as an immediate local error would. An earlier WQE that fails
  // instead (its retries exhausted, a NAK) moves the QP to the error state,
  // which drops the held error and flushes the WQE.
  if (req_.held_error == IBV_WC_SUCCESS) return;
  const uint64_t head = sq_.head_position();
  if (req_.held_error_pos < head || req_.held_error_pos - head >= sq_.size()) {
    req_.held_error = IBV_WC_SUCCESS;  // the WQE is gone (flushed)
    return;
  }
  const uint32_t index = static_cast<uint32_t>(req_.held_error_pos - head);
  if (first_unacked_locked() < index) return;
  const ibv_wc_status status = req_.held_error;
  req_.held_error = IBV_WC_SUCCESS;
  fail_send_locked(&sq_.at(index), status);
}

void Qp::check_drained_locked() {
  // The drain (RTS->SQD) ends when no message is under way and everything sent
  // is acknowledged; the application asked to be told with en_sqd_async_notify.
  if (attr_.qp_state != IBV_QPS_SQD || !attr_.sq_draining) return;
  if (req_.tx_offset != 0 || comp_.unacked_psn != req_.sent_end_psn) return;
  if (first_unacked_locked() < std::min(req_.tx_index, sq_.size())) return;
  attr_.sq_draining = 0;
  // rxe raises the event at every drain (the personality's [events]).
  if (attr_.en_sqd_async_notify || personality().sq_drained_always) {
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = IBV_EVENT_SQ_DRAINED;
    context().post_async_event(ev);
  }
}

void Qp::fail_send_locked(SendWqe* failed, ibv_wc_status status) {
  if (!failed) {
    // The oldest request not yet acknowledged is the one that failed.
    const uint32_t i = first_unacked_locked();
    if (i == sq_.size()) return;
    failed = &sq_.at(i);
  }
  // A work queue completes in order, each request exactly once (IBTA 10.8.3):
  // acknowledged requests before the failing one succeed, those still in flight
  // are flushed, then the failing one reports the error.
  uint32_t index = 0;
  while (index < sq_.size() && &sq_.at(index) != failed) ++index;
  for (uint32_t i = 0; i < index; ++i) {
    post_send_completion_locked(sq_.front(), sq_.front().acked ? IBV_WC_SUCCESS : IBV_WC_WR_FLUSH_ERR);
    sq_.pop();
  }
  if (!sq_.empty()) {
    post_send_completion_locked(sq_.front(), status);
    sq_.pop();
  }
  req_.tx_index = 0;
  req_.tx_offset = 0;
  // IBTA 10.8.3.3: a completion error moves the QP to the error state, which
  // flushes what remains.
  enter_error_locked();
}

// ---- the response steps -----------------------------------------------------

void Qp::completer_locked(const PacketView& pkt) {
  CompContext c{pkt};
  CompStep step = CompStep::get_ack;
  while (step != CompStep::done) {
    switch (step) {
      case CompStep::get_ack: step = comp_get_ack_locked(c); break;
      case CompStep::check_psn: step = comp_check_psn_locked(c); break;
      case CompStep::check_ack: step = comp_check_ack_locked(c); break;
      case CompStep::ack: step = comp_ack_locked(c); break;
      case CompStep::rnr_nak: step = comp_rnr_nak_locked(c); break;
      case CompStep::rnr_retry: step = comp_rnr_retry_locked(c); break;
      case CompStep::seq_nak: step = comp_seq_nak_locked(c); break;
      case CompStep::retry: step = comp_retry_locked(c); break;
      case CompStep::error_nak: step = comp_error_nak_locked(c); break;
      case CompStep::read_resp: step = comp_read_resp_locked(c); break;
      case CompStep::do_read: step = comp_do_read_locked(c); break;
      case CompStep::do_atomic: step = comp_do_atomic_locked(c); break;
      case CompStep::update: step = comp_update_locked(c); break;
      case CompStep::error: step = comp_error_locked(c); break;
      case CompStep::done: break;
    }
  }
}

CompStep Qp::comp_get_ack_locked(CompContext&) {
  // Only a reliable connection has responses.
  if (!requester_reliable()) return CompStep::done;
  // Any response, a duplicate too, says the peer answers (retransmit.hpp).
  retx_.answered = true;
  ++retx_.responses;
  return CompStep::check_psn;
}

CompStep Qp::comp_check_psn_locked(CompContext& c) {
  const uint32_t psn = c.pkt.bth.psn;
  // Responses for PSNs never sent, or for requests already acknowledged, are
  // ghosts or duplicates (a late or repeated ACK or NAK): ignore them (IBTA 9.9.2.1).
  // Ghosts are judged against the highest PSN ever sent: after a go-back the next
  // PSN to send is lower, but the responder may legitimately acknowledge up to the
  // highest one it has seen.
  if (psn_ge(psn, req_.sent_end_psn) || psn_lt(psn, comp_.unacked_psn)) {
    device().counters().duplicates.fetch_add(1, std::memory_order_relaxed);
    SV_LOG(kDebug, "qp 0x%06x: ignored %.*s psn %u (unacked %u, next %u)", qpn(),
           static_cast<int>(c.pkt.op->name.size()), c.pkt.op->name.data(), psn, comp_.unacked_psn, req_.sent_end_psn);
    return CompStep::done;
  }
  return CompStep::check_ack;
}

CompStep Qp::comp_check_ack_locked(CompContext& c) {
  switch (c.pkt.op->op_class) {
    case OpClass::ack: {
      const Aeth& a = c.pkt.aeth;
      if (a.is_ack()) return CompStep::ack;
      if (a.is_rnr_nak()) return CompStep::rnr_nak;
      if (a.is_nak()) return a.nak_code() == NakCode::psn_sequence_error ? CompStep::seq_nak : CompStep::error_nak;
      return CompStep::update;  // a reserved AETH type
    }
    case OpClass::rdma_read_response:
    case OpClass::atomic_ack:
      return CompStep::read_resp;
    default:
      return CompStep::done;
  }
}

void Qp::ack_through_locked(CompContext& c, uint32_t upto_exclusive) {
  // Everything before `upto_exclusive` is acknowledged: send and write requests
  // retire. The walk starts at the first WQE not acknowledged yet, so an
  // acknowledgement costs the WQEs it retires, not the length of the queue.
  for (uint32_t i = first_unacked_locked(); i < sq_.size(); ++i) {
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
      const uint32_t missing = psn_gt(comp_.unacked_psn, w.first_psn) ? comp_.unacked_psn : w.first_psn;
      if (psn_gt(upto_exclusive, missing)) {
        upto_exclusive = missing;
        if (comp_.gap_rewind_psn != missing) {
          comp_.gap_rewind_psn = missing;
          c.rewind = true;
        }
      }
      break;
    }
    if (psn_ge(w.last_psn, upto_exclusive)) break;
    w.acked = true;
    c.progressed = true;
  }
  if (psn_gt(upto_exclusive, comp_.unacked_psn)) {
    comp_.unacked_psn = upto_exclusive;
    c.progressed = true;
  }
}

CompStep Qp::comp_ack_locked(CompContext& c) {
  ack_through_locked(c, psn_add(c.pkt.bth.psn, 1));
  return CompStep::update;
}

CompStep Qp::comp_rnr_nak_locked(CompContext& c) {
  // Receiver not ready (IBTA 9.7.5.2.8): what precedes the PSN is acknowledged.
  device().counters().rnr_naks_received.fetch_add(1, std::memory_order_relaxed);
  ack_through_locked(c, c.pkt.bth.psn);
  return CompStep::rnr_retry;
}

CompStep Qp::comp_rnr_retry_locked(CompContext& c) {
  const uint32_t psn = c.pkt.bth.psn;
  const Aeth& a = c.pkt.aeth;
  if (attr_.rnr_retry != 7) {  // 7 means retry forever (IBTA 9.7.5.2.8)
    if (comp_.rnr_retry_left == 0) {
      c.status = IBV_WC_RNR_RETRY_EXC_ERR;
      return CompStep::error;
    }
    --comp_.rnr_retry_left;
  }
  retransmit_from_locked(psn);
  req_.rnr_waiting = true;
  rnr_until_ = device().clock().now() + std::chrono::microseconds(rnr_timer_us(a.rnr_timer()));
  if (trace::on()) trace_timer_locked("rnr_wait", "armed", std::chrono::microseconds(rnr_timer_us(a.rnr_timer())));
  arm_timer_locked();
  retire_acked_locked();
  // Not `update`: an RNR NAK is no progress, the retry counts go on.
  return CompStep::done;
}

CompStep Qp::comp_seq_nak_locked(CompContext& c) {
  const uint32_t psn = c.pkt.bth.psn;
  device().counters().naks_received.fetch_add(1, std::memory_order_relaxed);
  device().counters().seq_naks_received.fetch_add(1, std::memory_order_relaxed);
  note_loss_locked();
  // A sequence NAK past a read or atomic still waiting for its response
  // says the responder executed it: the response was lost (again). Ask
  // for it again with every such NAK, not only the first time its gap was
  // seen, or the NAKs would spend the retries while the response never
  // comes back.
  comp_.gap_rewind_psn = 0xffffffff;
  ack_through_locked(c, psn);
  // Already resending from there (after an RNR NAK, a timeout or an
  // earlier NAK for the same gap): this NAK brings no news.
  if (req_.rnr_waiting || psn_le(req_.psn, psn)) return CompStep::update;
  return CompStep::retry;
}

CompStep Qp::comp_retry_locked(CompContext& c) {
  // Go back to the PSN the responder expects (IBTA 9.7.5.1.4), within retry_cnt.
  // Exhausted, an armed QP migrates and retries on its alternate path
  // (IBTA 17.2.8); otherwise the request fails.
  if (comp_.retry_left > 0) {
    --comp_.retry_left;
  } else if (!migrate_on_path_failure_locked()) {
    c.status = IBV_WC_RETRY_EXC_ERR;
    return CompStep::error;
  }
  retransmit_from_locked(c.pkt.bth.psn);
  return CompStep::update;
}

CompStep Qp::comp_error_nak_locked(CompContext& c) {
  // The request at the NAK's PSN failed at the responder; those before it are
  // acknowledged (IBTA 9.7.5.2.3 .. 9.7.5.2.6).
  device().counters().naks_received.fetch_add(1, std::memory_order_relaxed);
  ack_through_locked(c, c.pkt.bth.psn);
  c.status = status_of_nak(c.pkt.aeth.nak_code());
  return CompStep::error;
}

CompStep Qp::comp_read_resp_locked(CompContext& c) {
  const uint32_t psn = c.pkt.bth.psn;
  // Responses arrive in PSN order; a gap means some were lost: ask again
  // from the first missing one (IBTA 9.7.5.1.6).
  if (psn != comp_.unacked_psn) {
    // Once per gap: the responses after the missing one are all dropped.
    if (psn_gt(psn, comp_.unacked_psn) && comp_.gap_rewind_psn != comp_.unacked_psn) {
      comp_.gap_rewind_psn = comp_.unacked_psn;
      note_loss_locked();
      retransmit_from_locked(comp_.unacked_psn);
    }
    return CompStep::update;
  }
  SendWqe* read = nullptr;
  for (uint32_t i = first_unacked_locked(); i < sq_.size(); ++i) {
    SendWqe& w = sq_.at(i);
    if (w.acked) continue;
    if (w.opcode == IBV_WR_RDMA_READ || w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
        w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      read = &w;
      c.index = i;
      break;
    }
    // A response implicitly acknowledges the sends and writes before it.
    if (w.started && psn_lt(w.last_psn, psn)) {
      w.acked = true;
      continue;
    }
    break;
  }
  const bool want_atomic = c.pkt.op->op_class == OpClass::atomic_ack;
  if (!read || psn_lt(psn, read->first_psn) || (want_atomic != (read->opcode != IBV_WR_RDMA_READ))) {
    // Not the response this requester waits for (IBTA C9-?? "bad response").
    c.failed = read ? read : &sq_.front();
    c.status = IBV_WC_BAD_RESP_ERR;
    return CompStep::error;
  }
  c.wqe = read;
  return want_atomic ? CompStep::do_atomic : CompStep::do_read;
}

CompStep Qp::comp_do_atomic_locked(CompContext& c) {
  SendWqe& w = *c.wqe;
  std::shared_lock mr_lock(device().mr_lock());
  std::vector<std::span<uint8_t>> spans;
  uint64_t orig = c.pkt.atomic_ack_eth.orig;
  if (!resolve_sges(device(), pd_, sq_.sges_at(c.index), w.num_sge, 0, 8, IBV_ACCESS_LOCAL_WRITE, spans)) {
    mr_lock.unlock();
    c.failed = &w;
    c.status = personality().bad_lkey;  // an SGE no region covers
    return CompStep::error;
  }
  scatter(spans, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&orig), 8));
  w.acked = true;
  comp_.unacked_psn = psn_add(c.pkt.bth.psn, 1);
  c.progressed = true;
  return CompStep::update;
}

CompStep Qp::comp_do_read_locked(CompContext& c) {
  SendWqe& w = *c.wqe;
  const uint32_t psn = c.pkt.bth.psn;
  std::shared_lock mr_lock(device().mr_lock());
  std::vector<std::span<uint8_t>> spans;
  const uint32_t mtu = mtu_bytes();
  uint64_t offset = static_cast<uint64_t>(psn_diff(psn, w.first_psn)) * mtu;
  uint64_t len = c.pkt.payload.size();
  const bool last = c.pkt.op->position == Position::last || c.pkt.op->position == Position::only;
  const bool chunk_end = last;
  c.failed = &w;
  if (offset + len > w.total_length || (!chunk_end && len != mtu)) {
    mr_lock.unlock();
    c.status = IBV_WC_BAD_RESP_ERR;
    return CompStep::error;
  }
  if (len && !resolve_sges(device(), pd_, sq_.sges_at(c.index), w.num_sge, offset, len, IBV_ACCESS_LOCAL_WRITE,
                           spans)) {
    mr_lock.unlock();
    c.status = personality().bad_lkey;  // an SGE no region covers
    return CompStep::error;
  }
  scatter(spans, c.pkt.payload);
  w.resp_bytes = offset + len;
  if (psn == w.last_psn) w.acked = true;
  comp_.unacked_psn = psn_add(psn, 1);
  c.progressed = true;
  return CompStep::update;
}

CompStep Qp::comp_update_locked(CompContext& c) {
  if (c.progressed) {
    comp_.retry_left = attr_.retry_cnt;
    comp_.rnr_retry_left = attr_.rnr_retry;
  }
  if (c.rewind) retransmit_from_locked(comp_.unacked_psn);
  // An acknowledgement past the retry's resend point: resume sending after it.
  if (psn_gt(comp_.unacked_psn, req_.psn)) retransmit_from_locked(comp_.unacked_psn);
  retire_acked_locked();
  // Everything acknowledged: the timer stops now (no clock read). Otherwise
  // the requester_locked that follows every response re-arms it, after the
  // packets this response lets it send: one clock read for both, at the same
  // moment as far as any timeout can tell.
  if (comp_.unacked_psn == req_.sent_end_psn && !req_.rnr_waiting)
    arm_timer_locked();
  else
    comp_.rearm = true;
  return CompStep::done;
}

CompStep Qp::comp_error_locked(CompContext& c) {
  fail_send_locked(c.failed, c.status);
  return CompStep::done;
}

}  // namespace softverbs::emu

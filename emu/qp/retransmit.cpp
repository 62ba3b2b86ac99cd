// Adaptive retransmission (retransmit.hpp): the setting, the round-trip
// estimate, and the QP's repair timer beside its local ACK timer (both on the
// QP's one EngineTimer; Qp::on_timer tells them apart).
#include "emu/qp/retransmit.hpp"

#include <algorithm>
#include <string_view>

#include "core/env.hpp"
#include "core/log.hpp"
#include "core/trace.hpp"
#include "emu/qp/qp.hpp"
#include "fabric/timer.hpp"
#include "wire/psn.hpp"

namespace softverbs::emu {

std::optional<bool> parse_adaptive_retransmit(const char* text) {
  const std::string_view v = text ? text : "";
  if (v == "1" || v == "on") return true;
  if (v == "0" || v == "off") return false;
  return std::nullopt;
}

bool adaptive_retransmit_enabled(bool otherwise) {
  static const std::optional<bool> setting = []() -> std::optional<bool> {
    const char* text = env::adaptive_retransmit();
    if (!text) return std::nullopt;
    const std::optional<bool> v = parse_adaptive_retransmit(text);
    if (!v) SV_LOG(kError, "SOFTVERBS_ADAPTIVE_RETRANSMIT=%s: expected 1, on, 0 or off; using on", text);
    return v.value_or(true);
  }();
  return setting.value_or(otherwise);
}

void AdaptiveRetransmit::sample(time_point now) {
  if (!probing_) return;
  probing_ = false;
  backoff_ = 0;  // a packet sent once was answered: the estimate holds again
  const duration r = std::max(now - probe_at_, duration::zero());
  // RFC 6298 section 2: the first sample sets the mean and half of it the
  // variation; later ones move them by 1/8 and 1/4 of the difference.
  if (!have_rtt_) {
    have_rtt_ = true;
    srtt_ = r;
    rttvar_ = r / 2;
    return;
  }
  const duration err = r > srtt_ ? r - srtt_ : srtt_ - r;
  rttvar_ += (err - rttvar_) / 4;
  srtt_ += (r - srtt_) / 8;
}

AdaptiveRetransmit::duration AdaptiveRetransmit::timeout() const {
  const duration base = std::max<duration>(srtt_ + 4 * rttvar_, kMinTimeout);
  // Bounded shift: a timeout this long is far past any local ACK timeout, and
  // the caller stops the repair timer there.
  return base * (int64_t{1} << std::min(backoff_, kMaxBackoff));
}

void Qp::arm_repair_locked(Clock::time_point now, Clock::duration ack_timeout) {
  // Called by arm_timer_locked with packets outstanding: its clock reading
  // serves the round-trip sample, the new probe and the repair deadline.
  AdaptiveRetransmit& r = retx_;
  if (!adaptive_retx_) return;
  if (r.probing() && wire::psn_gt(comp_.unacked_psn, r.probe_psn())) r.sample(now);
  // Packets went out since the last arming, the last of them just now: time it.
  if (wire::psn_gt(req_.sent_end_psn, r.sent_mark) && req_.psn == req_.sent_end_psn)
    r.probe(wire::psn_sub(req_.sent_end_psn, 1), now);
  r.sent_mark = req_.sent_end_psn;
  // Only for a peer that answers (a silent one is the local ACK timeout's, with
  // its retry_cnt), during a loss episode, and only below the local ACK timeout.
  const Clock::duration t = r.timeout();
  r.armed = r.answered && r.in_loss_episode(now) && t < ack_timeout;
  if (!r.armed) return;
  r.repair_at = now + t;  // the caller arms the timer for next_timer_locked()
}

Clock::time_point Qp::next_timer_locked() const {
  return retx_.armed ? std::min(deadline_, retx_.repair_at) : deadline_;
}

void Qp::note_loss_locked() {
  if (adaptive_retx_) retx_.loss_seen(device().clock().now());
}

void Qp::repair_locked(Clock::time_point now) {
  // The repair timer ran out with no response since it was armed (each one
  // re-arms it): resend from the oldest unacknowledged PSN, as a local ACK
  // timeout would, but without counting against retry_cnt and without moving
  // the local ACK deadline, so that a peer that stops answering still fails
  // the request after exactly the configured timeouts.
  AdaptiveRetransmit& r = retx_;
  r.armed = false;
  r.back_off();
  r.loss_seen(now);
  SV_LOG(kDebug, "qp 0x%06x: repair timeout, resend from psn %u (next psn %u), next wait %lld us", qpn(),
         comp_.unacked_psn, req_.psn,
         static_cast<long long>(std::chrono::duration_cast<std::chrono::microseconds>(r.timeout()).count()));
  if (trace::on()) trace_timer_locked("ack_repair", "fired");
  comp_.gap_rewind_psn = 0xffffffff;  // a read-response gap seen again is asked for again
  const Clock::time_point deadline = deadline_;
  const uint64_t responses = r.responses;
  retransmit_from_locked(comp_.unacked_psn);
  requester_locked();
  arm_timer_locked();
  // The resend re-armed the local ACK timer from now; only a response may.
  if (r.responses == responses && deadline > now) {
    deadline_ = deadline;
    timer_->arm_at(next_timer_locked());
  }
}

}  // namespace softverbs::emu

// Adaptive retransmission (SOFTVERBS_ADAPTIVE_RETRANSMIT, docs/faults.md
// "Recovery from loss"): the requester's measured round trip and the short
// repair timer it times. After ConnectX's adaptive retransmission ("lossy RoCE
// accelerations"): a requester that has heard from its peer since its last local
// ACK timeout and has seen loss in the last 0.25 s (kLossEpisode), and then gets
// no response for a few round trips, resends from the oldest unacknowledged PSN
// without waiting for the configured local ACK timeout, and doubles the wait
// each time, up to that timeout. The local ACK timeout and its retry_cnt
// accounting (IBTA 9.7.6.1.3, Qp::on_timer) are untouched: these early resends
// never count against retry_cnt and never move the local ACK deadline.
//
// Why: a responder sends one sequence NAK per gap and then drops the packets
// that follow without an answer until the expected PSN arrives (IBTA
// 9.7.5.1.2), so a lost NAK or a lost retransmission leaves the requester
// nothing to react to but a timer. An early resend is a duplicate at worst,
// which every responder must accept (IBTA 9.7.5.1.1).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

#include "core/clock.hpp"

namespace softverbs::emu {

// SOFTVERBS_ADAPTIVE_RETRANSMIT: "1"/"on" (the default) or "0"/"off"; nullopt
// for anything else.
std::optional<bool> parse_adaptive_retransmit(const char* text);
// The process's setting, read at the first call (the first RC QP to reach RTS);
// unset, the device personality's qp.adaptive_retransmit (`otherwise`).
bool adaptive_retransmit_enabled(bool otherwise = true);

// The repair timer's state for one requester: a round-trip estimate (RFC 6298's
// smoothed mean and variation, one sample in flight at a time, none from a
// retransmitted PSN: Karn's rule) and the backoff of the early resends, which a
// new sample ends.
class AdaptiveRetransmit {
 public:
  using duration = Clock::duration;
  using time_point = Clock::time_point;

  // The shortest repair timeout: a software peer on a loaded host cannot answer
  // reliably in less (and a shorter one would mostly resend in vain). Under
  // virtual time a round trip between devices of the process takes no time, so
  // the repair timeout is exactly this.
  static constexpr duration kMinTimeout = std::chrono::microseconds(500);
  // How long after its last sign of loss a requester keeps the repair timer
  // running. Outside such a loss episode it runs no timer but the local ACK
  // one, so that connections without loss, thousands of them at once, pay
  // nothing for it (a timer due every round trip of each QP would).
  static constexpr duration kLossEpisode = std::chrono::milliseconds(250);

  // A packet went out with this PSN at `at`: timed, unless another one is.
  void probe(uint32_t psn, time_point at) {
    if (probing_) return;
    probing_ = true;
    probe_psn_ = psn;
    probe_at_ = at;
  }
  // Packets are sent again: the answer to the timed one would be ambiguous.
  void cancel_probe() { probing_ = false; }
  bool probing() const { return probing_; }
  uint32_t probe_psn() const { return probe_psn_; }
  // The timed packet is acknowledged at `now`: one round-trip sample.
  void sample(time_point now);

  // The repair timeout now: 4 deviations above the smoothed round trip, at
  // least kMinTimeout, doubled per early resend since the last sample.
  duration timeout() const;
  // An early resend happened: the next waits twice as long, until a round trip
  // is measured again (Karn's rule: an acknowledgement after a resend does not
  // say which copy it answers, so it does not undo the backoff).
  void back_off() {
    if (backoff_ < kMaxBackoff) ++backoff_;
  }

  // A sign of loss at `now`: a sequence NAK, a gap in read responses, a local
  // ACK timeout or an early resend. The loss episode lasts kLossEpisode from it.
  void loss_seen(time_point now) { loss_until = now + kLossEpisode; }
  bool in_loss_episode(time_point now) const { return now < loss_until; }
  // Loss was seen at least once: round trips are measured even when one costs
  // a clock reading of its own (the last outstanding packet acknowledged).
  bool lossy() const { return loss_until != time_point{}; }

  // A response (ACK, NAK, read or atomic response) arrived since the last local
  // ACK timeout: the peer answers, so the repair timer may run.
  bool answered = false;
  time_point loss_until{};
  // The repair timer: armed (and due at repair_at) while packets are
  // outstanding, the peer answers, and the timeout is below the local ACK one.
  bool armed = false;
  time_point repair_at{};
  // Responses processed (any kind): tells an early resend whether one came
  // back while it sent.
  uint64_t responses = 0;
  // sent_end_psn at the last arming: packets past it went out since.
  uint32_t sent_mark = 0;

 private:
  static constexpr unsigned kMaxBackoff = 24;
  bool probing_ = false;
  uint32_t probe_psn_ = 0;
  time_point probe_at_{};
  bool have_rtt_ = false;
  duration srtt_{};
  duration rttvar_{};
  unsigned backoff_ = 0;
};

}  // namespace softverbs::emu

// FaultyLink: carrying out the packet-fault decisions (docs/faults.md).
#include "fabric/faulty_link.hpp"

#include <chrono>

#include "core/trace.hpp"
#include "fabric/trace_packet.hpp"
#include "faults/rule.hpp"
#include "wire/cm_mad.hpp"

namespace softverbs::fabric {
namespace {

// How long the fault layer holds a packet back for reordering when no other
// packet overtakes it.
constexpr auto kReorderHold = std::chrono::microseconds(200);

// Sends through the layers below with the trace's record of the packet left
// for the tap (core/trace.hpp).
void send_traced(Link& inner, const std::string& dev, in_addr dst, std::span<const uint8_t> packet, uint8_t tos,
                 bool icrc, std::string_view fault) {
  if (trace::on()) trace::set_pending({&dev, fault, 0});
  inner.send(dst, packet, tos, icrc);
}

// The frame number the tap left for a received packet.
uint64_t rx_frame() { return trace::take_pending().frame; }

std::string_view fault_name(const faults::FaultDecision& d) {
  return d.fired ? faults::to_string(d.action) : std::string_view("none");
}

// A decision made on a packet's headers (send_direct, send_gathered) whose
// packet then goes the usual way, built: send() carries it out instead of
// deciding again, so that each packet is decided once (a rule's nth match and
// its random stream count it once). Only for the next packet of the same link
// on this thread, and only if it is that packet; the sender forgets it when it
// starts another (FaultyLink::new_packet).
struct Decided {
  const void* link = nullptr;
  uint32_t dst = 0;
  uint32_t dest_qp = 0;
  uint32_t psn = 0;
  uint8_t opcode = 0;
  faults::FaultDecision decision;
};
thread_local Decided decided;

void keep_decision(const void* link, in_addr dst, const wire::PacketView& view, faults::FaultDecision d) {
  decided = Decided{link, dst.s_addr, view.bth.dest_qp, view.bth.psn, view.bth.opcode, std::move(d)};
}

// The decision kept for this packet, if any; a kept one for another is dropped.
bool take_decision(const void* link, in_addr dst, const wire::PacketView& view, faults::FaultDecision& out) {
  Decided& k = decided;
  if (!k.link) return false;
  const bool same = k.link == link && k.dst == dst.s_addr && k.dest_qp == view.bth.dest_qp &&
                    k.psn == view.bth.psn && k.opcode == view.bth.opcode;
  k.link = nullptr;
  if (same) out = std::move(k.decision);
  return same;
}

}  // namespace

void FaultyLink::new_packet() { decided.link = nullptr; }

FaultyLink::FaultyLink(Link& inner, faults::PacketFilter& filter, Scheduler& scheduler, LinkCounters& counters,
                       std::string device)
    : LinkDecorator(inner), filter_(filter), scheduler_(scheduler), counters_(counters), device_(std::move(device)) {}

void FaultyLink::attach(Receiver& receiver) {
  sink_ = dynamic_cast<PacketSink*>(&receiver);
  LinkDecorator::attach(receiver);
}

// ---- the way out ----------------------------------------------------------

void FaultyLink::send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  const Clock& clock = scheduler_.clock();
  std::string_view fault = "none";  // for the trace
  if (filter_.active()) {
    wire::PacketView view;
    if (wire::parse(packet, view) == wire::ParseError::ok) {
      faults::FaultDecision d;
      if (!take_decision(this, dst, view, d)) d = filter_.decide({faults::Direction::tx, device_, &view});
      if (d.fired) {
        switch (d.action) {
          case faults::FaultAction::drop:
            counters_.faults_dropped.fetch_add(1, std::memory_order_relaxed);
            if (trace::on()) trace_packet(clock, device_, "tx", packet, "drop", 0);
            return;
          case faults::FaultAction::duplicate:
            counters_.faults_duplicated.fetch_add(1, std::memory_order_relaxed);
            send_traced(inner_, device_, dst, packet, tos, icrc, "duplicate");
            fault = "duplicate";
            break;
          case faults::FaultAction::corrupt: {
            // One flipped bit in the middle of the packet: the ICRC no longer matches.
            // It goes on marked as carrying its ICRC even where the sender left
            // that field 0 (in-process, Link::needs_icrc), so the receiver checks
            // it and drops the packet as one damaged on a wire.
            counters_.faults_corrupted.fetch_add(1, std::memory_order_relaxed);
            std::vector<uint8_t> bad(packet.begin(), packet.end());
            bad[bad.size() / 2] ^= 0x10;
            send_traced(inner_, device_, dst, bad, tos, true, "corrupt");
            return;
          }
          case faults::FaultAction::delay:
            counters_.faults_delayed.fetch_add(1, std::memory_order_relaxed);
            scheduler_.after(std::chrono::microseconds(d.delay_us),
                             [this, dst, tos, icrc, bytes = std::vector<uint8_t>(packet.begin(), packet.end())] {
                               send_traced(inner_, device_, dst, bytes, tos, icrc, "delay");
                             });
            return;
          case faults::FaultAction::reorder: {
            counters_.faults_reordered.fetch_add(1, std::memory_order_relaxed);
            std::lock_guard lock(held_mu_);
            if (!held_tx_) {
              held_tx_ = Held{dst, std::vector<uint8_t>(packet.begin(), packet.end()), tos, icrc};
              has_held_tx_.store(true, std::memory_order_release);
              // It goes out after the next packet, or after a short while if none follows.
              scheduler_.after(kReorderHold, [this] { send_held(); });
              return;
            }
            break;
          }
          default:
            break;  // nak: receive side only; verb actions never reach packets
        }
      }
    }
  }
  send_traced(inner_, device_, dst, packet, tos, icrc, fault);
  if (has_held_tx_.load(std::memory_order_acquire)) send_held();
}

void FaultyLink::send_held() {
  std::optional<Held> held;
  {
    std::lock_guard lock(held_mu_);
    held.swap(held_tx_);
    has_held_tx_.store(false, std::memory_order_relaxed);
  }
  if (held) {
    send_traced(inner_, device_, held->dst, held->bytes, held->tos, held->icrc, "reorder");
  }
}

// ---- the way in -----------------------------------------------------------

bool FaultyLink::admit(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::PacketView& view,
                       wire::IpFields ip) {
  if (sink_) return sink_->admit(src, sport, packet, view, ip);
  if (wire::parse(packet, view) == wire::ParseError::ok) {
    view.ip = ip;
    return true;
  }
  up_->receive(src, sport, packet, ip);  // not a packet the rules can match: the receiver judges it
  return false;
}

void FaultyLink::deliver(in_addr src, uint16_t sport, std::span<const uint8_t> packet, const wire::PacketView& view) {
  if (sink_)
    sink_->deliver(src, view);
  else
    up_->receive(src, sport, packet, view.ip);
}

void FaultyLink::receive_unfaulted(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip) {
  up_->receive(src, sport, packet, ip);
}

void FaultyLink::receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip) {
  wire::PacketView view;
  if (!admit(src, sport, packet, view, ip)) return;
  if (filter_.active()) {
    faults::FaultDecision d = filter_.decide({faults::Direction::rx, device_, &view});
    if (trace::on()) trace_packet(scheduler_.clock(), device_, "rx", packet, fault_name(d), rx_frame());
    if (d.fired) {
      switch (d.action) {
        case faults::FaultAction::drop:
          counters_.faults_dropped.fetch_add(1, std::memory_order_relaxed);
          return;
        case faults::FaultAction::corrupt:
          // As if it had arrived damaged: the ICRC check drops it.
          counters_.faults_corrupted.fetch_add(1, std::memory_order_relaxed);
          counters_.rx_icrc_errors.fetch_add(1, std::memory_order_relaxed);
          return;
        case faults::FaultAction::duplicate:
          counters_.faults_duplicated.fetch_add(1, std::memory_order_relaxed);
          receive_unfaulted(src, sport, packet, ip);
          break;
        case faults::FaultAction::delay:
          counters_.faults_delayed.fetch_add(1, std::memory_order_relaxed);
          scheduler_.after(std::chrono::microseconds(d.delay_us),
                           [this, held = Datagram{src, sport, std::vector<uint8_t>(packet.begin(), packet.end()), ip}]() mutable {
                             {
                               std::lock_guard lock(due_mu_);
                               due_rx_.push_back(std::move(held));
                               due_pending_.store(true, std::memory_order_release);
                             }
                             up_->ready();
                           });
          return;
        case faults::FaultAction::reorder:
          if (!held_rx_) {
            counters_.faults_reordered.fetch_add(1, std::memory_order_relaxed);
            held_rx_.emplace(Datagram{src, sport, std::vector<uint8_t>(packet.begin(), packet.end()), ip});
            has_held_rx_.store(true, std::memory_order_release);
            // Handled after the next packet, or after a short while if none follows.
            scheduler_.after(kReorderHold, [this] {
              hold_expired_.store(true, std::memory_order_release);
              up_->ready();
            });
            return;
          }
          break;
        case faults::FaultAction::reject:
          if (sink_ && sink_->forge_reject(src, view, d.reason)) {
            counters_.faults_dropped.fetch_add(1, std::memory_order_relaxed);
            return;
          }
          break;
        case faults::FaultAction::nak:
          if (sink_ && view.op->is_request && sink_->forge_nak(view, d.syndrome)) {
            counters_.faults_naks_forged.fetch_add(1, std::memory_order_relaxed);
            return;
          }
          break;
        default:
          break;  // verb actions never reach packets
      }
    }
  } else if (trace::on()) {
    trace_packet(scheduler_.clock(), device_, "rx", packet, "none", rx_frame());
  }
  deliver(src, sport, packet, view);
  if (held_rx_) {
    Datagram held = std::move(*held_rx_);
    held_rx_.reset();
    has_held_rx_.store(false, std::memory_order_release);
    receive_unfaulted(held.src, held.sport, held.bytes, held.ip);
  }
}

bool FaultyLink::direct_ok(in_addr dst) {
  // Rules on the way out decide on the headers (send_direct); rules on the
  // way in see the bytes (the receiver's receive_direct refuses).
  return !filter_.watches(faults::Direction::rx) && !has_held_tx_.load(std::memory_order_acquire) &&
         inner_.direct_ok(dst);
}

template <class SendBelow>
bool FaultyLink::send_unbuilt(in_addr dst, const wire::PacketView& view, bool watched, SendBelow send_below) {
  // Nothing overtakes a held packet, and the trace shows each packet's bytes.
  if (has_held_tx_.load(std::memory_order_acquire)) return false;
  if (!watched) return send_below();
  if (trace::on() || view.bth.dest_qp == wire::cm::kGsiQpn) return false;  // a CM rule reads the MAD
  // The rules of the way out match on headers only (faults/rule.hpp): the
  // packet is decided here, once. Lost: it goes nowhere, as in send(). Any
  // other action needs its bytes, and so does a packet the layers below
  // refuse: built, it reaches send(), which carries out this decision.
  faults::FaultDecision d;  // decided already if an earlier way refused it
  if (!take_decision(this, dst, view, d)) d = filter_.decide({faults::Direction::tx, device_, &view});
  if (d.fired && d.action == faults::FaultAction::drop) {
    counters_.faults_dropped.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (!d.fired && send_below()) return true;
  keep_decision(this, dst, view, std::move(d));
  return false;
}

bool FaultyLink::send_direct(in_addr dst, const wire::PacketView& view) {
  return send_unbuilt(dst, view, filter_.watches(faults::Direction::tx),
                      [&] { return inner_.send_direct(dst, view); });
}

bool FaultyLink::send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) {
  // Asked once: a rule loaded meanwhile must not decide on headers not decoded.
  const bool watched = filter_.watches(faults::Direction::tx);
  wire::PacketView view;
  if (watched && !wire::parse_gathered(packet, view)) return false;
  return send_unbuilt(dst, view, watched, [&] { return inner_.send_gathered(dst, packet, tos); });
}

bool FaultyLink::receive_direct(in_addr src, const wire::PacketView& view) {
  // Nothing held back on the way in may be overtaken, and rules of the way in
  // loaded since the sender asked see every packet.
  if (!sink_ || filter_.watches(faults::Direction::rx) || due_pending_.load(std::memory_order_acquire) ||
      hold_expired_.load(std::memory_order_acquire) || has_held_rx_.load(std::memory_order_acquire))
    return false;
  return sink_->receive_direct(src, view);
}

bool FaultyLink::drain() {
  const bool any = drain_held();
  return inner_.drain() || any;
}

bool FaultyLink::poll() {
  const bool any = drain_held();
  return inner_.poll() || any;
}

bool FaultyLink::drain_held() {
  bool any = false;
  if (due_pending_.load(std::memory_order_acquire)) {
    std::deque<Datagram> due;
    {
      std::lock_guard lock(due_mu_);
      due.swap(due_rx_);
      due_pending_.store(false, std::memory_order_relaxed);
    }
    for (const Datagram& d : due) {
      any = true;
      receive_unfaulted(d.src, d.sport, d.bytes, d.ip);
    }
  }
  if (hold_expired_.load(std::memory_order_acquire) && hold_expired_.exchange(false) && held_rx_) {
    Datagram held = std::move(*held_rx_);
    held_rx_.reset();
    has_held_rx_.store(false, std::memory_order_release);
    any = true;
    receive_unfaulted(held.src, held.sport, held.bytes, held.ip);
  }
  return any;
}

}  // namespace softverbs::fabric

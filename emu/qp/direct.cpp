// The in-process fast path (docs/architecture.md, "Progress, threads and
// speed"): a packet to a device of this process, when the link allows it
// (fabric::Link::direct_ok: no capture, trace or fault rule of the way in; rules
// of the way out decide on its headers, fabric::FaultyLink), is handed to the
// receiver as the view parsing it would give (wire::as_received), with its
// payload straight from the sender's memory: not built, not parsed, copied
// once. PSNs, acknowledgements, checks, statuses and counters are the packet's.
// Only try-locks are taken towards the receiver; a busy receiver gets the
// packet the usual way. Answers for the QP this thread holds the lock of go
// through its inbox, taken before the lock is released.
//
// A direct session: the first packet of a requester's burst finds its
// receiver through the link's layers (fabric::Link::send_direct), which check
// that nothing needs the packet's bytes and that nothing queued for the
// receiver would be overtaken, and try its lock. The receiver's QP then stays
// locked and pinned for the burst's next packets to the same QP, which go to
// it straight: the burst is handed over as one, as a NIC's doorbell batch is.
// The session ends when the burst does (the requester's send loop, or its
// lock's scope), or at a packet that goes elsewhere or the usual way. While a
// thread holds a receiver so it waits for nothing but leaf locks and the
// sending device's region lock, which no QP lock is ever waited for under.
#include <cstring>
#include <utility>
#include <vector>

#include "core/trace.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "fabric/link.hpp"
#include "wire/packet.hpp"
#include "wire/psn.hpp"

namespace softverbs::emu {

using namespace wire;

namespace {

struct Stashed {
  in_addr src;
  // The QP whose plain ACK this is, when it came from transmit_plain_ack_locked
  // on this thread: that QP's next plain ACK may replace it in place.
  const Qp* acker;
  // Plain ACKs of acker folded into this one (fold_plain_ack_locked), not yet
  // counted, and acker's device, whose port counts them as sent.
  uint32_t folded;
  Device* acker_dev;
  PacketView view;             // its payload is set from bytes when taken
  std::vector<uint8_t> bytes;  // a copy: the sender's memory is not held meanwhile
};

// This thread's direct-delivery state, in one thread-local object with no
// constructor or destructor, so that a packet's way through the fast path
// looks its thread's storage up with no guard.
struct DirectState {
  // Direct deliveries under way on this thread. A receiver handed a packet
  // directly answers (ACKs, read responses, its own requests) with packets,
  // or, when the answer is for the QP in scope (below), through its inbox: no
  // thread ever holds two receivers' locks taken directly.
  int depth;
  bool draining;
  // The QP whose requester or receive path this thread runs, under its lock
  // (DirectScope): answers for it from a receiver it handed a packet to
  // directly cannot take its lock, which this thread holds, so they wait in
  // the inbox and the QP takes them before that lock is released
  // (drain_direct_locked), in the same call: no other thread is needed and
  // none waits for this one.
  Qp* scope;
  size_t size;   // inbox entries in use; the others keep their buffers
  size_t taken;  // entries the drain under way has taken (none merge into those)
  // The responder QP whose plain ACK is being transmitted, and its PSN: the
  // inbox entry it becomes is marked as that QP's (stash_direct).
  const Qp* acking;
  uint32_t acking_psn;
  // The direct session (above): the sending QP (the scope), the receiver QP,
  // locked and pinned (its slot), the address the packets go to and the one
  // they come from. `opening` asks the end of the link's chain
  // (Qp::try_receive) to keep the receiver it reaches.
  Qp* session_from;
  Qp* session_to;
  QpSlot* session_pin;
  in_addr session_dest;
  in_addr session_src;
  bool opening;
  // The session's packets after the first and their bytes, counted as sent
  // and received when it ends, once for the burst.
  uint64_t session_packets;
  uint64_t session_bytes;
};
// Both in the initial-exec TLS model: an offset from the thread pointer, not
// a call into the dynamic linker per lookup (__tls_get_addr), which the
// general-dynamic model of a shared library costs. The library is loaded with
// the program (or dlopen'ed into the static TLS surplus glibc keeps for
// such variables: these take about a hundred bytes of it).
[[gnu::tls_model("initial-exec")]] thread_local DirectState direct{};

// A direct delivery under way on this thread (DirectState::depth), also when
// the receiver throws.
struct Nested {
  explicit Nested(DirectState& d) : d_(d) { ++d_.depth; }
  ~Nested() { --d_.depth; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;
  DirectState& d_;
};
[[gnu::tls_model("initial-exec")]] thread_local std::vector<Stashed> inbox;

// The most packets a direct session hands over (its first included): the
// receiver's QP is held meanwhile, and a UD or UC send loop, which no window
// bounds, must not keep its application's ibv_post_recv waiting for long.
constexpr uint64_t kSessionPackets = 32;

// A plain positive acknowledgement (IBTA 9.7.5.1.1: no payload, an ACK
// syndrome), which a later one for a later PSN makes redundant.
bool plain_ack(const PacketView& pkt) {
  return (pkt.bth.opcode == opcode::rc_acknowledge || pkt.bth.opcode == opcode::xrc_acknowledge) &&
         pkt.aeth.is_ack() && pkt.payload.empty();
}

// The IP fields a packet handed over directly arrives with: those of the
// datagram it stands for, which carried no ICRC (fabric::Link::needs_icrc).
IpFields direct_ip(uint8_t tos) { return IpFields{tos, kDefaultTtl, true}; }

// The responder whose plain ACK pkt is, if it is being sent by
// transmit_plain_ack_locked on this thread; the mark is used once.
const Qp* acker_of(DirectState& d, const PacketView& pkt) {
  const Qp* q = d.acking;
  d.acking = nullptr;
  return q && plain_ack(pkt) && pkt.bth.psn == d.acking_psn ? q : nullptr;
}

}  // namespace

Qp::DirectScope::DirectScope(Qp* qp) : qp_(nullptr) {
  DirectState& d = direct;
  if (d.scope) return;
  qp_ = qp;
  d.scope = qp;
}

Qp::DirectScope::~DirectScope() {
  if (!qp_) return;
  qp_->end_direct_session_locked();  // normally ended already: requester_locked ends it
  qp_->drain_direct_locked();  // normally empty already: requester_locked takes it
  direct.scope = nullptr;
}

Qp* Qp::direct_scope_qp() { return direct.scope; }

void Qp::stash_direct(const PacketView& pkt, in_addr src) {
  // Every packet takes its own place, in arrival order; acknowledgements are
  // coalesced by their sender (transmit_plain_ack_locked), not here.
  DirectState& d = direct;
  std::vector<Stashed>& box = inbox;
  if (d.size == box.size()) box.emplace_back();
  Stashed& e = box[d.size++];
  e.src = src;
  e.acker = acker_of(d, pkt);
  e.folded = 0;
  e.view = pkt;
  e.bytes.assign(pkt.payload.begin(), pkt.payload.end());
}

void Qp::drain_direct_locked(size_t at_least) {
  // In arrival order, including what arrives meanwhile (answers to what the
  // QP sends while it takes these); receive_locked's own requester_locked
  // does not drain again, so this loop is the only one.
  DirectState& d = direct;
  if (d.draining || d.scope != this || d.size < at_least || d.size == 0) return;
  d.draining = true;
  std::vector<Stashed>& box = inbox;
  for (size_t i = 0; i < d.size; ++i) {
    if (box[i].folded) {
      // The ACKs folded into this one, counted as their packets would have
      // been (fold_plain_ack_locked) before the completions they retire.
      const uint64_t n = std::exchange(box[i].folded, 0);
      fabric::count_tx(box[i].acker_dev->counters(), n, packet_size(box[i].view.bth.opcode, 0));
      device().count_direct_rx(box[i].view, n);
    }
    PacketView view = box[i].view;
    // Moving the inbox (it may grow below) keeps each entry's buffer.
    view.payload = std::span<const uint8_t>(box[i].bytes.data(), box[i].bytes.size());
    d.taken = i + 1;
    receive_locked(view, box[i].src, in_addr{});
  }
  d.size = 0;
  d.taken = 0;
  d.draining = false;
}

bool Qp::fold_plain_ack_locked(uint8_t opcode, uint32_t psn, Aeth aeth) {
  // Coalesced acknowledgements, the one place they are (IBTA 9.7.5.1.1: an
  // ACK acknowledges every packet up to its PSN, so a responder may send one
  // for several): a responder handed a burst of requests directly answers
  // each with a plain ACK. When its previous plain ACK still waits, untaken
  // and last, in the inbox of the QP this thread runs, this one replaces it
  // there without being built, walked through the link and looked up again:
  // the requester then takes one ACK for the burst and retires the same WQEs,
  // with the same statuses and in the same order, once instead of once per
  // packet. Anything the responder sent in between (a NAK, an RNR NAK, a
  // response, a request) is behind it in the inbox, so the ACK is not last
  // and goes the usual way (transmit_plain_ack_locked), keeping its place.
  DirectState& d = direct;
  // A fault rule decides on every packet sent (fabric::FaultyLink): none is folded.
  if (d.depth == 0 || d.size <= d.taken || !d.scope || trace::on() || device().packet_filter().active()) return false;
  Stashed& last = inbox[d.size - 1];  // d.size > 0: the inbox is there
  // Only this responder's own plain ACK, of the same connection (same
  // requester QP, same opcode), for an earlier PSN, is replaced.
  if (last.acker != this || last.view.bth.opcode != opcode || !plain_ack(last.view)) return false;
  // The headers transmit_locked would send, as as_received makes them.
  Bth bth;
  bth.opcode = opcode;
  bth.dest_qp = attr_.dest_qp_num;
  bth.psn = psn;
  bth.migreq = migreq_locked();
  bth = as_received(bth, 0);
  if (last.view.bth.dest_qp != bth.dest_qp || !psn_gt(bth.psn, last.view.bth.psn)) return false;
  last.view.bth = bth;
  last.view.aeth = as_received(aeth);
  last.view.ip = direct_ip(attr_.ah_attr.is_global ? attr_.ah_attr.grh.traffic_class : 0);
  // Counted as sent and received, as the packet it stands for would have
  // been, when the entry is taken (drain_direct_locked): once per burst,
  // before the completions it retires are made.
  if (last.folded++ == 0) last.acker_dev = &device();
  return true;
}

void Qp::transmit_plain_ack_locked(PacketHeaders& h) {
  // Not folded (fold_plain_ack_locked): sent, and the inbox entry it may
  // become marked as this QP's, so that its next plain ACK may replace it.
  DirectState& d = direct;
  d.acking = this;
  d.acking_psn = h.bth.psn & 0xFFFFFF;
  transmit_locked(h, {});
  direct.acking = nullptr;
}

bool Qp::try_receive(const PacketView& pkt, in_addr src, QpPin& pin) {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  device().count_direct_rx(pkt);
  DirectState& d = direct;
  if (std::exchange(d.opening, false)) {
    // The first packet of a sender's burst: the session keeps this QP locked
    // and pinned for the next ones (transmit_direct_locked).
    d.session_to = this;
    d.session_pin = pin.keep();
    d.session_src = src;
    lock.release();
  }
  receive_locked(pkt, src, in_addr{});
  return true;
}

void Qp::end_direct_session_locked() {
  DirectState& d = direct;
  if (d.session_from != this) return;
  d.session_from = nullptr;
  if (Qp* to = std::exchange(d.session_to, nullptr)) {
    if (const uint64_t n = std::exchange(d.session_packets, 0)) {
      const uint64_t bytes = std::exchange(d.session_bytes, 0);
      fabric::count_tx_total(device().counters(), n, bytes);
      to->device().count_direct_rx_total(n, bytes);
    }
    to->mu_.unlock();
    QpPin::unpin(std::exchange(d.session_pin, nullptr));
  }
}

bool Qp::transmit_direct_locked(in_addr dest, const PacketHeaders& h,
                                std::span<const std::span<const uint8_t>> payload, uint8_t tos) {
  // The in-process fast path (fabric::Link::send_direct): the receiver gets
  // what parsing the packet would give, with the payload straight from the
  // sender's memory, so the packet is neither built nor parsed and the payload
  // is copied once, into the receiver's memory. PSNs, acknowledgements and
  // every check are the packet's own: only the bytes are missing.
  // Nested (a receiver's answer while a direct delivery runs): only to the QP
  // in scope, whose inbox takes it.
  DirectState& d = direct;
  if (d.depth > 0 && !(d.scope && h.bth.dest_qp == d.scope->qpn())) return false;
  Device& dev = device();
  // The session this QP's burst opened goes on with a packet to the same QP;
  // any other packet of this QP ends it (it goes elsewhere or the usual way).
  Qp* const to = d.session_from == this ? d.session_to : nullptr;
  // A fault rule decides on each packet in the link (fabric::FaultyLink), so
  // while one is loaded no session is opened or gone on with.
  const bool no_rules = !dev.packet_filter().active();
  const bool in_session = to && d.depth == 0 && dest.s_addr == d.session_dest.s_addr && h.bth.dest_qp == to->qpn() &&
                          no_rules && d.session_packets + 1 < kSessionPackets && dev.port_active() &&
                          to->device().port_active();
  if (!in_session && d.depth == 0) end_direct_session_locked();
  // A packet whose payload is one piece goes straight to send_direct, which
  // refuses whatever direct_ok would (fabric::Link::send_direct): asking
  // first walked the link's layers twice per packet. A gathered payload is
  // asked about first, not to copy it for nothing.
  if (!in_session && payload.size() > 1 && !dev.direct_ok(dest)) return false;
  size_t len = 0;
  for (const auto& p : payload) len += p.size();
  std::span<const uint8_t> bytes;
  if (payload.size() == 1) {
    bytes = payload[0];
  } else if (payload.size() > 1) {
    static thread_local std::vector<uint8_t> gathered;  // a payload spread over several SGEs
    gathered.resize(len);
    size_t at = 0;
    for (const auto& p : payload) {
      if (!p.empty()) std::memcpy(gathered.data() + at, p.data(), p.size());
      at += p.size();
    }
    bytes = std::span<const uint8_t>(gathered.data(), len);
  }
  PacketView& view = tx_view_;
  // Refused, it is built by the caller, which ends a session first (Qp::transmit_to_locked).
  if (!as_received(h, bytes, view)) return false;
  view.ip = direct_ip(tos);
  if (in_session) {
    // Counted as TapLink::send_direct and Qp::try_receive count it, when the
    // session ends (end_direct_session_locked): before the call that sent it
    // returns, but not before the receiver may complete it.
    ++d.session_packets;
    d.session_bytes += packet_size(view.bth.opcode, view.payload.size());
    const Nested nested(d);
    to->receive_locked(view, d.session_src, in_addr{});
    return true;
  }
  // A session is opened only by the thread's scope QP at the top level: its
  // scope, or its send loop, ends it (requester_locked).
  d.opening = d.depth == 0 && d.scope == this && no_rules;
  if (d.opening) d.session_from = this;
  bool done;
  {
    const Nested nested(d);
    done = dev.transmit_direct(dest, view);
  }
  d.opening = false;
  if (d.session_from == this) {
    if (d.session_to)
      d.session_dest = dest;
    else
      d.session_from = nullptr;  // the receiver was not reached, or was the scope's inbox
  }
  return done;
}

}  // namespace softverbs::emu

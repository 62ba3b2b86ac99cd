// The IB connection manager's protocol in the emulated CM (IBTA Vol1 ch.12;
// docs/rdma-cm.md "The wire"): CM MADs in GMPs to QP1, their retransmission
// on the CM response timeout (MRA extends it), the passive and active state
// machines for REQ/REP/RTU/REJ/DREQ/DREP and SIDR, duplicate and stale REQs,
// and time-wait. What arrives from the wire is checked before it is believed:
// a MAD that is not a well-formed CM MAD for a connection of ours is dropped
// and counted (EmuCm::stats()).
#include <arpa/inet.h>

#include <cstring>

#include "core/env.hpp"
#include "core/log.hpp"
#include "core/trace.hpp"
#include "emu/cm/cm.hpp"
#include "emu/objects/objects.hpp"
#include "wire/opcode.hpp"

namespace softverbs::emu {

using cm::Conn;
using cm::ConnState;
using cm::Event;
using cm::Id;
using cm::IdState;
namespace w = wire::cm;
using cm::gid_of;

namespace {

// The trace's record of a connection's timer (core/trace.hpp): the MAD retry
// timer, or the time-wait that ends the connection.
void trace_cm_timer(const Conn& c, std::string_view what, Clock::duration in = {}) {
  if (!trace::on()) return;
  trace::timer(c.device->clock(), c.device->name(), 0, c.state == ConnState::kTimewait ? "cm_timewait" : "cm_retry",
               what, std::chrono::duration_cast<std::chrono::nanoseconds>(in).count());
}

// IBTA's 4.096 us * 2^t, in Linux's rounding (cm_convert_to_ms).
Clock::duration cm_time(uint8_t t) { return std::chrono::milliseconds(1ull << (t > 8 ? t - 8 : 0)); }

template <class T>
T* as(w::Message& m) {
  return std::get_if<T>(&m);
}

}  // namespace

uint8_t EmuCm::response_timeout() {
  static const uint8_t t = [] {
    const char* v = env::cm_response_timeout();
    if (!v || !*v) return uint8_t{20};
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end || n < 0 || n > 31) {
      SV_LOG(kError, "SOFTVERBS_CM_RESPONSE_TIMEOUT=%s: expected 0..31; using 20", v);
      return uint8_t{20};
    }
    return static_cast<uint8_t>(n);
  }();
  return t;
}

int EmuCm::max_retries() {
  static const int n = [] {
    const char* v = env::cm_max_retries();
    if (!v || !*v) return 15;
    char* end = nullptr;
    long r = std::strtol(v, &end, 10);
    if (*end || r < 0 || r > 15) {
      SV_LOG(kError, "SOFTVERBS_CM_MAX_RETRIES=%s: expected 0..15; using 15", v);
      return 15;
    }
    return static_cast<int>(r);
  }();
  return n;
}

// Linux resends after 2 packet lifetimes plus the response timeout; with
// the path's lifetime two steps below the timeout that is 1.5 response times.
Clock::duration EmuCm::retry_interval() { return cm_time(response_timeout()) * 3 / 2; }

// ---------------------------------------------------------------------------
// Sending

std::shared_ptr<Conn> EmuCm::new_conn(Id* id, Device* dev, in_addr peer) {
  auto c = std::make_shared<Conn>();
  c->id = id;
  c->device = dev;
  c->peer = peer;
  c->local_comm_id = next_comm_id();
  while (conns_.count(c->local_comm_id) || c->local_comm_id == 0) c->local_comm_id = next_comm_id();
  c->tid = (static_cast<uint64_t>(getpid()) << 32) | c->local_comm_id;
  conns_[c->local_comm_id] = c;
  return c;
}

void EmuCm::send_mad_to(Device& dev, in_addr peer, const w::MadHeader& hdr, const w::Message& msg) {
  std::array<uint8_t, w::kMadSize> mad{};
  w::encode(hdr, msg, mad);
  std::array<uint8_t, w::kGmpPacketSize> pkt{};
  wire::IcrcFlow flow{dev.flow(dev.addr(), peer)};
  size_t n = w::build_gmp(mad, gmp_psn_++ & 0xFFFFFF, pkt, &flow);
  stats_.tx.fetch_add(1, std::memory_order_relaxed);
  SV_LOG(kDebug, "cm: %s: %s to %s", dev.name().c_str(), std::string(w::to_string(w::attr_of(msg))).c_str(),
         inet_ntoa(peer));
  dev.transmit(peer, std::span<const uint8_t>(pkt.data(), n));
}

void EmuCm::send_mad(Conn& c, const w::MadHeader& hdr, const w::Message& msg, bool expect_reply) {
  if (expect_reply) {
    w::encode(hdr, msg, c.last_mad);
    c.has_last_mad = true;
    c.retries_left = max_retries();
    c.retry_interval = retry_interval();
  }
  send_mad_to(*c.device, c.peer, hdr, msg);
}

void EmuCm::arm_retry(const std::shared_ptr<Conn>& c) {
  uint64_t gen = ++c->timer_generation;
  std::weak_ptr<Conn> wc = c;
  trace_cm_timer(*c, "armed", c->retry_interval);
  c->device->scheduler().after(c->retry_interval, [this, wc, gen] { on_retry_timer(wc, gen); });
}

void EmuCm::cancel_retry(Conn& c) {
  if (c.has_last_mad) trace_cm_timer(c, "cancelled");
  c.timer_generation++;
  c.has_last_mad = false;
}

void EmuCm::on_retry_timer(const std::weak_ptr<Conn>& wc, uint64_t generation) {
  Lock lock(mu_);
  std::shared_ptr<Conn> c = wc.lock();
  if (!c || c->timer_generation != generation) return;
  trace_cm_timer(*c, "fired");
  if (c->state == ConnState::kTimewait) {
    // Time-wait is over: the connection's numbers may be used again.
    Id* id = c->id;
    end_conn(*c);
    if (id && id->conn == c) {
      id->conn.reset();
      post_event(new_event(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0));
    }
    return;
  }
  if (!c->has_last_mad) return;
  // The loopback service passes over a device that left its REQ unanswered for one
  // retry interval when other devices remain to try: a device whose process runs the
  // CM answers at once (REP, MRA, or REJ without a listener), while one whose process
  // does not drops MADs to QP1 unanswered, and all retries would take minutes.
  const bool next_device = c->state == ConnState::kReqSent && c->id && !c->id->candidates.empty();
  if (c->retries_left > 0 && !next_device) {
    c->retries_left--;
    stats_.retransmitted.fetch_add(1, std::memory_order_relaxed);
    std::array<uint8_t, w::kGmpPacketSize> pkt{};
    wire::IcrcFlow flow{c->device->flow(c->device->addr(), c->peer)};
    size_t n = w::build_gmp(c->last_mad, gmp_psn_++ & 0xFFFFFF, pkt, &flow);
    c->device->transmit(c->peer, std::span<const uint8_t>(pkt.data(), n));
    c->retry_interval = retry_interval();
    arm_retry(c);
    return;
  }
  // Out of retries: what the IB CM reports for each message (Linux's
  // cm_process_send_error), and what rdma_cm makes of it.
  c->has_last_mad = false;
  Id* id = c->id;
  switch (c->state) {
    case ConnState::kReqSent:
    case ConnState::kMraReqRcvd:
      end_conn(*c);
      if (id && next_candidate(id)) return;
      if (id) connection_failed(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, nullptr, 0);
      break;
    case ConnState::kRepSent:
    case ConnState::kMraRepRcvd:
    case ConnState::kSidrReqSent:
      end_conn(*c);
      if (id) connection_failed(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT, nullptr, 0);
      break;
    case ConnState::kDreqSent:
      // No DREP: the connection is over anyway (DISCONNECTED, then time-wait).
      enter_timewait(c);
      if (id) post_event(new_event(id, RDMA_CM_EVENT_DISCONNECTED, 0));
      break;
    default:
      break;
  }
}

void EmuCm::enter_timewait(const std::shared_ptr<Conn>& c) {
  c->state = ConnState::kTimewait;
  c->has_last_mad = false;
  uint64_t gen = ++c->timer_generation;
  std::weak_ptr<Conn> wc = c;
  trace_cm_timer(*c, "armed", cm_time(response_timeout()));
  c->device->scheduler().after(cm_time(response_timeout()), [this, wc, gen] { on_retry_timer(wc, gen); });
}

void EmuCm::end_conn(Conn& c) {
  c.timer_generation++;
  c.has_last_mad = false;
  c.state = ConnState::kIdle;
  conns_.erase(c.local_comm_id);
}

std::shared_ptr<Conn> EmuCm::conn_by_local(uint32_t local_comm_id) {
  auto it = conns_.find(local_comm_id);
  return it == conns_.end() ? nullptr : it->second;
}

void EmuCm::send_rej_for(Device& dev, in_addr peer, uint64_t tid, uint32_t remote_comm_id, uint32_t local_comm_id,
                         w::MsgKind kind, w::RejReason reason, const void* data, uint8_t len) {
  w::MadHeader hdr;
  hdr.tid = tid;
  w::Rej rej;
  rej.local_comm_id = local_comm_id;
  rej.remote_comm_id = remote_comm_id;
  rej.message_rejected = kind;
  rej.reason = reason;
  if (data && len) std::memcpy(rej.private_data.data(), data, std::min<size_t>(len, w::kRejPrivate));
  send_mad_to(dev, peer, hdr, rej);
}

void EmuCm::send_dreq(const std::shared_ptr<Conn>& c) {
  w::MadHeader hdr;
  hdr.tid = c->tid;
  w::Dreq dreq;
  dreq.local_comm_id = c->local_comm_id;
  dreq.remote_comm_id = c->remote_comm_id;
  dreq.remote_qpn = c->remote_qpn;
  c->state = ConnState::kDreqSent;
  send_mad(*c, hdr, dreq, true);
  arm_retry(c);
}

void EmuCm::send_drep(Conn& c) {
  w::MadHeader hdr;
  hdr.tid = c.tid;
  w::Drep drep;
  drep.local_comm_id = c.local_comm_id;
  drep.remote_comm_id = c.remote_comm_id;
  send_mad_to(*c.device, c.peer, hdr, drep);
}

// A connection attempt of `id` failed: the event, and the QP to the error state
// for a rejection (librdmacm does that on REJECTED).
void EmuCm::connection_failed(Id* id, rdma_cm_event_type type, int status, const void* data, size_t len) {
  if (id->conn && id->conn->state == ConnState::kIdle) id->conn.reset();
  Event* ev = new_event(id, type, status);
  if (data && len) {
    len = std::min(len, ev->private_data.size());
    std::memcpy(ev->private_data.data(), data, len);
    if (id->pub.qp_type == IBV_QPT_UD) {
      ev->pub.param.ud.private_data = ev->private_data.data();
      ev->pub.param.ud.private_data_len = static_cast<uint8_t>(len);
    } else {
      ev->pub.param.conn.private_data = ev->private_data.data();
      ev->pub.param.conn.private_data_len = static_cast<uint8_t>(len);
    }
  }
  if (type == RDMA_CM_EVENT_REJECTED) move_qp_to_err(id);
  post_event(ev);
}

// ---------------------------------------------------------------------------
// Receiving

void EmuCm::receive_gsi(Device& dev, in_addr src, const wire::PacketView& pkt) {
  stats_.rx.fetch_add(1, std::memory_order_relaxed);
  // QP1 takes UD datagrams with the GSI Q_Key only (IBTA 9.6.1.1, Q_Key check).
  if (pkt.bth.opcode != wire::opcode::ud_send_only || pkt.deth.qkey != w::kGsiQkey || pkt.payload.size() < w::kMadSize) {
    stats_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  w::MadHeader hdr;
  w::Message msg;
  w::MadError err = w::decode(pkt.payload.first(w::kMadSize), hdr, msg);
  if (err != w::MadError::ok) {
    stats_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
    SV_LOG(kDebug, "cm: %s: dropped MAD from %s: %s", dev.name().c_str(), inet_ntoa(src),
           std::string(w::to_string(err)).c_str());
    return;
  }
  SV_LOG(kDebug, "cm: %s: %s from %s", dev.name().c_str(), std::string(w::to_string(hdr.attr_id)).c_str(),
         inet_ntoa(src));
  Lock lock(mu_);
  if (auto* m = as<w::Req>(msg)) return on_req(dev, src, hdr, *m);
  if (auto* m = as<w::Mra>(msg)) return on_mra(src, *m);
  if (auto* m = as<w::Rej>(msg)) return on_rej(src, *m);
  if (auto* m = as<w::Rep>(msg)) return on_rep(src, hdr, *m);
  if (auto* m = as<w::Rtu>(msg)) return on_rtu(src, *m);
  if (auto* m = as<w::Dreq>(msg)) return on_dreq(dev, src, hdr, *m);
  if (auto* m = as<w::Drep>(msg)) return on_drep(src, *m);
  if (auto* m = as<w::SidrReq>(msg)) return on_sidr_req(dev, src, hdr, *m);
  if (auto* m = as<w::SidrRep>(msg)) return on_sidr_rep(src, *m);
}

// As if this side's application had rejected it: REJ to a REQ, a rejecting
// SIDR_REP to a SIDR_REQ. The MAD itself is not taken.
bool EmuCm::reject_gsi(Device& dev, in_addr src, const wire::PacketView& pkt, uint16_t reason) {
  if (pkt.bth.opcode != wire::opcode::ud_send_only || pkt.payload.size() < w::kMadSize) return false;
  w::MadHeader hdr;
  w::Message msg;
  if (w::decode(pkt.payload.first(w::kMadSize), hdr, msg) != w::MadError::ok) return false;
  Lock lock(mu_);
  if (auto* req = as<w::Req>(msg)) {
    send_rej_for(dev, src, hdr.tid, req->local_comm_id, 0, w::MsgKind::kReq, static_cast<w::RejReason>(reason),
                 nullptr, 0);
    return true;
  }
  if (auto* sreq = as<w::SidrReq>(msg)) {
    w::MadHeader h;
    h.tid = hdr.tid;
    w::SidrRep rep;
    rep.request_id = sreq->request_id;
    rep.status = w::SidrStatus::kRejected;
    rep.service_id = sreq->service_id;
    send_mad_to(dev, src, h, rep);
    return true;
  }
  return false;
}

// Linux's rdma_cm reports a bonding failover of an id's netdev as
// RDMA_CM_EVENT_ADDR_CHANGE (cma_netdev_callback); connections stay.
void EmuCm::link_failed_over(Device& dev) {
  Lock lock(mu_);
  for (auto& [pub, id] : ids_) {
    if (!id->dev || id->dev->device != &dev) continue;
    if (id->state == IdState::kDestroying || id->state == IdState::kIdle || id->state == IdState::kDeviceRemoval) continue;
    post_event(new_event(id, RDMA_CM_EVENT_ADDR_CHANGE, 0));
  }
}

void EmuCm::device_failed(Device& dev) {
  Lock lock(mu_);
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn& c = *it->second;
    ++it;
    if (c.device == &dev) {
      if (c.id && c.id->conn.get() == &c) c.id->conn.reset();
      end_conn(c);
    }
  }
  fail_joins(dev);
  for (auto& [pub, id] : ids_) {
    if (!id->dev || id->dev->device != &dev || id->state == IdState::kDestroying) continue;
    id->state = IdState::kDeviceRemoval;
    post_event(new_event(id, RDMA_CM_EVENT_DEVICE_REMOVAL, 0));
  }
}

// The other side of a connection of ours: a MAD that names a comm ID we did
// not hand out, another remote comm ID than the peer's, or that comes from
// another address than the peer's, is dropped. ib_cm matches by comm IDs
// alone; the address check keeps a stranger who guesses a comm ID (they are
// handed out in sequence) from ending or answering someone else's connection.
std::shared_ptr<Conn> EmuCm::conn_for(in_addr src, uint32_t local_comm_id, uint32_t remote_comm_id) {
  std::shared_ptr<Conn> c = conn_by_local(local_comm_id);
  if (!c || c->peer.s_addr != src.s_addr ||
      (c->remote_comm_id && remote_comm_id && c->remote_comm_id != remote_comm_id)) {
    stats_.rx_unmatched.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  return c;
}

void EmuCm::on_mra(in_addr src, const w::Mra& mra) {
  std::shared_ptr<Conn> c = conn_for(src, mra.remote_comm_id, mra.local_comm_id);
  if (!c) return;
  if (c->state == ConnState::kReqSent && mra.message_mraed == w::MsgKind::kReq) {
    c->state = ConnState::kMraReqRcvd;
  } else if (c->state == ConnState::kRepSent && mra.message_mraed == w::MsgKind::kRep) {
    c->state = ConnState::kMraRepRcvd;
  } else {
    return;
  }
  c->remote_comm_id = mra.local_comm_id;
  // The peer needs longer: wait its service timeout before resending.
  c->retry_interval = cm_time(mra.service_timeout) + retry_interval();
  arm_retry(c);
}

void EmuCm::on_rej(in_addr src, const w::Rej& rej) {
  std::shared_ptr<Conn> c;
  if (rej.remote_comm_id == 0) {
    // A requester that gives up before it learned our comm ID (its id was
    // destroyed during the REQ) names only its own: the connection is the
    // one that peer's comm ID and address belong to (ib_cm finds it by the
    // remote comm ID and the CA GUID in the REJ's ARI).
    for (auto& [local, conn] : conns_)
      if (conn->passive && conn->remote_comm_id == rej.local_comm_id && conn->peer.s_addr == src.s_addr) c = conn;
    if (!c) stats_.rx_unmatched.fetch_add(1, std::memory_order_relaxed);
  } else {
    c = conn_for(src, rej.remote_comm_id, rej.local_comm_id);
  }
  if (!c) return;
  Id* id = c->id;
  int reason = static_cast<int>(rej.reason);
  switch (c->state) {
    case ConnState::kReqSent:
    case ConnState::kMraReqRcvd:
      end_conn(*c);
      // The loopback service: a device without the listener says so; the next is asked.
      if (id && rej.reason == w::RejReason::kInvalidServiceId && next_candidate(id)) return;
      if (id) connection_failed(id, RDMA_CM_EVENT_REJECTED, reason, rej.private_data.data(), w::kRejPrivate);
      return;
    case ConnState::kReqRcvd:
    case ConnState::kMraReqSent:
    case ConnState::kRepSent:
    case ConnState::kMraRepRcvd:
    case ConnState::kRepRcvd:
      end_conn(*c);
      if (id) connection_failed(id, RDMA_CM_EVENT_REJECTED, reason, rej.private_data.data(), w::kRejPrivate);
      return;
    default:
      return;
  }
}

void EmuCm::on_rtu(in_addr src, const w::Rtu& rtu) {
  std::shared_ptr<Conn> c = conn_for(src, rtu.remote_comm_id, rtu.local_comm_id);
  if (!c || (c->state != ConnState::kRepSent && c->state != ConnState::kMraRepRcvd)) return;
  cancel_retry(*c);
  c->state = ConnState::kEstablished;
  if (Id* id = c->id) {
    Event* ev = new_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
    std::memcpy(ev->private_data.data(), rtu.private_data.data(), w::kRtuPrivate);
    fill_conn_param(ev, c->rep.initiator_depth, c->rep.responder_resources, *c);
    ev->pub.param.conn.private_data_len = static_cast<uint8_t>(w::kRtuPrivate);
    post_event(ev);
  }
}

void EmuCm::on_dreq(Device& dev, in_addr src, const w::MadHeader& hdr, const w::Dreq& dreq) {
  std::shared_ptr<Conn> c = conn_for(src, dreq.remote_comm_id, dreq.local_comm_id);
  if (!c) {
    // An unknown connection's DREQ is answered, so that its sender stops (Linux: cm_issue_drep).
    w::Drep drep;
    drep.local_comm_id = dreq.remote_comm_id;
    drep.remote_comm_id = dreq.local_comm_id;
    w::MadHeader h;
    h.tid = hdr.tid;
    send_mad_to(dev, src, h, drep);
    return;
  }
  Id* id = c->id;
  switch (c->state) {
    case ConnState::kEstablished:
    case ConnState::kRepSent:
    case ConnState::kMraRepRcvd:
    case ConnState::kRepRcvd:
      cancel_retry(*c);
      c->tid = hdr.tid;
      if (!id) {
        send_drep(*c);
        enter_timewait(c);
        return;
      }
      c->state = ConnState::kDreqRcvd;
      post_event(new_event(id, RDMA_CM_EVENT_DISCONNECTED, 0));
      return;
    case ConnState::kDreqSent:
      // Both sides disconnect at once: each answers the other.
      c->tid = hdr.tid;
      send_drep(*c);
      enter_timewait(c);
      if (id) post_event(new_event(id, RDMA_CM_EVENT_DISCONNECTED, 0));
      return;
    case ConnState::kTimewait:
    case ConnState::kDreqRcvd:
      if (c->state == ConnState::kTimewait) send_drep(*c);  // a lost DREP: answered again
      return;
    default:
      return;
  }
}

void EmuCm::on_drep(in_addr src, const w::Drep& drep) {
  std::shared_ptr<Conn> c = conn_for(src, drep.remote_comm_id, drep.local_comm_id);
  if (!c || c->state != ConnState::kDreqSent) return;
  Id* id = c->id;
  enter_timewait(c);
  if (id) post_event(new_event(id, RDMA_CM_EVENT_DISCONNECTED, 0));
}

// The parameters of a CONNECT_REQUEST, CONNECT_RESPONSE or ESTABLISHED event:
// the peer's responder resources are our initiator depth and vice versa.
void EmuCm::fill_conn_param(Event* ev, uint8_t responder_resources, uint8_t initiator_depth, const Conn& c) {
  rdma_conn_param& p = ev->pub.param.conn;
  p.private_data = ev->private_data.data();
  p.responder_resources = responder_resources;
  p.initiator_depth = initiator_depth;
  if (c.passive) {
    p.flow_control = c.req.end_to_end_flow_control;
    p.retry_count = c.req.retry_count;
    p.rnr_retry_count = c.req.rnr_retry_count;
    p.srq = c.req.srq;
    p.qp_num = c.req.local_qpn;
  } else {
    p.flow_control = c.rep.end_to_end_flow_control;
    p.rnr_retry_count = c.rep.rnr_retry_count;
    p.srq = c.rep.srq;
    p.qp_num = c.rep.local_qpn;
  }
}

}  // namespace softverbs::emu

// The requester: turns send work requests into request packets (IBTA 9.7.4,
// 9.4): segmentation by path MTU, PSN assignment, the window of unacknowledged
// packets, max_rd_atomic, fences, and retransmission from a PSN.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "emu/device/caps.hpp"
#include "emu/device/identity.hpp"
#include "emu/device/personality.hpp"
#include "emu/qp/qp.hpp"
#include "emu/memory/sge.hpp"
#include "emu/memory/window.hpp"
#include "emu/objects/objects.hpp"
#include "fabric/faulty_link.hpp"
#include "fabric/timer.hpp"
#include "core/log.hpp"
#include "core/trace.hpp"
#include "wire/psn.hpp"

namespace softverbs::emu {
namespace {

using namespace wire;

// Packets in flight per QP before the requester waits for acknowledgements. It
// bounds what one QP can put into a receiver's socket buffer.
constexpr uint32_t kWindow = 64;
// A request asks for an acknowledgement at least this often, so the window keeps
// moving within long messages.
constexpr uint32_t kAckEvery = 16;
// Large RDMA READs are requested in pieces of at most this many response
// packets, so the responder's burst is bounded by the window too.
constexpr uint32_t kReadChunkPackets = 32;
// Floor of the local ACK timeout: software on a loaded host cannot answer within
// microseconds, so shorter timeouts would only cause spurious retransmissions.
constexpr auto kMinAckTimeout = std::chrono::milliseconds(1);
// Answers in the direct-delivery inbox (direct.cpp) that make the requester
// take them before it sends on.
constexpr size_t kInboxBurst = 8;

}  // namespace

void Qp::transmit_locked(PacketHeaders& h, std::span<const std::span<const uint8_t>> payload) {
  // Every packet of a connection says where the sender's path migration state
  // machine is (IBTA 9.2.3 MigReq; path_migration.cpp), and requests and
  // responses alike carry the path's traffic class. Set in the caller's
  // headers, not in a copy: they are built for this one packet.
  h.bth.migreq = migreq_locked();
  const uint8_t tclass = attr_.ah_attr.is_global ? attr_.ah_attr.grh.traffic_class : 0;
  transmit_to_locked(dest_addr_, h, payload, tclass);
}

void Qp::transmit_to_locked(in_addr dest, const PacketHeaders& h, std::span<const std::span<const uint8_t>> payload,
                            uint8_t tos) {
  Device& dev = device();
  // Each packet is decided once by the fault rules, on whichever way it goes.
  if (dev.packet_filter().active()) fabric::FaultyLink::new_packet();
  if (h.bth.dest_qp != wire::kMulticastQpn) {
    if (transmit_direct_locked(dest, h, payload, tos)) return;
    // To a device of another process of this host whose ring takes packets
    // without their ICRC, with nothing on the way that needs the packet's
    // bytes (fabric::Link::send_gathered): only the headers are encoded, and
    // the payload is copied once, from this memory into the ring's record.
    uint8_t headers[kMaxHeaderBytes];
    GatheredPacket gathered;
    if (gather(h, payload, headers, gathered) && dev.transmit_gathered(dest, gathered, tos)) return;
  }
  // Built, it goes the usual way: a direct session this QP has open ends first,
  // so that none of its later packets overtakes this one.
  end_direct_session_locked();
  // Declared after the fast paths, which do not need it: a thread-local with
  // a constructor costs a lookup and a guard check where it is declared.
  static thread_local std::vector<uint8_t> buf(kMaxUdpPayload);
  // To a device of this process, with no capture to show it, the ICRC is not
  // computed (fabric::Link::needs_icrc); the multicast QPN always gets one,
  // as its receivers find the group by it.
  const bool icrc = h.bth.dest_qp == wire::kMulticastQpn || dev.needs_icrc(dest);
  const IcrcFlow flow{icrc ? dev.flow(dev.addr(), dest) : wire::Ipv4Flow{}};
  size_t n = build(h, payload, buf, icrc ? &flow : nullptr);
  if (n) dev.transmit(dest, std::span<const uint8_t>(buf.data(), n), tos, icrc);
}

bool resolve_av(const Device& dev, const ibv_ah_attr& av, in_addr* out) {
  if (av.is_global) {
    const uint8_t* g = av.grh.dgid.raw;
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(g, v4mapped, 12) == 0) {
      std::memcpy(&out->s_addr, g + 12, 4);
      return true;
    }
    // A device's IPv6 GID carries its IPv4 address, whose socket the packets
    // travel on (docs/wire.md §1).
    if (dev.link_layer() == LinkLayer::kEthernet && ipv4_in_ipv6(g, out)) return true;
    // The fe80::/64 GID of an emulated port: on InfiniBand its port GID, on RoCE
    // its link-local GID (entry 0, what ibv_rc_pingpong -g 0 and programs taking
    // the first GID use). A real RoCE device routes a link-local GID to the
    // neighbour owning its MAC; here the MAC, and so the GUID, carries the peer's
    // address, which reaches it as the IPv4-mapped GID does, in this process or
    // another. The packets still travel as RoCEv2 over IPv4.
    if (addr_of_port_gid(av.grh.dgid, out)) return true;
    if (dev.link_layer() == LinkLayer::kInfiniBand && g[0] == 0xfe && g[1] == 0x80) {
      // Any other fe80::/64 GID on InfiniBand: the GUID's address bytes, as
      // emulated IB ports have always been addressed.
      uint8_t b[4] = {g[10], g[13], g[14], g[15]};
      std::memcpy(&out->s_addr, b, 4);
      return true;
    }
    return false;  // other IPv6 destinations have no device
  }
  *out = dev.addr_of_lid(av.dlid);
  return true;
}

bool Qp::resolve_dest_locked() { return resolve_av(device(), attr_.ah_attr, &dest_addr_); }

void Qp::arm_timer_locked() {
  // Called right after packets went out (once per burst, requester_locked): the
  // high-water mark must include them, or a packet sent just after everything
  // before it was acknowledged gets no timer.
  if (psn_gt(req_.psn, req_.sent_end_psn)) req_.sent_end_psn = req_.psn;
  comp_.rearm = false;
  if (!timer_) return;
  if (comp_.unacked_psn == req_.sent_end_psn && !req_.rnr_waiting) {
    if (trace_ack_armed_) trace_timer_locked("ack_timeout", "cancelled");  // everything is acknowledged
    retx_.armed = false;
    // The timed packet is acknowledged with everything else: its round trip is
    // the one sample that costs a clock reading of its own, taken once the
    // connection has seen loss.
    if (retx_.probing() && retx_.lossy()) retx_.sample(device().clock().now());
    return;
  }
  auto now = device().clock().now();
  if (req_.rnr_waiting) {
    retx_.armed = false;
    timer_->arm_at(rnr_until_);
    return;
  }
  if (attr_.timeout == 0) return;  // 0: wait forever (IBTA 9.7.6.1.3)
  // 4.096 us * 2^timeout
  auto t = std::chrono::nanoseconds(static_cast<int64_t>(4096) << attr_.timeout);
  const Clock::duration timeout = std::max<Clock::duration>(t, kMinAckTimeout);
  deadline_ = now + timeout;
  arm_repair_locked(now, timeout);
  timer_->arm_at(next_timer_locked());
  if (!trace_ack_armed_ && trace::on()) trace_timer_locked("ack_timeout", "armed", deadline_ - now);
}

void Qp::trace_timer_locked(std::string_view which, std::string_view what, Clock::duration in) {
  if (which == "ack_timeout") trace_ack_armed_ = what == "armed";
  if (!trace::on()) return;
  trace::timer(device().clock(), device().name(), qpn(), which, what,
               std::chrono::duration_cast<std::chrono::nanoseconds>(in).count());
}

void Qp::requester_locked() {
  DirectScope scope(this);
  const ibv_qp_state s = attr_.qp_state;
  bool sent = false;
  if (s == IBV_QPS_RTS) {
    // Answers that came back directly are taken every few packets, between
    // two of them (the requester's state is whole there), so the inbox stays
    // small enough to stay in the cache: a burst of RDMA READ responses is a
    // window of MTU-sized copies.
    while (send_next_packet_locked()) {
      sent = true;
      drain_direct_locked(kInboxBurst);
    }
  } else if (s == IBV_QPS_SQD) {
    // Draining: finish the message under way, start none.
    while (req_.tx_offset > 0 && send_next_packet_locked()) sent = true;
  }
  // The burst is over: its receiver, held for it (direct.cpp), is let go
  // before the timer is armed.
  end_direct_session_locked();
  if (psn_gt(req_.psn, req_.sent_end_psn)) req_.sent_end_psn = req_.psn;
  // The local ACK timeout runs from the last packet sent or response taken
  // (comp_.rearm): armed once per burst, after the response that let it go
  // out, which is one clock read, not one per packet or response.
  if ((sent || comp_.rearm) && requester_reliable()) arm_timer_locked();
  // Answers that came back through the inbox meanwhile (direct deliveries).
  drain_direct_locked();
}

void Qp::send_read_request_locked(SendWqe& w, uint32_t psn, uint64_t offset) {
  const uint32_t mtu = mtu_bytes();
  uint64_t len = std::min<uint64_t>(w.total_length - offset, uint64_t{kReadChunkPackets} * mtu);
  PacketHeaders h;
  h.bth.opcode = service_opcode(opcode::rc_rdma_read_request);
  h.xrceth.srqn = w.remote_srqn;
  h.bth.dest_qp = attr_.dest_qp_num;
  h.bth.psn = psn;
  h.bth.ack_req = true;
  h.reth.va = w.remote_addr + offset;
  h.reth.rkey = w.rkey;
  h.reth.dma_len = static_cast<uint32_t>(len);
  transmit_locked(h, {});
  req_.psn = psn_add(psn, packets_for(len, mtu));
  req_.tx_offset = offset + len;
}

bool Qp::send_ud_locked() {
  // Unreliable datagram (IBTA 9.8.4): each SEND is one packet to the address and
  // QP its work request names, and is done once sent.
  SendWqe& w = sq_.at(req_.tx_index);
  const uint32_t mtu = 128u << device().active_mtu();
  if (w.total_length > mtu) {
    fail_send_locked(&w, IBV_WC_LOC_LEN_ERR);
    return false;
  }
  // Taken only to read registered memory: inline data was copied when posted.
  std::shared_lock mr_lock(device().mr_lock(), std::defer_lock);
  PacketHeaders h;
  const bool with_imm = w.opcode == IBV_WR_SEND_WITH_IMM;
  h.bth.opcode = with_imm ? opcode::ud_send_only_with_immediate : opcode::ud_send_only;
  h.bth.dest_qp = w.remote_qpn;
  h.bth.psn = req_.psn;
  h.bth.se = (w.send_flags & IBV_SEND_SOLICITED) != 0;
  // A Q_Key with the high-order bit set means the QP's own (IBTA 10.2.5).
  h.deth.qkey = (w.remote_qkey & 0x80000000u) ? attr_.qkey : w.remote_qkey;
  h.deth.src_qp = qpn();
  if (with_imm) h.imm.data = w.imm_data;
  std::vector<std::span<const uint8_t>>& payload = tx_payload_;  // as in send_data_packet_locked
  payload.clear();
  if (w.total_length) {
    if (w.is_inline) {
      payload.emplace_back(sq_.inline_at(req_.tx_index), w.total_length);
    } else {
      std::vector<std::span<uint8_t>>& spans = tx_spans_;
      mr_lock.lock();
      if (!resolve_sges(device(), pd_, sq_.sges_at(req_.tx_index), w.num_sge, 0, w.total_length, 0, spans)) {
        mr_lock.unlock();
        fail_send_locked(&w, personality().bad_lkey);  // an SGE no region covers
        return false;
      }
      for (auto& sp : spans) payload.emplace_back(sp.data(), sp.size());
    }
  }
  in_addr dest{};
  dest.s_addr = w.ud_dest;
  transmit_to_locked(dest, h, payload, w.ud_tclass);
  if (mr_lock.owns_lock()) mr_lock.unlock();
  req_.psn = psn_add(req_.psn, 1);
  w.started = w.acked = true;
  ++req_.tx_index;
  retire_acked_locked();
  return true;
}

bool Qp::send_next_packet_locked() {
  if (req_.rnr_waiting || req_.tx_index >= sq_.size()) return false;
  // A held local error (fail_local_locked): nothing is sent from its WQE on.
  if (req_.held_error != IBV_WC_SUCCESS && sq_.head_position() + req_.tx_index >= req_.held_error_pos) return false;
  SendWqe& w = sq_.at(req_.tx_index);
  if (!opcode_valid_for(type_, w.opcode)) {
    // An opcode the QP's service does not have (an RDMA READ on UC, an RDMA
    // WRITE on UD, ...) was posted, as ConnectX lets it be: it completes with a
    // local QP operation error and the QP goes to the error state, as there.
    fail_send_locked(&w, IBV_WC_LOC_QP_OP_ERR);
    return false;
  }
  if (type_ == IBV_QPT_UD) return send_ud_locked();
  const bool uc = type_ == IBV_QPT_UC;
  if (is_local_op(w.opcode)) return execute_local_locked(w);
  if (!uc && static_cast<uint32_t>(psn_diff(req_.psn, comp_.unacked_psn)) >= kWindow) return false;

  if (req_.tx_offset == 0 && !may_start_locked(w)) return false;
  // The region lock is taken only where a request reads registered memory
  // (send_data_packet_locked): inline data was copied when it was posted, and
  // a READ or atomic request carries none.
  std::shared_lock mr_lock(device().mr_lock(), std::defer_lock);
  switch (w.opcode) {
    case IBV_WR_RDMA_READ:
      send_read_request_locked(w, req_.psn, req_.tx_offset);
      if (req_.tx_offset >= w.total_length) {
        ++req_.tx_index;
        req_.tx_offset = 0;
      }
      return true;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      send_atomic_locked(w);
      return true;
    default:
      return send_data_packet_locked(w, mr_lock);
  }
}

bool Qp::execute_local_locked(SendWqe& w) {
  // A bind or local invalidation runs once everything posted before it has
  // completed, so that a window changes only after the operations before it are
  // done with it (a stronger fence than ConnectX's, which orders it only after
  // earlier reads and atomics). It sends nothing and is done at once.
  if (first_unacked_locked() < req_.tx_index) return false;
  bool ok;
  {
    std::unique_lock mr_lock(device().mr_lock());  // a binding changes only with no access under way
    if (w.opcode == IBV_WR_BIND_MW) {
      const ibv_mw_bind_info& b = w.bind_info;
      ok = bind_window(pd_, qpn(),
                       BindRequest{Mw::from(w.bind_mw), w.bind_rkey, b.mr ? Mr::from(b.mr) : nullptr, b.addr, b.length,
                                   b.mw_access_flags});
    } else {
      // The rkey to invalidate travels in the imm_data/invalidate_rkey union.
      ok = invalidate_window(device(), pd_, qpn(), w.imm_data, Invalidation::local);
    }
  }
  if (!ok) {
    // As rxe: a refused bind completes with MW_BIND_ERR, a refused local
    // invalidation with LOC_QP_OP_ERR; either moves the QP to the error state.
    fail_send_locked(&w, w.opcode == IBV_WR_BIND_MW ? IBV_WC_MW_BIND_ERR : IBV_WC_LOC_QP_OP_ERR);
    return false;
  }
  w.started = w.acked = true;
  ++req_.tx_index;
  req_.tx_offset = 0;
  retire_acked_locked();
  return true;
}

bool Qp::may_start_locked(SendWqe& w) {
  const bool uc = type_ == IBV_QPT_UC;
  // Only a fenced WQE or a read or atomic asks how many reads and atomics are
  // outstanding: a plain SEND or WRITE starts without the count.
  if (!uc && ((w.send_flags & IBV_SEND_FENCE) || is_read_or_atomic(w.opcode))) {
    // The reads and atomics sent and not yet answered: those between the first
    // unacknowledged WQE and this one (WQEs are acknowledged in order), counted
    // by the running counts of the two, not by a walk over the WQEs between.
    const uint32_t from = first_unacked_locked();
    const uint64_t reads = from < req_.tx_index ? rd_before_locked(req_.tx_index) - rd_before_locked(from) : 0;
    // IBV_SEND_FENCE waits for every earlier RDMA READ and atomic to finish.
    if (reads && (w.send_flags & IBV_SEND_FENCE)) return false;
    const uint32_t max_rd = std::max<uint32_t>(1, attr_.max_rd_atomic);
    if (is_read_or_atomic(w.opcode) && reads >= max_rd) return false;
  }
  if (w.total_length > personality().max_msg_sz) {
    fail_send_locked(&w, IBV_WC_LOC_LEN_ERR);
    return false;
  }
  if (!w.started) {
    // The PSNs of a request are fixed at its first transmission; a retry resends
    // the same ones.
    w.first_psn = req_.psn;
    const bool atomic = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
    w.last_psn = psn_add(w.first_psn, atomic ? 0 : packets_for(w.total_length, mtu_bytes()) - 1);
    w.started = true;
    if (w.trace_id && trace::on())
      trace::wr_started(device().clock(), device().name(), qpn(), w.trace_id, w.first_psn, w.last_psn,
                        attr_.dest_qp_num);
  }
  return true;
}

void Qp::send_atomic_locked(SendWqe& w) {
  PacketHeaders h;
  h.bth.dest_qp = attr_.dest_qp_num;
  h.bth.psn = req_.psn;
  h.bth.opcode = service_opcode(w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? opcode::rc_compare_swap : opcode::rc_fetch_add);
  h.xrceth.srqn = w.remote_srqn;
  h.bth.ack_req = true;
  h.atomic_eth.va = w.remote_addr;
  h.atomic_eth.rkey = w.rkey;
  h.atomic_eth.swap_add = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? w.swap : w.compare_add;
  h.atomic_eth.compare = w.compare_add;
  transmit_locked(h, {});
  req_.psn = psn_add(req_.psn, 1);
  ++req_.tx_index;
  req_.tx_offset = 0;
}

bool Qp::send_data_packet_locked(SendWqe& w, std::shared_lock<SpreadSharedMutex>& mr_lock) {
  // SEND and RDMA WRITE: one packet of up to one MTU of payload.
  const bool uc = type_ == IBV_QPT_UC;
  const uint32_t mtu = mtu_bytes();
  PacketHeaders h;
  h.bth.dest_qp = attr_.dest_qp_num;
  h.bth.psn = req_.psn;
  const bool is_write = w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  const uint64_t left = w.total_length - req_.tx_offset;
  const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(left, mtu));
  const bool first = req_.tx_offset == 0;
  const bool last = left <= mtu;
  const bool with_imm = w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  const bool with_inv = w.opcode == IBV_WR_SEND_WITH_INV;
  // The opcode from the wire table: the LAST or ONLY packet carries the
  // immediate data or the R_Key to invalidate.
  const Position position = first && last ? Position::only
                            : first       ? Position::first
                            : last        ? Position::last
                                          : Position::middle;
  const uint16_t extra = !last ? 0 : with_imm ? ext::imm : with_inv ? ext::ieth : 0;
  const Transport service = uc ? Transport::uc : type_ == IBV_QPT_XRC_SEND ? Transport::xrc : Transport::rc;
  h.bth.opcode = request_opcode(service, is_write ? OpClass::rdma_write : OpClass::send, position, extra);
  h.xrceth.srqn = w.remote_srqn;  // IBTA 9.5: every XRC request packet names the SRQ
  if (is_write && first) {
    h.reth.va = w.remote_addr;
    h.reth.rkey = w.rkey;
    h.reth.dma_len = static_cast<uint32_t>(w.total_length);
  }
  if (last && with_imm) h.imm.data = w.imm_data;
  if (last && with_inv) h.ieth.rkey = w.imm_data;  // the invalidate_rkey member of the union, host order
  if (last && (w.send_flags & IBV_SEND_SOLICITED) && (!is_write || with_imm)) h.bth.se = true;
  const uint32_t pkt_index = static_cast<uint32_t>(req_.tx_offset / mtu);
  h.bth.ack_req = !uc && (last || (pkt_index + 1) % kAckEvery == 0);

  // The payload, straight from the registered memory (or the inline copy). The
  // list is the QP's, as the spans are (tx_payload_), so that a packet
  // allocates nothing; the transmit has consumed it before the QP sends again.
  std::vector<std::span<const uint8_t>>& payload = tx_payload_;
  payload.clear();
  if (len) {
    if (w.is_inline) {
      payload.emplace_back(sq_.inline_at(req_.tx_index) + req_.tx_offset, len);
    } else {
      std::vector<std::span<uint8_t>>& spans = tx_spans_;
      mr_lock.lock();
      if (!resolve_sges(device(), pd_, sq_.sges_at(req_.tx_index), w.num_sge, req_.tx_offset, len, 0, spans)) {
        mr_lock.unlock();
        fail_local_locked(w, personality().bad_lkey);  // an SGE no region covers
        return false;
      }
      for (auto& s : spans) payload.emplace_back(s.data(), s.size());
    }
  }
  transmit_locked(h, payload);
  if (mr_lock.owns_lock()) mr_lock.unlock();
  req_.psn = psn_add(req_.psn, 1);
  req_.tx_offset += len;
  if (last) {
    ++req_.tx_index;
    req_.tx_offset = 0;
    if (uc) {
      // UC has no acknowledgements: the work request is done once sent.
      w.acked = true;
      comp_.unacked_psn = req_.psn;
      retire_acked_locked();
    }
  }
  return true;
}

void Qp::retransmit_from_locked(uint32_t psn) {
  // Go back N (IBTA 9.7.5.1.4): resend everything from the oldest packet the
  // responder has not acknowledged, never from before it. Also used to move
  // forward, when an acknowledgement covers packets a retry was about to resend.
  if (psn_lt(psn, comp_.unacked_psn)) psn = comp_.unacked_psn;
  for (uint32_t i = first_unacked_locked(); i < sq_.size(); ++i) {
    SendWqe& w = sq_.at(i);
    if (w.acked) continue;
    uint64_t offset = 0;
    if (w.started) {
      if (psn_gt(psn, w.last_psn)) continue;  // a read or atomic waiting for its response
      if (psn_lt(psn, w.first_psn)) psn = w.first_psn;
      offset = static_cast<uint64_t>(psn_diff(psn, w.first_psn)) * mtu_bytes();
      if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || offset >= w.total_length)
        offset = 0;
      if (offset == 0) psn = w.first_psn;
    }
    SV_LOG(kDebug, "qp 0x%06x: resume at psn %u: WQE %u (wr_id %lu, psns %u..%u%s), offset %lu", qpn(), psn, i,
           static_cast<unsigned long>(w.wr_id), w.first_psn, w.last_psn, w.started ? "" : " not started",
           static_cast<unsigned long>(offset));
    const bool back = psn_lt(psn, req_.psn);
    req_.tx_index = i;
    req_.tx_offset = offset;
    req_.psn = psn;
    if (back) {
      device().counters().retransmits.fetch_add(1, std::memory_order_relaxed);
      retx_.cancel_probe();  // Karn's rule: no round trip from a resent PSN
    }
    return;
  }
  // Every request is acknowledged up to psn: sending resumes after them.
  if (psn_gt(psn, req_.psn)) {
    req_.psn = psn;
    req_.tx_index = sq_.size();
    req_.tx_offset = 0;
  }
}

void Qp::on_timer() {
  // The ACK timer is not cancelled when everything is acknowledged (a heap entry
  // stays; see arm_timer_locked), so most expiries of an idle QP find nothing to
  // time. Those return here without draining the device: the drain (a blocking
  // receive lock and the socket reads) once per idle QP per timeout made the
  // progress thread's work grow with the number of QPs (docs/performance.md,
  // "Flat at scale").
  {
    std::lock_guard lock(mu_);
    const bool sending = attr_.qp_state == IBV_QPS_RTS || attr_.qp_state == IBV_QPS_SQD;
    if (!error_pending_ && sending && !req_.rnr_waiting) {
      if (comp_.unacked_psn == req_.sent_end_psn) {
        if (trace_ack_armed_) trace_timer_locked("ack_timeout", "cancelled");
        return;
      }
      // Nothing due: the deadlines moved on since the timer was armed (every
      // burst and response moves them, and the timer is only ever armed
      // earlier). Armed again, without draining the device either.
      if (attr_.timeout != 0) {
        const Clock::time_point next = next_timer_locked();
        if (device().clock().now() < next) {
          timer_->arm_at(next);
          return;
        }
      }
    }
  }
  // Responses may be waiting in this device's own receive queue, behind a backlog
  // the application has not drained: process them first, so that a response that
  // has arrived is never counted as a missing one (on a NIC, arrival and
  // processing are one). Without this, a slow receiver turns its own backlog into
  // retransmissions, which deepen the backlog.
  device().progress(true);
  std::lock_guard lock(mu_);
  if (error_pending_) {
    error_locked(error_event_);
    return;
  }
  if (attr_.qp_state != IBV_QPS_RTS && attr_.qp_state != IBV_QPS_SQD) return;
  auto now = device().clock().now();
  if (req_.rnr_waiting) {
    if (now < rnr_until_) {
      timer_->arm_at(rnr_until_);
      return;
    }
    req_.rnr_waiting = false;
    trace_timer_locked("rnr_wait", "fired");
    retransmit_from_locked(comp_.unacked_psn);
    requester_locked();
    arm_timer_locked();
    return;
  }
  if (comp_.unacked_psn == req_.sent_end_psn) {  // everything acknowledged meanwhile
    if (trace_ack_armed_) trace_timer_locked("ack_timeout", "cancelled");
    return;
  }
  if (attr_.timeout == 0) return;             // no local ACK timeout (a late timer of an earlier connection)
  if (now < deadline_) {
    if (retx_.armed && now >= retx_.repair_at) {
      repair_locked(now);  // adaptive retransmission (retransmit.cpp)
      return;
    }
    timer_->arm_at(next_timer_locked());
    return;
  }
  device().counters().timeouts.fetch_add(1, std::memory_order_relaxed);
  trace_timer_locked("ack_timeout", "fired");
  SV_LOG(kDebug, "qp 0x%06x: local ACK timeout, unacked psn %u, next psn %u, %u WQEs, retries left %u (%s)", qpn(),
         comp_.unacked_psn, req_.psn, sq_.size(), comp_.retry_left, device().rx_state().c_str());
  // A timeout counts against retry_cnt only when the peer has been silent: a peer
  // that sends packets (its own requests, duplicate ACKs) is reachable and only
  // slow, as an emulated device on a loaded host can be for a while. A NIC, which
  // answers in microseconds, cannot tell the two apart; this is a deliberate
  // deviation (docs/compatibility.md).
  const bool peer_alive = req_.heard_from_peer;
  req_.heard_from_peer = false;
  // Adaptive retransmission waits for the peer to answer again.
  retx_.answered = false;
  retx_.armed = false;
  retx_.loss_seen(now);
  comp_.gap_rewind_psn = 0xffffffff;  // a gap seen again after a timeout is asked for again
  if (peer_alive) {
    retransmit_from_locked(comp_.unacked_psn);
    requester_locked();
    arm_timer_locked();
    return;
  }
  if (comp_.retry_left > 0) {
    --comp_.retry_left;
  } else if (!migrate_on_path_failure_locked()) {
    // Transport retries exhausted (IBTA 9.7.6.1.3) with no armed alternate
    // path to migrate to (IBTA 17.2.8): the oldest outstanding work request
    // fails and the QP goes to the error state.
    fail_send_locked(nullptr, IBV_WC_RETRY_EXC_ERR);
    return;
  }
  // Else migrated: the resend below is the first try on the alternate path.
  retransmit_from_locked(comp_.unacked_psn);
  requester_locked();
  arm_timer_locked();
}

}  // namespace softverbs::emu

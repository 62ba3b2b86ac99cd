// The responder: checks each request in the order of IBTA 9.7.5 (PSN, opcode
// sequence, opcode valid for the QP, resources, length, R_Key), executes it and
// answers: ACK, NAK, RNR NAK, read responses, atomic responses.
#include <cstring>

#include "emu/device/caps.hpp"
#include "emu/memory/sge.hpp"
#include "emu/objects/objects.hpp"
#include "core/log.hpp"
#include "wire/psn.hpp"

namespace softverbs::emu {
namespace {

using namespace wire;

// Recently served reads and atomics kept to answer duplicates; at least the
// responder resources the QP advertises (max_dest_rd_atomic).
constexpr size_t kMinResources = 16;

}  // namespace

void Qp::send_ack_locked(Aeth aeth, uint32_t psn) {
  PacketHeaders h;
  h.bth.opcode = opcode::rc_acknowledge;
  h.bth.dest_qp = attr_.dest_qp_num;
  h.bth.psn = psn;
  h.aeth = aeth;
  transmit_locked(h, {});
}

bool Qp::take_recv_wqe_locked() {
  if (rcv_.active) return true;
  if (srq_) {
    std::lock_guard lock(srq_->mu);
    if (srq_->rq.empty()) return false;
    rcv_.wqe = srq_->rq.front();
    const Sge* s = srq_->rq.sges_at(0);
    rcv_.sges.assign(s, s + rcv_.wqe.num_sge);
    srq_->rq.pop();
    // IBTA 10.2.9.2: the limit event fires once when the queue drops below it.
    if (srq_->limit && srq_->rq.size() < srq_->limit) {
      srq_->limit = 0;
      ibv_async_event ev{};
      ev.element.srq = srq_->ibv();
      ev.event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
      context().post_async_event(ev);
    }
  } else {
    if (rq_.empty()) return false;
    rcv_.wqe = rq_.front();
    const Sge* s = rq_.sges_at(0);
    rcv_.sges.assign(s, s + rcv_.wqe.num_sge);
    rq_.pop();
  }
  rcv_.active = true;
  rcv_.offset = 0;
  return true;
}

void Qp::complete_recv_locked(ibv_wc_status status, ibv_wc_opcode opcode, uint32_t byte_len, bool with_imm,
                              uint32_t imm, bool with_inv, bool solicited) {
  ibv_wc wc{};
  wc.wr_id = rcv_.wqe.wr_id;
  wc.status = status;
  wc.opcode = opcode;
  wc.byte_len = byte_len;
  wc.qp_num = qpn();
  wc.src_qp = attr_.dest_qp_num;
  if (with_imm) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = imm;
  }
  if (with_inv) {
    wc.wc_flags |= IBV_WC_WITH_INV;
    wc.invalidated_rkey = imm;
  }
  if (device().link_layer() == LinkLayer::kInfiniBand) wc.slid = attr_.ah_attr.dlid;
  wc.sl = attr_.ah_attr.sl;
  rcv_.active = false;
  rcv_.offset = 0;
  push_completion_locked(recv_cq_, wc, solicited);
}

void Qp::responder_error_locked(NakCode code, ibv_wc_status recv_status, uint32_t psn) {
  if (type_ == IBV_QPT_RC) {
    device().counters().naks_sent.fetch_add(1, std::memory_order_relaxed);
    send_ack_locked(Aeth::nak(msn_, code), psn);
  }
  if (rcv_.active) complete_recv_locked(recv_status, IBV_WC_RECV, 0, false, 0, false, false);
  // The responder's QP reports the error as an affiliated asynchronous event and
  // goes to the error state (IBTA 10.8.3.3, 11.6.3).
  ibv_async_event ev{};
  ev.element.qp = ibv();
  ev.event_type = code == NakCode::remote_access_error ? IBV_EVENT_QP_ACCESS_ERR : IBV_EVENT_QP_REQ_ERR;
  context().post_async_event(ev);
  enter_error_locked();
}

void Qp::read_reply_locked(uint32_t psn, uint64_t va, uint32_t rkey, uint64_t len) {
  const uint32_t mtu = mtu_bytes();
  const uint32_t n = packets_for(len, mtu);
  std::shared_lock mr_lock(device().mr_lock());
  Mr* mr = len ? check_rkey(device(), pd_, attr_.qp_access_flags, rkey, va, len, IBV_ACCESS_REMOTE_READ) : nullptr;
  if (len && !mr) return;  // the region went away since the request was checked
  for (uint32_t i = 0; i < n; ++i) {
    PacketHeaders h;
    h.bth.dest_qp = attr_.dest_qp_num;
    h.bth.psn = psn_add(psn, i);
    if (n == 1) {
      h.bth.opcode = opcode::rc_rdma_read_response_only;
    } else if (i == 0) {
      h.bth.opcode = opcode::rc_rdma_read_response_first;
    } else if (i + 1 == n) {
      h.bth.opcode = opcode::rc_rdma_read_response_last;
    } else {
      h.bth.opcode = opcode::rc_rdma_read_response_middle;
    }
    h.aeth = Aeth::ack(msn_);
    uint64_t off = uint64_t{i} * mtu;
    uint64_t take = std::min<uint64_t>(mtu, len - std::min(len, off));
    std::span<const uint8_t> part =
        take ? std::span<const uint8_t>(mr->host_addr(va + off), take) : std::span<const uint8_t>();
    std::span<const uint8_t> parts[1] = {part};
    transmit_locked(
        h, take ? std::span<const std::span<const uint8_t>>(parts, 1) : std::span<const std::span<const uint8_t>>());
  }
}

void Qp::ud_receive_locked(const PacketView& pkt, in_addr src) {
  // Unreliable datagram (IBTA 9.8.4, 10.2.5): a SEND whose Q_Key matches goes
  // into the next receive WQE after 40 bytes for the GRH; anything else, or a
  // SEND with no receive WQE posted, is dropped silently: UD has no responses.
  auto dropped = [this] { device().counters().rx_dropped.fetch_add(1, std::memory_order_relaxed); };
  if (pkt.op->transport != Transport::ud || pkt.deth.qkey != attr_.qkey) return dropped();
  std::shared_lock mr_lock(device().mr_lock());
  if (!take_recv_wqe_locked()) return dropped();
  constexpr uint32_t kGrh = 40;
  const uint64_t need = kGrh + pkt.payload.size();
  ibv_wc_status status = IBV_WC_SUCCESS;
  if (need > rcv_.wqe.total_length) {
    status = IBV_WC_LOC_LEN_ERR;
  } else {
    // The GRH area: on RoCEv2 over IPv4 its last 20 bytes are the IPv4 header the
    // packet arrived with (rdma-core's ibv_init_ah_from_wc reads it from there);
    // on an InfiniBand port there is no GRH on the emulated wire and the area is
    // left as it was.
    uint8_t grh[kGrh] = {};
    const bool eth = device().link_layer() == LinkLayer::kEthernet;
    if (eth) {
      const Ipv4Flow f = device().flow(src, device().addr());
      write_ipv4_header(grh + 20, f.saddr, f.daddr,
                        pkt.op->header_len + pkt.payload.size() + pkt.bth.pad_cnt + kIcrcBytes);
    }
    std::vector<std::span<uint8_t>> spans;
    if (!resolve_sges(device(), pd_, rcv_.sges.data(), rcv_.wqe.num_sge, 0, need, IBV_ACCESS_LOCAL_WRITE, spans)) {
      status = IBV_WC_LOC_PROT_ERR;
    } else {
      std::vector<uint8_t> whole(grh, grh + (eth ? kGrh : 0));
      if (eth) {
        whole.insert(whole.end(), pkt.payload.begin(), pkt.payload.end());
        scatter(spans, whole);
      } else {
        // Keep the GRH area untouched: scatter the payload after it.
        std::vector<std::span<uint8_t>> after;
        uint64_t skip = kGrh;
        for (auto& sp : spans) {
          if (skip >= sp.size()) {
            skip -= sp.size();
            continue;
          }
          after.emplace_back(sp.data() + skip, sp.size() - skip);
          skip = 0;
        }
        scatter(after, pkt.payload);
      }
    }
  }
  mr_lock.unlock();
  ibv_wc wc{};
  wc.wr_id = rcv_.wqe.wr_id;
  wc.status = status;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qpn();
  if (status == IBV_WC_SUCCESS) {
    wc.byte_len = static_cast<uint32_t>(need);
    wc.src_qp = pkt.deth.src_qp;
    if (pkt.op->has(ext::imm)) {
      wc.wc_flags |= IBV_WC_WITH_IMM;
      wc.imm_data = pkt.imm.data;
    }
    if (device().link_layer() == LinkLayer::kEthernet) {
      wc.wc_flags |= IBV_WC_GRH;
    } else {
      wc.slid = static_cast<uint16_t>(ntohl(src.s_addr) & 0xffff);
    }
  }
  rcv_.active = false;
  rcv_.offset = 0;
  push_completion_locked(recv_cq_, wc, pkt.bth.se);
  // A receive error puts the QP in the error state, as every completion error.
  if (status != IBV_WC_SUCCESS) request_error_locked(false);
}

void Qp::responder_locked(const PacketView& pkt, in_addr src) {
  if (type_ == IBV_QPT_UD) return ud_receive_locked(pkt, src);
  const OpcodeInfo& op = *pkt.op;
  const uint32_t psn = pkt.bth.psn;
  const bool rc = type_ == IBV_QPT_RC;
  const bool uc = type_ == IBV_QPT_UC;
  if (!(rc && op.transport == Transport::rc) && !(uc && op.transport == Transport::uc)) {
    device().counters().rx_dropped.fetch_add(1, std::memory_order_relaxed);
    return;  // an opcode of another transport service: silently dropped (IBTA 9.6.1)
  }
  if (attr_.qp_state == IBV_QPS_RTR && !comm_established_) {
    // IBTA 11.6.3: the first packet received in RTR establishes communication.
    comm_established_ = true;
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = IBV_EVENT_COMM_EST;
    context().post_async_event(ev);
  }

  // ---- PSN ----
  if (rc) {
    const int32_t d = psn_diff(psn, epsn_);
    if (d > 0) {
      // Out of sequence (IBTA 9.7.5.1.2, class B): one NAK, then silence until the
      // expected PSN arrives.
      SV_LOG(kDebug, "qp 0x%06x: request psn %u out of sequence, expected %u%s", qpn(), psn, epsn_,
             nak_sent_ ? "" : ", NAK");
      if (!nak_sent_) {
        nak_sent_ = true;
        device().counters().naks_sent.fetch_add(1, std::memory_order_relaxed);
        send_ack_locked(Aeth::nak(msn_, NakCode::psn_sequence_error), epsn_);
      }
      return;
    }
    if (d < 0) {
      // A duplicate (IBTA 9.7.5.1.1): acknowledge sends and writes again without
      // executing them, re-execute reads, answer atomics from the saved result.
      device().counters().duplicates.fetch_add(1, std::memory_order_relaxed);
      SV_LOG(kDebug, "qp 0x%06x: duplicate request psn %u, expected %u", qpn(), psn, epsn_);
      if (op.op_class == OpClass::send || op.op_class == OpClass::rdma_write) {
        send_ack_locked(Aeth::ack(msn_), psn_sub(epsn_, 1));
      } else if (op.op_class == OpClass::rdma_read_request) {
        for (const Resource& r : resources_) {
          if (r.atomic || psn_lt(psn, r.first_psn) || psn_gt(psn, r.last_psn)) continue;
          if (pkt.reth.rkey != r.rkey || pkt.reth.va < r.va || pkt.reth.va + pkt.reth.dma_len > r.va + r.len) break;
          read_reply_locked(psn, pkt.reth.va, pkt.reth.rkey, pkt.reth.dma_len);
          break;
        }
      } else if (op.op_class == OpClass::atomic) {
        for (const Resource& r : resources_) {
          if (!r.atomic || r.first_psn != psn) continue;
          PacketHeaders h;
          h.bth.opcode = opcode::rc_atomic_acknowledge;
          h.bth.dest_qp = attr_.dest_qp_num;
          h.bth.psn = psn;
          h.aeth = Aeth::ack(msn_);
          h.atomic_ack_eth.orig = r.orig;
          transmit_locked(h, {});
          break;
        }
      }
      return;
    }
    nak_sent_ = false;
  } else {
    // UC (IBTA 9.8.3): a PSN gap loses the message in progress; the next packet
    // that starts a message is accepted whatever its PSN.
    if (psn != epsn_) {
      if (rcv_.active) rcv_.offset = 0;  // the receive WQE is reused
      wr_ = Writing{};
      uc_drop_ = !op.starts_message();
      prev_opcode_ = kNoPrevOpcode;
    }
    epsn_ = psn_add(psn, 1);
    if (op.starts_message()) uc_drop_ = false;
    if (uc_drop_) return;
  }

  // ---- opcode sequence ----
  if (!next_opcode_valid(prev_opcode_, op.opcode)) {
    if (rc) {
      responder_error_locked(NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR, psn);
    } else {
      if (rcv_.active) rcv_.offset = 0;
      wr_ = Writing{};
      uc_drop_ = true;
      prev_opcode_ = kNoPrevOpcode;
    }
    return;
  }

  const uint32_t mtu = mtu_bytes();
  const uint64_t plen = pkt.payload.size();
  std::shared_lock mr_lock(device().mr_lock());

  // Drops a UC message (class D) or fails an RC request (class C).
  auto fail = [&](NakCode code, ibv_wc_status recv_status) {
    mr_lock.unlock();
    if (rc) {
      responder_error_locked(code, recv_status, psn);
    } else {
      if (rcv_.active) rcv_.offset = 0;
      wr_ = Writing{};
      uc_drop_ = !op.ends_message();
      prev_opcode_ = kNoPrevOpcode;
    }
  };

  switch (op.op_class) {
    case OpClass::send: {
      if (!take_recv_wqe_locked()) {
        mr_lock.unlock();
        if (rc) {
          rnr_nak_locked(psn);
        } else {
          uc_drop_ = !op.ends_message();
        }
        return;
      }
      // Every packet but the last of a message carries exactly one MTU.
      if (!op.ends_message() && plen != mtu) return fail(NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR);
      if (rcv_.offset + plen > rcv_.wqe.total_length) return fail(NakCode::invalid_request, IBV_WC_LOC_LEN_ERR);
      std::vector<std::span<uint8_t>> spans;
      if (plen && !resolve_sges(device(), pd_, rcv_.sges.data(), rcv_.wqe.num_sge, rcv_.offset, plen,
                                IBV_ACCESS_LOCAL_WRITE, spans))
        return fail(NakCode::remote_operational_error, IBV_WC_LOC_PROT_ERR);
      scatter(spans, pkt.payload);
      rcv_.offset += plen;
      if (op.ends_message()) {
        if (op.has_ieth()) {
          // Only memory windows and fast-registered regions can be invalidated
          // remotely, and emulated devices have neither (IBTA 10.6.7.2.4).
          return fail(NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR);
        }
        msn_ = psn_add(msn_, 1);
        mr_lock.unlock();
        complete_recv_locked(IBV_WC_SUCCESS, IBV_WC_RECV, static_cast<uint32_t>(rcv_.offset), op.has_imm(),
                             pkt.imm.data, false, pkt.bth.se);
      }
      break;
    }
    case OpClass::rdma_write: {
      if (op.starts_message()) {
        wr_ = Writing{pkt.reth.va, pkt.reth.rkey, pkt.reth.dma_len, pkt.reth.dma_len};
        if (pkt.reth.dma_len > caps::kMaxMsgSz) return fail(NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR);
        if (pkt.reth.dma_len &&
            !check_rkey(device(), pd_, attr_.qp_access_flags, wr_.rkey, wr_.va, wr_.total, IBV_ACCESS_REMOTE_WRITE))
          return fail(NakCode::remote_access_error, IBV_WC_REM_ACCESS_ERR);
      }
      if (op.needs_recv_wqe && !take_recv_wqe_locked()) {
        mr_lock.unlock();
        if (rc) {
          rnr_nak_locked(psn);
        } else {
          uc_drop_ = !op.ends_message();
        }
        return;
      }
      if ((!op.ends_message() && plen != mtu) || plen > wr_.remaining || (op.ends_message() && plen != wr_.remaining))
        return fail(NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR);
      if (plen) {
        Mr* mr = check_rkey(device(), pd_, attr_.qp_access_flags, wr_.rkey, wr_.va, plen, IBV_ACCESS_REMOTE_WRITE);
        if (!mr) return fail(NakCode::remote_access_error, IBV_WC_REM_ACCESS_ERR);
        std::memcpy(mr->host_addr(wr_.va), pkt.payload.data(), plen);
      }
      wr_.va += plen;
      wr_.remaining -= plen;
      if (op.ends_message()) {
        msn_ = psn_add(msn_, 1);
        mr_lock.unlock();
        if (op.has_imm())
          complete_recv_locked(IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, static_cast<uint32_t>(wr_.total), true,
                               pkt.imm.data, false, pkt.bth.se);
      }
      break;
    }
    case OpClass::rdma_read_request: {
      const uint64_t len = pkt.reth.dma_len;
      if (len > caps::kMaxMsgSz) return fail(NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR);
      if (len &&
          !check_rkey(device(), pd_, attr_.qp_access_flags, pkt.reth.rkey, pkt.reth.va, len, IBV_ACCESS_REMOTE_READ))
        return fail(NakCode::remote_access_error, IBV_WC_REM_ACCESS_ERR);
      mr_lock.unlock();
      const uint32_t n = packets_for(len, mtu);
      resources_.push_back(Resource{false, psn, psn_add(psn, n - 1), pkt.reth.va, len, pkt.reth.rkey, 0});
      msn_ = psn_add(msn_, 1);  // IBTA C9-148: counted when executed
      read_reply_locked(psn, pkt.reth.va, pkt.reth.rkey, len);
      epsn_ = psn_add(psn, n);
      prev_opcode_ = op.opcode;
      while (resources_.size() > std::max<size_t>(kMinResources, attr_.max_dest_rd_atomic)) resources_.pop_front();
      return;
    }
    case OpClass::atomic: {
      const uint64_t va = pkt.atomic_eth.va;
      if (va % 8) return fail(NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR);  // misaligned atomic
      Mr* mr = check_rkey(device(), pd_, attr_.qp_access_flags, pkt.atomic_eth.rkey, va, 8, IBV_ACCESS_REMOTE_ATOMIC);
      if (!mr) return fail(NakCode::remote_access_error, IBV_WC_REM_ACCESS_ERR);
      // The operation is atomic with respect to the host CPU too.
      auto* target = reinterpret_cast<uint64_t*>(mr->host_addr(va));
      uint64_t orig;
      if (op.opcode == opcode::rc_compare_swap) {
        orig = pkt.atomic_eth.compare;
        __atomic_compare_exchange_n(target, &orig, pkt.atomic_eth.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      } else {
        orig = __atomic_fetch_add(target, pkt.atomic_eth.swap_add, __ATOMIC_SEQ_CST);
      }
      mr_lock.unlock();
      resources_.push_back(Resource{true, psn, psn, va, 8, pkt.atomic_eth.rkey, orig});
      while (resources_.size() > std::max<size_t>(kMinResources, attr_.max_dest_rd_atomic)) resources_.pop_front();
      msn_ = psn_add(msn_, 1);
      PacketHeaders h;
      h.bth.opcode = opcode::rc_atomic_acknowledge;
      h.bth.dest_qp = attr_.dest_qp_num;
      h.bth.psn = psn;
      h.aeth = Aeth::ack(msn_);
      h.atomic_ack_eth.orig = orig;
      transmit_locked(h, {});
      epsn_ = psn_add(psn, 1);
      prev_opcode_ = op.opcode;
      return;
    }
    default:
      return;
  }

  prev_opcode_ = op.opcode;
  if (rc) {
    epsn_ = psn_add(psn, 1);
    // Acknowledge when asked (coalescing the rest, IBTA 9.7.5.1.3).
    if (pkt.bth.ack_req) send_ack_locked(Aeth::ack(msn_), psn);
  }
}

void Qp::rnr_nak_locked(uint32_t psn) {
  // Receiver not ready (IBTA 9.7.5.2.8): the request is not executed and the
  // requester will send it again after the RNR timer. The packets it already has in
  // flight behind it are dropped silently, like those after a sequence NAK: a
  // sequence NAK for them would only start a second, competing retransmission.
  nak_sent_ = true;
  device().counters().rnr_naks_sent.fetch_add(1, std::memory_order_relaxed);
  send_ack_locked(Aeth::rnr_nak(msn_, attr_.min_rnr_timer), psn);
}

void Qp::forge_nak(uint32_t psn, uint8_t syndrome) {
  std::lock_guard lock(mu_);
  if (type_ != IBV_QPT_RC) return;
  const ibv_qp_state s = attr_.qp_state;
  if (s == IBV_QPS_RESET || s == IBV_QPS_INIT || s == IBV_QPS_ERR) return;
  send_ack_locked(Aeth{syndrome, msn_}, psn);
}

void Qp::receive(const PacketView& pkt, in_addr src) {
  std::lock_guard lock(mu_);
  const ibv_qp_state s = attr_.qp_state;
  if (s == IBV_QPS_RESET || s == IBV_QPS_INIT || s == IBV_QPS_ERR) return;
  heard_from_peer_ = true;
  if (pkt.op->is_request) {
    responder_locked(pkt, src);
  } else if (s != IBV_QPS_RTR) {
    completer_locked(pkt);
  }
  requester_locked();
}

}  // namespace softverbs::emu

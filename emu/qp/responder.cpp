// The responder: takes each request through the steps of responder.hpp (the
// checks of IBTA 9.7.5: opcode valid for the QP, PSN, opcode sequence, R_Key,
// resources, length), executes it and answers: ACK, NAK, RNR NAK, read
// responses, atomic responses. Errors map through one table (kRespErrors).
#include <cstring>
#include <optional>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/memory/sge.hpp"
#include "emu/memory/window.hpp"
#include "emu/qp/qp.hpp"
#include "core/log.hpp"
#include "wire/psn.hpp"

namespace softverbs::emu {
namespace {

using namespace wire;

// Recently served reads and atomics kept to answer duplicates; at least the
// responder resources the QP advertises (max_dest_rd_atomic).
constexpr size_t kMinResources = 16;

}  // namespace

// ---- answers, receive WQEs, duplicates' resources ---------------------------

void Qp::send_ack_locked(Aeth aeth, uint32_t psn) {
  const uint8_t op = service_opcode(opcode::rc_acknowledge);
  // A plain ACK may stand for the ones before it (IBTA 9.7.5.1.1), which the
  // direct path uses (asked before any headers are made: on a burst handed
  // over directly, most ACKs fold); a NAK or RNR NAK keeps its own packet.
  if (aeth.is_ack() && fold_plain_ack_locked(op, psn, aeth)) return;
  PacketHeaders h;
  h.bth.opcode = op;
  h.bth.dest_qp = attr_.dest_qp_num;
  h.bth.psn = psn;
  h.aeth = aeth;
  if (aeth.is_ack()) {
    transmit_plain_ack_locked(h);
  } else {
    transmit_locked(h, {});
  }
}

std::optional<uint64_t> Qp::next_recv_length_locked() {
  if (resp_.rcv.active) return resp_.rcv.wqe.total_length;
  if (srq_) {
    std::lock_guard lock(srq_->mu);
    if (srq_->rq.empty()) return std::nullopt;
    return srq_->rq.front().total_length;
  }
  if (rq_.empty()) return std::nullopt;
  return rq_.front().total_length;
}

bool Qp::take_recv_wqe_locked() {
  if (resp_.rcv.active) return true;
  if (srq_) {
    std::lock_guard lock(srq_->mu);
    if (srq_->rq.empty()) return false;
    resp_.rcv.wqe = srq_->rq.front();
    const Sge* s = srq_->rq.sges_at(0);
    resp_.rcv.sges.assign(s, s + resp_.rcv.wqe.num_sge);
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
    resp_.rcv.wqe = rq_.front();
    const Sge* s = rq_.sges_at(0);
    resp_.rcv.sges.assign(s, s + resp_.rcv.wqe.num_sge);
    rq_.pop();
  }
  resp_.rcv.active = true;
  resp_.rcv.offset = 0;
  return true;
}

void Qp::complete_recv_locked(ibv_wc_status status, ibv_wc_opcode opcode, uint32_t byte_len, bool with_imm,
                              uint32_t imm, bool with_inv, bool solicited) {
  ibv_wc wc{};
  wc.wr_id = resp_.rcv.wqe.wr_id;
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
  // Every RoCE packet carries a GRH; rxe says so on RC and UC receives too.
  else if (personality().grh_on_connected) wc.wc_flags |= IBV_WC_GRH;
  wc.sl = attr_.ah_attr.sl;
  resp_.rcv.active = false;
  resp_.rcv.offset = 0;
  push_completion_locked(recv_cq_, wc, solicited, resp_.rcv.wqe.trace_id);
}

void Qp::responder_error_locked(const RespErrorRow& e, uint32_t psn) {
  // Where adapters differ from the table, the personality's [completions] and
  // [events] decide: the NAK (so the sender's status), the receiver's status,
  // and whether the access error is reported at all.
  const Personality& persona = personality();
  wire::NakCode nak = e.nak;
  ibv_wc_status status = e.recv_status;
  if (e.step == RespStep::err_length) {
    status = persona.recv_too_small_receiver;
    if (persona.recv_too_small_sender == IBV_WC_REM_OP_ERR) nak = wire::NakCode::remote_operational_error;
  } else if (e.step == RespStep::err_local_protection) {
    status = persona.bad_lkey;
  }
  if (responder_reliable()) {
    device().counters().naks_sent.fetch_add(1, std::memory_order_relaxed);
    send_ack_locked(Aeth::nak(resp_.msn, nak), psn);
  }
  if (resp_.rcv.active) complete_recv_locked(status, IBV_WC_RECV, 0, false, 0, false, false);
  // The responder's QP reports the error as an affiliated asynchronous event and
  // goes to the error state (IBTA 10.8.3.3, 11.6.3).
  if (e.event != IBV_EVENT_QP_ACCESS_ERR || persona.event_qp_access_err) {
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = e.event;
    context().post_async_event(ev);
  }
  enter_error_locked();
}

void Qp::send_atomic_ack_locked(uint32_t psn, uint64_t orig) {
  PacketHeaders h;
  h.bth.opcode = service_opcode(opcode::rc_atomic_acknowledge);
  h.bth.dest_qp = attr_.dest_qp_num;
  h.bth.psn = psn;
  h.aeth = Aeth::ack(resp_.msn);
  h.atomic_ack_eth.orig = orig;
  transmit_locked(h, {});
}

void Qp::keep_resource_locked(const ResponderState::Resource& r) {
  resp_.resources.push_back(r);
  while (resp_.resources.size() > std::max<size_t>(kMinResources, attr_.max_dest_rd_atomic))
    resp_.resources.erase(resp_.resources.begin());
}

void Qp::read_reply_locked(uint32_t psn, uint64_t va, uint32_t rkey, uint64_t len) {
  const uint32_t mtu = mtu_bytes();
  const uint32_t n = packets_for(len, mtu);
  std::shared_lock mr_lock(device().mr_lock());
  const uint8_t* src =
      len ? check_rkey(device(), access_pd(), qpn(), attr_.qp_access_flags, rkey, va, len, IBV_ACCESS_REMOTE_READ) : nullptr;
  if (len && !src) return;  // the region or window went away since the request was checked
  for (uint32_t i = 0; i < n; ++i) {
    PacketHeaders h;
    h.bth.dest_qp = attr_.dest_qp_num;
    h.bth.psn = psn_add(psn, i);
    if (n == 1) {
      h.bth.opcode = service_opcode(opcode::rc_rdma_read_response_only);
    } else if (i == 0) {
      h.bth.opcode = service_opcode(opcode::rc_rdma_read_response_first);
    } else if (i + 1 == n) {
      h.bth.opcode = service_opcode(opcode::rc_rdma_read_response_last);
    } else {
      h.bth.opcode = service_opcode(opcode::rc_rdma_read_response_middle);
    }
    h.aeth = Aeth::ack(resp_.msn);
    uint64_t off = uint64_t{i} * mtu;
    uint64_t take = std::min<uint64_t>(mtu, len - std::min(len, off));
    std::span<const uint8_t> part =
        take ? std::span<const uint8_t>(src + off, take) : std::span<const uint8_t>();
    std::span<const uint8_t> parts[1] = {part};
    transmit_locked(
        h, take ? std::span<const std::span<const uint8_t>>(parts, 1) : std::span<const std::span<const uint8_t>>());
  }
}

void Qp::ud_receive_locked(const PacketView& pkt, in_addr src, in_addr dst) {
  // Unreliable datagram (IBTA 9.8.4, 10.2.5): a SEND whose Q_Key matches goes
  // into the next receive WQE after 40 bytes for the GRH; anything else, or a
  // SEND with no receive WQE posted, is dropped silently: UD has no responses.
  auto dropped = [this] { device().counters().rx_dropped.fetch_add(1, std::memory_order_relaxed); };
  if (pkt.op->transport != Transport::ud || pkt.deth.qkey != attr_.qkey) return dropped();
  constexpr uint32_t kGrh = 40;
  const uint64_t need = kGrh + pkt.payload.size();
  // A datagram larger than the next receive WQE is discarded like one that
  // finds no WQE, and the WQE stays posted for the next datagram: a length
  // error of a UD responder is of the IBTA's class D (silently dropped; rxe
  // classifies it so too), as on ConnectX.
  const std::optional<uint64_t> room = next_recv_length_locked();
  if (!room || need > *room) return dropped();
  std::shared_lock mr_lock(device().mr_lock());
  // (Another QP of the SRQ may have taken that WQE meanwhile: one that does not
  // fit either stays with this QP, for its next datagram.)
  if (!take_recv_wqe_locked() || need > resp_.rcv.wqe.total_length) return dropped();
  ibv_wc_status status = IBV_WC_SUCCESS;
  {
    // The GRH area: on RoCEv2 over IPv4 its first 20 bytes are zero and its last
    // 20 the IPv4 header the packet arrived with, TOS (the traffic class) and
    // TTL (the hop limit) included, as rxe writes it and mlx5 scatters it
    // (rdma-core's ibv_init_ah_from_wc reads the addresses, the TOS and the TTL
    // from there, and the zero flow label from the first word); on an InfiniBand
    // port there is no GRH on the emulated wire and the area is left as it was.
    uint8_t grh[kGrh] = {};
    const bool eth = device().link_layer() == LinkLayer::kEthernet;
    if (eth) {
      // A multicast packet's IP destination is its group.
      const Ipv4Flow f = device().flow(src, dst.s_addr ? dst : device().addr());
      write_ipv4_header(grh + 20, f.saddr, f.daddr,
                        pkt.op->header_len + pkt.payload.size() + pkt.bth.pad_cnt + kIcrcBytes, pkt.ip.tos,
                        pkt.ip.ttl);
    }
    std::vector<std::span<uint8_t>> spans;
    if (!resolve_sges(device(), recv_pd(), resp_.rcv.sges.data(), resp_.rcv.wqe.num_sge, 0, need, IBV_ACCESS_LOCAL_WRITE, spans)) {
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
  wc.wr_id = resp_.rcv.wqe.wr_id;
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
  resp_.rcv.active = false;
  resp_.rcv.offset = 0;
  push_completion_locked(recv_cq_, wc, pkt.bth.se, resp_.rcv.wqe.trace_id);
  // A receive error puts the QP in the error state, as every completion error.
  if (status != IBV_WC_SUCCESS) request_error_locked(false);
}

// ---- the request steps ------------------------------------------------------

void Qp::responder_locked(const PacketView& pkt, in_addr src, in_addr dst) {
  if (type_ == IBV_QPT_UD) return ud_receive_locked(pkt, src, dst);
  RespContext r{pkt, *pkt.op, src, pkt.bth.psn, responder_reliable()};
  RespStep step = RespStep::check_op_valid;
  while (step != RespStep::done) {
    switch (step) {
      case RespStep::check_op_valid: step = resp_check_op_valid_locked(r); break;
      case RespStep::establish: step = resp_establish_locked(r); break;
      case RespStep::check_psn: step = resp_check_psn_locked(r); break;
      case RespStep::duplicate: step = resp_duplicate_locked(r); break;
      case RespStep::nak_psn: step = resp_nak_psn_locked(r); break;
      case RespStep::check_op_seq: step = resp_check_op_seq_locked(r); break;
      case RespStep::check_rkey: step = resp_check_rkey_locked(r); break;
      case RespStep::check_resources: step = resp_check_resources_locked(r); break;
      case RespStep::rnr: step = resp_rnr_locked(r); break;
      case RespStep::check_length: step = resp_check_length_locked(r); break;
      case RespStep::execute: step = resp_execute_locked(r); break;
      case RespStep::acknowledge: step = resp_acknowledge_locked(r); break;
      case RespStep::drop: step = resp_drop_locked(r); break;
      case RespStep::done: break;
      default: {
        const RespErrorRow* e = resp_error_row(step);
        step = e ? resp_error_locked(r, *e) : RespStep::done;
        break;
      }
    }
  }
}

RespStep Qp::resp_check_op_valid_locked(RespContext& r) {
  // An opcode of another transport service is silently dropped (IBTA 9.6.1),
  // before it can touch the PSN state.
  const bool uc = type_ == IBV_QPT_UC;
  const Transport expected = type_ == IBV_QPT_XRC_RECV ? Transport::xrc : uc ? Transport::uc : Transport::rc;
  if ((!r.rc && !uc) || r.op.transport != expected) return RespStep::drop;
  // IBTA 9.5: an XRC request names its SRQ; one that is no XRC SRQ of the QP's
  // domain makes the request invalid (NAK invalid request).
  if (type_ == IBV_QPT_XRC_RECV && !bind_xrc_srq_locked(r.pkt.xrceth.srqn)) return RespStep::err_invalid_request;
  return RespStep::establish;
}

RespStep Qp::resp_drop_locked(RespContext&) {
  device().counters().rx_dropped.fetch_add(1, std::memory_order_relaxed);
  return RespStep::done;
}

RespStep Qp::resp_establish_locked(RespContext&) {
  if (attr_.qp_state == IBV_QPS_RTR && !resp_.comm_established) {
    // IBTA 11.6.3: the first packet received in RTR establishes communication.
    resp_.comm_established = true;
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = IBV_EVENT_COMM_EST;
    context().post_async_event(ev);
  }
  return RespStep::check_psn;
}

RespStep Qp::resp_check_psn_locked(RespContext& r) {
  const uint32_t psn = r.psn;
  if (r.rc) {
    const int32_t d = psn_diff(psn, resp_.epsn);
    if (d > 0) return RespStep::nak_psn;
    if (d < 0) return RespStep::duplicate;
    resp_.nak_sent = false;
    return RespStep::check_op_seq;
  }
  // UC (IBTA 9.8.3): a PSN gap loses the message in progress; the next packet
  // that starts a message is accepted whatever its PSN.
  if (psn != resp_.epsn) {
    if (resp_.rcv.active) resp_.rcv.offset = 0;  // the receive WQE is reused
    resp_.wr = ResponderState::Writing{};
    resp_.uc_drop = !r.op.starts_message();
    resp_.prev_opcode = kNoPrevOpcode;
  }
  resp_.epsn = psn_add(psn, 1);
  if (r.op.starts_message()) resp_.uc_drop = false;
  if (resp_.uc_drop) return RespStep::done;
  return RespStep::check_op_seq;
}

RespStep Qp::resp_nak_psn_locked(RespContext& r) {
  // Out of sequence (IBTA 9.7.5.1.2, class B): one NAK, then silence until the
  // expected PSN arrives.
  SV_LOG(kDebug, "qp 0x%06x: request psn %u out of sequence, expected %u%s", qpn(), r.psn, resp_.epsn,
         resp_.nak_sent ? "" : ", NAK");
  device().counters().out_of_seq_requests.fetch_add(1, std::memory_order_relaxed);
  if (!resp_.nak_sent) {
    resp_.nak_sent = true;
    device().counters().naks_sent.fetch_add(1, std::memory_order_relaxed);
    send_ack_locked(Aeth::nak(resp_.msn, NakCode::psn_sequence_error), resp_.epsn);
  }
  return RespStep::done;
}

RespStep Qp::resp_duplicate_locked(RespContext& r) {
  // A duplicate (IBTA 9.7.5.1.1): acknowledge sends and writes again without
  // executing them, re-execute reads, answer atomics from the saved result.
  const PacketView& pkt = r.pkt;
  const uint32_t psn = r.psn;
  device().counters().duplicates.fetch_add(1, std::memory_order_relaxed);
  device().counters().dup_requests.fetch_add(1, std::memory_order_relaxed);
  SV_LOG(kDebug, "qp 0x%06x: duplicate request psn %u, expected %u", qpn(), psn, resp_.epsn);
  if (r.op.op_class == OpClass::send || r.op.op_class == OpClass::rdma_write) {
    send_ack_locked(Aeth::ack(resp_.msn), psn_sub(resp_.epsn, 1));
  } else if (r.op.op_class == OpClass::rdma_read_request) {
    for (const ResponderState::Resource& res : resp_.resources) {
      if (res.atomic || psn_lt(psn, res.first_psn) || psn_gt(psn, res.last_psn)) continue;
      if (pkt.reth.rkey != res.rkey || pkt.reth.va < res.va || pkt.reth.va + pkt.reth.dma_len > res.va + res.len) break;
      read_reply_locked(psn, pkt.reth.va, pkt.reth.rkey, pkt.reth.dma_len);
      break;
    }
  } else if (r.op.op_class == OpClass::atomic) {
    for (const ResponderState::Resource& res : resp_.resources) {
      if (!res.atomic || res.first_psn != psn) continue;
      send_atomic_ack_locked(psn, res.orig);
      break;
    }
  }
  return RespStep::done;
}

RespStep Qp::resp_check_op_seq_locked(RespContext& r) {
  // IBTA 9.7.5.1.3 (RC, class C) and 9.8.3 (UC, class D): the packets of a
  // message arrive FIRST, MIDDLE..., LAST, and messages do not interleave.
  if (!next_opcode_valid(resp_.prev_opcode, r.op.opcode)) return RespStep::err_op_seq;
  return RespStep::check_rkey;
}

RespStep Qp::resp_check_rkey_locked(RespContext& r) {
  // From here on the request uses registered memory.
  r.mr_lock = std::shared_lock(device().mr_lock());
  const PacketView& pkt = r.pkt;
  // The first packet's RETH or AtomicETH is checked before the receive WQE is
  // looked for: a request that cannot be executed fails even when none is posted.
  switch (r.op.op_class) {
    case OpClass::send:
      return RespStep::check_resources;
    case OpClass::rdma_write:
      if (r.op.starts_message()) {
        resp_.wr = ResponderState::Writing{pkt.reth.va, pkt.reth.rkey, pkt.reth.dma_len, pkt.reth.dma_len};
        RespStep err = RespStep::check_resources;
        if (pkt.reth.dma_len > personality().max_msg_sz) {
          err = RespStep::err_invalid_request;
        } else if (pkt.reth.dma_len && !check_rkey(device(), access_pd(), qpn(), attr_.qp_access_flags, resp_.wr.rkey,
                                                   resp_.wr.va, resp_.wr.total, IBV_ACCESS_REMOTE_WRITE)) {
          err = RespStep::err_remote_access;
        }
        // An RDMA WRITE ONLY with immediate that fails consumes its receive WQE,
        // which completes with the error's status (the rest are flushed), as in
        // rxe, whose responder takes the WQE before it checks the R_Key.
        if (err != RespStep::check_resources && r.op.needs_recv_wqe) take_recv_wqe_locked();
        return err;
      }
      return RespStep::check_resources;
    case OpClass::rdma_read_request: {
      const uint64_t len = pkt.reth.dma_len;
      if (len > personality().max_msg_sz) return RespStep::err_invalid_request;
      if (len && !check_rkey(device(), access_pd(), qpn(), attr_.qp_access_flags, pkt.reth.rkey, pkt.reth.va, len,
                             IBV_ACCESS_REMOTE_READ))
        return RespStep::err_remote_access;
      return RespStep::check_resources;
    }
    case OpClass::atomic: {
      const uint64_t va = pkt.atomic_eth.va;
      if (va % 8) return RespStep::err_invalid_request;  // misaligned atomic
      r.atomic_target = check_rkey(device(), access_pd(), qpn(), attr_.qp_access_flags, pkt.atomic_eth.rkey, va, 8,
                                   IBV_ACCESS_REMOTE_ATOMIC);
      if (!r.atomic_target) return RespStep::err_remote_access;
      return RespStep::check_resources;
    }
    default:
      return RespStep::done;  // FLUSH, ATOMIC WRITE: not supported, ignored
  }
}

RespStep Qp::resp_check_resources_locked(RespContext& r) {
  // SENDs and RDMA WRITEs with immediate consume a receive WQE.
  if (r.op.needs_recv_wqe && !take_recv_wqe_locked()) return RespStep::rnr;
  return RespStep::check_length;
}

RespStep Qp::resp_rnr_locked(RespContext& r) {
  r.mr_lock.unlock();
  if (r.rc) {
    rnr_nak_locked(r.psn);
  } else {
    resp_.uc_drop = !r.op.ends_message();
  }
  return RespStep::done;
}

RespStep Qp::resp_check_length_locked(RespContext& r) {
  const uint64_t plen = r.pkt.payload.size();
  const uint32_t mtu = mtu_bytes();
  const bool ends = r.op.ends_message();
  // Every packet but the last of a message carries exactly one MTU.
  if (r.op.op_class == OpClass::send) {
    if (!ends && plen != mtu) return RespStep::err_invalid_request;
    if (resp_.rcv.offset + plen > resp_.rcv.wqe.total_length) return RespStep::err_length;
  } else if (r.op.op_class == OpClass::rdma_write) {
    // ... and the packets of an RDMA WRITE add up to its RETH's DMA length.
    if ((!ends && plen != mtu) || plen > resp_.wr.remaining || (ends && plen != resp_.wr.remaining))
      return RespStep::err_invalid_request;
  }
  return RespStep::execute;
}

RespStep Qp::resp_execute_locked(RespContext& r) {
  switch (r.op.op_class) {
    case OpClass::send:
      return resp_execute_send_locked(r);
    case OpClass::rdma_write:
      return resp_execute_write_locked(r);
    case OpClass::rdma_read_request:
      return resp_execute_read_locked(r);
    case OpClass::atomic:
      return resp_execute_atomic_locked(r);
    default:
      return RespStep::done;
  }
}

RespStep Qp::resp_execute_send_locked(RespContext& r) {
  const PacketView& pkt = r.pkt;
  const uint64_t plen = pkt.payload.size();
  std::vector<std::span<uint8_t>>& spans = rx_spans_;  // the QP's: a packet allocates nothing
  spans.clear();
  if (plen && !resolve_sges(device(), recv_pd(), resp_.rcv.sges.data(), resp_.rcv.wqe.num_sge, resp_.rcv.offset, plen,
                            IBV_ACCESS_LOCAL_WRITE, spans))
    return RespStep::err_local_protection;
  scatter(spans, pkt.payload);
  resp_.rcv.offset += plen;
  if (r.op.ends_message()) {
    r.mr_lock.unlock();
    if (r.op.has_ieth()) {
      // SEND with Invalidate (IBTA 9.4.1, 10.6.7.2.4): the responder invalidates
      // the rkey before the receive completes. Only a type 2 window of this
      // QP's PD bound to this QP can be; anything else, an ordinary region's
      // rkey included, is an invalid request.
      std::unique_lock excl(device().mr_lock());
      // rxe completes one naming a region's rkey and leaves the region alone
      // (the personality's completions.send_inv_of_region).
      if (!invalidate_window(device(), access_pd(), qpn(), pkt.ieth.rkey, Invalidation::remote) &&
          (personality().send_inv_of_region_fails || !device().find_mr_locked(pkt.ieth.rkey)))
        return RespStep::err_invalid_request;
    }
    resp_.msn = psn_add(resp_.msn, 1);
    const bool with_inv = r.op.has_ieth();
    complete_recv_locked(IBV_WC_SUCCESS, IBV_WC_RECV, static_cast<uint32_t>(resp_.rcv.offset), r.op.has_imm(),
                         with_inv ? pkt.ieth.rkey : pkt.imm.data, with_inv, pkt.bth.se);
  }
  return RespStep::acknowledge;
}

RespStep Qp::resp_execute_write_locked(RespContext& r) {
  const PacketView& pkt = r.pkt;
  const uint64_t plen = pkt.payload.size();
  if (plen) {
    // Checked for every packet: the region may have gone since the first.
    uint8_t* dst = check_rkey(device(), access_pd(), qpn(), attr_.qp_access_flags, resp_.wr.rkey, resp_.wr.va, plen,
                              IBV_ACCESS_REMOTE_WRITE);
    if (!dst) return RespStep::err_remote_access;
    std::memcpy(dst, pkt.payload.data(), plen);
  }
  resp_.wr.va += plen;
  resp_.wr.remaining -= plen;
  if (r.op.ends_message()) {
    resp_.msn = psn_add(resp_.msn, 1);
    r.mr_lock.unlock();
    if (r.op.has_imm())
      complete_recv_locked(IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, static_cast<uint32_t>(resp_.wr.total), true,
                           pkt.imm.data, false, pkt.bth.se);
  }
  return RespStep::acknowledge;
}

RespStep Qp::resp_execute_read_locked(RespContext& r) {
  const PacketView& pkt = r.pkt;
  const uint32_t psn = r.psn;
  const uint64_t len = pkt.reth.dma_len;
  r.mr_lock.unlock();
  const uint32_t n = packets_for(len, mtu_bytes());
  keep_resource_locked(ResponderState::Resource{false, psn, psn_add(psn, n - 1), pkt.reth.va, len, pkt.reth.rkey, 0});
  resp_.msn = psn_add(resp_.msn, 1);  // IBTA C9-148: counted when executed
  read_reply_locked(psn, pkt.reth.va, pkt.reth.rkey, len);
  // The read responses are its acknowledgement; its PSNs are the responses'.
  resp_.epsn = psn_add(psn, n);
  resp_.prev_opcode = r.op.opcode;
  return RespStep::done;
}

RespStep Qp::resp_execute_atomic_locked(RespContext& r) {
  const PacketView& pkt = r.pkt;
  const uint32_t psn = r.psn;
  const uint64_t va = pkt.atomic_eth.va;
  // The operation is atomic with respect to the host CPU too.
  auto* target = reinterpret_cast<uint64_t*>(r.atomic_target);
  uint64_t orig;
  if (r.op.opcode == service_opcode(opcode::rc_compare_swap)) {
    orig = pkt.atomic_eth.compare;
    __atomic_compare_exchange_n(target, &orig, pkt.atomic_eth.swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  } else {
    orig = __atomic_fetch_add(target, pkt.atomic_eth.swap_add, __ATOMIC_SEQ_CST);
  }
  r.mr_lock.unlock();
  keep_resource_locked(ResponderState::Resource{true, psn, psn, va, 8, pkt.atomic_eth.rkey, orig});
  resp_.msn = psn_add(resp_.msn, 1);
  send_atomic_ack_locked(psn, orig);
  resp_.epsn = psn_add(psn, 1);
  resp_.prev_opcode = r.op.opcode;
  return RespStep::done;
}

RespStep Qp::resp_acknowledge_locked(RespContext& r) {
  resp_.prev_opcode = r.op.opcode;
  if (r.rc) {
    resp_.epsn = psn_add(r.psn, 1);
    // Acknowledge when asked (coalescing the rest, IBTA 9.7.5.1.3).
    if (r.pkt.bth.ack_req) send_ack_locked(Aeth::ack(resp_.msn), r.psn);
  }
  return RespStep::done;
}

RespStep Qp::resp_error_locked(RespContext& r, const RespErrorRow& e) {
  if (r.mr_lock.owns_lock()) r.mr_lock.unlock();
  if (r.rc) {
    // RC (class C): NAK, fail the receive WQE in progress, error state.
    responder_error_locked(e, r.psn);
    return RespStep::done;
  }
  // UC (class D): the message is dropped; reception resumes with a later one.
  if (resp_.rcv.active) resp_.rcv.offset = 0;
  resp_.wr = ResponderState::Writing{};
  resp_.uc_drop = e.uc_drop_until_first || !r.op.ends_message();
  resp_.prev_opcode = kNoPrevOpcode;
  return RespStep::done;
}

void Qp::rnr_nak_locked(uint32_t psn) {
  // Receiver not ready (IBTA 9.7.5.2.8): the request is not executed and the
  // requester will send it again after the RNR timer. The packets it already has in
  // flight behind it are dropped silently, like those after a sequence NAK: a
  // sequence NAK for them would only start a second, competing retransmission.
  resp_.nak_sent = true;
  device().counters().rnr_naks_sent.fetch_add(1, std::memory_order_relaxed);
  send_ack_locked(Aeth::rnr_nak(resp_.msn, attr_.min_rnr_timer), psn);
}

void Qp::forge_nak(uint32_t psn, uint8_t syndrome) {
  std::lock_guard lock(mu_);
  if (!responder_reliable()) return;
  const ibv_qp_state s = attr_.qp_state;
  if (s == IBV_QPS_RESET || s == IBV_QPS_INIT || s == IBV_QPS_ERR) return;
  send_ack_locked(Aeth{syndrome, resp_.msn}, psn);
}

bool Qp::bind_xrc_srq_locked(uint32_t srqn) {
  if (srq_ && srq_->srqn == srqn) return true;
  // The QP keeps a use of the SRQ it delivers into, so that the SRQ outlives
  // a message under way (ibv_destroy_srq: EBUSY meanwhile).
  Srq* s = acquire_srq(device(), srqn);
  if (!s) return false;
  if (!s->xrcd || !xrcd_ || s->xrcd->domain() != xrcd_->domain()) {
    s->users.put();
    return false;
  }
  if (srq_) srq_->users.put();
  srq_ = s;
  recv_cq_ = s->cq;
  return true;
}

void Qp::receive(const PacketView& pkt, in_addr src, in_addr dst) {
  std::lock_guard lock(mu_);
  receive_locked(pkt, src, dst);
}

void Qp::receive_locked(const PacketView& pkt, in_addr src, in_addr dst) {
  DirectScope scope(this);
  const ibv_qp_state s = attr_.qp_state;
  if (s == IBV_QPS_RESET || s == IBV_QPS_INIT || s == IBV_QPS_ERR) return;
  req_.heard_from_peer = true;
  if (type_ != IBV_QPT_UD) observe_migreq_locked(pkt.bth.migreq);
  if (pkt.op->is_request) {
    responder_locked(pkt, src, dst);
  } else if (s != IBV_QPS_RTR) {
    completer_locked(pkt);
  }
  requester_locked();
}

}  // namespace softverbs::emu

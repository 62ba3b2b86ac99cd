// The QP an rdma_cm id drives (docs/rdma-cm.md, "QPs"): rdma_create_qp_ex with
// the CQs librdmacm makes when the application gives none, rdma_init_qp_attr,
// and the transitions the CM makes (INIT at creation; RTR and RTS when the
// connection is accepted or answered; ERR on reject and disconnect), with the
// values IBTA 12.9 and Linux's CM take from the REQ and REP (docs/wire.md §4.5).
#include <fcntl.h>

#include <cstring>
#include <utility>

#include "core/log.hpp"
#include "emu/cm/cm.hpp"
#include "emu/objects/objects.hpp"
#include "emu/objects/ops.hpp"
#include "emu/provider.hpp"

namespace softverbs::emu {

using cm::Conn;
using cm::ConnState;
using cm::Id;

namespace {

bool is_ud(const Id* id) { return id->pub.qp_type == IBV_QPT_UD; }
// The QP types that take the receive side's RC attributes at RTR, and those
// that take the send side's at RTS (the kernel's cm_init_qp_rtr_attr and
// cm_init_qp_rts_attr: an XRC target has no send queue, an initiator no
// receive queue).
bool rc_receiver(const Id* id) { return id->pub.qp_type == IBV_QPT_RC || id->pub.qp_type == IBV_QPT_XRC_RECV; }
bool rc_sender(const Id* id) { return id->pub.qp_type == IBV_QPT_RC || id->pub.qp_type == IBV_QPT_XRC_SEND; }

}  // namespace

// librdmacm 44's init_ece: what a new QP answers to ibv_query_ece is what the
// id offers; a QP made for a received REQ is offered the peer's options, or
// none when they are another vendor's.
void EmuCm::init_ece(Id* id, ibv_qp* qp) {
  EmuProvider& p = EmuProvider::instance();
  ibv_ece ece{};
  if (p.query_ece(qp, &ece) != 0) return;
  id->local_ece_vendor = ece.vendor_id;
  id->local_ece_options = ece.options;
  if (!id->remote_ece_vendor) return;
  if (id->remote_ece_vendor == ece.vendor_id) ece.options = id->remote_ece_options;
  else ece.options = 0;
  p.set_ece(qp, &ece);
}

// ucma_process_conn_resp_ece: a REP without ECE clears the QP's options; one
// naming another vendor than the REQ offered fails the connection (EINVAL).
int EmuCm::apply_rep_ece(Id* id, uint32_t vendor, uint32_t options) {
  ibv_ece ece{};
  ece.vendor_id = vendor ? vendor : id->local_ece_vendor;
  ece.options = vendor ? options : 0;
  if (vendor && vendor != id->local_ece_vendor) return EINVAL;
  if (ece.vendor_id) EmuProvider::instance().set_ece(id->pub.qp, &ece);
  return 0;
}

// librdmacm 44's set_local_ece: once the QP is initialised, a passive side
// answers with the options the QP settled on.
void EmuCm::settle_local_ece(Id* id) {
  if (!id->remote_ece_vendor || !id->pub.qp) return;
  ibv_ece ece{};
  if (EmuProvider::instance().query_ece(id->pub.qp, &ece) == 0) id->local_ece_options = ece.options;
}

ibv_ah_attr EmuCm::ah_to_peer(Id* id) const {
  ibv_ah_attr ah{};
  in_addr peer = id->conn ? id->conn->peer : id->peer_device;
  ah.port_num = 1;
  if (id->ib) {
    // InfiniBand within one subnet: routed by LID, no GRH (the path record's
    // hop limit is 0), SL 0, path bits 0 (ib_init_ah_attr_from_path).
    ah.dlid = identity_of(peer).lid;
    return ah;
  }
  ah.is_global = 1;
  wire::cm::Gid dgid = cm::gid_of(peer, id->v6);
  std::memcpy(ah.grh.dgid.raw, dgid.data(), 16);
  ah.grh.sgid_index = cm::sgid_index_of(id->v6);  // the device's GID of the id's family
  ah.grh.hop_limit = 64;
  ah.grh.traffic_class = id->tos.value_or(0);
  ah.port_num = 1;
  return ah;
}

// rdma_init_qp_attr: what the CM would set for `state` now.
int EmuCm::qp_attr_for(Id* id, ibv_qp_state state, ibv_qp_attr* attr, int* mask) {
  std::memset(attr, 0, sizeof *attr);
  attr->qp_state = state;
  Conn* c = id->conn.get();
  switch (state) {
    case IBV_QPS_INIT:
      attr->pkey_index = 0;
      attr->port_num = 1;
      if (is_ud(id)) {
        attr->qkey = RDMA_UDP_QKEY;
        *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
      } else {
        // Remote write always; reads and atomics when the id offers responder
        // resources (the kernel's cm_init_qp_init_attr); none before a connection.
        if (c) {
          attr->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
          if (id->responder_resources) attr->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        }
        *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      if (is_ud(id)) {
        *mask = IBV_QP_STATE;
        return 0;
      }
      if (!c || (c->state != ConnState::kRepRcvd && c->state != ConnState::kMraRepRcvd &&
                 c->state != ConnState::kReqRcvd && c->state != ConnState::kMraReqSent &&
                 c->state != ConnState::kRepSent && c->state != ConnState::kEstablished))
        return fail(EINVAL);
      attr->ah_attr = ah_to_peer(id);
      attr->path_mtu = static_cast<ibv_mtu>(std::min<int>(c->req.path_mtu, id->dev->device->active_mtu()));
      attr->dest_qp_num = c->passive ? c->req.local_qpn : c->rep.local_qpn;
      attr->rq_psn = c->passive ? c->rep.starting_psn : c->req.starting_psn;
      *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (rc_receiver(id)) {
        attr->max_dest_rd_atomic = id->responder_resources;
        attr->min_rnr_timer = 0;  // what Linux's CM sets (cm_init_qp_rtr_attr)
        *mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      }
      return 0;
    case IBV_QPS_RTS:
      attr->sq_psn = 0;
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      if (is_ud(id)) return 0;
      if (!c) return fail(EINVAL);
      attr->sq_psn = c->passive ? c->req.starting_psn : c->rep.starting_psn;
      if (rc_sender(id)) {
        attr->retry_cnt = c->req.retry_count;
        attr->rnr_retry = c->passive ? c->req.rnr_retry_count : c->rep.rnr_retry_count;
        attr->max_rd_atomic = id->initiator_depth;
        *mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      }
      if (rc_sender(id) || id->pub.qp_type == IBV_QPT_XRC_RECV) {
        attr->timeout = c->req.primary.local_ack_timeout;
        *mask |= IBV_QP_TIMEOUT;
      }
      return 0;
    default:
      return fail(EINVAL);
  }
}

int EmuCm::init_qp_attr(rdma_cm_id* pub, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!qp_attr || !qp_attr_mask) return fail(EINVAL);
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id || !id->dev) return fail(EINVAL);
  return qp_attr_for(id, qp_attr->qp_state, qp_attr, qp_attr_mask);
}

int EmuCm::modify_qp(Id* id, ibv_qp_attr* attr, int mask) {
  int ret = EmuProvider::instance().modify_qp(id->pub.qp, attr, mask);
  if (ret) {
    SV_LOG(kDebug, "cm: moving QP %u to state %d failed: %s", id->pub.qp->qp_num, attr->qp_state, strerror(ret));
    return fail(ret);
  }
  return 0;
}

// librdmacm's ucma_modify_qp_rtr: INIT again (the access flags of the
// connection), then RTR; the application's responder resources win.
int EmuCm::move_qp_to_rtr(Id* id, uint8_t resp_res) {
  if (!id->pub.qp) return 0;
  ibv_qp_attr attr;
  int mask;
  if (qp_attr_for(id, IBV_QPS_INIT, &attr, &mask) != 0 || modify_qp(id, &attr, mask) != 0) return -1;
  if (qp_attr_for(id, IBV_QPS_RTR, &attr, &mask) != 0) return -1;
  if (resp_res != RDMA_MAX_RESP_RES) attr.max_dest_rd_atomic = resp_res;
  return modify_qp(id, &attr, mask);
}

int EmuCm::move_qp_to_rts(Id* id, uint8_t init_depth) {
  if (!id->pub.qp) return 0;
  ibv_qp_attr attr;
  int mask;
  if (qp_attr_for(id, IBV_QPS_RTS, &attr, &mask) != 0) return -1;
  if (init_depth != RDMA_MAX_INIT_DEPTH) attr.max_rd_atomic = init_depth;
  return modify_qp(id, &attr, mask);
}

void EmuCm::move_qp_to_err(Id* id) {
  if (!id->pub.qp) return;
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  modify_qp(id, &attr, IBV_QP_STATE);
}

// ---------------------------------------------------------------------------

int EmuCm::create_qp_ex(rdma_cm_id* pub, ibv_qp_init_attr_ex* attr) {
  if (!attr) return fail(EINVAL);
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (id->pub.qp || !id->dev) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
    attr->pd = id->pub.pd;
  } else if (attr->pd->context != id->pub.verbs) {
    return fail(EINVAL);
  }
  if ((id->pub.recv_cq && attr->recv_cq && id->pub.recv_cq != attr->recv_cq) ||
      (id->pub.send_cq && attr->send_cq && id->pub.send_cq != attr->send_cq))
    return fail(EINVAL);
  if (id->pub.qp_type == IBV_QPT_XRC_RECV && (!(attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !attr->xrcd)) {
    attr->xrcd = xrcd_of(*id->dev);
    if (!attr->xrcd) return -1;
    attr->comp_mask |= IBV_QP_INIT_ATTR_XRCD;
  }
  EmuProvider& p = EmuProvider::instance();
  ibv_context* ctx = id->pub.verbs;
  // The CQs librdmacm makes for an id whose application gives none, each on
  // a completion channel of its own (rdma_verbs.h's rdma_get_*_comp use them).
  auto make_cq = [&](ibv_comp_channel** ch, ibv_cq** cq, uint32_t size) {
    *ch = p.create_comp_channel(ctx);
    if (!*ch) return false;
    *cq = p.create_cq(ctx, static_cast<int>(std::max<uint32_t>(size, 1)), &id->pub, *ch, 0);
    return *cq != nullptr;
  };
  bool made_recv = false, made_send = false;
  if (!attr->recv_cq && !id->pub.recv_cq) {
    if (!make_cq(&id->pub.recv_cq_channel, &id->pub.recv_cq, attr->cap.max_recv_wr)) goto fail_cqs;
    made_recv = true;
  }
  if (!attr->send_cq && !id->pub.send_cq) {
    if (!make_cq(&id->pub.send_cq_channel, &id->pub.send_cq, attr->cap.max_send_wr)) goto fail_cqs;
    made_send = true;
  }
  if (!attr->send_cq) attr->send_cq = id->pub.send_cq;
  if (!attr->recv_cq) attr->recv_cq = id->pub.recv_cq;
  if (id->pub.srq && !attr->srq) attr->srq = id->pub.srq;
  {
    ibv_qp* qp = nullptr;
    if (attr->comp_mask & ~static_cast<uint32_t>(IBV_QP_INIT_ATTR_PD)) {
      // Send ops flags (the ibv_wr_* API) or creation flags: the verbs' own
      // ibv_create_qp_ex checks them and writes the capabilities back.
      qp = p.create_qp_ex(ctx, attr);
    } else {
      ibv_qp_init_attr plain{};
      std::memcpy(&plain, attr, sizeof plain);
      qp = p.create_qp(attr->pd, &plain);
      if (qp) std::memcpy(attr, &plain, sizeof plain);  // the capabilities the QP got
    }
    if (!qp) goto fail_cqs;
    id->pub.qp = qp;
    init_ece(id, qp);
    ibv_qp_attr qa;
    int mask;
    int ret = qp_attr_for(id, IBV_QPS_INIT, &qa, &mask);
    if (ret == 0) ret = modify_qp(id, &qa, mask);
    if (ret == 0 && is_ud(id)) {
      // A UD QP is ready at once (librdmacm's ucma_init_ud_qp).
      qa = {};
      qa.qp_state = IBV_QPS_RTR;
      ret = modify_qp(id, &qa, IBV_QP_STATE);
      if (ret == 0) {
        qa.qp_state = IBV_QPS_RTS;
        qa.sq_psn = 0;
        ret = modify_qp(id, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN);
      }
    }
    if (ret != 0) {
      int err = errno;
      id->pub.qp = nullptr;
      lock.unlock();  // see destroy_qp
      p.destroy_qp(qp);
      lock.lock();
      errno = err;
      goto fail_cqs;
    }
    settle_local_ece(id);
    id->pub.pd = qp->pd;
  }
  return 0;
fail_cqs : {
  int err = errno;
  if (made_send) {
    if (id->pub.send_cq) p.destroy_cq(id->pub.send_cq);
    if (id->pub.send_cq_channel) p.destroy_comp_channel(id->pub.send_cq_channel);
    id->pub.send_cq = nullptr;
    id->pub.send_cq_channel = nullptr;
  }
  if (made_recv) {
    if (id->pub.recv_cq) p.destroy_cq(id->pub.recv_cq);
    if (id->pub.recv_cq_channel) p.destroy_comp_channel(id->pub.recv_cq_channel);
    id->pub.recv_cq = nullptr;
    id->pub.recv_cq_channel = nullptr;
  }
  errno = err ? err : ENOMEM;
  return -1;
}
}

// The QP and the CQs librdmacm made go outside the CM's lock: destroying a QP
// waits for the device's receive path, which may be waiting for the CM.
void EmuCm::destroy_qp(rdma_cm_id* pub) {
  ibv_qp* qp;
  ibv_cq *recv_cq, *send_cq;
  ibv_comp_channel *recv_ch, *send_ch;
  {
    Lock lock(mu_);
    Id* id = find_id(pub);
    if (!id) return;
    qp = std::exchange(id->pub.qp, nullptr);
    // librdmacm's ucma_destroy_cqs: the CQs and channels it made go with the
    // QP, except an XRC target's, which its XRC SRQ completes into: those go
    // with the SRQ (destroy_srq).
    if (id->pub.qp_type == IBV_QPT_XRC_RECV && id->pub.srq) {
      lock.unlock();
      if (qp) EmuProvider::instance().destroy_qp(qp);
      return;
    }
    recv_cq = std::exchange(id->pub.recv_cq, nullptr);
    send_cq = recv_cq ? std::exchange(id->pub.send_cq, nullptr) : nullptr;
    recv_ch = std::exchange(id->pub.recv_cq_channel, nullptr);
    send_ch = std::exchange(id->pub.send_cq_channel, nullptr);
  }
  EmuProvider& p = EmuProvider::instance();
  if (qp) p.destroy_qp(qp);
  if (recv_cq) p.destroy_cq(recv_cq);
  if (send_cq && send_cq != recv_cq) p.destroy_cq(send_cq);
  if (recv_ch) p.destroy_comp_channel(recv_ch);
  if (send_ch && send_ch != recv_ch) p.destroy_comp_channel(send_ch);
}

int EmuCm::create_srq_ex(rdma_cm_id* pub, ibv_srq_init_attr_ex* attr) {
  if (!attr) return fail(EINVAL);
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id || !id->dev) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_PD;
    attr->pd = id->pub.pd;
  }
  const bool xrc = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type == IBV_SRQT_XRC;
  if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type != IBV_SRQT_BASIC && !xrc)
    return fail(EOPNOTSUPP);
  EmuProvider& p = EmuProvider::instance();
  if (!id->pub.recv_cq) {
    id->pub.recv_cq_channel = p.create_comp_channel(id->pub.verbs);
    if (!id->pub.recv_cq_channel) return -1;
    id->pub.recv_cq = p.create_cq(id->pub.verbs, static_cast<int>(std::max<uint32_t>(attr->attr.max_wr, 1)),
                                  &id->pub, id->pub.recv_cq_channel, 0);
    if (!id->pub.recv_cq) return -1;
  }
  ibv_srq* srq = nullptr;
  if (xrc) {
    // librdmacm's rdma_create_srq_ex: the device's XRC domain and the id's
    // receive CQ unless the application names its own.
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !attr->xrcd) attr->xrcd = xrcd_of(*id->dev);
    if (!attr->xrcd) return -1;
    if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !attr->cq) attr->cq = id->pub.recv_cq;
    attr->comp_mask |= IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    srq = op_create_srq_ex(id->pub.verbs, attr);
  } else {
    ibv_srq_init_attr plain{};
    plain.srq_context = attr->srq_context;
    plain.attr = attr->attr;
    srq = p.create_srq(attr->pd, &plain);
    if (srq) attr->attr = plain.attr;
  }
  if (!srq) return -1;
  if (!id->pub.pd) id->pub.pd = attr->pd;
  id->pub.srq = srq;
  return 0;
}

ibv_xrcd* EmuCm::xrcd_of(cm::CmDevice& dev) {
  if (!dev.xrcd) {
    ibv_xrcd_init_attr attr{};
    attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    attr.fd = -1;
    attr.oflags = O_CREAT;
    dev.xrcd = op_open_xrcd(dev.context, &attr);
  }
  return dev.xrcd;
}

void EmuCm::destroy_srq(rdma_cm_id* pub) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return;
  EmuProvider& p = EmuProvider::instance();
  if (id->pub.srq) p.destroy_srq(id->pub.srq);
  id->pub.srq = nullptr;
  if (id->pub.recv_cq && !id->pub.qp) {
    p.destroy_cq(id->pub.recv_cq);
    id->pub.recv_cq = nullptr;
    if (id->pub.recv_cq_channel) p.destroy_comp_channel(id->pub.recv_cq_channel);
    id->pub.recv_cq_channel = nullptr;
  }
}

}  // namespace softverbs::emu

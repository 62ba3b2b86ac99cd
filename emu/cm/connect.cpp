// Connections in the emulated CM: rdma_connect, rdma_accept, rdma_reject,
// rdma_establish, rdma_notify, rdma_disconnect and rdma_get_request, and the
// REQ, REP and SIDR messages they send and answer (IBTA 12.6, 12.11; the
// values Linux's rdma_cm puts in them: docs/wire.md §4.4-4.6).
#include <arpa/inet.h>
#include <infiniband/ib.h>

#include <cstring>

#include "core/log.hpp"
#include "emu/cm/cm.hpp"
#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/objects/objects.hpp"

namespace softverbs::emu {

using cm::Conn;
using cm::ConnState;
using cm::Event;
using cm::Id;
using cm::IdState;
namespace w = wire::cm;
using cm::gid_of;

namespace {

constexpr uint8_t kMraServiceTimeout = 24;  // Linux's CMA_CM_MRA_SETTING, about 68.7 s

// rdma_cm's private-data header rides in front of the user's data on the IP
// port spaces; RDMA_PS_IB carries the user's data alone.
bool has_cma_header(const Id* id) { return id->pub.ps != RDMA_PS_IB; }

uint16_t dst_port(const Id* id) {
  const sockaddr* sa = &id->pub.route.addr.dst_addr;
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  if (sa->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
  if (sa->sa_family == AF_IB)
    return static_cast<uint16_t>(be64toh(reinterpret_cast<const sockaddr_ib*>(sa)->sib_sid) & 0xffff);
  return 0;
}

// The 16-byte form of an address for the cma header (IPv4: 12 zero bytes first).
w::Gid header_addr(const sockaddr* sa) {
  w::Gid g{};
  if (sa->sa_family == AF_INET) {
    std::memcpy(g.data() + 12, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, 4);
  } else if (sa->sa_family == AF_INET6) {
    std::memcpy(g.data(), &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, 16);
  }
  return g;
}

// The peer's address as an id reports it, from the cma header.
void addr_from_header(sockaddr_storage* out, int family, const w::Gid& a, uint16_t port) {
  std::memset(out, 0, sizeof *out);
  if (family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(out);
    s6->sin6_family = AF_INET6;
    std::memcpy(&s6->sin6_addr, a.data(), 16);
    s6->sin6_port = htons(port);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(out);
    s4->sin_family = AF_INET;
    std::memcpy(&s4->sin_addr, a.data() + 12, 4);
    s4->sin_port = htons(port);
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// The active side

bool EmuCm::next_candidate(Id* id) {
  if (id->candidates.empty()) return false;
  id->peer_device = id->candidates.front();
  id->candidates.erase(id->candidates.begin());
  fill_route(id);
  SV_LOG(kDebug, "cm: trying the next device of the loopback service, %s", inet_ntoa(id->peer_device));
  rdma_conn_param param = id->last_param;
  param.private_data = id->last_private.empty() ? nullptr : id->last_private.data();
  int ret = id->pub.qp_type == IBV_QPT_UD ? send_sidr_req(id, &param) : send_req(id, &param);
  return ret == 0;
}

int EmuCm::send_req(Id* id, const rdma_conn_param* param) {
  Device& dev = *id->dev->device;
  size_t offset = has_cma_header(id) ? w::CmaHeader::kSize : 0;
  size_t user_len = param && param->private_data ? param->private_data_len : 0;
  if (id->connect_data.size() + user_len > w::kReqPrivate - offset) return fail(EINVAL);
  std::shared_ptr<Conn> c = new_conn(id, &dev, id->peer_device);
  w::Req& req = c->req;
  req.local_comm_id = c->local_comm_id;
  req.vendor_id = id->local_ece_vendor & 0xFFFFFF;
  req.service_id = w::service_id(static_cast<uint16_t>(id->pub.ps), dst_port(id));
  if (id->pub.route.addr.dst_addr.sa_family == AF_IB)
    req.service_id = be64toh(reinterpret_cast<const sockaddr_ib*>(&id->pub.route.addr.dst_addr)->sib_sid);
  req.local_ca_guid = dev.guid();
  req.local_qpn = id->pub.qp ? id->pub.qp->qp_num : (param ? param->qp_num : 0);
  req.responder_resources = id->responder_resources;
  req.initiator_depth = id->initiator_depth;
  req.remote_cm_response_timeout = response_timeout();
  const ibv_qp_type qp_type = id->pub.qp ? id->pub.qp->qp_type : id->pub.qp_type;
  req.transport = qp_type == IBV_QPT_UC ? w::Transport::kUc : qp_type == IBV_QPT_XRC_SEND ? w::Transport::kXrc : w::Transport::kRc;
  // An XRC initiator's REQ: transport type 3 with extended transport type 1
  // (IBTA 12.6.5 as amended by the XRC annex; the kernel's cm_req_set_qp_type).
  if (req.transport == w::Transport::kXrc) req.extended_transport = 1;
  req.end_to_end_flow_control = param && param->flow_control;
  req.starting_psn = random_psn();
  req.local_cm_response_timeout = response_timeout();
  req.retry_count = param ? std::min<uint8_t>(param->retry_count, 7) : 7;
  req.pkey = 0xFFFF;
  req.path_mtu = static_cast<uint8_t>(id->path.mtu);
  req.rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
  req.max_cm_retries = static_cast<uint8_t>(max_retries());
  req.srq = id->pub.qp ? id->pub.qp->srq != nullptr : (param && param->srq);
  req.primary.local_gid = cm::gid_for(id, dev.addr());
  req.primary.remote_gid = cm::gid_for(id, c->peer);
  if (id->ib) {
    // The path record's LIDs, within one subnet (the kernel's cm_format_req
    // on an IB path; RoCE keeps the permissive LIDs).
    req.primary.local_lid = dev.lid();
    req.primary.remote_lid = identity_of(c->peer).lid;
    req.primary.subnet_local = true;
  }
  req.primary.packet_rate = static_cast<uint8_t>(id->path.rate);
  req.primary.traffic_class = id->tos.value_or(0);
  req.primary.hop_limit = id->path.hop_limit;
  req.primary.local_ack_timeout = id->ack_timeout.value_or(static_cast<uint8_t>(id->path.packet_life_time + 1));
  uint8_t* pd = req.private_data.data();
  if (offset) {
    w::CmaHeader h;
    h.ip_version = id->pub.route.addr.src_addr.sa_family == AF_INET6 ? 6 : 4;
    h.src_port = id->port;
    h.src_addr = header_addr(&id->pub.route.addr.src_addr);
    h.dst_addr = header_addr(&id->pub.route.addr.dst_addr);
    w::encode(h, std::span<uint8_t, w::CmaHeader::kSize>(pd, w::CmaHeader::kSize));
  }
  if (!id->connect_data.empty()) std::memcpy(pd + offset, id->connect_data.data(), id->connect_data.size());
  if (user_len) std::memcpy(pd + offset + id->connect_data.size(), param->private_data, user_len);
  c->state = ConnState::kReqSent;
  id->conn = c;
  w::MadHeader hdr;
  hdr.tid = c->tid;
  hdr.attr_mod = id->local_ece_options;
  send_mad(*c, hdr, req, true);
  arm_retry(c);
  return 0;
}

int EmuCm::send_sidr_req(Id* id, const rdma_conn_param* param) {
  Device& dev = *id->dev->device;
  size_t user_len = param && param->private_data ? param->private_data_len : 0;
  if (user_len + id->connect_data.size() > w::kSidrReqPrivate - w::CmaHeader::kSize) return fail(EINVAL);
  std::shared_ptr<Conn> c = new_conn(id, &dev, id->peer_device);
  w::SidrReq req;
  req.request_id = c->local_comm_id;
  req.service_id = w::service_id(static_cast<uint16_t>(id->pub.ps), dst_port(id));
  w::CmaHeader h;
  h.ip_version = id->pub.route.addr.src_addr.sa_family == AF_INET6 ? 6 : 4;
  h.src_port = id->port;
  h.src_addr = header_addr(&id->pub.route.addr.src_addr);
  h.dst_addr = header_addr(&id->pub.route.addr.dst_addr);
  w::encode(h, std::span<uint8_t, w::CmaHeader::kSize>(req.private_data.data(), w::CmaHeader::kSize));
  uint8_t* pd = req.private_data.data() + w::CmaHeader::kSize;
  if (!id->connect_data.empty()) std::memcpy(pd, id->connect_data.data(), id->connect_data.size());
  if (user_len) std::memcpy(pd + id->connect_data.size(), param->private_data, user_len);
  c->state = ConnState::kSidrReqSent;
  id->conn = c;
  w::MadHeader hdr;
  hdr.tid = c->tid;
  send_mad(*c, hdr, req, true);
  arm_retry(c);
  return 0;
}

// librdmacm's ucma_valid_param: RDMA_PS_TCP checks the RDMA resources asked
// for against the device's (RDMA_MAX_* means "the device's maximum").
int EmuCm::check_param(Id* id, const rdma_conn_param* param) {
  if (id->pub.ps != RDMA_PS_TCP) return 0;
  if (!id->pub.qp && !param) return fail(EINVAL);
  if (!param) return 0;
  if (param->responder_resources != RDMA_MAX_RESP_RES && param->responder_resources > personality().max_qp_rd_atom)
    return fail(EINVAL);
  if (param->initiator_depth != RDMA_MAX_INIT_DEPTH && param->initiator_depth > personality().max_qp_init_rd_atom)
    return fail(EINVAL);
  return 0;
}

int EmuCm::connect(rdma_cm_id* pub, rdma_conn_param* param) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (check_param(id, param) != 0) return -1;
  if (id->state != IdState::kRouteResolved) return fail(EINVAL);
  id->initiator_depth =
      param && param->initiator_depth != RDMA_MAX_INIT_DEPTH ? param->initiator_depth : personality().max_qp_init_rd_atom;
  id->responder_resources =
      param && param->responder_resources != RDMA_MAX_RESP_RES ? param->responder_resources : personality().max_qp_rd_atom;
  id->last_param = param ? *param : rdma_conn_param{};
  id->last_private.clear();
  if (param && param->private_data && param->private_data_len) {
    auto* p = static_cast<const uint8_t*>(param->private_data);
    id->last_private.assign(p, p + param->private_data_len);
  }
  int ret = id->pub.qp_type == IBV_QPT_UD ? send_sidr_req(id, param) : send_req(id, param);
  if (ret != 0) return ret;
  id->connect_data.clear();
  id->state = IdState::kConnect;
  lock.unlock();
  return complete(id);
}

void EmuCm::on_rep(in_addr src, const w::MadHeader& hdr, const w::Rep& rep) {
  std::shared_ptr<Conn> c = conn_for(src, rep.remote_comm_id, 0);
  if (!c) return;
  if (c->state == ConnState::kEstablished && !c->passive) {
    // Our RTU was lost: the passive side resends its REP; answer it again.
    w::MadHeader h;
    h.tid = c->tid;
    w::Rtu rtu;
    rtu.local_comm_id = c->local_comm_id;
    rtu.remote_comm_id = c->remote_comm_id;
    send_mad_to(*c->device, c->peer, h, rtu);
    return;
  }
  if (c->state != ConnState::kReqSent && c->state != ConnState::kMraReqRcvd) return;
  cancel_retry(*c);
  c->rep = rep;
  c->remote_comm_id = rep.local_comm_id;
  c->remote_qpn = rep.local_qpn;
  c->remote_ca_guid = rep.local_ca_guid;
  c->state = ConnState::kRepRcvd;
  Id* id = c->id;
  if (!id) return;
  id->candidates.clear();
  id->remote_ece_vendor = rep.vendor_id;
  id->remote_ece_options = hdr.attr_mod;
  // The peer's resources, swapped (IBTA 12.7.33): what it answers for is our
  // initiator depth, what it initiates is our responder resources.
  id->initiator_depth = rep.responder_resources;
  id->responder_resources = rep.initiator_depth;
  Event* ev = new_event(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
  std::memcpy(ev->private_data.data(), rep.private_data.data(), w::kRepPrivate);
  fill_conn_param(ev, rep.initiator_depth, rep.responder_resources, *c);
  ev->pub.param.conn.private_data_len = static_cast<uint8_t>(w::kRepPrivate);
  if (!id->pub.qp) {
    post_event(ev);  // the application calls rdma_establish (or rejects)
    return;
  }
  // librdmacm applies the REP's ECE to the QP, moves it to RTR and RTS and has
  // the RTU sent (ucma_process_conn_resp_ece).
  const int ece_err = apply_rep_ece(id, rep.vendor_id, hdr.attr_mod);
  if (ece_err || move_qp_to_rtr(id, RDMA_MAX_RESP_RES) != 0 || move_qp_to_rts(id, RDMA_MAX_INIT_DEPTH) != 0) {
    int err = ece_err ? ece_err : errno;
    move_qp_to_err(id);
    send_rej_for(*c->device, c->peer, c->tid, c->remote_comm_id, c->local_comm_id, w::MsgKind::kRep,
                 w::RejReason::kConsumerDefined, nullptr, 0);
    end_conn(*c);
    id->conn.reset();
    id->connect_error = true;
    ev->pub.event = RDMA_CM_EVENT_CONNECT_ERROR;
    ev->pub.status = -err;
    post_event(ev);
    return;
  }
  settle_local_ece(id);
  send_rtu(*c);
  ev->pub.event = RDMA_CM_EVENT_ESTABLISHED;
  post_event(ev);
}

void EmuCm::send_rtu(Conn& c) {
  w::MadHeader h;
  h.tid = c.tid;
  w::Rtu rtu;
  rtu.local_comm_id = c.local_comm_id;
  rtu.remote_comm_id = c.remote_comm_id;
  c.state = ConnState::kEstablished;
  send_mad_to(*c.device, c.peer, h, rtu);
}

int EmuCm::establish(rdma_cm_id* pub) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id || id->pub.qp) return fail(EINVAL);
  if (!id->conn || id->conn->passive || id->conn->state != ConnState::kRepRcvd) return fail(EINVAL);
  send_rtu(*id->conn);
  return 0;
}

void EmuCm::on_sidr_rep(in_addr src, const w::SidrRep& rep) {
  std::shared_ptr<Conn> c = conn_for(src, rep.request_id, 0);
  if (!c || c->state != ConnState::kSidrReqSent) return;
  Id* id = c->id;
  end_conn(*c);
  if (!id) return;
  if (id->conn == c) id->conn.reset();
  if (rep.status != w::SidrStatus::kValid) {
    if (rep.status == w::SidrStatus::kServiceIdNotSupported && next_candidate(id)) return;
    connection_failed(id, RDMA_CM_EVENT_UNREACHABLE, static_cast<int>(rep.status), rep.private_data.data(),
                      w::kSidrRepPrivate);
    return;
  }
  id->candidates.clear();
  Event* ev = new_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
  std::memcpy(ev->private_data.data(), rep.private_data.data(), w::kSidrRepPrivate);
  rdma_ud_param& ud = ev->pub.param.ud;
  ud.private_data = ev->private_data.data();
  ud.private_data_len = static_cast<uint8_t>(w::kSidrRepPrivate);
  ud.ah_attr = ah_to_peer(id);
  ud.qp_num = rep.qpn;
  ud.qkey = rep.qkey;
  post_event(ev);
}

// ---------------------------------------------------------------------------
// The passive side

// A new id for a connection request to `listener`, on the device it came in on.
Id* EmuCm::child_of(Id* listener, Device& dev, in_addr src, const w::CmaHeader* h, uint16_t port) {
  Id* child = new_id(listener->channel, false, listener->pub.context, listener->pub.ps, listener->pub.qp_type);
  child->listener = listener;
  if (attach_device(child, cm_device(&dev)) != 0) {
    ids_.erase(&child->pub);
    delete child;
    return nullptr;
  }
  if (listener->pub.pd) child->pub.pd = listener->pub.pd;
  int family = h && h->ip_version == 6 ? AF_INET6 : AF_INET;
  if (h) {
    addr_from_header(&child->pub.route.addr.src_storage, family, h->dst_addr, port);
    addr_from_header(&child->pub.route.addr.dst_storage, family, h->src_addr, h->src_port);
    // A request to a device's IPv6 address: the connection uses the IPv6 GIDs.
    in_addr dst{};
    child->v6 = family == AF_INET6 && ipv4_in_ipv6(h->dst_addr.data(), &dst);
  } else {
    w::Gid mine = gid_of(dev.addr()), theirs = gid_of(src);
    addr_from_header(&child->pub.route.addr.src_storage, AF_INET6, mine, port);
    addr_from_header(&child->pub.route.addr.dst_storage, AF_INET6, theirs, 0);
  }
  child->port = port;
  child->peer_device = src;
  auto& ib = child->pub.route.addr.addr.ibaddr;
  w::Gid s = cm::gid_for(child, dev.addr()), d = cm::gid_for(child, src);
  std::memcpy(ib.sgid.raw, s.data(), 16);
  std::memcpy(ib.dgid.raw, d.data(), 16);
  ib.pkey = htobe16(0xffff);
  fill_route(child);
  child->state = IdState::kConnect;
  return child;
}

// rdma_cm's backlog is the number of connection requests a listener has
// queued and the application not yet taken (the kernel's ucma counts them so).
// A request beyond it is dropped unanswered, as ucma has ib_cm drop it, so
// the requester's resend finds room once the application takes one.
bool EmuCm::backlog_full(const Id* listener) {
  int queued = 0;
  for (const Event* ev : listener->channel->queue)
    if (ev->pub.event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->pub.listen_id == &listener->pub) ++queued;
  if (queued < listener->backlog) return false;
  stats_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Whether a REQ's primary path can end at this device's port. InfiniBand:
// it names the port GID (fe80::/64 and the GUID) as the remote one. RoCE:
// rdma_cm names IP GIDs at both ends, so a link-local requester GID comes
// from an InfiniBand port, which shares no link with this one.
bool EmuCm::path_fits_port(const Device& dev, const w::ReqPath& path) {
  if (dev.link_layer() == LinkLayer::kInfiniBand) return path.remote_gid == cm::ib_gid_of(dev.addr());
  return !(path.local_gid[0] == 0xfe && path.local_gid[1] == 0x80);
}

void EmuCm::on_req(Device& dev, in_addr src, const w::MadHeader& hdr, const w::Req& req) {
  // A REQ we already have: the sender did not hear from us in time.
  for (auto& [cid, c] : conns_) {
    if (!c->passive || c->remote_comm_id != req.local_comm_id || c->remote_ca_guid != req.local_ca_guid) continue;
    stats_.rx_duplicates.fetch_add(1, std::memory_order_relaxed);
    if (c->state == ConnState::kReqRcvd || c->state == ConnState::kMraReqSent) {
      // The application has not answered: ask for more time (MRA).
      c->state = ConnState::kMraReqSent;
      w::MadHeader h;
      h.tid = c->tid;
      w::Mra mra;
      mra.local_comm_id = c->local_comm_id;
      mra.remote_comm_id = c->remote_comm_id;
      mra.message_mraed = w::MsgKind::kReq;
      mra.service_timeout = kMraServiceTimeout;
      send_mad_to(dev, src, h, mra);
    } else if (c->state == ConnState::kTimewait) {
      send_rej_for(dev, src, hdr.tid, req.local_comm_id, c->local_comm_id, w::MsgKind::kReq, w::RejReason::kStaleConn,
                   nullptr, 0);
    }
    return;
  }
  // A REQ from a QP whose old connection is still in time-wait: stale (IBTA 12.9.8.3.1).
  for (auto& [cid, c] : conns_) {
    if (c->state == ConnState::kTimewait && c->remote_qpn == req.local_qpn && c->remote_ca_guid == req.local_ca_guid) {
      send_rej_for(dev, src, hdr.tid, req.local_comm_id, 0, w::MsgKind::kReq, w::RejReason::kStaleConn, nullptr, 0);
      return;
    }
  }
  uint16_t ps = w::service_ps(req.service_id);
  uint16_t port = w::service_port(req.service_id);
  w::CmaHeader h;
  bool ip = ps != RDMA_PS_IB;
  Id* listener = nullptr;
  if ((req.service_id & w::kIpServiceMask) == w::kIpServicePrefix) {
    if (ip && (!w::decode(req.private_data, h) || h.cma_version != 0 || (h.ip_version != 4 && h.ip_version != 6))) {
      stats_.rx_dropped.fetch_add(1, std::memory_order_relaxed);
      return;  // not rdma_cm's header: no service of ours
    }
    sockaddr_storage dst{};
    if (ip) addr_from_header(&dst, h.ip_version == 6 ? AF_INET6 : AF_INET, h.dst_addr, port);
    listener = find_listener(cm_device(&dev), ps, port, ip ? reinterpret_cast<sockaddr*>(&dst) : nullptr);
  }
  const bool xrc = req.transport == w::Transport::kXrc && req.extended_transport == 1;
  if (!listener || (req.transport == w::Transport::kXrc && !xrc) || req.transport == w::Transport::kRd) {
    send_rej_for(dev, src, hdr.tid, req.local_comm_id, 0, w::MsgKind::kReq,
                 listener ? w::RejReason::kInvalidTransportType : w::RejReason::kInvalidServiceId, nullptr, 0);
    return;
  }
  if (!path_fits_port(dev, req.primary)) {
    // The path does not end at this port: the requester is on the other link
    // layer. The kernel's cm_req_handler, finding no GID of the port for the
    // path, rejects with "invalid GID" (IBTA 12.6.7.2, reason 12).
    send_rej_for(dev, src, hdr.tid, req.local_comm_id, 0, w::MsgKind::kReq, w::RejReason::kInvalidGid, nullptr, 0);
    return;
  }
  if (backlog_full(listener)) return;
  Id* child = child_of(listener, dev, src, ip ? &h : nullptr, port);
  if (!child) {
    send_rej_for(dev, src, hdr.tid, req.local_comm_id, 0, w::MsgKind::kReq, w::RejReason::kNoResources, nullptr, 0);
    return;
  }
  std::shared_ptr<Conn> c = new_conn(child, &dev, src);
  c->passive = true;
  c->req = req;
  c->tid = hdr.tid;
  c->remote_comm_id = req.local_comm_id;
  c->remote_ca_guid = req.local_ca_guid;
  c->remote_qpn = req.local_qpn;
  c->state = ConnState::kReqRcvd;
  child->conn = c;
  child->remote_ece_vendor = req.vendor_id;
  child->remote_ece_options = hdr.attr_mod;
  child->responder_resources = req.initiator_depth;
  child->initiator_depth = req.responder_resources;
  // The new id's QP type is the REQ's (the kernel's cm_req_get_qp_type): an
  // XRC initiator's peer is an XRC target.
  if (req.transport == w::Transport::kUc) child->pub.qp_type = IBV_QPT_UC;
  if (xrc) child->pub.qp_type = IBV_QPT_XRC_RECV;

  Event* ev = new_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  ev->id = listener;  // counted against the listener, as librdmacm does
  ev->pub.listen_id = &listener->pub;
  size_t offset = ip ? w::CmaHeader::kSize : 0;
  std::memcpy(ev->private_data.data(), req.private_data.data() + offset, w::kReqPrivate - offset);
  fill_conn_param(ev, req.initiator_depth, req.responder_resources, *c);
  ev->pub.param.conn.private_data_len = static_cast<uint8_t>(w::kReqPrivate - offset);
  post_event(ev);
}

void EmuCm::on_sidr_req(Device& dev, in_addr src, const w::MadHeader& hdr, const w::SidrReq& req) {
  // A SIDR_REQ we already have, resent because our answer is late: the
  // application has it and will answer it once (ib_cm drops the duplicate).
  for (auto& [cid, c] : conns_) {
    if (c->passive && c->state == ConnState::kSidrReqRcvd && c->remote_comm_id == req.request_id &&
        c->peer.s_addr == src.s_addr) {
      stats_.rx_duplicates.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  uint16_t ps = w::service_ps(req.service_id);
  uint16_t port = w::service_port(req.service_id);
  w::CmaHeader h;
  Id* listener = nullptr;
  if ((req.service_id & w::kIpServiceMask) == w::kIpServicePrefix && w::decode(req.private_data, h) &&
      h.cma_version == 0 && (h.ip_version == 4 || h.ip_version == 6)) {
    sockaddr_storage dst{};
    addr_from_header(&dst, h.ip_version == 6 ? AF_INET6 : AF_INET, h.dst_addr, port);
    listener = find_listener(cm_device(&dev), ps, port, reinterpret_cast<sockaddr*>(&dst));
  }
  if (listener && backlog_full(listener)) return;
  Id* child = listener ? child_of(listener, dev, src, &h, port) : nullptr;
  if (!child) {
    w::MadHeader rh;
    rh.tid = hdr.tid;
    w::SidrRep rep;
    rep.request_id = req.request_id;
    rep.status = w::SidrStatus::kServiceIdNotSupported;
    rep.service_id = req.service_id;
    send_mad_to(dev, src, rh, rep);
    return;
  }
  std::shared_ptr<Conn> c = new_conn(child, &dev, src);
  c->passive = true;
  c->tid = hdr.tid;
  c->remote_comm_id = req.request_id;
  c->sidr_service_id = req.service_id;
  c->state = ConnState::kSidrReqRcvd;
  child->conn = c;
  Event* ev = new_event(child, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  ev->id = listener;
  ev->pub.listen_id = &listener->pub;
  std::memcpy(ev->private_data.data(), req.private_data.data() + w::CmaHeader::kSize,
              w::kSidrReqPrivate - w::CmaHeader::kSize);
  ev->pub.param.ud.private_data = ev->private_data.data();
  ev->pub.param.ud.private_data_len = static_cast<uint8_t>(w::kSidrReqPrivate - w::CmaHeader::kSize);
  ev->pub.param.ud.ah_attr = ah_to_peer(child);
  post_event(ev);
}

// A SIDR_REP for the connection's request; a valid one carries the QP and the
// port space's Q_Key.
void EmuCm::send_sidr_rep(Conn& c, w::SidrStatus status, uint32_t qpn, const void* data, size_t len) {
  w::MadHeader h;
  h.tid = c.tid;
  w::SidrRep rep;
  rep.request_id = c.remote_comm_id;
  rep.status = status;
  rep.service_id = c.sidr_service_id;
  if (status == w::SidrStatus::kValid) {
    rep.qpn = qpn;
    rep.qkey = RDMA_UDP_QKEY;
  }
  if (data && len) std::memcpy(rep.private_data.data(), data, std::min(len, rep.private_data.size()));
  send_mad_to(*c.device, c.peer, h, rep);
}

int EmuCm::accept(rdma_cm_id* pub, rdma_conn_param* param) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (!id->pub.qp && !param) return fail(EINVAL);
  if (check_param(id, param) != 0) return -1;
  std::shared_ptr<Conn> c = id->conn;
  if (id->state != IdState::kConnect || !c || !c->passive) return fail(EINVAL);
  if (c->state == ConnState::kSidrReqRcvd) {
    size_t len = param && param->private_data ? param->private_data_len : 0;
    if (len > w::kSidrRepPrivate) return fail(EINVAL);
    send_sidr_rep(*c, w::SidrStatus::kValid, id->pub.qp ? id->pub.qp->qp_num : param->qp_num,
                  len ? param->private_data : nullptr, len);
    end_conn(*c);
    id->conn.reset();
    if (id->sync) ack_held_event(id);
    return 0;
  }
  if (c->state != ConnState::kReqRcvd && c->state != ConnState::kMraReqSent) return fail(EINVAL);
  size_t len = param && param->private_data ? param->private_data_len : 0;
  if (len > w::kRepPrivate) return fail(EINVAL);
  // librdmacm: the application's resources, or what the request offered
  // within the device's limits.
  if (!param || param->initiator_depth == RDMA_MAX_INIT_DEPTH)
    id->initiator_depth = std::min<uint8_t>(id->initiator_depth, static_cast<uint8_t>(personality().max_qp_init_rd_atom));
  else
    id->initiator_depth = param->initiator_depth;
  if (!param || param->responder_resources == RDMA_MAX_RESP_RES)
    id->responder_resources = std::min<uint8_t>(id->responder_resources, static_cast<uint8_t>(personality().max_qp_rd_atom));
  else
    id->responder_resources = param->responder_resources;
  w::Rep& rep = c->rep;
  rep.local_comm_id = c->local_comm_id;
  rep.remote_comm_id = c->remote_comm_id;
  rep.local_qpn = id->pub.qp ? id->pub.qp->qp_num : param->qp_num;
  rep.starting_psn = random_psn();
  rep.responder_resources = id->responder_resources;
  rep.initiator_depth = id->initiator_depth;
  rep.target_ack_delay = personality().local_ca_ack_delay;
  rep.end_to_end_flow_control = param && param->flow_control;
  rep.rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
  rep.srq = id->pub.qp ? id->pub.qp->srq != nullptr : param->srq;
  rep.local_ca_guid = c->device->guid();
  rep.vendor_id = id->remote_ece_vendor & 0xFFFFFF;  // answered with the ID it came with
  if (len) std::memcpy(rep.private_data.data(), param->private_data, len);
  if (move_qp_to_rtr(id, id->responder_resources) != 0 || move_qp_to_rts(id, id->initiator_depth) != 0) return -1;
  c->state = ConnState::kRepSent;
  w::MadHeader h;
  h.tid = c->tid;
  h.attr_mod = id->local_ece_options;
  send_mad(*c, h, rep, true);
  arm_retry(c);
  lock.unlock();
  return complete(id);
}

int EmuCm::reject(rdma_cm_id* pub, const void* private_data, uint8_t len) {
  return reject_with(pub, private_data, len, w::RejReason::kConsumerDefined);
}

int EmuCm::reject_ece(rdma_cm_id* pub, const void* private_data, uint8_t len) {
  // IBTA's "vendor option not supported".
  return reject_with(pub, private_data, len, static_cast<w::RejReason>(35));
}

int EmuCm::reject_with(rdma_cm_id* pub, const void* private_data, uint8_t len, w::RejReason reason) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  std::shared_ptr<Conn> c = id->conn;
  if (!c) return fail(EINVAL);
  if (c->state == ConnState::kSidrReqRcvd) {
    if (len > w::kSidrRepPrivate) return fail(EINVAL);
    send_sidr_rep(*c, w::SidrStatus::kRejected, 0, private_data, len);
  } else if (c->state == ConnState::kReqRcvd || c->state == ConnState::kMraReqSent ||
             (c->state == ConnState::kRepRcvd && !c->passive)) {
    if (len > w::kRejPrivate) return fail(EINVAL);
    send_rej_for(*c->device, c->peer, c->tid, c->remote_comm_id, c->local_comm_id,
                 c->passive ? w::MsgKind::kReq : w::MsgKind::kRep, reason, private_data, len);
  } else {
    return fail(EINVAL);
  }
  end_conn(*c);
  id->conn.reset();
  return 0;
}

int EmuCm::notify(rdma_cm_id* pub, ibv_event_type event) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (event != IBV_EVENT_COMM_EST) return fail(EINVAL);
  std::shared_ptr<Conn> c = id->conn;
  if (!c) return fail(EINVAL);
  if (c->state == ConnState::kEstablished) return fail(EISCONN);
  if (c->state != ConnState::kRepSent && c->state != ConnState::kMraRepRcvd) return fail(EINVAL);
  // Data arrived before the RTU: the connection is established (IBTA 12.9.7.1).
  cancel_retry(*c);
  c->state = ConnState::kEstablished;
  Event* ev = new_event(id, RDMA_CM_EVENT_ESTABLISHED, 0);
  fill_conn_param(ev, c->rep.initiator_depth, c->rep.responder_resources, *c);
  post_event(ev);
  return 0;
}

int EmuCm::disconnect(rdma_cm_id* pub) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (!id->pub.verbs) return fail(EINVAL);
  std::shared_ptr<Conn> c = id->conn;
  if (!c) return fail(EINVAL);
  move_qp_to_err(id);  // librdmacm's ucma_shutdown on an IB transport
  switch (c->state) {
    case ConnState::kEstablished:
    case ConnState::kRepSent:
    case ConnState::kMraRepRcvd:
    case ConnState::kRepRcvd:
      cancel_retry(*c);
      send_dreq(c);
      break;
    case ConnState::kDreqRcvd:
      send_drep(*c);
      enter_timewait(c);
      return 0;  // DISCONNECTED was reported when the DREQ came
    case ConnState::kDreqSent:
    case ConnState::kTimewait:
      return 0;
    default:
      return fail(EINVAL);
  }
  lock.unlock();
  return complete(id);
}

int EmuCm::get_request(rdma_cm_id* listen_pub, rdma_cm_id** out) {
  Id* listen;
  {
    Lock lock(mu_);
    listen = find_id(listen_pub);
    if (!listen || !out) return fail(EINVAL);
    if (!listen->sync) return fail(EINVAL);
    ack_held_event(listen);
  }
  rdma_cm_event* event = nullptr;
  if (get_cm_event(&listen->channel->pub, &event) != 0) return -1;
  int err = 0;
  if (event->event == RDMA_CM_EVENT_REJECTED)
    err = ECONNREFUSED;
  else if (event->status)
    err = event->status < 0 ? -event->status : event->status;
  else if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST)
    err = EINVAL;
  if (!err) {
    std::optional<ibv_qp_init_attr> qp_attr;
    ibv_pd* pd;
    {
      Lock lock(mu_);
      qp_attr = listen->ep_qp_init_attr;
      pd = listen->pub.pd;
    }
    if (qp_attr) {
      ibv_qp_init_attr_ex ex{};
      std::memcpy(&ex, &*qp_attr, sizeof *qp_attr);
      ex.comp_mask = IBV_QP_INIT_ATTR_PD;
      ex.pd = pd ? pd : event->id->pd;
      if (create_qp_ex(event->id, &ex) != 0) err = errno;
    }
  }
  Lock lock(mu_);
  if (err) {
    listen->pub.event = event;
    errno = err;
    return -1;
  }
  *out = event->id;
  event->id->event = event;
  return 0;
}

}  // namespace softverbs::emu

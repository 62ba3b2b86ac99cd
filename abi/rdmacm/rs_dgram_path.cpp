// rsockets: the datagram path behind the socket calls (rs_dgram.hpp describes
// the protocol): the UD QPs per source address, destinations and their
// address handles, the UDP exchange that learns a peer's QPN, and the
// completions. Every function runs with rs.mu held.
#include <endian.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "abi/rdmacm/rs_dgram.hpp"

namespace softverbs::abi::rs {
namespace {

int fail(int err) {
  errno = err;
  return -1;
}

bool same_addr(const sockaddr_storage& a, const sockaddr_storage& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

bool is_any(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    const auto& s = reinterpret_cast<const sockaddr_in&>(a);
    return s.sin_addr.s_addr == htonl(INADDR_ANY) || s.sin_addr.s_addr == htonl(INADDR_LOOPBACK);
  }
  const auto& s6 = reinterpret_cast<const sockaddr_in6&>(a);
  return IN6_IS_ADDR_UNSPECIFIED(&s6.sin6_addr) || IN6_IS_ADDR_LOOPBACK(&s6.sin6_addr);
}

uint16_t port_of(const sockaddr_storage& a) {
  return a.ss_family == AF_INET ? reinterpret_cast<const sockaddr_in&>(a).sin_port
                                : reinterpret_cast<const sockaddr_in6&>(a).sin6_port;
}

void set_port(sockaddr_storage& a, uint16_t port) {
  if (a.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in&>(a).sin_port = port;
  else
    reinterpret_cast<sockaddr_in6&>(a).sin6_port = port;
}

// The address in the family of a socket of `domain` (v4-mapped for AF_INET6).
bool to_family(sockaddr_storage& a, int domain) {
  if (a.ss_family == domain) return true;
  if (a.ss_family == AF_INET && domain == AF_INET6) {
    sockaddr_in v4;
    std::memcpy(&v4, &a, sizeof v4);
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_port = v4.sin_port;
    v6.sin6_addr.s6_addr[10] = v6.sin6_addr.s6_addr[11] = 0xff;
    std::memcpy(&v6.sin6_addr.s6_addr[12], &v4.sin_addr, 4);
    a = {};
    std::memcpy(&a, &v6, sizeof v6);
    return true;
  }
  return false;
}

// rdma-core's ds_format_hdr.
void format_hdr(DsHeader& h, const sockaddr_storage& a) {
  h = {};
  if (a.ss_family == AF_INET) {
    const auto& s = reinterpret_cast<const sockaddr_in&>(a);
    h.version = 4;
    h.length = kDsIpv4HdrLen;
    h.port = s.sin_port;
    h.addr.ipv4 = s.sin_addr.s_addr;
  } else {
    const auto& s6 = reinterpret_cast<const sockaddr_in6&>(a);
    h.version = 6;
    h.length = kDsIpv6HdrLen;
    h.port = s6.sin6_port;
    h.addr.ipv6.flowinfo = s6.sin6_flowinfo;
    std::memcpy(h.addr.ipv6.addr, &s6.sin6_addr, 16);
  }
}

// rdma-core's ds_get_src_addr: the socket's own address, or when it is a
// wildcard, the address the kernel routes to dst from, with our port.
int get_src_addr(const Dgram& dg, const sockaddr_storage& dst, sockaddr_storage* src) {
  sockaddr_storage raw{};
  socklen_t len = sizeof raw;
  if (getsockname(dg.udp, reinterpret_cast<sockaddr*>(&raw), &len) != 0) return -1;
  if (!dgram_norm_addr(reinterpret_cast<sockaddr*>(&raw), len, src)) return fail(EINVAL);
  if (!is_any(*src)) return 0;
  const uint16_t port = port_of(*src);
  const int s = socket(dst.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  int ret = connect(s, reinterpret_cast<const sockaddr*>(&dst), dgram_addr_len(dst));
  if (ret == 0) {
    len = sizeof raw;
    ret = getsockname(s, reinterpret_cast<sockaddr*>(&raw), &len);
    if (ret == 0 && !dgram_norm_addr(reinterpret_cast<sockaddr*>(&raw), len, src)) ret = fail(EINVAL);
  }
  const int e = errno;
  ::close(s);
  errno = e;
  if (ret == 0) set_port(*src, port);
  return ret;
}

void free_qp(DsQp& qp) {
  if (qp.id && qp.id->qp) rdma_destroy_qp(qp.id);
  if (qp.smr) ibv_dereg_mr(qp.smr);
  if (qp.rmr) ibv_dereg_mr(qp.rmr);
  std::free(qp.rbuf);
  if (qp.cq) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(qp.ch, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
    ibv_destroy_cq(qp.cq);
  }
  if (qp.ch) ibv_destroy_comp_channel(qp.ch);
  if (qp.pd) ibv_dealloc_pd(qp.pd);
  if (qp.id) rdma_destroy_id(qp.id);
  qp = DsQp{};
}

// rdma-core's ds_create_qp: a UD QP on an id bound to the source address,
// its receives posted and its CQ armed.
DsQp* create_qp(Rsocket& rs, const sockaddr_storage& src) {
  Dgram& dg = *rs.dg;
  auto qp = std::make_unique<DsQp>();
  qp->addr = src;
  format_hdr(qp->hdr, src);
  auto undo = [&]() -> DsQp* {
    const int e = errno;
    free_qp(*qp);
    errno = e ? e : ENOMEM;
    return nullptr;
  };
  if (rdma_create_id(nullptr, &qp->id, qp.get(), RDMA_PS_UDP) != 0) return undo();
  sockaddr_storage bind_addr = src;
  if (rdma_bind_addr(qp->id, reinterpret_cast<sockaddr*>(&bind_addr)) != 0) return undo();
  if (!qp->id->verbs) return errno = ENODEV, undo();
  if (!(qp->pd = ibv_alloc_pd(qp->id->verbs))) return undo();
  if (!(qp->ch = ibv_create_comp_channel(qp->id->verbs))) return undo();
  const int fl = fcntl(qp->ch->fd, F_GETFL);
  if (fl < 0 || fcntl(qp->ch->fd, F_SETFL, fl | O_NONBLOCK) != 0) return undo();
  if (!(qp->cq = ibv_create_cq(qp->id->verbs, rs.sq_size + rs.rq_size, qp.get(), qp->ch, 0))) return undo();

  const size_t rlen = size_t{rs.rbuf_size} + kGrhLen;
  qp->rbuf = static_cast<uint8_t*>(std::calloc(1, rlen));
  if (!qp->rbuf) return errno = ENOMEM, undo();
  if (!(qp->smr = ibv_reg_mr(qp->pd, dg.sbuf, rs.sbuf_size, IBV_ACCESS_LOCAL_WRITE))) return undo();
  if (!(qp->rmr = ibv_reg_mr(qp->pd, qp->rbuf, rlen, IBV_ACCESS_LOCAL_WRITE))) return undo();

  ibv_qp_init_attr qa{};
  qa.qp_context = qp.get();
  qa.send_cq = qp->cq;
  qa.recv_cq = qp->cq;
  qa.qp_type = IBV_QPT_UD;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = rs.sq_size;
  qa.cap.max_recv_wr = rs.rq_size;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 2;
  qa.cap.max_inline_data = rs.sq_inline;
  if (rdma_create_qp(qp->id, qp->pd, &qa) != 0) return undo();
  rs.sq_inline = static_cast<uint16_t>(std::min<uint32_t>(qa.cap.max_inline_data, kQpMaxSize));

  for (uint32_t i = 0; i < rs.rq_size; ++i)
    if (dgram_post_recv(*qp, i * kSndLowat) != 0) return undo();
  ibv_req_notify_cq(qp->cq, 0);
  qp->cq_armed = true;
  dg.qps.push_back(std::move(qp));
  return dg.qps.back().get();
}

// The GID table index of gid on the id's port (rdma-core looks at 16 entries).
uint8_t sgid_index(rdma_cm_id* id, const ibv_gid& gid) {
  for (int i = 0; i < 16; ++i) {
    ibv_gid g{};
    if (ibv_query_gid(id->verbs, id->port_num, i, &g) == 0 && std::memcmp(&g, &gid, sizeof g) == 0)
      return static_cast<uint8_t>(i);
  }
  return 0;
}

// rdma-core's udp_svc_create_ah: a route from the QP's address to the
// destination, resolved on an id of its own, and the address handle from it.
void create_ah(DsDest& d, uint32_t qpn) {
  if (d.ah) ibv_destroy_ah(d.ah);
  d.ah = nullptr;
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP) != 0) return;
  sockaddr_storage src = d.qp->addr;
  set_port(src, 0);
  sockaddr_storage dst = d.addr;
  if (rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        kDsResolveTimeoutMs) == 0 &&
      rdma_resolve_route(id, kDsResolveTimeoutMs) == 0 && id->route.path_rec) {
    const ibv_sa_path_rec& p = *id->route.path_rec;
    ibv_port_attr pa{};
    const bool eth =
        ibv_query_port(d.qp->id->verbs, d.qp->id->port_num, &pa) == 0 && pa.link_layer == IBV_LINK_LAYER_ETHERNET;
    ibv_ah_attr attr{};
    // RoCE needs the GRH whatever the hop limit (rdma-core keys it on the
    // hop limit alone, which a RoCE route always has above 1).
    if (p.hop_limit > 1 || eth) {
      attr.is_global = 1;
      attr.grh.dgid = p.dgid;
      attr.grh.flow_label = be32toh(p.flow_label);
      attr.grh.sgid_index = sgid_index(d.qp->id, p.sgid);
      attr.grh.hop_limit = p.hop_limit;
      attr.grh.traffic_class = p.traffic_class;
    }
    attr.dlid = be16toh(p.dlid);
    attr.sl = p.sl;
    attr.src_path_bits = static_cast<uint8_t>(be16toh(p.slid) & ((1 << pa.lmc) - 1));
    attr.static_rate = p.rate;
    attr.port_num = d.qp->id->port_num;
    d.qpn = qpn;
    d.ah = ibv_create_ah(d.qp->pd, &attr);
  }
  rdma_destroy_id(id);
}

bool valid_udp_hdr(const DsUdpHeader& h, size_t n, int family) {
  return n >= kDsUdpIpv4HdrLen && be32toh(h.tag) == kDsUdpTag &&
         ((h.version == 4 && family == AF_INET && h.length == kDsUdpIpv4HdrLen) ||
          (h.version == 6 && family == AF_INET6 && h.length == kDsUdpIpv6HdrLen)) &&
         n >= h.length;
}

// rdma-core's udp_svc_process_rs for one datagram on the UDP socket: the
// sender's destination entry (and our QP toward it), a CTRL answer to DATA
// (our QPN), the address handle for the QPN it carries, and the payload
// delivered as a received datagram.
void process_udp(Rsocket& rs, uint8_t* buf, size_t n, const sockaddr_storage& from) {
  Dgram& dg = *rs.dg;
  DsUdpHeader h;
  std::memcpy(&h, buf, std::min(n, sizeof h));
  if (!valid_udp_hdr(h, n, from.ss_family)) return;
  const uint32_t qpn = be32toh(h.qpn) & 0xFFFFFF;
  DsDest* d = dgram_get_dest(rs, from);
  if (!d) return;
  if (h.op == kOpData) dgram_send_udp(rs, *d, nullptr, 0, MSG_DONTWAIT, kOpCtrl);
  if (!d->ah || d->qpn != qpn) create_ah(*d, qpn);
  if (h.op != kOpData || dg.rmsgs.size() >= rs.rq_size) return;
  DsHeader src;
  format_hdr(src, from);
  const size_t len = n - h.length;
  DsMsg m;
  m.length = static_cast<uint32_t>(src.length + len);
  m.local.resize(m.length);
  std::memcpy(m.local.data(), &src, src.length);
  std::memcpy(m.local.data() + src.length, buf + h.length, len);
  dg.rmsgs.push_back(std::move(m));
}

// rdma-core's ds_valid_recv, and the header's claimed length inside the datagram.
bool valid_recv(const DsQp& qp, const ibv_wc& wc, uint32_t offset) {
  if (wc.byte_len < kGrhLen + kDsIpv4HdrLen || wc.byte_len > kGrhLen + kSndLowat) return false;
  const DsHeader* h = reinterpret_cast<const DsHeader*>(qp.rbuf + offset);
  return ((h->version == 4 && h->length == kDsIpv4HdrLen) || (h->version == 6 && h->length == kDsIpv6HdrLen)) &&
         wc.byte_len - kGrhLen >= h->length;
}

// rdma-core's ds_poll_cqs: every CQ round robin; a receive is kept when
// there is room in the receive queue, else its slot is posted again.
void poll_cqs(Rsocket& rs) {
  Dgram& dg = *rs.dg;
  const size_t nqp = dg.qps.size();
  for (bool any = true; any;) {
    any = false;
    for (size_t k = 0; k < nqp; ++k) {
      DsQp& qp = *dg.qps[(dg.next_qp + k) % nqp];
      ibv_wc wc[16];
      const int n = ibv_poll_cq(qp.cq, 16, wc);
      for (int i = 0; i < n; ++i) {
        any = true;
        const auto offset = static_cast<uint32_t>(wc[i].wr_id & 0xFFFFFFFF);
        if (wc[i].wr_id & kRecvFlag) {
          if (wc[i].status == IBV_WC_SUCCESS && dg.rmsgs.size() < rs.rq_size && valid_recv(qp, wc[i], offset)) {
            DsMsg m;
            m.qp = &qp;
            m.offset = offset;
            m.length = wc[i].byte_len - kGrhLen;
            dg.rmsgs.push_back(std::move(m));
          } else {
            dgram_post_recv(qp, offset);
          }
        } else {
          dg.free_slots.push_back(offset);
        }
      }
    }
    if (nqp) dg.next_qp = (dg.next_qp + 1) % nqp;
  }
}

}  // namespace

bool dgram_norm_addr(const sockaddr* sa, socklen_t len, sockaddr_storage* out) {
  *out = {};
  if (!sa) return false;
  if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    sockaddr_in in{}, s;
    std::memcpy(&s, sa, sizeof s);
    in.sin_family = AF_INET;
    in.sin_port = s.sin_port;
    in.sin_addr = s.sin_addr;
    std::memcpy(out, &in, sizeof in);
    return true;
  }
  if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    sockaddr_in6 in6{}, s6;
    std::memcpy(&s6, sa, sizeof s6);
    in6.sin6_family = AF_INET6;
    in6.sin6_port = s6.sin6_port;
    in6.sin6_addr = s6.sin6_addr;
    in6.sin6_scope_id = s6.sin6_scope_id;
    std::memcpy(out, &in6, sizeof in6);
    return true;
  }
  return false;
}

socklen_t dgram_addr_len(const sockaddr_storage& a) {
  return a.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

int dgram_post_recv(DsQp& qp, uint32_t offset) {
  // The GRH lands in the area after the slots, the datagram in its slot.
  ibv_sge sge[2];
  sge[0].addr = reinterpret_cast<uintptr_t>(qp.rbuf) + qp.rmr->length - kGrhLen;
  sge[0].length = kGrhLen;
  sge[0].lkey = qp.rmr->lkey;
  sge[1].addr = reinterpret_cast<uintptr_t>(qp.rbuf) + offset;
  sge[1].length = kSndLowat;
  sge[1].lkey = qp.rmr->lkey;
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kRecvFlag | offset;
  wr.sg_list = sge;
  wr.num_sge = 2;
  if (int e = ibv_post_recv(qp.id->qp, &wr, &bad)) return fail(e);
  return 0;
}

int dgram_init_ep(Rsocket& rs) {
  Dgram& dg = *rs.dg;
  // rdma-core's ds_set_qp_size: whole 2 KiB slots, as many as the buffer
  // sizes allow and the queue sizes ask for.
  rs.sq_size = std::min(rs.sq_size, kQpMaxSize);
  rs.rq_size = std::min(rs.rq_size, kQpMaxSize);
  if (rs.rq_size > rs.rbuf_size / kSndLowat)
    rs.rq_size = static_cast<uint16_t>(rs.rbuf_size / kSndLowat);
  else
    rs.rbuf_size = rs.rq_size * kSndLowat;
  if (rs.sq_size > rs.sbuf_size / kSndLowat)
    rs.sq_size = static_cast<uint16_t>(rs.sbuf_size / kSndLowat);
  else
    rs.sbuf_size = rs.sq_size * kSndLowat;
  if (!rs.sq_size) return fail(EINVAL);
  dg.sbuf = static_cast<uint8_t*>(std::calloc(rs.sq_size, kSndLowat));
  if (!dg.sbuf) return fail(ENOMEM);
  dg.free_slots.clear();
  for (uint32_t i = rs.sq_size; i-- > 0;) dg.free_slots.push_back(i * kSndLowat);
  rs.state = kReadable | kWritable;
  return 0;
}

void dgram_pick_source(Dgram& dg, int domain, const sockaddr* dst) {
  sockaddr_storage own{};
  socklen_t len = sizeof own;
  if (getsockname(dg.udp, reinterpret_cast<sockaddr*>(&own), &len) != 0 ||
      port_of(reinterpret_cast<sockaddr_storage&>(own)) != 0)
    return;
  // The kernel's choice for an unbound socket is its route's source, which
  // for addresses of this host is 127.0.0.1 whatever device owns them: the
  // CM's choice names the device that will carry the datagrams.
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP) != 0) return;
  sockaddr_storage to{};
  std::memcpy(&to, dst, dst->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&to), kDsResolveTimeoutMs) == 0) {
    sockaddr_storage src{};
    const sockaddr* local = rdma_get_local_addr(id);
    if (dgram_norm_addr(local, local->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6), &src) &&
        to_family(src, domain)) {
      set_port(src, 0);
      if (::bind(dg.udp, reinterpret_cast<sockaddr*>(&src), dgram_addr_len(src)) != 0) errno = 0;
    }
  }
  rdma_destroy_id(id);
}

DsDest* dgram_get_dest(Rsocket& rs, const sockaddr_storage& addr) {
  Dgram& dg = *rs.dg;
  for (auto& d : dg.dests)
    if (same_addr(d->addr, addr)) return d.get();
  sockaddr_storage src{};
  if (get_src_addr(dg, addr, &src) != 0) return nullptr;
  DsQp* qp = nullptr;
  for (auto& q : dg.qps)
    if (same_addr(q->addr, src)) qp = q.get();
  if (!qp && !(qp = create_qp(rs, src))) return nullptr;
  auto d = std::make_unique<DsDest>();
  d->addr = addr;
  d->qp = qp;
  dg.dests.push_back(std::move(d));
  return dg.dests.back().get();
}

// rdma-core's ds_sendv_udp (at most 8 vectors behind the header).
ssize_t dgram_send_udp(Rsocket& rs, DsDest& d, const iovec* iov, int iovcnt, int flags, uint8_t op) {
  Dgram& dg = *rs.dg;
  if (iovcnt > 8) return fail(ENOTSUP);
  DsUdpHeader h{};
  h.tag = htobe32(kDsUdpTag);
  h.version = d.qp->hdr.version;
  h.op = op;
  h.qpn = htobe32(d.qp->id->qp->qp_num & 0xFFFFFF);
  if (h.version == 4) {
    h.length = kDsUdpIpv4HdrLen;
    h.addr.ipv4 = d.qp->hdr.addr.ipv4;
  } else {
    h.length = kDsUdpIpv6HdrLen;
    std::memcpy(h.addr.ipv6, d.qp->hdr.addr.ipv6.addr, 16);
  }
  iovec miov[9];
  miov[0] = {&h, h.length};
  for (int i = 0; i < iovcnt; ++i) miov[i + 1] = iov[i];
  msghdr msg{};
  msg.msg_name = &d.addr;
  msg.msg_namelen = dgram_addr_len(d.addr);
  msg.msg_iov = miov;
  msg.msg_iovlen = static_cast<size_t>(iovcnt) + 1;
  const ssize_t n = sendmsg(dg.udp, &msg, flags | MSG_NOSIGNAL);
  return n > 0 ? n - h.length : n;
}

void dgram_progress(Rsocket& rs) {
  Dgram& dg = *rs.dg;
  if (!dg.sbuf || dg.udp < 0) return;  // not set up yet, or closed
  // Room for the largest header and slot (a longer datagram is cut, as
  // rdma-core's 2 KiB read cuts it).
  uint8_t buf[kSndLowat + kDsUdpIpv6HdrLen];
  for (int i = 0; i < 64; ++i) {
    sockaddr_storage raw{}, from{};
    socklen_t len = sizeof raw;
    const ssize_t n = recvfrom(dg.udp, buf, sizeof buf, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&raw), &len);
    if (n < 0) break;
    if (dgram_norm_addr(reinterpret_cast<sockaddr*>(&raw), len, &from))
      process_udp(rs, buf, static_cast<size_t>(n), from);
  }
  errno = 0;
  poll_cqs(rs);
}

void dgram_arm(Rsocket& rs) {
  for (auto& qp : rs.dg->qps)
    if (!qp->cq_armed) {
      ibv_req_notify_cq(qp->cq, 0);
      qp->cq_armed = true;
    }
}

void dgram_drain_events(Rsocket& rs) {
  for (auto& qp : rs.dg->qps) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (ibv_get_cq_event(qp->ch, &cq, &ctx) == 0) {
      ibv_ack_cq_events(cq, 1);
      qp->cq_armed = false;
    }
  }
}

void dgram_free(Rsocket& rs) {
  Dgram& dg = *rs.dg;
  for (auto& d : dg.dests)
    if (d->ah) ibv_destroy_ah(d->ah);
  dg.dests.clear();
  dg.conn_dest = nullptr;
  dg.rmsgs.clear();
  for (auto& qp : dg.qps) free_qp(*qp);
  dg.qps.clear();
  std::free(dg.sbuf);
  dg.sbuf = nullptr;
  dg.free_slots.clear();
  if (dg.udp >= 0) ::close(dg.udp);
  dg.udp = -1;
}

}  // namespace softverbs::abi::rs

// rsockets: the descriptor table, socket creation, bind/listen/accept/connect
// and teardown (rsocket.hpp describes the protocol). Each rsocket owns an
// rdma_cm event channel of its own whose fd is the rsocket's descriptor (as in
// rdma-core, so a descriptor never collides with a real fd); the channel is
// always non-blocking and blocking calls poll(2) it.
#include <endian.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "abi/rdmacm/rs_dgram.hpp"
#include "abi/rdmacm/rsocket.hpp"

namespace softverbs::abi::rs {
namespace {

std::mutex g_table_mu;
std::unordered_map<int, RsPtr>& table() {
  static auto* t = new std::unordered_map<int, RsPtr>;  // never destroyed: used from exit paths
  return *t;
}

int fail(int err) {
  errno = err;
  return -1;
}

int set_fd_nonblock(int fd, bool on) {
  const int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

// A fresh socket with its own channel; sizes inherited from a listener.
RsPtr alloc(const Rsocket* parent) {
  auto rs = std::make_shared<Rsocket>();
  if (parent) {
    rs->domain = parent->domain;
    rs->sbuf_size = parent->sbuf_size;
    rs->rbuf_size = parent->rbuf_size;
    rs->sq_inline = parent->sq_inline;
    rs->sq_size = parent->sq_size;
    rs->rq_size = parent->rq_size;
    rs->target_iomap_size = parent->target_iomap_size;
  }
  rs->ch = rdma_create_event_channel();
  if (!rs->ch) return nullptr;
  if (set_fd_nonblock(rs->ch->fd, true) != 0) {
    rdma_destroy_event_channel(rs->ch);
    return nullptr;
  }
  rs->index = rs->ch->fd;
  return rs;
}

// rdma-core's rs_value_to_scale/rs_scale_to_value: an 8-bit count that is
// exact up to 128 and scaled beyond.
int value_to_scale(int value, int bits) {
  return value <= (1 << (bits - 1)) ? value : (1 << (bits - 1)) | (value >> bits);
}
int scale_to_value(int value, int bits) {
  return value <= (1 << (bits - 1)) ? value : (value & ~(1 << (bits - 1))) << bits;
}

void* page_alloc(size_t len) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = std::aligned_alloc(page, (len + page - 1) / page * page);
  if (p) std::memset(p, 0, len);
  return p;
}

void free_ep(Rsocket& rs) {
  if (rs.id && rs.id->qp) rdma_destroy_qp(rs.id);
  free_iomaps(rs);
  if (rs.smr) ibv_dereg_mr(rs.smr);
  if (rs.rmr) ibv_dereg_mr(rs.rmr);
  if (rs.target_mr) ibv_dereg_mr(rs.target_mr);
  rs.smr = rs.rmr = rs.target_mr = nullptr;
  std::free(rs.sbuf);
  std::free(rs.rbuf);
  std::free(rs.target_list);
  rs.sbuf = rs.rbuf = rs.target_list = nullptr;
  rs.target_sgl = nullptr;
  if (rs.cq) {
    drain_cq_events(rs);
    ibv_destroy_cq(rs.cq);
  }
  if (rs.cq_ch) ibv_destroy_comp_channel(rs.cq_ch);
  rs.cq = nullptr;
  rs.cq_ch = nullptr;
  if (rs.own_pd && rs.pd) ibv_dealloc_pd(rs.pd);
  rs.pd = nullptr;
}

// rdma-core's rs_create_ep and rs_init_bufs: the CQ (one for both queues, on
// a completion channel), the RC QP, the buffers and the posted receives.
int create_ep(Rsocket& rs) {
  ibv_context* verbs = rs.id->verbs;
  if (!verbs) return fail(ENODEV);
  ibv_device_attr dattr{};
  int max_size = kQpMaxSize;
  if (ibv_query_device(verbs, &dattr) == 0 && dattr.max_qp_wr < max_size) max_size = dattr.max_qp_wr;
  auto clamp = [&](uint16_t& v) {
    if (v > max_size)
      v = static_cast<uint16_t>(max_size);
    else if (v < kQpMinSize)
      v = kQpMinSize;
  };
  clamp(rs.sq_size);
  clamp(rs.rq_size);

  rs.pd = rs.id->pd;
  if (!rs.pd) {
    rs.pd = ibv_alloc_pd(verbs);
    if (!rs.pd) return -1;
    rs.own_pd = true;
  }
  rs.cq_ch = ibv_create_comp_channel(verbs);
  if (!rs.cq_ch) return -1;
  if (set_fd_nonblock(rs.cq_ch->fd, true) != 0) return -1;
  rs.cq = ibv_create_cq(verbs, rs.sq_size + rs.rq_size, &rs, rs.cq_ch, 0);
  if (!rs.cq) return -1;

  ibv_qp_init_attr qa{};
  qa.qp_context = &rs;
  qa.send_cq = rs.cq;
  qa.recv_cq = rs.cq;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 1;
  qa.cap.max_send_wr = rs.sq_size;
  qa.cap.max_recv_wr = rs.rq_size;
  qa.cap.max_send_sge = 2;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = rs.sq_inline;
  if (rdma_create_qp(rs.id, rs.pd, &qa) != 0) return -1;
  rs.sq_inline = static_cast<uint16_t>(qa.cap.max_inline_data > kQpMaxSize ? kQpMaxSize : qa.cap.max_inline_data);

  // The send buffer, plus room for control messages when they cannot go inline.
  uint32_t total_sbuf = rs.sbuf_size;
  if (rs.sq_inline < sizeof(RsSge)) total_sbuf += sizeof(RsSge) * kQpCtrlSize;
  rs.sbuf = static_cast<uint8_t*>(page_alloc(total_sbuf));
  if (!rs.sbuf) return fail(ENOMEM);
  rs.smr = ibv_reg_mr(rs.pd, rs.sbuf, total_sbuf, IBV_ACCESS_LOCAL_WRITE);
  if (!rs.smr) return -1;

  const size_t tlen = sizeof(RsSge) * kSglSize + sizeof(RsIomap) * rs.target_iomap_size;
  rs.target_list = static_cast<uint8_t*>(page_alloc(tlen));
  if (!rs.target_list) return fail(ENOMEM);
  rs.target_mr = ibv_reg_mr(rs.pd, rs.target_list, tlen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!rs.target_mr) return -1;
  rs.target_sgl = reinterpret_cast<volatile RsSge*>(rs.target_list);
  if (rs.target_iomap_size)
    rs.target_iomap = reinterpret_cast<volatile RsIomap*>(rs.target_list + sizeof(RsSge) * kSglSize);

  rs.rbuf = static_cast<uint8_t*>(page_alloc(rs.rbuf_size));
  if (!rs.rbuf) return fail(ENOMEM);
  rs.rmr = ibv_reg_mr(rs.pd, rs.rbuf, rs.rbuf_size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!rs.rmr) return -1;

  rs.ssgl[0].addr = rs.ssgl[1].addr = reinterpret_cast<uintptr_t>(rs.sbuf);
  rs.ssgl[0].lkey = rs.ssgl[1].lkey = rs.smr->lkey;
  rs.sbuf_bytes_avail = rs.sbuf_size;
  rs.rbuf_free_offset = static_cast<int>(rs.rbuf_size >> 1);
  rs.rbuf_bytes_avail = static_cast<int>(rs.rbuf_size >> 1);
  rs.sqe_avail = rs.sq_size - static_cast<int>(rs.ctrl_max_seqno);
  rs.rseq_comp = rs.rq_size >> 1;
  rs.rmsg.assign(rs.rq_size + 1u, Rsocket::RMsg{});

  for (int i = 0; i < rs.rq_size; ++i) {
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = kRecvFlag;
    if (int e = ibv_post_recv(rs.id->qp, &wr, &bad)) return fail(e);
  }
  ibv_req_notify_cq(rs.cq, 0);
  rs.cq_armed = true;
  return 0;
}

// rdma-core's rs_format_conn_data.
void format_conn_data(const Rsocket& rs, RsConnData* c) {
  std::memset(c, 0, sizeof *c);
  c->version = 1;
  c->flags = kConnFlagIomap | (__BYTE_ORDER == __BIG_ENDIAN ? kConnFlagNet : 0);
  c->credits = htobe16(rs.rq_size);
  c->target_iomap_size = static_cast<uint8_t>(value_to_scale(rs.target_iomap_size, 8));
  c->target_sgl.addr = htobe64(reinterpret_cast<uintptr_t>(rs.target_list));
  c->target_sgl.length = htobe32(kSglSize);
  c->target_sgl.key = htobe32(rs.target_mr->rkey);
  c->data_buf.addr = htobe64(reinterpret_cast<uintptr_t>(rs.rbuf));
  c->data_buf.length = htobe32(rs.rbuf_size >> 1);
  c->data_buf.key = htobe32(rs.rmr->rkey);
}

// rdma-core's rs_save_conn_data: the peer's target SGL, its iomap table, the
// first buffer we may write, and its credits.
void save_conn_data(Rsocket& rs, const RsConnData& c) {
  rs.remote_sgl.addr = be64toh(c.target_sgl.addr);
  rs.remote_sgl.length = be32toh(c.target_sgl.length);
  rs.remote_sgl.key = be32toh(c.target_sgl.key);
  rs.remote_sge = 1;
  const bool host_net = __BYTE_ORDER == __BIG_ENDIAN;
  rs.swap_sgl = host_net != ((c.flags & kConnFlagNet) != 0);
  if (c.flags & kConnFlagIomap) {
    rs.remote_iomap.addr = rs.remote_sgl.addr + sizeof(RsSge) * rs.remote_sgl.length;
    rs.remote_iomap.length = static_cast<uint32_t>(scale_to_value(c.target_iomap_size, 8));
    rs.remote_iomap.key = rs.remote_sgl.key;
  }
  rs.target_sgl[0].addr = be64toh(c.data_buf.addr);
  rs.target_sgl[0].length = be32toh(c.data_buf.length);
  rs.target_sgl[0].key = be32toh(c.data_buf.key);
  rs.sseq_comp = be16toh(c.credits);
  rs.iomap_slots.assign(rs.remote_iomap.length, Rsocket::IoMapping{});
}

// The errno a failed CM step reports, as librdmacm's synchronous calls do.
int event_errno(const rdma_cm_event& ev) {
  if (ev.event == RDMA_CM_EVENT_REJECTED) return ECONNREFUSED;
  if (ev.status < 0) return -ev.status;
  if (ev.status > 0) return ev.status;
  return ev.event == RDMA_CM_EVENT_UNREACHABLE ? ETIMEDOUT : ECONNREFUSED;
}

int resolve_addr(Rsocket& rs) {
  rs.state = kResolvingAddr;
  return rdma_resolve_addr(rs.id, nullptr, reinterpret_cast<sockaddr*>(&rs.dst), 1000 << rs.retries++);
}

int resolve_route(Rsocket& rs) {
  rs.state = kResolvingRoute;
  if (!rs.route.empty()) {
    std::vector<uint8_t> r = std::move(rs.route);
    rs.route.clear();
    return rdma_set_option(rs.id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, r.data(), r.size());
  }
  return rdma_resolve_route(rs.id, 1000 << rs.retries++);
}

int start_connect(Rsocket& rs) {
  if (create_ep(rs) != 0) return -1;
  RsConnData creq;
  format_conn_data(rs, &creq);
  rdma_conn_param param{};
  param.private_data = &creq;
  param.private_data_len = sizeof creq;
  param.flow_control = 1;
  param.retry_count = 7;
  param.rnr_retry_count = 7;
  rs.retries = 0;
  rs.state = kConnecting;
  return rdma_connect(rs.id, &param);
}

// One CM event of a connection being set up; 0, or -1 with errno when the
// connection failed.
int connect_event(Rsocket& rs, const rdma_cm_event& ev) {
  switch (ev.event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      if (rs.state != kResolvingAddr) return 0;
      rs.retries = 0;
      return resolve_route(rs);
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      if (rs.state != kResolvingRoute) return 0;
      return start_connect(rs);
    case RDMA_CM_EVENT_ADDR_ERROR:
      if (ev.status == -ETIMEDOUT && rs.retries <= kConnRetries) return resolve_addr(rs);
      return fail(event_errno(ev));
    case RDMA_CM_EVENT_ROUTE_ERROR:
      if (ev.status == -ETIMEDOUT && rs.retries <= kConnRetries) return resolve_route(rs);
      return fail(event_errno(ev));
    case RDMA_CM_EVENT_ESTABLISHED: {
      if (rs.state != kConnecting) return 0;
      const auto* c = static_cast<const RsConnData*>(ev.param.conn.private_data);
      if (!c || ev.param.conn.private_data_len < sizeof(RsConnData) || c->version != 1) {
        rdma_disconnect(rs.id);
        return fail(ENOTSUP);
      }
      RsConnData copy;
      std::memcpy(&copy, c, sizeof copy);
      save_conn_data(rs, copy);
      rs.cm_connected = true;
      rs.state = kConnectRdwr;
      return 0;
    }
    case RDMA_CM_EVENT_REJECTED:
    case RDMA_CM_EVENT_UNREACHABLE:
    case RDMA_CM_EVENT_CONNECT_ERROR:
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
    case RDMA_CM_EVENT_DISCONNECTED:
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return fail(event_errno(ev));
    default:
      return 0;
  }
}

}  // namespace

void insert(const RsPtr& rs) {
  std::lock_guard lock(g_table_mu);
  table()[rs->index] = rs;
}

RsPtr lookup(int index) {
  std::lock_guard lock(g_table_mu);
  auto it = table().find(index);
  return it == table().end() ? nullptr : it->second;
}

int create(int domain, int type, int protocol) {
  // rdma-core: AF_INET, AF_INET6 and AF_IB; stream (TCP) or datagram (UDP).
  if ((domain != AF_INET && domain != AF_INET6 && domain != AF_IB) || (type != SOCK_STREAM && type != SOCK_DGRAM) ||
      (type == SOCK_STREAM && protocol && protocol != IPPROTO_TCP) ||
      (type == SOCK_DGRAM && protocol && protocol != IPPROTO_UDP))
    return fail(ENOTSUP);
  // AF_IB passes for both types; a datagram one then fails in socket(2)
  // (EAFNOSUPPORT), as rdma-core's does.
  if (type == SOCK_DGRAM) return dgram_create(domain);
  RsPtr rs = alloc(nullptr);
  if (!rs) return -1;
  rs->domain = domain;
  if (rdma_create_id(rs->ch, &rs->id, rs.get(), RDMA_PS_TCP) != 0) {
    const int e = errno;
    rdma_destroy_event_channel(rs->ch);
    return fail(e);
  }
  // rdma-core records the family, which rgetsockname reports before a bind.
  rs->id->route.addr.src_addr.sa_family = static_cast<sa_family_t>(domain);
  insert(rs);
  return rs->index;
}

int bind(Rsocket& rs, const sockaddr* addr) {
  if (rdma_bind_addr(rs.id, const_cast<sockaddr*>(addr)) != 0) return -1;
  rs.state = kBound;
  return 0;
}

int listen(Rsocket& rs, int backlog) {
  if (rs.state == kListening) return 0;
  if (rdma_listen(rs.id, backlog) != 0) return -1;
  rs.state = kListening;
  return 0;
}

void take_requests(Rsocket& rs) {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(rs.ch, &ev) == 0) {
    if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
      PendingRequest req{};
      req.id = ev->id;
      req.param = ev->param.conn;
      req.param.private_data = nullptr;
      req.param.private_data_len = 0;
      const auto* c = static_cast<const RsConnData*>(ev->param.conn.private_data);
      req.valid = c && ev->param.conn.private_data_len >= sizeof(RsConnData) && c->version == 1;
      if (req.valid) std::memcpy(&req.creq, c, sizeof req.creq);
      rs.pending.push_back(req);
    }
    rdma_ack_cm_event(ev);
  }
}

namespace {

// rdma-core's rs_accept: the new socket gets the request's id (moved to a
// channel of its own), its endpoint, the requester's data, and accepts with
// its own connection data.
RsPtr accept_one(Rsocket& listener, PendingRequest& req) {
  if (!req.valid) return nullptr;
  RsPtr rs = alloc(&listener);
  if (!rs) return nullptr;
  if (rdma_migrate_id(req.id, rs->ch) != 0) {
    rdma_destroy_event_channel(rs->ch);
    return nullptr;
  }
  rs->id = req.id;
  rs->id->context = rs.get();
  if (create_ep(*rs) == 0) {
    save_conn_data(*rs, req.creq);
    RsConnData cresp;
    format_conn_data(*rs, &cresp);
    rdma_conn_param param = req.param;
    param.private_data = &cresp;
    param.private_data_len = sizeof cresp;
    if (rdma_accept(rs->id, &param) == 0) {
      rs->cm_connected = true;
      rs->state = kConnectRdwr;
      return rs;
    }
  }
  free_ep(*rs);
  // The id goes back to the caller for its rejection; the channel is ours.
  rdma_migrate_id(req.id, listener.ch);
  rdma_destroy_event_channel(rs->ch);
  return nullptr;
}

}  // namespace

int accept(const RsPtr& lrs, sockaddr* addr, socklen_t* addrlen) {
  std::unique_lock lk(lrs->mu);
  if (lrs->state != kListening) return fail(EBADF);
  for (;;) {
    take_requests(*lrs);
    while (!lrs->pending.empty()) {
      PendingRequest req = lrs->pending.front();
      lrs->pending.pop_front();
      RsPtr rs = accept_one(*lrs, req);
      if (!rs) {
        rdma_reject(req.id, nullptr, 0);
        rdma_destroy_id(req.id);
        continue;
      }
      insert(rs);
      if (addr && addrlen) {
        const sockaddr* peer = rdma_get_peer_addr(rs->id);
        const socklen_t size = peer->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
        std::memcpy(addr, peer, std::min(*addrlen, size));
        *addrlen = size;
      }
      return rs->index;
    }
    if (lrs->fd_flags & O_NONBLOCK) return fail(EAGAIN);
    pollfd pf{lrs->ch->fd, POLLIN, 0};
    lk.unlock();
    const int n = ::poll(&pf, 1, -1);
    lk.lock();
    if (n < 0 && errno != EINTR) return -1;
    if (lrs->state != kListening) return fail(EBADF);
  }
}

int do_connect(Rsocket& rs, std::unique_lock<std::mutex>& lk, bool block) {
  if (rs.state == kInit || rs.state == kBound) {
    rs.retries = 0;
    if (resolve_addr(rs) != 0) {
      rs.err = errno;
      rs.state = kConnectError;
      return -1;
    }
  }
  if (rs.state == kConnectError || rs.state == kDisconnected || rs.state == kError) return fail(ENOTCONN);
  if (!(rs.state & kOpening)) return (rs.state & kConnected) ? 0 : fail(EINVAL);
  for (;;) {
    rdma_cm_event* ev = nullptr;
    while (rdma_get_cm_event(rs.ch, &ev) == 0) {
      const int rc = connect_event(rs, *ev);
      const int e = errno;
      rdma_ack_cm_event(ev);
      if (rc != 0) {
        rs.err = e;
        rs.state = kConnectError;
        return fail(e);
      }
      if (!(rs.state & kOpening)) return 0;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      rs.err = errno;
      rs.state = kConnectError;
      return -1;
    }
    if (!block) return fail(EINPROGRESS);
    pollfd pf{rs.ch->fd, POLLIN, 0};
    lk.unlock();
    const int n = ::poll(&pf, 1, -1);
    lk.lock();
    if (n < 0 && errno != EINTR) return -1;
  }
}

int connect(Rsocket& rs, const sockaddr* addr, socklen_t len) {
  std::unique_lock lk(rs.mu);
  if (rs.state == kInit || rs.state == kBound) {
    if (!addr || len > sizeof rs.dst || len < sizeof(sa_family_t)) return fail(EINVAL);
    std::memcpy(&rs.dst, addr, len);
  }
  return do_connect(rs, lk, !(rs.fd_flags & O_NONBLOCK));
}

void process_cm(Rsocket& rs) {
  if (!rs.ch || (rs.state & kOpening) || rs.state == kListening) return;
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(rs.ch, &ev) == 0) {
    if (ev->event == RDMA_CM_EVENT_DISCONNECTED || ev->event == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      rs.cm_connected = false;
      if (rs.state & kConnected) rs.state = kDisconnected;
    }
    rdma_ack_cm_event(ev);
  }
}

int close(int index) {
  RsPtr rs;
  {
    std::lock_guard lock(g_table_mu);
    auto it = table().find(index);
    if (it == table().end()) return fail(EBADF);
    rs = it->second;
    table().erase(it);
  }
  std::unique_lock lk(rs->mu);
  if (rs->dg) return dgram_close(*rs, lk);
  if (rs->state & kConnected) shutdown(*rs, lk, SHUT_RDWR);
  for (PendingRequest& req : rs->pending) {
    rdma_reject(req.id, nullptr, 0);
    rdma_destroy_id(req.id);
  }
  rs->pending.clear();
  if (rs->cm_connected && rs->id) {
    rdma_disconnect(rs->id);
    process_cm(*rs);
  }
  free_ep(*rs);
  if (rs->id) rdma_destroy_id(rs->id);
  rs->id = nullptr;
  if (rs->ch) rdma_destroy_event_channel(rs->ch);
  rs->ch = nullptr;
  rs->state = kError;
  return 0;
}

}  // namespace softverbs::abi::rs

// The emulated CM's objects and the rdma_cm calls that are bookkeeping:
// event channels, ids, events (their queue, acknowledgement and the wait of a
// synchronous id), options, endpoints and migration. Connection calls are in
// emu/cm/connect.cpp, addresses in emu/cm/addr.cpp, the QP an id drives in
// emu/cm/qp.cpp, the wire protocol in emu/cm/protocol.cpp.
#include "emu/cm/cm.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "core/log.hpp"
#include "core/trace.hpp"
#include "emu/objects/objects.hpp"
#include "emu/provider.hpp"
#include "fabric/scheduler.hpp"

namespace softverbs::emu {

using cm::Channel;
using cm::Event;
using cm::Id;
using cm::IdState;

EmuCm& EmuCm::instance() {
  static EmuCm* cm = new EmuCm;  // lives until exit, like the devices it serves
  return *cm;
}

// ---------------------------------------------------------------------------
// Event channels: pub.fd is one end of a socket pair; each queued event is one
// byte written to the other end, so the fd polls readable exactly while events
// wait and its O_NONBLOCK flag (the application's to set) decides whether
// rdma_get_cm_event blocks.

Channel* EmuCm::new_channel() {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
  auto* ch = new Channel;
  ch->pub.fd = fds[0];
  ch->write_fd = fds[1];
  channels_.insert(ch);
  return ch;
}

// A thread may be blocked reading the channel while another destroys it. With
// the kernel's rdma_cm that read keeps waiting (the file stays open under it),
// so here the writing end stays open until that reader is gone, and the
// reader, which then never wakes, does not see a spurious end of file.
void EmuCm::free_channel(Channel* ch) {
  channels_.erase(ch);
  for (Event* ev : ch->queue) {
    events_.erase(ev);
    delete ev;
  }
  ch->queue.clear();
  close(ch->pub.fd);
  if (ch->readers > 0) {
    ch->destroyed = true;
    return;
  }
  close(ch->write_fd);
  delete ch;
}

// With no emulated device the CM is not there, as librdmacm finds no RDMA
// device (ENODEV): the next provider is asked (SOFTVERBS_BACKEND=both).
rdma_event_channel* EmuCm::create_event_channel() {
  ensure_devices();
  if (devices_.empty()) return fail_null<rdma_event_channel>(ENODEV);
  Lock lock(mu_);
  Channel* ch = new_channel();
  return ch ? &ch->pub : nullptr;
}

void EmuCm::destroy_event_channel(rdma_event_channel* channel) {
  Lock lock(mu_);
  auto* ch = reinterpret_cast<Channel*>(channel);
  if (!channels_.count(ch)) return;
  // librdmacm closes the fd; ids still on it are the application's error.
  free_channel(ch);
}

Event* EmuCm::new_event(Id* id, rdma_cm_event_type type, int status) {
  auto* ev = new Event;
  ev->id = id;
  ev->pub.id = &id->pub;
  ev->pub.event = type;
  ev->pub.status = status;
  return ev;
}

void EmuCm::post_event(Event* ev) {
  Channel* ch = ev->id->channel;
  // Events of an id on no device yet (an address error) are left out: the
  // trace's records are a device's, on its clock.
  if (ev->id->dev && trace::on()) {
    const Device& d = *ev->id->dev->device;
    const uint32_t qpn = ev->id->pub.qp ? ev->id->pub.qp->qp_num : 0;
    trace::event(d.clock(), d.name(), "cm", trace::cm_event_name(ev->pub.event), qpn, ev->pub.status);
  }
  events_.insert(ev);
  ch->queue.push_back(ev);
  char b = 1;
  while (send(ch->write_fd, &b, 1, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  SV_LOG(kDebug, "cm: event %d (status %d) on id %p", static_cast<int>(ev->pub.event), ev->pub.status,
         static_cast<void*>(ev->pub.id));
}

// Events not yet taken by the application whose id goes away are discarded,
// as the kernel's rdma_cm does; their bytes are taken back (a reader that
// already took one finds the queue empty and reads again).
std::vector<Id*> EmuCm::drop_queued_events(Id* id) {
  Channel* ch = id->channel;
  size_t dropped = 0;
  std::vector<Id*> orphans;
  for (auto it = ch->queue.begin(); it != ch->queue.end();) {
    if ((*it)->id == id || (*it)->pub.id == &id->pub) {
      if ((*it)->pub.event == RDMA_CM_EVENT_CONNECT_REQUEST && (*it)->pub.id != &id->pub)
        if (Id* child = find_id((*it)->pub.id)) orphans.push_back(child);
      events_.erase(*it);
      delete *it;
      it = ch->queue.erase(it);
      ++dropped;
    } else {
      ++it;
    }
  }
  char buf[64];
  while (dropped > 0) {
    ssize_t n = recv(ch->pub.fd, buf, std::min(dropped, sizeof buf), MSG_DONTWAIT);
    if (n <= 0) break;
    dropped -= static_cast<size_t>(n);
  }
  return orphans;
}

int EmuCm::get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!event) return fail(EINVAL);
  auto* ch = reinterpret_cast<Channel*>(channel);
  for (;;) {
    int fd;
    {
      // The channel is looked up on every pass: it may have been destroyed
      // (and freed, with no reader left) since the last one.
      Lock lock(mu_);
      // Not a channel (any more): librdmacm would read the descriptor of a
      // destroyed channel, which is closed, so its read fails with EBADF.
      if (!channels_.count(ch)) return fail(EBADF);
      // The wait reads a descriptor of its own, of the same open file (so the
      // application's O_NONBLOCK holds for it): the channel may be destroyed
      // meanwhile, closing pub.fd, whose number the next socket or file of the
      // process may take at once; this read must not then read that file.
      fd = fcntl(ch->pub.fd, F_DUPFD_CLOEXEC, 0);
      if (fd < 0) return fail(errno);
      ch->readers++;
    }
    // Under virtual time the wait runs the engine's work (docs/simulation.md).
    fabric::process_scheduler().wait_readable(fd);
    char b;
    ssize_t n = read(fd, &b, 1);  // blocks unless the application set O_NONBLOCK
    int err = errno;
    close(fd);
    Lock lock(mu_);
    if (--ch->readers == 0 && ch->destroyed) {
      close(ch->write_fd);
      delete ch;
      return fail(EBADF);
    }
    if (!channels_.count(ch)) return fail(EBADF);
    if (n < 0) {
      if (err == EINTR) continue;
      return fail(err);
    }
    if (n == 0) return fail(ENODATA);
    if (ch->queue.empty()) continue;
    Event* ev = ch->queue.front();
    ch->queue.pop_front();
    ev->id->events_reported++;
    if (ev->mc) process_join(ev);
    if (ev->pub.event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->id->sync) {
      // A synchronous listener's new id is synchronous too (librdmacm migrates it).
      Id* child = find_id(ev->pub.id);
      if (child && child->channel == ch) {
        if (Channel* own = new_channel()) {
          own->owned_by_id = true;
          child->channel = own;
          child->pub.channel = &own->pub;
          child->sync = true;
        }
      }
    }
    *event = &ev->pub;
    return 0;
  }
}

int EmuCm::ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  Lock lock(mu_);
  auto* ev = reinterpret_cast<Event*>(event);
  if (!events_.count(ev)) return fail(EINVAL);
  events_.erase(ev);
  ev->id->events_acked++;
  if (ev->mc) ev->mc->acked++;
  delete ev;
  acked_.notify_all();
  return 0;
}

void EmuCm::ack_held_event(Id* id) {
  if (!id->pub.event) return;
  Event* ev = reinterpret_cast<Event*>(id->pub.event);
  id->pub.event = nullptr;
  if (events_.erase(ev)) {
    ev->id->events_acked++;
    delete ev;
    acked_.notify_all();
  }
}

// librdmacm's ucma_complete: a synchronous id's call returns when its event
// arrives, which the id keeps in pub.event until the next call.
int EmuCm::complete(Id* id) {
  if (!id->sync) return 0;
  if (id->pub.event) {
    ack_cm_event(id->pub.event);
    id->pub.event = nullptr;
  }
  rdma_cm_event* ev = nullptr;
  if (get_cm_event(&id->channel->pub, &ev) != 0) return -1;
  id->pub.event = ev;
  if (ev->status) {
    if (ev->event == RDMA_CM_EVENT_REJECTED) return fail(ECONNREFUSED);
    return fail(ev->status < 0 ? -ev->status : ev->status);
  }
  return 0;
}

// ---------------------------------------------------------------------------
// Ids

Id* EmuCm::find_id(rdma_cm_id* id) {
  auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : it->second;
}

Id* EmuCm::new_id(Channel* ch, bool sync, void* context, rdma_port_space ps, ibv_qp_type qp_type) {
  auto* id = new Id;
  id->pub.context = context;
  id->pub.ps = ps;
  id->pub.qp_type = qp_type;
  id->pub.channel = &ch->pub;
  id->channel = ch;
  id->sync = sync;
  if (sync) ch->owned_by_id = true;
  ids_.emplace(&id->pub, id);
  return id;
}

int EmuCm::create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps) {
  if (!out) return fail(EINVAL);
  ensure_devices();
  if (devices_.empty()) return fail(ENODEV);
  ibv_qp_type qp_type = (ps == RDMA_PS_IPOIB || ps == RDMA_PS_UDP) ? IBV_QPT_UD : IBV_QPT_RC;
  if (ps != RDMA_PS_TCP && ps != RDMA_PS_UDP && ps != RDMA_PS_IB && ps != RDMA_PS_IPOIB) return fail(EINVAL);
  Lock lock(mu_);
  Channel* ch;
  bool sync = channel == nullptr;
  if (sync) {
    ch = new_channel();
    if (!ch) return -1;
  } else {
    ch = reinterpret_cast<Channel*>(channel);
    if (!channels_.count(ch)) return fail(EINVAL);
  }
  *out = &new_id(ch, sync, context, ps, qp_type)->pub;
  return 0;
}

void EmuCm::free_id(Lock& lock, Id* id) {
  id->state = IdState::kDestroying;
  id->op_generation++;
  if (id->conn) {
    std::shared_ptr<cm::Conn> c = std::move(id->conn);
    c->id = nullptr;
    // What the IB CM does with a connection whose id goes (ib_destroy_cm_id).
    using cm::ConnState;
    switch (c->state) {
      // The active side gives up on its REQ (Timeout); the passive side
      // turns down a REQ its consumer never answered (Consumer Defined).
      case ConnState::kReqSent:
      case ConnState::kMraReqRcvd:
        send_rej_for(*c->device, c->peer, c->tid, c->remote_comm_id, c->local_comm_id, wire::cm::MsgKind::kOther,
                     wire::cm::RejReason::kTimeout, nullptr, 0);
        end_conn(*c);
        break;
      case ConnState::kReqRcvd:
      case ConnState::kMraReqSent:
        send_rej_for(*c->device, c->peer, c->tid, c->remote_comm_id, c->local_comm_id, wire::cm::MsgKind::kReq,
                     wire::cm::RejReason::kConsumerDefined, nullptr, 0);
        end_conn(*c);
        break;
      case ConnState::kRepSent:
      case ConnState::kRepRcvd:
      case ConnState::kMraRepRcvd:
        send_rej_for(*c->device, c->peer, c->tid, c->remote_comm_id, c->local_comm_id, wire::cm::MsgKind::kRep,
                     wire::cm::RejReason::kConsumerDefined, nullptr, 0);
        end_conn(*c);
        break;
      case ConnState::kEstablished:
        send_dreq(c);
        break;
      case ConnState::kDreqRcvd:
        send_drep(*c);
        enter_timewait(c);
        break;
      case ConnState::kSidrReqRcvd: {
        // An unanswered SIDR_REQ is turned down (ib_cm's destroy: IB_SIDR_REJECT),
        // so that the requester learns it now rather than by timing out.
        send_sidr_rep(*c, wire::cm::SidrStatus::kRejected, 0, nullptr, 0);
        end_conn(*c);
        break;
      }
      case ConnState::kSidrReqSent:
        end_conn(*c);
        break;
      default:
        break;  // DREQ sent or time-wait: the connection ends by itself
    }
  }
  // Requests the application never saw go with their listener (rejected).
  for (Id* orphan : drop_queued_events(id)) free_id(lock, orphan);
  // rdma_destroy_id returns once every event reported on the id is acknowledged.
  acked_.wait(lock, [&] { return id->events_acked >= id->events_reported; });
  ids_.erase(&id->pub);
  for (auto& [pub, other] : ids_)
    if (other->listener == id) other->listener = nullptr;
  if (id->sync) free_channel(id->channel);
  delete id;
}

int EmuCm::destroy_id(rdma_cm_id* pub) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  ack_held_event(id);
  free_id(lock, id);
  return 0;
}

int EmuCm::migrate_id(rdma_cm_id* pub, rdma_event_channel* channel) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (id->sync && !channel) return fail(EINVAL);
  Channel* to;
  bool sync = channel == nullptr;
  if (sync) {
    to = new_channel();
    if (!to) return -1;
    to->owned_by_id = true;
  } else {
    to = reinterpret_cast<Channel*>(channel);
    if (!channels_.count(to)) return fail(EINVAL);
  }
  Channel* from = id->channel;
  if (id->sync) ack_held_event(id);
  // The id's queued events move with it, in order.
  size_t moved = 0;
  for (auto it = from->queue.begin(); it != from->queue.end();) {
    if ((*it)->id == id) {
      to->queue.push_back(*it);
      it = from->queue.erase(it);
      ++moved;
    } else {
      ++it;
    }
  }
  char buf[64];
  for (size_t left = moved; left > 0;) {
    ssize_t n = recv(from->pub.fd, buf, std::min(left, sizeof buf), MSG_DONTWAIT);
    if (n <= 0) break;
    left -= static_cast<size_t>(n);
  }
  for (size_t i = 0; i < moved; ++i) {
    char b = 1;
    (void)!send(to->write_fd, &b, 1, MSG_NOSIGNAL);
  }
  id->channel = to;
  id->pub.channel = &to->pub;
  bool was_sync = id->sync;
  id->sync = sync;
  if (was_sync) free_channel(from);
  return 0;
}

int EmuCm::set_option(rdma_cm_id* pub, int level, int optname, void* optval, size_t optlen) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (!optval) return fail(EINVAL);
  // The kernel's rdma_set_option: each option checks its length.
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->tos = *static_cast<uint8_t*>(optval);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
        if (optlen != sizeof(int)) return fail(EINVAL);
        if (id->state != IdState::kIdle) return fail(EINVAL);
        id->reuse_addr = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_AFONLY:
        if (optlen != sizeof(int)) return fail(EINVAL);
        if (id->state != IdState::kIdle) return fail(EINVAL);
        id->afonly = *static_cast<int*>(optval) ? 1 : 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        id->ack_timeout = *static_cast<uint8_t*>(optval);
        return 0;
      default:
        return fail(ENOSYS);
    }
  }
  if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
    // A path record from rdma_getaddrinfo: the route is given, not resolved.
    if (optlen == 0 || optlen % sizeof(ibv_path_data) != 0) return fail(EINVAL);
    if (id->state != IdState::kAddrResolved) return fail(EINVAL);
    fill_route(id);
    id->state = IdState::kRouteResolved;
    post_event(new_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
    return 0;
  }
  return fail(ENOSYS);
}

// ---------------------------------------------------------------------------
// Endpoints (rdma_create_ep): an id set up from an rdma_addrinfo, with a QP.

int EmuCm::create_ep(rdma_cm_id** out, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!out || !res) return fail(EINVAL);
  rdma_cm_id* pub = nullptr;
  if (create_id(nullptr, &pub, nullptr, static_cast<rdma_port_space>(res->ai_port_space)) != 0) return -1;
  {
    Lock lock(mu_);
    find_id(pub)->pub.qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
  }
  int ret = 0;
  if (res->ai_flags & RAI_PASSIVE) {
    ret = bind_addr(pub, res->ai_src_addr);
    if (ret == 0) {
      Lock lock(mu_);
      Id* id = find_id(pub);
      if (pd) id->pub.pd = pd;
      if (qp_init_attr) {
        id->ep_qp_init_attr = *qp_init_attr;
        id->ep_qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      }
    }
  } else {
    ret = resolve_addr(pub, res->ai_src_addr, res->ai_dst_addr, 2000);
    if (ret == 0) ret = resolve_route(pub, 2000);
    if (ret == 0 && qp_init_attr) {
      qp_init_attr->qp_type = static_cast<ibv_qp_type>(res->ai_qp_type);
      ibv_qp_init_attr_ex ex{};
      std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
      ex.comp_mask = IBV_QP_INIT_ATTR_PD;
      ex.pd = pd ? pd : pub->pd;
      ret = create_qp_ex(pub, &ex);
      std::memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
    }
    if (ret == 0 && res->ai_connect_len) {
      Lock lock(mu_);
      auto* p = static_cast<const uint8_t*>(res->ai_connect);
      find_id(pub)->connect_data.assign(p, p + res->ai_connect_len);
    }
  }
  if (ret != 0) {
    int err = errno;
    destroy_ep(pub);
    errno = err;
    return -1;
  }
  *out = pub;
  return 0;
}

void EmuCm::destroy_ep(rdma_cm_id* pub) {
  {
    Lock lock(mu_);
    if (!find_id(pub)) return;
  }
  if (pub->qp) destroy_qp(pub);
  if (pub->srq) destroy_srq(pub);
  destroy_id(pub);
}

// ---------------------------------------------------------------------------
// Devices (rdma_get_devices): the context of every device, opened by the CM.

ibv_context** EmuCm::get_devices(int* num_devices) {
  ensure_devices();
  if (devices_.empty()) {
    if (num_devices) *num_devices = 0;
    return fail_null<ibv_context*>(ENODEV);
  }
  Lock lock(mu_);
  auto** list = static_cast<ibv_context**>(calloc(devices_.size() + 1, sizeof(ibv_context*)));
  if (!list) return fail_null<ibv_context*>(ENOMEM);
  int n = 0;
  for (auto& d : devices_) {
    if (!d->context && attach_device(nullptr, d.get()) != 0) continue;
    list[n++] = d->context;
  }
  if (num_devices) *num_devices = n;
  return list;
}

void EmuCm::free_devices(ibv_context** list) { free(list); }

// ---------------------------------------------------------------------------
// ECE (librdmacm 44's rules): an application without a QP on the id offers
// vendor options; they travel in the REQ's or REP's vendor ID and attribute
// modifier, and the peer reads what came. Emulated QPs have no vendor options
// (ibv_query_ece answers EOPNOTSUPP), so nothing is applied to them.

int EmuCm::set_local_ece(rdma_cm_id* pub, ibv_ece* ece) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id || id->pub.qp || !ece || !ece->vendor_id || ece->comp_mask) return fail(EINVAL);
  id->local_ece_vendor = ece->vendor_id;
  id->local_ece_options = ece->options;
  return 0;
}

int EmuCm::get_remote_ece(rdma_cm_id* pub, ibv_ece* ece) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id || id->pub.qp || !ece) return fail(EINVAL);
  ece->vendor_id = id->remote_ece_vendor;
  ece->options = id->remote_ece_options;
  ece->comp_mask = 0;
  return 0;
}

}  // namespace softverbs::emu

softverbs::CmProvider* softverbs::emu_cm_provider() { return &emu::EmuCm::instance(); }

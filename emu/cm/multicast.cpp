// rdma_cm multicast on the emulated devices: rdma_join_multicast_ex and
// rdma_leave_multicast, as the kernel's rdma_cm joins on a RoCE port (locally:
// no SA, no IGMP on the emulated wire) and as librdmacm attaches the id's QP
// when the application takes the MULTICAST_JOIN event (docs/rdma-cm.md).
#include <arpa/inet.h>
#include <infiniband/ib.h>

#include <algorithm>
#include <cstring>

#include "emu/cm/cm.hpp"
#include "emu/objects/objects.hpp"
#include "emu/provider.hpp"

namespace softverbs::emu {

using cm::Channel;
using cm::Event;
using cm::Id;
using cm::IdState;
using cm::McJoin;

int EmuCm::join_multicast_ex(rdma_cm_id* pub, rdma_cm_join_mc_attr_ex* attr, void* context) {
  // librdmacm's own checks of the attributes.
  if (!attr || !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) ||
      !(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) || attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
    return fail(EINVAL);
  const size_t len = cm::addr_len(attr->addr);
  if (!len) return fail(EINVAL);
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  // The kernel's rdma_join_multicast: the id must have its device, bound or
  // resolved, and no connection under way.
  if (!id->dev || (id->state != IdState::kAddrBound && id->state != IdState::kAddrResolved)) return fail(EINVAL);
  // RoCEv2 carries IPv4 groups as IPv4-mapped GIDs (cma_iboe_set_mgid); the
  // devices have no IPv6 address, and an IPv6 or AF_IB group is not offered
  // on this port (the kernel: no IPv6 multicast over RoCEv2 here).
  if (attr->addr->sa_family != AF_INET) return fail(EOPNOTSUPP);
  in_addr group = reinterpret_cast<const sockaddr_in*>(attr->addr)->sin_addr;
  if (group.s_addr == 0) return fail(EINVAL);  // cma_zero_addr

  auto mc = std::make_unique<McJoin>();
  std::memcpy(&mc->addr, attr->addr, len);
  mc->context = context;
  mc->join_flags = attr->join_flags;
  const fabric::McastGid gid = fabric::mcast_gid_of(group);
  std::memcpy(mc->mgid.raw, gid.data(), gid.size());

  // The join completes at once (the kernel queues its work item): the event
  // carries the address handle of the group, the multicast QPN and the UDP
  // port space's Q_Key (cma_make_mc_event with ib_init_ah_from_mcmember).
  Device& dev = *id->dev->device;
  const bool up = dev.port_active() && !dev.fatal();
  Event* ev = new_event(id, up ? RDMA_CM_EVENT_MULTICAST_JOIN : RDMA_CM_EVENT_MULTICAST_ERROR, up ? 0 : -ENETUNREACH);
  ev->mc = mc.get();
  ev->pub.param.ud.private_data = context;
  if (up) {
    ibv_ah_attr& ah = ev->pub.param.ud.ah_attr;
    ah.is_global = 1;
    ah.grh.dgid = mc->mgid;
    ah.grh.sgid_index = 1;  // the device's IPv4-mapped RoCEv2 GID
    ah.grh.hop_limit = 64;  // IPV6_DEFAULT_HOPLIMIT
    ah.grh.traffic_class = id->tos.value_or(0);
    ah.port_num = 1;
    ev->pub.param.ud.qp_num = wire::kMulticastQpn;
    ev->pub.param.ud.qkey = RDMA_UDP_QKEY;
  }
  id->mc.push_back(std::move(mc));
  post_event(ev);
  lock.unlock();
  return complete(id);
}

// Under mu_, as the application takes the event (librdmacm's ucma_process_join).
void EmuCm::process_join(Event* ev) {
  McJoin* mc = ev->mc;
  mc->reported++;
  if (ev->pub.event != RDMA_CM_EVENT_MULTICAST_JOIN) return;
  mc->mgid = ev->pub.param.ud.ah_attr.grh.dgid;
  mc->mlid = ev->pub.param.ud.ah_attr.dlid;
  ibv_qp* qp = ev->id->pub.qp;
  // No QP yet, or a send-only member: nothing to attach.
  if (!qp || mc->join_flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) return;
  if (int err = EmuProvider::instance().attach_mcast(qp, &mc->mgid, mc->mlid)) {
    // librdmacm turns a failed attach into MULTICAST_ERROR, status -1.
    errno = err;
    ev->pub.event = RDMA_CM_EVENT_MULTICAST_ERROR;
    ev->pub.status = -1;
  }
}

int EmuCm::leave_multicast(rdma_cm_id* pub, sockaddr* addr) {
  const size_t len = cm::addr_len(addr);
  if (!len) return fail(EINVAL);
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  auto it = std::find_if(id->mc.begin(), id->mc.end(),
                         [&](const std::unique_ptr<McJoin>& m) { return std::memcmp(&m->addr, addr, len) == 0; });
  if (it == id->mc.end()) return fail(EADDRNOTAVAIL);
  std::unique_ptr<McJoin> mc = std::move(*it);
  id->mc.erase(it);
  if (id->pub.qp && mc->join_flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER)
    EmuProvider::instance().detach_mcast(id->pub.qp, &mc->mgid, mc->mlid);  // its result is ignored, as librdmacm does
  // Events of the join not yet taken go (the kernel's ucma_cleanup_mc_events);
  // a synchronous id's kept event is acknowledged; then the call waits for the
  // application to acknowledge those it took.
  Channel* ch = id->channel;
  size_t dropped = 0;
  for (auto q = ch->queue.begin(); q != ch->queue.end();) {
    if ((*q)->mc == mc.get()) {
      events_.erase(*q);
      delete *q;
      q = ch->queue.erase(q);
      ++dropped;
    } else {
      ++q;
    }
  }
  char buf[16];
  while (dropped > 0) {
    ssize_t n = recv(ch->pub.fd, buf, std::min(dropped, sizeof buf), MSG_DONTWAIT);
    if (n <= 0) break;
    dropped -= static_cast<size_t>(n);
  }
  if (id->sync && id->pub.event && reinterpret_cast<Event*>(id->pub.event)->mc == mc.get()) {
    Event* kept = reinterpret_cast<Event*>(id->pub.event);
    id->pub.event = nullptr;
    if (events_.erase(kept)) {
      id->events_acked++;
      mc->acked++;
      delete kept;
    }
  }
  McJoin* m = mc.get();
  acked_.wait(lock, [&] { return m->acked >= m->reported; });
  return 0;
}

// Under mu_. The device failed: every group joined through it is lost
// (status -ENETRESET, what the kernel's multicast module reports when a port
// loses its groups), before the ids see DEVICE_REMOVAL.
void EmuCm::fail_joins(Device& dev) {
  for (auto& [pub, id] : ids_) {
    if (!id->dev || id->dev->device != &dev || id->state == IdState::kDestroying) continue;
    for (auto& mc : id->mc) {
      Event* ev = new_event(id, RDMA_CM_EVENT_MULTICAST_ERROR, -ENETRESET);
      ev->mc = mc.get();
      ev->pub.param.ud.private_data = mc->context;
      post_event(ev);
    }
  }
}

}  // namespace softverbs::emu

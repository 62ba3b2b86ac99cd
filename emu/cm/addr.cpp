// Addresses in the emulated CM (docs/rdma-cm.md, "Addresses"): which device an
// IP address belongs to, ports and their conflicts, address and route
// resolution, rdma_getaddrinfo, and listening.
//
// The model: each emulated device owns one IPv4 address (its RoCEv2 GID is the
// IPv4-mapped form) and one IPv6 address that carries it (fd73:7665:7262::a.b.c.d,
// emu/device/identity.hpp), so every rule below holds for both: the IPv6 one
// resolves, binds and listens as the IPv4 one does, with GIDs of its own.
// An address a device of this process owns resolves to it; another 127/8
// address resolves when some process of this host has a device there (its UDP
// port 4791 is bound: the emulated ARP answer), or fails with
// ADDR_ERROR/-ETIMEDOUT when nothing answers within the timeout; 127.0.0.1 and
// ::1 are "this host's RDMA" (the loopback service): a connection to them is
// offered to every device of the host in turn until one has a listener. Other
// addresses (other hosts, a kernel rxe) resolve when the host has a route.
#include <arpa/inet.h>
#include <infiniband/ib.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "emu/cm/cm.hpp"
#include "emu/device/host.hpp"
#include "emu/objects/objects.hpp"
#include "emu/provider.hpp"

namespace softverbs::emu {

using cm::CmDevice;
using cm::Id;
using cm::IdState;
using cm::addr_len;
using cm::gid_of;

namespace {

constexpr uint32_t kLoopback = 0x7f000001;  // 127.0.0.1, host order

bool is_loopback_range(in_addr a) { return (ntohl(a.s_addr) >> 24) == 127; }

// The IPv4 address a socket address names (v4-mapped and AF_IB GIDs included,
// and a device's IPv6 address, which carries it); ::1 is 127.0.0.1 and :: is
// 0.0.0.0. False for other IPv6 addresses.
bool v4_of(const sockaddr* sa, in_addr* out) {
  if (!sa) return false;
  if (sa->sa_family == AF_INET) {
    *out = reinterpret_cast<const sockaddr_in*>(sa)->sin_addr;
    return true;
  }
  const uint8_t* raw = nullptr;
  if (sa->sa_family == AF_INET6) raw = reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr.s6_addr;
  if (sa->sa_family == AF_IB) raw = reinterpret_cast<const sockaddr_ib*>(sa)->sib_addr.sib_raw;
  if (!raw) return false;
  if (ipv4_in_ipv6(raw, out)) return true;
  static const uint8_t kZero[16] = {};
  if (std::memcmp(raw, kZero, 10) != 0) return false;
  if (raw[10] == 0xff && raw[11] == 0xff) {
    std::memcpy(&out->s_addr, raw + 12, 4);
    return true;
  }
  if (raw[10] == 0 && raw[11] == 0 && raw[12] == 0 && raw[13] == 0 && raw[14] == 0 && (raw[15] == 0 || raw[15] == 1)) {
    out->s_addr = raw[15] ? htonl(kLoopback) : 0;
    return true;
  }
  return false;
}

uint16_t port_of(const sockaddr* sa) {
  if (!sa) return 0;
  switch (sa->sa_family) {
    case AF_INET:
      return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
    case AF_INET6:
      return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
    case AF_IB:
      return static_cast<uint16_t>(be64toh(reinterpret_cast<const sockaddr_ib*>(sa)->sib_sid) & 0xffff);
  }
  return 0;
}

void set_port(sockaddr* sa, uint16_t port) {
  switch (sa->sa_family) {
    case AF_INET:
      reinterpret_cast<sockaddr_in*>(sa)->sin_port = htons(port);
      break;
    case AF_INET6:
      reinterpret_cast<sockaddr_in6*>(sa)->sin6_port = htons(port);
      break;
    case AF_IB: {
      auto* sib = reinterpret_cast<sockaddr_ib*>(sa);
      uint64_t sid = be64toh(sib->sib_sid);
      sib->sib_sid = htobe64((sid & ~0xffffull) | port);
      break;
    }
  }
}

void set_v4(sockaddr* sa, in_addr a) {
  switch (sa->sa_family) {
    case AF_INET:
      reinterpret_cast<sockaddr_in*>(sa)->sin_addr = a;
      break;
    case AF_INET6: {
      uint8_t* raw = reinterpret_cast<sockaddr_in6*>(sa)->sin6_addr.s6_addr;
      std::memset(raw, 0, 10);
      raw[10] = raw[11] = 0xff;
      std::memcpy(raw + 12, &a.s_addr, 4);
      break;
    }
    case AF_IB: {
      uint8_t* raw = reinterpret_cast<sockaddr_ib*>(sa)->sib_addr.sib_raw;
      std::memset(raw, 0, 10);
      raw[10] = raw[11] = 0xff;
      std::memcpy(raw + 12, &a.s_addr, 4);
      break;
    }
  }
}

// Whether the address is a device's IPv6 address (not IPv4, v4-mapped or a wildcard).
bool is_dev_v6(const sockaddr* sa) {
  in_addr a{};
  if (sa && sa->sa_family == AF_INET6)
    return ipv4_in_ipv6(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr.s6_addr, &a);
  if (sa && sa->sa_family == AF_IB) return ipv4_in_ipv6(reinterpret_cast<const sockaddr_ib*>(sa)->sib_addr.sib_raw, &a);
  return false;
}

// Writes the device address `a` into `sa`: as an IPv4 (or v4-mapped) address,
// or as the device's IPv6 address for an id that uses those.
void set_dev_addr(sockaddr* sa, in_addr a, bool v6) {
  set_v4(sa, a);
  if (!v6 || sa->sa_family == AF_INET) return;
  ibv_gid g = ipv6_gid_of(a);
  uint8_t* raw = sa->sa_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(sa)->sin6_addr.s6_addr
                                           : reinterpret_cast<sockaddr_ib*>(sa)->sib_addr.sib_raw;
  std::memcpy(raw, g.raw, 16);
}

// Two bound addresses overlap when either is a wildcard or both name the same
// address: a device's IPv4 and IPv6 addresses are two addresses.
bool overlaps(const sockaddr* a, const sockaddr* b) {
  in_addr x{}, y{};
  if (!v4_of(a, &x) || !v4_of(b, &y)) return true;
  if (x.s_addr == 0 || y.s_addr == 0) return true;
  return x.s_addr == y.s_addr && is_dev_v6(a) == is_dev_v6(b);
}

bool is_any(const sockaddr* sa) {
  in_addr a{};
  return v4_of(sa, &a) && a.s_addr == 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// Devices

void EmuCm::ensure_devices() {
  std::call_once(devices_once_, [this] {
    for (Device* d : DeviceRegistry::instance().devices()) {
      auto cd = std::make_unique<CmDevice>();
      cd->device = d;
      devices_.push_back(std::move(cd));
      d->set_gsi_agent(this);
      d->start_progress();  // MADs may arrive at any time from now on
    }
  });
}

CmDevice* EmuCm::cm_device(Device* dev) {
  for (auto& d : devices_)
    if (d->device == dev) return d.get();
  return nullptr;
}

// Opens the device's shared context and PD on first use (librdmacm's
// ucma_get_device) and hangs them on the id.
int EmuCm::attach_device(Id* id, CmDevice* dev) {
  if (!dev->context) {
    EmuProvider& p = EmuProvider::instance();
    ibv_context* ctx = p.open_device(dev->device->ibv());
    if (!ctx) return -1;
    ibv_pd* pd = p.alloc_pd(ctx);
    if (!pd) {
      p.close_device(ctx);
      return -1;
    }
    dev->context = ctx;
    dev->pd = pd;
  }
  if (id) {
    id->dev = dev;
    id->pub.verbs = dev->context;
    if (!id->pub.pd) id->pub.pd = dev->pd;
    id->pub.port_num = 1;
    id->ib = dev->device->link_layer() == LinkLayer::kInfiniBand;
  }
  return 0;
}

CmDevice* EmuCm::device_for_local(const sockaddr* addr) {
  in_addr a{};
  if (!v4_of(addr, &a)) return nullptr;
  return device_owning(a);
}

CmDevice* EmuCm::device_owning(in_addr a) {
  if (a.s_addr == 0) return nullptr;
  for (auto& d : devices_)
    if (d->device->addr().s_addr == a.s_addr && !d->device->fatal()) return d.get();
  return nullptr;
}

// ---------------------------------------------------------------------------
// Ports (per port space, for the ids of this process; docs/rdma-cm.md)

bool EmuCm::port_in_use(const Id* self, const sockaddr* addr, uint16_t port) const {
  for (auto& [pub, other] : ids_) {
    if (other == self || !other->owns_port || other->port != port || other->pub.ps != self->pub.ps) continue;
    if (other->state == IdState::kIdle || other->state == IdState::kDestroying) continue;
    if (self->reuse_addr && other->reuse_addr && other->state != IdState::kListen) continue;
    if (overlaps(addr, &other->pub.route.addr.src_addr)) return true;
  }
  return false;
}

uint16_t EmuCm::ephemeral_port(const Id* id, const sockaddr* addr) {
  // The kernel's default ip_local_port_range.
  constexpr uint32_t kFirst = 32768, kLast = 60999;
  uint32_t start = kFirst + static_cast<uint32_t>(rng_() % (kLast - kFirst + 1));
  for (uint32_t i = 0; i <= kLast - kFirst; ++i) {
    uint16_t port = static_cast<uint16_t>(kFirst + (start - kFirst + i) % (kLast - kFirst + 1));
    if (!port_in_use(id, addr, port)) return port;
  }
  return 0;
}

// rdma_bind_addr under the lock: the address picks the device (none for a
// wildcard), the port is taken or allocated.
int EmuCm::bind_locked(Id* id, const sockaddr* addr) {
  size_t len = addr_len(addr);
  if (!len) return fail(EAFNOSUPPORT);
  if (id->state != IdState::kIdle) return fail(EINVAL);
  in_addr a{};
  CmDevice* dev = nullptr;
  // IPv6 beyond ::, ::1, v4-mapped and the devices' own: no device has it.
  if (!v4_of(addr, &a)) return fail(EADDRNOTAVAIL);
  const bool v6 = is_dev_v6(addr);
  if (a.s_addr != 0) {
    dev = device_for_local(addr);
    if (!dev && v6) return fail(EADDRNOTAVAIL);  // no device of this process has it
    if (!dev && ntohl(a.s_addr) == kLoopback && !devices_.empty()) dev = devices_.front().get();  // the kernel's cma_bind_loopback
    if (!dev) return fail(is_loopback_range(a) ? ENODEV : EADDRNOTAVAIL);
  }
  sockaddr_storage src{};
  std::memcpy(&src, addr, len);
  uint16_t port = port_of(addr);
  if (port == 0) {
    port = ephemeral_port(id, addr);
    if (port == 0) return fail(EADDRNOTAVAIL);
  } else if (port_in_use(id, addr, port)) {
    SV_LOG(kDebug, "cm: bind to port %u (port space 0x%x): in use", port, static_cast<unsigned>(id->pub.ps));
    return fail(EADDRINUSE);
  }
  set_port(reinterpret_cast<sockaddr*>(&src), port);
  if (dev && attach_device(id, dev) != 0) return -1;
  std::memcpy(&id->pub.route.addr.src_storage, &src, sizeof src);
  id->port = port;
  id->owns_port = true;
  id->v6 = v6;
  id->state = IdState::kAddrBound;
  return 0;
}

int EmuCm::bind_addr(rdma_cm_id* pub, sockaddr* addr) {
  if (!addr_len(addr)) return fail(EINVAL);  // librdmacm: an unknown family is EINVAL
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  return bind_locked(id, addr);
}

// ---------------------------------------------------------------------------
// Address resolution

int EmuCm::resolve_addr(rdma_cm_id* pub, sockaddr* src_addr, sockaddr* dst_addr, int timeout_ms) {
  if (!addr_len(dst_addr)) return fail(EINVAL);
  if (src_addr && !addr_len(src_addr)) return fail(EINVAL);
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (id->state == IdState::kIdle) {
    sockaddr_storage any{};
    if (src_addr) {
      std::memcpy(&any, src_addr, addr_len(src_addr));
    } else {
      any.ss_family = dst_addr->sa_family;
    }
    if (bind_locked(id, reinterpret_cast<sockaddr*>(&any)) != 0) return -1;
  }
  if (id->state != IdState::kAddrBound) return fail(EINVAL);
  in_addr dst{};
  if (!v4_of(dst_addr, &dst) || dst.s_addr == 0) {
    // An IPv6 address no device has: the route lookup fails.
    return fail(EINVAL);
  }
  std::memcpy(&id->pub.route.addr.dst_storage, dst_addr, addr_len(dst_addr));
  id->v6 = is_dev_v6(dst_addr);  // the destination's family picks the GIDs, as the kernel's route lookup does
  id->state = IdState::kAddrQuery;
  id->candidates.clear();

  // The source device: the bound one, the one owning the destination (a
  // connection inside this process), or the first (the only route there is).
  if (!id->dev) {
    CmDevice* dev = device_for_local(dst_addr);
    if (!dev) {
      for (auto& d : devices_)
        if (!d->device->fatal()) {
          dev = d.get();
          break;
        }
    }
    if (!dev) {
      id->state = IdState::kAddrBound;
      return fail(ENODEV);
    }
    if (attach_device(id, dev) != 0) {
      id->state = IdState::kAddrBound;
      return -1;
    }
    if (is_any(&id->pub.route.addr.src_addr)) set_dev_addr(&id->pub.route.addr.src_addr, dev->device->addr(), id->v6);
  }

  if (ntohl(dst.s_addr) == kLoopback && !id->v6) {
    // The loopback service: this process's devices first, then the host's.
    for (auto& d : devices_)
      if (!d->device->fatal()) id->candidates.push_back(d->device->addr());
    for (in_addr a : roce_ports_bound_now())
      if (is_loopback_range(a) && !device_owning(a) &&
          std::none_of(id->candidates.begin(), id->candidates.end(),
                       [&](in_addr c) { return c.s_addr == a.s_addr; }))
        id->candidates.push_back(a);
    id->peer_device = id->candidates.empty() ? dst : id->candidates.front();
    if (!id->candidates.empty()) id->candidates.erase(id->candidates.begin());
  } else {
    id->peer_device = dst;
  }
  uint64_t gen = ++id->op_generation;
  auto deadline = id->dev->device->clock().now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  resolve_addr_step(gen, id, deadline);
  lock.unlock();
  return complete(id);
}

// One attempt of the emulated ARP; repeated every 10 ms until the deadline
// (on the device's scheduler), as the kernel repeats its neighbour probe.
void EmuCm::resolve_addr_step(uint64_t generation, Id* id, Clock::time_point deadline) {
  if (id->op_generation != generation || id->state != IdState::kAddrQuery) return;
  in_addr dst = id->peer_device;
  int status = 0;
  bool answered = false;
  // A multicast destination needs no neighbour: its MAC is derived from the
  // group (the kernel's ip_eth_mc_map), so it resolves at once.
  if (device_owning(dst) || !id->candidates.empty() || ntohl(dst.s_addr) == kLoopback ||
      IN_MULTICAST(ntohl(dst.s_addr))) {
    answered = true;
  } else if (is_loopback_range(dst)) {
    for (in_addr a : roce_ports_bound_now())
      if (a.s_addr == dst.s_addr) answered = true;
  } else {
    // Another host: resolved when the host has a route there.
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(wire::kRoceV2UdpPort);
    to.sin_addr = dst;
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) status = -errno;
    if (fd >= 0) close(fd);
    answered = status == 0;
  }
  Device& dev = *id->dev->device;
  if (!answered && status == 0 && dev.clock().now() < deadline) {
    dev.scheduler().after(std::chrono::milliseconds(10), [this, generation, id, deadline] {
      Lock lock(mu_);
      // The id may be gone: its generation is checked through the table.
      for (auto& [pub, other] : ids_)
        if (other == id) return resolve_addr_step(generation, id, deadline);
    });
    return;
  }
  if (!answered) {
    id->state = IdState::kAddrBound;
    post_event(new_event(id, RDMA_CM_EVENT_ADDR_ERROR, status ? status : -ETIMEDOUT));
    return;
  }
  id->state = IdState::kAddrResolved;
  auto& ib = id->pub.route.addr.addr.ibaddr;
  // On InfiniBand the peer's port GID, as IPoIB's ARP answer carries it.
  wire::cm::Gid s = cm::gid_for(id, dev.addr()), d = cm::gid_for(id, id->peer_device);
  std::memcpy(ib.sgid.raw, s.data(), 16);
  std::memcpy(ib.dgid.raw, d.data(), 16);
  ib.pkey = htobe16(0xffff);
  post_event(new_event(id, RDMA_CM_EVENT_ADDR_RESOLVED, 0));
}

// The path record of the route. RoCE: built locally as the kernel does (no
// SA), GIDs of the IP family, hop limit 64. InfiniBand: what the SA answers
// for two ports of one subnet (the kernel's cma_query_ib_route): the port
// GIDs, the LIDs, the default P_Key, SL 0 and hop limit 0, so that no GRH is
// needed (ib_init_ah_attr_from_path adds one only for a hop limit above 0).
void EmuCm::fill_route(Id* id) {
  Device& dev = *id->dev->device;
  ibv_sa_path_rec& p = id->path;
  p = {};
  wire::cm::Gid s = cm::gid_for(id, dev.addr()), d = cm::gid_for(id, id->peer_device);
  std::memcpy(p.sgid.raw, s.data(), 16);
  std::memcpy(p.dgid.raw, d.data(), 16);
  p.pkey = htobe16(0xffff);
  if (id->ib) {
    p.slid = htobe16(dev.lid());
    p.dlid = htobe16(identity_of(id->peer_device).lid);
    p.hop_limit = 0;
    p.traffic_class = 0;
  } else {
    p.hop_limit = 64;
    p.traffic_class = id->tos.value_or(0);
  }
  p.reversible = 1;
  p.numb_path = 1;
  p.mtu_selector = 2;  // exactly
  p.mtu = dev.active_mtu();
  p.rate_selector = 2;
  p.rate = IBV_RATE_100_GBPS;
  p.packet_life_time_selector = 2;
  p.packet_life_time = id->ack_timeout ? std::max<int>(*id->ack_timeout, 1) - 1 : 18;
  id->pub.route.path_rec = &id->path;
  id->pub.route.num_paths = 1;
}

int EmuCm::resolve_route(rdma_cm_id* pub, int /*timeout_ms*/) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (id->state != IdState::kAddrResolved) return fail(EINVAL);
  if (!id->dev->device->port_active()) {
    // The device's port is down: no route leaves it (the kernel: -ENETUNREACH).
    post_event(new_event(id, RDMA_CM_EVENT_ROUTE_ERROR, -ENETUNREACH));
  } else {
    fill_route(id);
    id->state = IdState::kRouteResolved;
    post_event(new_event(id, RDMA_CM_EVENT_ROUTE_RESOLVED, 0));
  }
  lock.unlock();
  return complete(id);
}

// ---------------------------------------------------------------------------
// Listening

Id* EmuCm::find_listener(CmDevice* dev, uint16_t ps, uint16_t port, const sockaddr* dst) {
  in_addr want{};
  v4_of(dst, &want);
  const bool want_v6 = is_dev_v6(dst);
  Id* wildcard = nullptr;
  for (auto& [pub, id] : ids_) {
    if (id->state != IdState::kListen || id->port != port || id->pub.ps != ps) continue;
    in_addr bound{};
    v4_of(&id->pub.route.addr.src_addr, &bound);
    if (bound.s_addr == 0) {
      wildcard = id;
      continue;
    }
    if (id->dev != dev) continue;
    // No destination (RDMA_PS_IB: the REQ carries no rdma_cm header, the
    // kernel matches an AF_IB listener by service ID alone): any listener
    // bound on the device the REQ reached.
    if (!dst) return id;
    if (bound.s_addr == want.s_addr && is_dev_v6(&id->pub.route.addr.src_addr) == want_v6) return id;
  }
  return wildcard;
}

int EmuCm::listen(rdma_cm_id* pub, int backlog) {
  Lock lock(mu_);
  Id* id = find_id(pub);
  if (!id) return fail(EINVAL);
  if (id->state == IdState::kIdle) {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (bind_locked(id, reinterpret_cast<sockaddr*>(&any)) != 0) return -1;
  }
  // The kernel's ucma: a backlog outside 1..1023 means its maximum, 1024.
  int room = backlog > 0 && backlog < 1024 ? backlog : 1024;
  if (id->state == IdState::kListen) {
    id->backlog = room;
    return 0;
  }
  if (id->state != IdState::kAddrBound) return fail(EINVAL);
  id->state = IdState::kListen;  // port_in_use now counts it as a listener
  for (auto& [p, other] : ids_) {
    if (other == id || other->state != IdState::kListen || other->port != id->port || other->pub.ps != id->pub.ps)
      continue;
    if (overlaps(&id->pub.route.addr.src_addr, &other->pub.route.addr.src_addr)) {
      id->state = IdState::kAddrBound;
      return fail(EADDRINUSE);
    }
  }
  id->backlog = room;
  return 0;
}

// ---------------------------------------------------------------------------
// rdma_getaddrinfo: the libc resolver, then the rdma_cm view of the answer.

int EmuCm::getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  if (!service && !node && !hints) return fail(EINVAL);
  if (!res) return fail(EINVAL);
  ensure_devices();
  if (devices_.empty()) return fail(ENODEV);
  static const rdma_addrinfo kNoHints{};
  if (!hints) hints = &kNoHints;
  auto* rai = static_cast<rdma_addrinfo*>(calloc(1, sizeof(rdma_addrinfo)));
  if (!rai) return fail(ENOMEM);
  auto copy = [](sockaddr** dst, socklen_t* dst_len, const void* src, size_t len) {
    *dst = static_cast<sockaddr*>(malloc(len));
    if (!*dst) return false;
    std::memcpy(*dst, src, len);
    *dst_len = static_cast<socklen_t>(len);
    return true;
  };
  if (node || service) {
    addrinfo ai_hints{};
    if (hints->ai_flags & RAI_PASSIVE) ai_hints.ai_flags |= AI_PASSIVE;
    if (hints->ai_flags & RAI_NUMERICHOST) ai_hints.ai_flags |= AI_NUMERICHOST;
    if (hints->ai_family != AF_IB) ai_hints.ai_family = hints->ai_family;
    ai_hints.ai_socktype = hints->ai_qp_type == IBV_QPT_UD ? SOCK_DGRAM : hints->ai_qp_type ? SOCK_STREAM : 0;
    ai_hints.ai_protocol = hints->ai_port_space == RDMA_PS_TCP ? IPPROTO_TCP
                           : (hints->ai_port_space == RDMA_PS_UDP || hints->ai_port_space == RDMA_PS_IPOIB)
                               ? IPPROTO_UDP
                               : 0;
    addrinfo* ai = nullptr;
    int ret = ::getaddrinfo(node, service, &ai_hints, &ai);
    if (ret) {
      free(rai);
      return ret;  // librdmacm passes the resolver's EAI_ code on
    }
    rai->ai_qp_type = hints->ai_qp_type ? hints->ai_qp_type : ai->ai_socktype == SOCK_DGRAM ? IBV_QPT_UD : IBV_QPT_RC;
    rai->ai_port_space = hints->ai_port_space ? hints->ai_port_space
                         : ai->ai_protocol == IPPROTO_UDP ? RDMA_PS_UDP
                                                          : RDMA_PS_TCP;
    rai->ai_family = ai->ai_family;
    bool ok;
    if (ai->ai_flags & AI_PASSIVE) {
      rai->ai_flags = RAI_PASSIVE;
      if (ai->ai_canonname) rai->ai_src_canonname = strdup(ai->ai_canonname);
      ok = copy(&rai->ai_src_addr, &rai->ai_src_len, ai->ai_addr, ai->ai_addrlen);
    } else {
      if (ai->ai_canonname) rai->ai_dst_canonname = strdup(ai->ai_canonname);
      ok = copy(&rai->ai_dst_addr, &rai->ai_dst_len, ai->ai_addr, ai->ai_addrlen);
    }
    ::freeaddrinfo(ai);
    if (!ok) {
      freeaddrinfo(rai);
      return fail(ENOMEM);
    }
  } else {
    rai->ai_flags = hints->ai_flags;
    rai->ai_family = hints->ai_family;
    rai->ai_qp_type = hints->ai_qp_type;
    rai->ai_port_space = hints->ai_port_space;
    if (hints->ai_dst_len && !copy(&rai->ai_dst_addr, &rai->ai_dst_len, hints->ai_dst_addr, hints->ai_dst_len)) {
      freeaddrinfo(rai);
      return fail(ENOMEM);
    }
  }
  if (!rai->ai_src_len && hints->ai_src_len &&
      !copy(&rai->ai_src_addr, &rai->ai_src_len, hints->ai_src_addr, hints->ai_src_len)) {
    freeaddrinfo(rai);
    return fail(ENOMEM);
  }
  *res = rai;
  return 0;
}

void EmuCm::freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    free(res->ai_connect);
    free(res->ai_route);
    free(res->ai_src_canonname);
    free(res->ai_dst_canonname);
    free(res->ai_src_addr);
    free(res->ai_dst_addr);
    free(res);
    res = next;
  }
}

}  // namespace softverbs::emu

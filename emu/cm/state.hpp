// The objects of the emulator's connection manager (docs/rdma-cm.md): event
// channels, rdma_cm ids, their events, and the IB CM connection each connected
// id has. The public structs (rdma_event_channel, rdma_cm_id, rdma_cm_event) are
// the first member of ours, so a pointer the application hands back is
// recovered by a cast after a lookup in the CM's tables (never trusted blindly).
//
// Two layers, as in Linux: a Conn is the IB CM's connection (ib_cm: comm IDs,
// REQ/REP/RTU/DREQ/DREP state, MAD retries, time-wait); an Id is the rdma_cm
// id above it (addresses, port space, the QP it drives, the events it queues).
// An Id owns at most one Conn; a Conn outlives its Id until its time-wait ends,
// so that late MADs of a destroyed connection are answered as the CM would.
#pragma once

#include <infiniband/ib.h>
#include <rdma/rdma_cma.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "core/clock.hpp"
#include "emu/device/identity.hpp"
#include "wire/cm_mad.hpp"

namespace softverbs::emu {

class Device;

namespace cm {

struct Id;
struct Conn;

// The length of a socket address librdmacm accepts (its ucma_addrlen): 0 for
// none or an unknown family.
inline size_t addr_len(const sockaddr* sa) {
  if (!sa) return 0;
  switch (sa->sa_family) {
    case AF_INET:
      return sizeof(sockaddr_in);
    case AF_INET6:
      return sizeof(sockaddr_in6);
    case AF_IB:
      return sizeof(sockaddr_ib);
  }
  return 0;
}

// The RoCEv2 GID of an IPv4 address (::ffff:a.b.c.d), as a device's GID table has it.
inline wire::cm::Gid gid_of(in_addr a) {
  wire::cm::Gid g{};
  g[10] = g[11] = 0xff;
  std::memcpy(g.data() + 12, &a.s_addr, 4);
  return g;
}

// The RoCEv2 GID of a device address in the family an id uses: the device's
// IPv6 address (fd73:7665:7262::a.b.c.d, GID index 2) for an id whose
// addresses are the devices' IPv6 ones, else the IPv4-mapped GID (index 1).
inline wire::cm::Gid gid_of(in_addr a, bool v6) {
  if (!v6) return gid_of(a);
  ibv_gid g = ipv6_gid_of(a);
  wire::cm::Gid out;
  std::memcpy(out.data(), g.raw, out.size());
  return out;
}
inline uint8_t sgid_index_of(bool v6) { return v6 ? 2 : 1; }

// The port GID of the device at `a` on an InfiniBand port: fe80::/64 and the
// GUID (entry 0, the only one), which IPoIB's hardware address carries, so the
// kernel's address resolution yields it for a peer's IP address.
inline wire::cm::Gid ib_gid_of(in_addr a) {
  ibv_gid g;
  ibv_gid_type type;
  emu::gid_of(LinkLayer::kInfiniBand, a, 0, &g, &type);
  wire::cm::Gid out;
  std::memcpy(out.data(), g.raw, out.size());
  return out;
}

// rdma_cm's id states (the kernel's enum rdma_cm_state).
enum class IdState {
  kIdle,
  kAddrQuery,
  kAddrResolved,
  kRouteQuery,
  kRouteResolved,
  kConnect,
  kDisconnect,
  kAddrBound,
  kListen,
  kDeviceRemoval,
  kDestroying,
};

// A multicast join of an id (emu/cm/multicast.cpp): librdmacm's struct cma_multicast.
struct McJoin {
  sockaddr_storage addr{};  // the group as the application named it
  void* context = nullptr;  // the join's context (the event's private_data)
  uint32_t join_flags = 0;  // RDMA_MC_JOIN_FLAG_*
  ibv_gid mgid{};           // the group's GID, once joined
  uint16_t mlid = 0;
  uint32_t reported = 0, acked = 0;  // its events taken and acknowledged
};

// One event as the application sees it, plus the storage its pointers use.
struct Event {
  rdma_cm_event pub{};
  Id* id = nullptr;  // the id it is counted against (the new id for CONNECT_REQUEST)
  McJoin* mc = nullptr;  // the join a MULTICAST_JOIN/ERROR event reports
  std::array<uint8_t, 256> private_data{};
};

struct Channel {
  rdma_event_channel pub{};
  int write_fd = -1;          // the other end of pub.fd (a socket pair)
  std::deque<Event*> queue;   // guarded by the CM's lock
  bool owned_by_id = false;   // the private channel of a synchronous id
  int readers = 0;            // threads inside rdma_get_cm_event on it
  bool destroyed = false;     // destroyed while a reader waits: freed by the last one
};

// A device as the CM uses it: the verbs context every id on it shares
// (id->verbs) and the default protection domain (id->pd), opened on first use;
// and the private XRC domain of its XRC ids, opened when the first one needs it
// (librdmacm's ucma_get_xrcd: fd -1, O_CREAT).
struct CmDevice {
  Device* device = nullptr;
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_xrcd* xrcd = nullptr;
};

struct Id {
  rdma_cm_id pub{};
  Channel* channel = nullptr;
  bool sync = false;  // created with a NULL channel: calls wait for their event
  IdState state = IdState::kIdle;
  CmDevice* dev = nullptr;

  // Addressing (pub.route.addr holds the addresses the application reads).
  uint16_t port = 0;        // bound port, host order (0: none yet)
  bool owns_port = false;   // bound by rdma_bind_addr (a request's id shares its listener's)
  bool reuse_addr = false;  // RDMA_OPTION_ID_REUSEADDR
  int afonly = -1;          // RDMA_OPTION_ID_AFONLY (-1: not set)
  std::optional<uint8_t> tos;          // RDMA_OPTION_ID_TOS
  std::optional<uint8_t> ack_timeout;  // RDMA_OPTION_ID_ACK_TIMEOUT
  ibv_sa_path_rec path{};   // what pub.route.path_rec points at once resolved
  in_addr peer_device{};    // the device address the connection goes to
  bool v6 = false;          // its addresses are devices' IPv6 ones: so are its GIDs
  bool ib = false;          // its device's link layer is InfiniBand (LID routes, port GIDs)
  std::vector<in_addr> candidates;  // loopback service: devices still to try
  uint64_t op_generation = 0;       // cancels a pending resolve's timer

  // Listening.
  int backlog = 0;
  Id* listener = nullptr;  // the listen id a CONNECT_REQUEST's id came from
  std::optional<ibv_qp_init_attr> ep_qp_init_attr;  // rdma_create_ep(RAI_PASSIVE)

  // Connection parameters (rdma_connect/rdma_accept and the peer's).
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  std::vector<uint8_t> connect_data;  // rdma_create_ep's ai_connect
  rdma_conn_param last_param{};       // rdma_connect's, for the next loopback candidate
  std::vector<uint8_t> last_private;
  bool connect_error = false;
  // Enhanced connection establishment (ECE): what the application offers
  // (rdma_set_local_ece) and what the peer's REQ or REP carried.
  uint32_t local_ece_vendor = 0, local_ece_options = 0;
  uint32_t remote_ece_vendor = 0, remote_ece_options = 0;
  std::shared_ptr<Conn> conn;
  // The peer's QP number and Q_Key of a UD id (SIDR_REP), for the ESTABLISHED event.
  uint32_t ud_qpn = 0;
  uint32_t ud_qkey = 0;

  // Multicast groups joined (rdma_join_multicast_ex), until left.
  std::vector<std::unique_ptr<McJoin>> mc;

  // Events: reported to the application and acknowledged by it.
  uint32_t events_reported = 0;
  uint32_t events_acked = 0;
  rdma_cm_event* sync_event = nullptr;  // pub.event of a synchronous id
};

// The GID rdma_cm uses for device address `a` on the id's device: the port GID
// on InfiniBand (IPoIB), the RoCEv2 GID of the id's IP family on Ethernet.
inline wire::cm::Gid gid_for(const Id* id, in_addr a) { return id->ib ? ib_gid_of(a) : gid_of(a, id->v6); }

// The IB CM connection states (IBTA 12.9.6; the kernel's enum ib_cm_state).
enum class ConnState {
  kIdle,
  kReqSent,
  kReqRcvd,
  kMraReqSent,
  kMraReqRcvd,
  kRepSent,
  kRepRcvd,
  kMraRepRcvd,
  kEstablished,
  kDreqSent,
  kDreqRcvd,
  kTimewait,
  kSidrReqSent,
  kSidrReqRcvd,
};

struct Conn {
  ConnState state = ConnState::kIdle;
  Id* id = nullptr;  // null once the id is destroyed
  Device* device = nullptr;
  in_addr peer{};    // the peer device's address (where MADs go)
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint64_t remote_ca_guid = 0;
  uint32_t remote_qpn = 0;
  uint64_t tid = 0;
  bool passive = false;

  // The last MAD sent that expects an answer, resent on timeout.
  std::array<uint8_t, wire::cm::kMadSize> last_mad{};
  bool has_last_mad = false;
  int retries_left = 0;
  Clock::duration retry_interval{};
  uint64_t timer_generation = 0;  // a timer fires only if this did not change

  // From the REQ (both sides keep it: the passive side moves its QP with it).
  wire::cm::Req req;
  wire::cm::Rep rep;
  uint64_t sidr_service_id = 0;
  uint8_t remote_cm_response_timeout = 20;
  uint8_t max_cm_retries = 15;
};

}  // namespace cm
}  // namespace softverbs::emu

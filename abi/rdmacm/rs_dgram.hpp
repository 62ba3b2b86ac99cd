// rsockets: datagram (SOCK_DGRAM) rsockets, rdma-core 44's "ds" protocol
// (librdmacm/rsocket.c), so either end may be rdma-core's:
//  * The rsocket's descriptor is a real UDP socket, which gives it its port
//    (rbind, or the kernel's choice at rconnect/rsendto) and carries address
//    resolution. Each source address the socket sends from gets a UD QP of
//    its own, on an rdma_cm id of port space RDMA_PS_UDP bound to that
//    address and the socket's port (so QKey RDMA_UDP_QKEY, 0x01234567).
//  * A datagram to a destination whose QP number is not known yet goes over
//    the UDP socket, behind a DsUdpHeader (tag 0x55555555, op DATA, our QPN
//    and address). The receiver delivers it, answers with a header-only op
//    CTRL datagram carrying its own QPN, and resolves a route back; each
//    side makes an address handle once it has the other's QPN, and from then
//    on datagrams are UD SENDs: a DsHeader (the sender's address and port)
//    in front of the payload, at most 2048 bytes together (RS_SNDLOWAT).
//  * Receives land in 2048-byte slots behind a shared 40-byte GRH area.
// The UDP socket is read whenever the rsocket is used or waited on (rdma-core
// runs a thread for it); a datagram that finds the receive queue full is
// dropped, as UDP drops it.
#pragma once

#include <sys/uio.h>

#include <deque>
#include <memory>
#include <vector>

#include "abi/rdmacm/rsocket.hpp"

namespace softverbs::abi::rs {

// rdma-core's struct ds_header: version 4 or 6, its own length, the port and
// the address as they are in the sender's sockaddr (network order).
struct DsHeader {
  uint8_t version;
  uint8_t length;
  uint16_t port;
  union {
    uint32_t ipv4;
    struct {
      uint32_t flowinfo;
      uint8_t addr[16];
    } ipv6;
  } addr;
};
static_assert(sizeof(DsHeader) == 24);
inline constexpr uint8_t kDsIpv4HdrLen = 8;   // DS_IPV4_HDR_LEN
inline constexpr uint8_t kDsIpv6HdrLen = 24;  // DS_IPV6_HDR_LEN

// rdma-core's struct ds_udp_header (the UDP path): tag and QPN big-endian,
// the QPN's top 8 bits zero.
struct DsUdpHeader {
  uint32_t tag;
  uint8_t version;
  uint8_t op;  // kOpData or kOpCtrl
  uint8_t length;
  uint8_t reserved;
  uint32_t qpn;
  union {
    uint32_t ipv4;
    uint8_t ipv6[16];
  } addr;
};
static_assert(sizeof(DsUdpHeader) == 28);
inline constexpr uint32_t kDsUdpTag = 0x55555555;  // DS_UDP_TAG
inline constexpr uint8_t kDsUdpIpv4HdrLen = 16;
inline constexpr uint8_t kDsUdpIpv6HdrLen = 28;
inline constexpr uint32_t kGrhLen = 40;           // sizeof(struct ibv_grh)
inline constexpr int kDsResolveTimeoutMs = 2000;  // rdma-core's, for the route back

// One UD QP: the socket's port on one source address.
struct DsQp {
  rdma_cm_id* id = nullptr;  // synchronous, RDMA_PS_UDP
  ibv_pd* pd = nullptr;
  ibv_comp_channel* ch = nullptr;
  ibv_cq* cq = nullptr;  // sends and receives
  bool cq_armed = false;
  ibv_mr* smr = nullptr;  // the socket's send slots, registered on this PD
  ibv_mr* rmr = nullptr;
  uint8_t* rbuf = nullptr;  // rq_size slots of kSndLowat, then the GRH area
  sockaddr_storage addr{};  // the source address (normalised)
  DsHeader hdr{};
};

// A destination: the QP that sends to it and, once its QPN is known, the
// address handle.
struct DsDest {
  sockaddr_storage addr{};  // normalised
  DsQp* qp = nullptr;
  ibv_ah* ah = nullptr;
  uint32_t qpn = 0;
};

// A received datagram waiting to be read: in a QP's receive slot, or (when
// it came over UDP) held here.
struct DsMsg {
  DsQp* qp = nullptr;
  uint32_t offset = 0;
  uint32_t length = 0;  // header + payload
  std::vector<uint8_t> local;
};

struct Dgram {
  int udp = -1;  // the descriptor
  std::vector<std::unique_ptr<DsQp>> qps;
  std::vector<std::unique_ptr<DsDest>> dests;
  DsDest* conn_dest = nullptr;  // rconnect's
  uint8_t* sbuf = nullptr;      // sq_size slots of kSndLowat
  std::vector<uint32_t> free_slots;
  std::deque<DsMsg> rmsgs;
  size_t next_qp = 0;  // where the round-robin CQ poll resumes
};

// ---- rs_dgram.cpp: the socket calls (rs.mu held unless said) ----
int dgram_create(int domain);
int dgram_bind(Rsocket& rs, const sockaddr* addr, socklen_t len);
int dgram_connect(Rsocket& rs, const sockaddr* addr, socklen_t len);
ssize_t dgram_sendto(Rsocket& rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags,
                     const sockaddr* dest, socklen_t destlen);
ssize_t dgram_recvfrom(Rsocket& rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags,
                       sockaddr* src, socklen_t* srclen);
// What rpoll reports for a datagram rsocket; with `arm`, its CQs are armed
// when nothing is ready.
short dgram_poll(Rsocket& rs, short events, bool arm);
void dgram_wait_fds(const Rsocket& rs, std::vector<pollfd>& out);
int dgram_close(Rsocket& rs, std::unique_lock<std::mutex>& lk);

// ---- rs_dgram_path.cpp: QPs, destinations, the UDP path, completions ----
// The largest payload a datagram may carry from qp.
inline size_t dgram_max_payload(const DsQp& qp) { return kSndLowat - qp.hdr.length; }
// rdma-core's ds_init_ep: the queue and buffer sizes, the send slots.
int dgram_init_ep(Rsocket& rs);
// Binds an unbound UDP socket to the address the CM would send to `dst` from.
void dgram_pick_source(Dgram& dg, int domain, const sockaddr* dst);
// The destination entry for `addr` (made with its QP when new); nullptr with errno.
DsDest* dgram_get_dest(Rsocket& rs, const sockaddr_storage& addr);
// Sends over the UDP socket to d: payload (kOpData) or header only (kOpCtrl).
ssize_t dgram_send_udp(Rsocket& rs, DsDest& d, const iovec* iov, int iovcnt, int flags, uint8_t op);
// Reads what the UDP socket holds and polls every CQ.
void dgram_progress(Rsocket& rs);
// Arms every CQ not armed; then takes the completion events waiting.
void dgram_arm(Rsocket& rs);
void dgram_drain_events(Rsocket& rs);
int dgram_post_recv(DsQp& qp, uint32_t offset);
void dgram_free(Rsocket& rs);
// Family/port/address only, everything else zero; false when len is short.
bool dgram_norm_addr(const sockaddr* sa, socklen_t len, sockaddr_storage* out);
socklen_t dgram_addr_len(const sockaddr_storage& a);

}  // namespace softverbs::abi::rs

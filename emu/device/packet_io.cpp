// The device's RoCEv2 endpoint over its link (fabric/link.hpp): sending packets,
// receiving them and handing each to its QP (the receive demultiplexer).
#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "emu/objects/objects.hpp"
#include "emu/device/gsi.hpp"
#include "emu/qp/qp.hpp"
#include "fabric/link.hpp"
#include "wire/cm_mad.hpp"
#include "core/log.hpp"

namespace softverbs::emu {
namespace {

constexpr uint16_t kRoceV2Port = wire::kRoceV2UdpPort;

std::array<uint8_t, 4> bytes_of(in_addr a) {
  std::array<uint8_t, 4> b;
  std::memcpy(b.data(), &a.s_addr, 4);
  return b;
}

}  // namespace

wire::Ipv4Flow Device::flow(in_addr src, in_addr dst) const {
  wire::Ipv4Flow f;
  f.saddr = bytes_of(src);
  f.daddr = bytes_of(dst);
  // Sent from the endpoint's own port over an unconnected socket with DF set,
  // which gives IP ID 0 (see fabric::UdpLink::bind).
  f.id = 0;
  f.frag_off = wire::kIpv4FlagDf;
  f.sport = kRoceV2Port;
  f.dport = kRoceV2Port;
  return f;
}

in_addr Device::addr_of_lid(uint16_t lid) const {
  in_addr a;
  a.s_addr = htonl((ntohl(addr_.s_addr) & 0xffff0000u) | lid);
  return a;
}

void Device::connect(fabric::Link& link) {
  link_ = &link;
  link.attach(*this);
}

void Device::inject(in_addr src, std::span<const uint8_t> packet) {
  std::lock_guard lock(rx_mu_);
  link_->inject(src, kRoceV2Port, packet);
}

std::string Device::rx_state() {
  bool busy = !rx_mu_.try_lock();
  if (!busy) rx_mu_.unlock();
  return link_->rx_state() + ", receive " + (busy ? "busy" : "idle");
}

void Device::start_progress() { link_->watch(); }

void Device::transmit(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc) {
  if (!port_active()) {
    // A port that is down sends nothing: to its peers it is a lost link.
    counters_.port_down_drops.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  link_->send(dst, packet, tos, icrc);
}

void Device::progress(bool block) {
  std::unique_lock lock(rx_mu_, std::defer_lock);
  if (block) {
    lock.lock();
  } else if (!lock.try_lock()) {
    return;
  }
  if (block) {
    // The timers: everything that has arrived, sockets included, is processed
    // before a missing answer is counted (Qp::on_timer).
    while (link_->drain()) {
    }
  } else {
    // An application thread polling: the link may skip its sockets (Link::poll).
    while (link_->poll()) {
    }
  }
}

void Device::ready() {
  // The link announced arrivals: its in-process queue, or a socket, which then
  // says so itself (fabric::LocalLink::ready), so the empty sockets are not read
  // on every announcement of in-process packets.
  std::lock_guard lock(rx_mu_);
  while (link_->poll()) {
  }
}

bool Device::try_poll() {
  std::unique_lock lock(rx_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  (void)link_->poll();
  return true;
}

// The checks every received datagram passes before the fault layer sees it.
bool Device::admit(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::PacketView& pkt,
                   wire::IpFields ip) {
  counters_.rx_datagrams.fetch_add(1, std::memory_order_relaxed);
  if (!port_active()) {
    counters_.port_down_drops.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  wire::Ipv4Flow f = flow(src, addr_);
  f.sport = sport;
  // A packet of the in-process queue whose sender left the ICRC uncomputed
  // (fabric::Link::needs_icrc) is not checked: it never left this process's
  // memory. Everything else is (IBTA: invariant CRC), a corrupted one included.
  wire::ParseError err = ip.icrc_skipped ? wire::parse(packet, pkt) : wire::parse(packet, pkt, wire::IcrcFlow{f});
  rx_group_ = in_addr{};
  if (err == wire::ParseError::icrc_mismatch) err = admit_mcast(packet, f, pkt);
  if (err == wire::ParseError::icrc_mismatch) {
    counters_.rx_icrc_errors.fetch_add(1, std::memory_order_relaxed);
    return false;  // a corrupted packet is dropped silently (IBTA: invariant CRC error)
  }
  if (err != wire::ParseError::ok) {
    counters_.rx_malformed.fetch_add(1, std::memory_order_relaxed);
    SV_LOG(kDebug, "%s: dropped malformed packet: %.*s", name().c_str(),
           static_cast<int>(wire::to_string(err).size()), wire::to_string(err).data());
    return false;
  }
  // Not in the UDP payload: the IP header's fields, for a UD receive's GRH.
  pkt.ip = ip;
  // The port's data counter counts the datagram: IPv4 and UDP headers too.
  counters_.rx_bytes.fetch_add(fabric::kIpUdpHeaderBytes + packet.size(), std::memory_order_relaxed);
  if (pkt.bth.dest_qp == wire::kMulticastQpn) counters_.rx_multicast.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// The receive demultiplexer: the packet goes to the QP it names, or to every
// QP attached to its group (IBTA: DestQP 0xFFFFFF is the multicast QPN).
void Device::deliver(in_addr src, const wire::PacketView& pkt) {
  if (pkt.bth.dest_qp == wire::kMulticastQpn) return deliver_mcast(src, pkt);
  if (pkt.bth.dest_qp == wire::cm::kGsiQpn) {
    if (GsiAgent* agent = gsi_agent_.load(std::memory_order_acquire)) {
      // A MAD's fields steer the connection manager, and the packet may lie
      // in memory its sender can still write (fabric/host_ring.hpp): the
      // agent reads a private copy.
      std::vector<uint8_t> mad(pkt.payload.begin(), pkt.payload.end());
      wire::PacketView own = pkt;
      own.payload = mad;
      agent->receive_gsi(*this, src, own);
      return;
    }
  }
  Qp* qp = find_qp(pkt.bth.dest_qp);
  if (!qp) {
    counters_.rx_unknown_qp.fetch_add(1, std::memory_order_relaxed);
  } else {
    qp->receive(pkt, src);
  }
}

bool Device::receive_direct(in_addr src, const wire::PacketView& pkt) {
  // Every lock here is tried, never waited for: the sender holds its own QP's
  // lock (and its device's mr_lock), and a thread holding the target QP's may
  // be waiting for those. Busy: the packet path.
  if (pkt.bth.dest_qp == wire::kMulticastQpn || pkt.bth.dest_qp == wire::cm::kGsiQpn || !port_active()) return false;
  // An answer for the QP whose lock this very thread holds (it handed the
  // request over directly): its inbox, taken before that lock is released.
  if (Qp* scope = Qp::direct_scope_qp(); scope && &scope->device() == this && scope->qpn() == pkt.bth.dest_qp) {
    count_direct_rx(pkt);
    scope->stash_direct(pkt, src);
    return true;
  }
  // The receive lock is not needed: the pin keeps the QP alive (unregister_qp
  // waits for it), and the link has checked that no queued packet is waiting
  // to be delivered before this one (fabric::LocalLink::receive_direct_from).
  // So threads driving different QPs of the device do not meet here.
  QpPin qp = pin_qp(pkt.bth.dest_qp);
  return qp && qp->try_receive(pkt, src, qp);
}

void Device::count_direct_rx(const wire::PacketView& pkt, uint64_t packets) {
  count_direct_rx_total(packets, packets * wire::packet_size(pkt.bth.opcode, pkt.payload.size()));
}

void Device::count_direct_rx_total(uint64_t packets, uint64_t packet_bytes) {
  // As admit() counts a datagram, with its IPv4 and UDP headers.
  const size_t cell = ShardedCounter::here();
  counters_.rx_direct.add_at(cell, packets);
  counters_.rx_bytes.add_at(cell, packets * fabric::kIpUdpHeaderBytes + packet_bytes);
}

bool Device::forge_reject(in_addr src, const wire::PacketView& pkt, uint16_t reason) {
  GsiAgent* agent = gsi_agent_.load(std::memory_order_acquire);
  if (!agent || pkt.bth.dest_qp != wire::cm::kGsiQpn) return false;
  std::vector<uint8_t> mad(pkt.payload.begin(), pkt.payload.end());  // a private copy, as in deliver()
  wire::PacketView own = pkt;
  own.payload = mad;
  return agent->reject_gsi(*this, src, own, reason);
}

bool Device::forge_nak(const wire::PacketView& pkt, uint8_t syndrome) {
  Qp* qp = find_qp(pkt.bth.dest_qp);
  if (!qp) return false;
  qp->forge_nak(pkt.bth.psn, syndrome);
  return true;
}

}  // namespace softverbs::emu

// The network seam of a device: the Link it sends packets through and receives
// them from, and the Receiver a link hands datagrams to.
//
// A device's link is a chain assembled once per device (emu/device/device.cpp):
//   FaultyLink (packet faults) -> TapLink (counters, capture) -> [TopologyLink
//   (the simulated fabric, with SOFTVERBS_TOPOLOGY)] -> LocalLink (devices of
//   this process) -> HostLink (devices of other processes of this
//   host, lossless) -> UdpLink (the socket on 127.x:4791).
// Packets are UDP payloads (BTH..ICRC), always from and to UDP port 4791 on the
// destination side. Sending may happen on any thread; receiving happens only in
// drain(), which the caller serialises (the device's receive lock), and in the
// link's own scheduled work, which goes through the receiver's ready().
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <span>
#include <string>

#include "core/counter.hpp"
#include "wire/packet.hpp"

namespace softverbs::fabric {

// What a link counts, as part of the device's counters (emu/objects/objects.hpp).
// Sharded by thread (core/counter.hpp): threads driving QPs of their own do not
// contend on them.
struct LinkCounters {
  // rx_datagrams: the packets taken off the link as bytes; the device adds those
  // handed over without bytes (emu::Device::Counters::rx_packets).
  ShardedCounter tx_packets, rx_datagrams, rx_icrc_errors;
  // What went out: the packets' IPv4 datagram bytes (IP and UDP headers, BTH ..
  // ICRC), and how many of the packets went to a multicast group.
  ShardedCounter tx_bytes, tx_multicast;
  // What the fault layer did (docs/faults.md).
  ShardedCounter faults_dropped, faults_duplicated, faults_corrupted, faults_delayed,
      faults_reordered, faults_naks_forged;
  // Packets for a device of this host whose receiver stayed full past the
  // lossless path's wait (fabric/host_link.hpp).
  ShardedCounter host_drops;
  // Packets a link of the simulated fabric (fabric/topology_link.hpp) dropped:
  // lost by its loss draw, or larger than its MTU.
  ShardedCounter topology_loss_drops, topology_mtu_drops;
};

// The IPv4 and UDP headers in front of every packet: the octets a port
// counter counts are the datagram's (docs/compatibility.md, "Counters").
inline constexpr uint64_t kIpUdpHeaderBytes = 20 + 8;

// What sent packets add to the port's transmit counters, the one definition:
// count_tx for `packets` packets of `packet_bytes` octets each (BTH .. ICRC:
// TapLink's packets, the in-process path's acknowledgements that are never
// walked through the link, emu/qp/direct.cpp), count_tx_total for `packets`
// packets of `packet_bytes` octets in all (a direct session's burst).
// uncount_tx takes a count_tx back.
inline void count_tx_total(LinkCounters& c, uint64_t packets, uint64_t packet_bytes) noexcept {
  const size_t cell = ShardedCounter::here();
  c.tx_packets.add_at(cell, packets);
  c.tx_bytes.add_at(cell, packets * kIpUdpHeaderBytes + packet_bytes);
}
inline void count_tx(LinkCounters& c, uint64_t packets, uint64_t packet_bytes) noexcept {
  count_tx_total(c, packets, packets * packet_bytes);
}
inline void uncount_tx(LinkCounters& c, uint64_t packets, uint64_t packet_bytes) noexcept {
  c.tx_packets.fetch_sub(packets);
  c.tx_bytes.fetch_sub(packets * (kIpUdpHeaderBytes + packet_bytes));
}

class Receiver {
 public:
  virtual ~Receiver() = default;
  // One datagram from src:sport, with the IP header fields it arrived with
  // (TOS and TTL: what a UD receive shows in its GRH area). Called from
  // drain() (or inject()), so never concurrently.
  virtual void receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip = {}) = 0;
  // Datagrams may be waiting: called on the scheduler's thread; the receiver
  // drains the link under whatever serialises its drains.
  virtual void ready() = 0;
  // On an application thread that ends its wake-up lease (fabric/host_link.hpp):
  // one look at the link (Link::poll) now, under whatever serialises the
  // receiver's drains, if that is free; false (and nothing read) if another
  // thread holds it. Default: false.
  virtual bool try_poll() { return false; }
  // A request or response from a device of this process handed over without
  // packet bytes (Link::send_direct): `view` is what parsing the packet would
  // give, its payload pointing into the sender's memory for the duration of
  // the call. Processed now, in the caller's thread, or refused (false: the
  // receiver is busy, something is queued before it, or a layer needs the
  // bytes), and then the sender sends the packet as usual. Never blocks on a
  // lock another thread may hold while it waits for the caller. Default: refused.
  virtual bool receive_direct(in_addr /*src*/, const wire::PacketView& /*view*/) { return false; }
};

// A device's receive path, in the two stages the fault layer sits between: the
// checks every datagram passes (counting, port state, ICRC and header parse),
// then delivery to its QP.
class PacketSink : public Receiver {
 public:
  // False when the datagram stops here (counted by the sink); else `view` is it,
  // parsed, with `ip` in view.ip.
  virtual bool admit(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::PacketView& view,
                     wire::IpFields ip = {}) = 0;
  virtual void deliver(in_addr src, const wire::PacketView& view) = 0;
  // The fault layer's forged NAK for a request (docs/faults.md "nak"): false if
  // no QP of the sink takes it.
  virtual bool forge_nak(const wire::PacketView& view, uint8_t syndrome) = 0;
  // The fault layer's "reject" of a CM REQ/REP/SIDR_REQ from src: false if no
  // connection manager of the sink answers it.
  virtual bool forge_reject(in_addr /*src*/, const wire::PacketView& /*view*/, uint16_t /*reason*/) { return false; }

  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip = {}) final {
    wire::PacketView view;
    if (admit(src, sport, packet, view, ip)) deliver(src, view);
  }
};

class Link {
 public:
  virtual ~Link() = default;
  // Where received datagrams go; called once, before any other call.
  virtual void attach(Receiver& receiver) = 0;
  // Sends one packet to dst:4791 with IPv4 TOS byte tos (the GRH traffic
  // class of a RoCEv2 packet: DSCP and ECN). A packet that cannot go is lost,
  // as on a congested link: the reliable transport recovers it. icrc false:
  // the packet's ICRC field was not computed (it holds 0), which a sender may
  // do only where needs_icrc(dst) said false; the receiver is told so
  // (IpFields::icrc_skipped) and does not verify it.
  virtual void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) = 0;
  // Whether a packet to dst must carry a computed ICRC: false only where it
  // stays in this process's memory, where nothing can corrupt it, and no link
  // on the way shows its bytes (a capture). A link that changes the bytes (the
  // fault layer's corrupt) sends the changed packet with icrc true, so the
  // receiver's check drops it as before.
  virtual bool needs_icrc(in_addr /*dst*/) { return true; }
  // Whether a packet to dst may go without bytes (send_direct): only to a
  // device of this process over the lossless in-process queue, with nothing on
  // the way that needs the bytes (a capture, the trace, fault rules, a packet
  // held back by them). False by default, and a decorator that does not say
  // otherwise stops it, so a link that acts on packets is never bypassed.
  virtual bool direct_ok(in_addr /*dst*/) { return false; }
  // The packet `view` stands for, handed to the receiving device without being
  // built (Receiver::receive_direct), counted as the packet would be. False if
  // it was not delivered: the caller then builds and send()s it. It refuses
  // whatever direct_ok(dst) refuses, so a caller need not ask that first.
  virtual bool send_direct(in_addr /*dst*/, const wire::PacketView& /*view*/) { return false; }
  // The packet `packet` describes (headers, payload spans, a zero tail:
  // wire::gather), without its ICRC, sent with TOS byte tos where no layer
  // needs its bytes whole: only into a same-host ring whose receiver takes
  // packets without their ICRC (fabric/host_link.hpp), with no capture, trace,
  // fault rule or held packet on the way, so the payload is copied once, from
  // the sender's memory into the ring. Counted as the packet would be. False
  // if it was not sent (the default; a decorator that does not say otherwise
  // stops it): the caller then builds the packet and send()s it.
  virtual bool send_gathered(in_addr /*dst*/, const wire::GatheredPacket& /*packet*/, uint8_t /*tos*/) {
    return false;
  }
  // Hands the datagrams waiting now to the receiver without blocking; false if
  // there were none. Callers serialise drains (the device's receive lock).
  virtual bool drain() = 0;
  // drain() for an application thread that polls (ibv_poll_cq): a link may
  // leave its sockets unread on some of these calls while they keep coming back
  // empty, because the progress thread waits on them (watch()) and receives
  // whatever arrives there. Serialised as drain() is.
  virtual bool poll() { return drain(); }
  // What waits in memory shared with another process (the same-host rings),
  // handed to the receiver with no system call; false if none. For a poller
  // between the reads of poll() that skip the sockets. Serialised as drain() is.
  virtual bool poll_shared() { return false; }
  // Makes the scheduler call the receiver's ready() whenever datagrams arrive
  // (idempotent).
  virtual void watch() = 0;
  // Hands a datagram to the receive path above this link as if it had arrived
  // (fuzzing and tests of hostile input), with TOS 0 and the default TTL.
  // Serialised as drain() is.
  virtual void inject(in_addr src, uint16_t sport, std::span<const uint8_t> packet) = 0;
  // For diagnostics: what waits in the link ("socket N bytes, local M").
  virtual std::string rx_state() = 0;
};

// A link that wraps another and passes everything through; subclasses override
// what they change. It is the inner link's receiver.
class LinkDecorator : public Link, protected Receiver {
 public:
  explicit LinkDecorator(Link& inner) : inner_(inner) {}
  void attach(Receiver& receiver) override {
    up_ = &receiver;
    inner_.attach(*this);
  }
  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override {
    inner_.send(dst, packet, tos, icrc);
  }
  bool needs_icrc(in_addr dst) override { return inner_.needs_icrc(dst); }
  // direct_ok, send_direct, send_gathered and receive_direct are not passed
  // through: a decorator that leaves packets alone says so itself (TapLink,
  // FaultyLink).
  bool drain() override { return inner_.drain(); }
  bool poll() override { return inner_.poll(); }
  bool poll_shared() override { return inner_.poll_shared(); }
  void watch() override { inner_.watch(); }
  void inject(in_addr src, uint16_t sport, std::span<const uint8_t> packet) override { receive(src, sport, packet); }
  std::string rx_state() override { return inner_.rx_state(); }

 protected:
  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip = {}) override {
    up_->receive(src, sport, packet, ip);
  }
  void ready() override { up_->ready(); }
  bool try_poll() override { return up_->try_poll(); }

  Link& inner_;
  Receiver* up_ = nullptr;
};

}  // namespace softverbs::fabric

// The link between devices of one process: a packet to a device of this
// process goes into that device's queue instead of a socket, with the same
// packet semantics. Packets to any other address go to the outside link (the
// UDP socket), if there is one. A packet to a multicast group goes to each
// member device of the host (fabric/mcast_directory.hpp).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

#include "core/clock.hpp"
#include "fabric/link.hpp"

namespace softverbs::fabric {

class LocalLink;

// The devices of one process by address. Links join it when attached, all
// before any traffic (the device list is built once), so lookups take no lock.
class LocalHub {
 public:
  void add(in_addr addr, LocalLink* link) { links_.emplace_back(addr.s_addr, link); }
  LocalLink* find(in_addr addr) const {
    for (const auto& [a, l] : links_)
      if (a == addr.s_addr) return l;
    return nullptr;
  }

 private:
  std::vector<std::pair<in_addr_t, LocalLink*>> links_;
};

class LocalLink final : public Link, private Receiver {
 public:
  // Datagrams queued for this link are announced through the scheduler.
  // direct: packets to devices of this process may go without bytes
  // (send_direct); false under virtual time, where every delivery is a step of
  // the virtual scheduler.
  LocalLink(LocalHub& hub, in_addr addr, Scheduler& scheduler, Link* outside = nullptr, bool direct = false);

  void attach(Receiver& receiver) override;
  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override;
  // The outside link's batch, then everything queued by devices of this process.
  bool drain() override;
  // The same, but the outside link (sockets: a system call each) is read only
  // when it said it is ready (its watch fired, see ready()) or on some polls
  // while it keeps coming back empty: after k empty reads in a row, the next
  // min(2^k - 1, kMaxSocketSkip) polls leave it alone. Every arrival on it makes
  // it ready, and the progress thread then drains the device, so nothing that
  // arrives is left there.
  bool poll() override;
  void watch() override;
  void inject(in_addr src, uint16_t sport, std::span<const uint8_t> packet) override {
    up_->receive(src, sport, packet);
  }
  std::string rx_state() override;
  // Only a unicast packet to a device of this process may leave its ICRC
  // uncomputed: multicast receivers find their group by the ICRC
  // (emu/device/mcast.cpp), and sockets carry the bytes out of the process;
  // or one to a device of another process whose same-host ring takes it
  // (the outside link says, fabric/host_link.hpp).
  bool needs_icrc(in_addr dst) override {
    if (IN_MULTICAST(ntohl(dst.s_addr))) return true;
    if (hub_.find(dst) != nullptr) return false;
    return outside_ == nullptr || outside_->needs_icrc(dst);
  }
  // Unicast to another device of this process (not this one: its receive
  // lock may be the caller's own).
  bool direct_ok(in_addr dst) override;
  // Handed to the peer's receive path now, if nothing queued for it would be
  // overtaken (receive_direct_from).
  bool send_direct(in_addr dst, const wire::PacketView& view) override;
  // A packet in pieces goes on to the outside link, for a device of another
  // process only: the in-process queue holds whole packets, and multicast is
  // replicated from its bytes.
  bool send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) override {
    if (IN_MULTICAST(ntohl(dst.s_addr)) || hub_.find(dst) != nullptr) return false;
    return outside_ != nullptr && outside_->send_gathered(dst, packet, tos);
  }

 private:
  // One copy to one device: its local queue, or the outside link.
  void send_unicast(in_addr dst, std::span<const uint8_t> packet, uint8_t tos, bool icrc);
  // A packet from the device at src (on another thread), sent with TOS byte
  // tos; it arrives with the TTL a socket sends (loopback routes do not
  // decrement it). icrc false: its ICRC was not computed, which the receiver
  // is told (IpFields::icrc_skipped).
  void enqueue(in_addr src, std::span<const uint8_t> packet, uint8_t tos, bool icrc);
  // Everything queued by devices of this process.
  bool drain_local();
  // A packet without bytes from the device at src: refused while packets wait
  // in this link's queue, which it would overtake. The receiver then holds its
  // receive lock, so no batch taken from the queue is being delivered either.
  bool receive_direct_from(in_addr src, const wire::PacketView& view);
  // From the outside link, passed up.
  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip = {}) override {
    up_->receive(src, sport, packet, ip);
  }
  // The outside link has datagrams (a socket's watch, a same-host stash): the
  // next poll reads it, whatever the backoff says.
  void ready() override {
    outside_ready_.store(true, std::memory_order_release);
    up_->ready();
  }
  bool try_poll() override { return up_->try_poll(); }

  LocalHub& hub_;
  in_addr addr_;
  Scheduler& scheduler_;
  Link* outside_;
  bool direct_;
  Receiver* up_ = nullptr;
  std::once_flag watched_;
  std::atomic<bool> watching_{false};  // watch() has run: the progress thread reads the outside link
  // Polls that skip the outside link, and how many the next empty read skips
  // (poll(); both under the drains' serialisation).
  uint32_t socket_skip_ = 0;
  uint32_t socket_backoff_ = 0;
  std::atomic<bool> outside_ready_{false};  // set by ready(), taken by poll()
  struct Queued {
    in_addr src;
    uint8_t tos;
    bool icrc;
    std::vector<uint8_t> bytes;
  };
  using Queue = std::deque<Queued>;
  std::mutex mu_;
  Queue queue_;
  // Packet buffers delivered and kept for reuse (under mu_), so that a packet
  // costs no allocation once the queue has been this deep; at most kSpareBuffers.
  std::vector<std::vector<uint8_t>> spare_;
  Queue batch_;  // the batch being delivered (under the drains' serialisation)
  std::atomic<bool> pending_{false};
  std::atomic<bool> delivering_{false};  // drain_local is handing batch_ up
};

}  // namespace softverbs::fabric

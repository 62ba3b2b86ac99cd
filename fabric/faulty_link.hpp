// The packet-fault layer (docs/faults.md) as a link decorator: on the way out
// and on the way in, each packet is offered to a faults::PacketFilter, and what
// the filter decides (drop, duplicate, corrupt, delay, reorder, forged NAK) is
// carried out here, with delays through the Scheduler.
//
// On the receive side the layer sits between the device's checks and delivery
// (PacketSink): a packet that fails the ICRC or arrives at a port that is down
// never reaches the rules. Packets the layer holds back (delay, reorder) are
// handed on from drain(), under the caller's serialisation, after the
// scheduler has called the receiver's ready().
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "fabric/link.hpp"
#include "faults/filter.hpp"

namespace softverbs::fabric {

class FaultyLink final : public LinkDecorator {
 public:
  // `device` is the name rules match against.
  FaultyLink(Link& inner, faults::PacketFilter& filter, Scheduler& scheduler, LinkCounters& counters,
             std::string device);

  // A PacketSink gets the full layer; any other receiver gets it after a plain
  // parse (no ICRC check), and no forged NAKs.
  void attach(Receiver& receiver) override;
  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override;
  // Held-back packets that are due, then the inner link's batch.
  bool drain() override;
  bool poll() override;
  // Packets may go without bytes while no rule of the way in is loaded and
  // nothing is held back: rules of the way out decide on a packet's headers
  // (send_unbuilt), and nothing overtakes a held one.
  bool direct_ok(in_addr dst) override;
  bool send_direct(in_addr dst, const wire::PacketView& view) override;
  // The same rules for a packet in pieces (Link::send_gathered).
  bool send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) override;
  // A sender starts another packet, while rules are loaded: a decision kept
  // for the one before (send_unbuilt) is forgotten on this thread.
  static void new_packet();

 private:
  struct Datagram {
    in_addr src;
    uint16_t sport;
    std::vector<uint8_t> bytes;
    wire::IpFields ip;
  };

  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip = {}) override;
  bool receive_direct(in_addr src, const wire::PacketView& view) override;
  // The receiver's two stages (see PacketSink).
  bool admit(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::PacketView& view,
             wire::IpFields ip);
  void deliver(in_addr src, uint16_t sport, std::span<const uint8_t> packet, const wire::PacketView& view);
  // Both stages, without the fault layer (held-back and duplicated packets).
  void receive_unfaulted(in_addr src, uint16_t sport, std::span<const uint8_t> packet, wire::IpFields ip);
  // The held-back packets that are due (drain and poll, before the inner link's).
  bool drain_held();
  // The reordered packet goes after the one just sent.
  void send_held();
  // A packet without its bytes (send_direct, send_gathered), decided by the
  // rules of the way out on its headers: true if it went (send_below) or was
  // lost; false if it must be built and sent, which then carries out the
  // decision made here.
  template <class SendBelow>
  bool send_unbuilt(in_addr dst, const wire::PacketView& view, bool watched, SendBelow send_below);

  faults::PacketFilter& filter_;
  Scheduler& scheduler_;
  LinkCounters& counters_;
  std::string device_;
  PacketSink* sink_ = nullptr;

  // Reordering on the way out: a packet held back until the next one has gone.
  std::mutex held_mu_;
  struct Held {
    in_addr dst;
    std::vector<uint8_t> bytes;
    uint8_t tos;
    bool icrc;
  };
  std::optional<Held> held_tx_;
  std::atomic<bool> has_held_tx_{false};  // skips held_mu_ on the common path

  // On the way in: the held-back packet (under the drain's serialisation), and
  // what the scheduler has made due.
  std::optional<Datagram> held_rx_;
  std::atomic<bool> has_held_rx_{false};  // held_rx_ is set, for receive_direct on another thread
  std::atomic<bool> hold_expired_{false};
  std::mutex due_mu_;
  std::deque<Datagram> due_rx_;
  std::atomic<bool> due_pending_{false};
};

}  // namespace softverbs::fabric

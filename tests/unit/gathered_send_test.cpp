// Packets in pieces (fabric::Link::send_gathered) through a device's link
// layers: passed on only where nothing needs the packet's bytes (no capture,
// not multicast, not a device of this process, a link below that takes
// them), counted as the packet, and otherwise refused,
// with nothing counted, so that the sender builds the packet. Rules of the way
// out decide on the headers, once per packet, also when it is then built.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "fabric/faulty_link.hpp"
#include "fabric/local_link.hpp"
#include "fabric/tap_link.hpp"
#include "tests/unit/fake_time.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"
#include "wire/pcap.hpp"

namespace softverbs::fabric {
namespace {

using Bytes = std::vector<uint8_t>;
using Pieces = std::vector<std::span<const uint8_t>>;

Bytes joined(const wire::GatheredPacket& g) {
  Bytes out(g.headers.begin(), g.headers.end());
  for (const auto& piece : g.payload) out.insert(out.end(), piece.begin(), piece.end());
  out.insert(out.end(), g.tail.begin(), g.tail.end());
  return out;
}

in_addr addr(const char* dotted) {
  in_addr a{};
  inet_pton(AF_INET, dotted, &a);
  return a;
}

// The link below the in-process queue: takes packets in pieces (as a
// same-host ring does) when `takes` says so.
class PieceTaker final : public Link {
 public:
  void attach(Receiver& r) override { up = &r; }
  void send(in_addr dst, std::span<const uint8_t> p, uint8_t, bool) override {
    whole.emplace_back(p.begin(), p.end());
    (void)dst;
  }
  bool send_gathered(in_addr, const wire::GatheredPacket& g, uint8_t tos) override {
    if (!takes) return false;
    pieces.push_back(joined(g));
    last_tos = tos;
    return true;
  }
  bool drain() override { return false; }
  void watch() override {}
  void inject(in_addr, uint16_t, std::span<const uint8_t>) override {}
  std::string rx_state() override { return "pieces"; }
  Receiver* up = nullptr;
  bool takes = true;
  std::vector<Bytes> pieces, whole;
  uint8_t last_tos = 0;
};

// Rules of either way, or none; fires the queued decisions, one per packet.
class Switchable final : public faults::PacketFilter {
 public:
  faults::FaultDecision decide(const faults::PacketFacts& f) override {
    seen.push_back(*f.pkt);
    if (next.empty()) return {};
    faults::FaultDecision d;
    d.fired = true;
    d.action = next.front();
    next.erase(next.begin());
    return d;
  }
  void load(bool rules) { set_active(rules, rules); }
  void load(bool tx, bool rx) { set_active(tx, rx); }
  std::vector<faults::FaultAction> next;
  std::vector<wire::PacketView> seen;
};

class Nobody final : public Receiver {
 public:
  void receive(in_addr, uint16_t, std::span<const uint8_t>, wire::IpFields) override {}
  void ready() override {}
};

// FaultyLink -> TapLink -> LocalLink -> PieceTaker, as a device's chain.
struct Chain {
  explicit Chain(wire::PcapWriter* pcap = nullptr)
      : local(hub, self, s, &below),
        neighbour(hub, addr("127.0.1.2"), s),
        tap(local, self, counters, clock, pcap, &hub),
        faulty(tap, filter, s, counters, "dev0") {
    faulty.attach(up);
    neighbour.attach(up2);
  }
  bool send(in_addr dst, uint8_t tos = 0) {
    wire::PacketHeaders h;
    h.bth.opcode = wire::opcode::rc_rdma_write_only;
    h.bth.dest_qp = 0x42;
    h.bth.psn = 9;
    h.reth = {0x1000, 0x77, 5};
    const Pieces one = {std::span<const uint8_t>(payload)};
    uint8_t room[wire::kMaxHeaderBytes];
    wire::GatheredPacket g;
    EXPECT_TRUE(wire::gather(h, one, room, g));
    expected.assign(g.size, 0);
    expected.resize(wire::build(h, one, expected, nullptr));
    return faulty.send_gathered(dst, g, tos);
  }
  const in_addr self = addr("127.0.1.1");
  const in_addr other = addr("127.0.9.9");  // a device of another process
  const Bytes payload = {1, 2, 3, 4, 5};
  fake::ManualClock clock;
  fake::ManualScheduler s{clock};
  LocalHub hub;
  PieceTaker below;
  LocalLink local, neighbour;
  LinkCounters counters;
  TapLink tap;
  Switchable filter;
  FaultyLink faulty;
  Nobody up, up2;
  Bytes expected;
};

TEST(GatheredSend, GoesThroughTheLayersAndIsCountedAsThePacket) {
  Chain c;
  ASSERT_TRUE(c.send(c.other, 0x2e));
  ASSERT_EQ(c.below.pieces.size(), 1u);
  EXPECT_EQ(c.below.pieces[0], c.expected);
  EXPECT_EQ(c.below.last_tos, 0x2e);
  EXPECT_EQ(c.counters.tx_packets, 1u);
  EXPECT_EQ(c.counters.tx_bytes, 20u + 8u + c.expected.size());
}

TEST(GatheredSend, IsRefusedWhereSomethingNeedsTheWholePacket) {
  {
    // Rules of the way in are the receiver's (they see its packets' bytes),
    // not decided on the way out.
    Chain c;
    c.filter.load(false, true);
    EXPECT_TRUE(c.send(c.other));
    EXPECT_TRUE(c.filter.seen.empty());
  }
  {
    Chain c;
    EXPECT_FALSE(c.send(addr("127.0.1.2")));  // a device of this process: its queue holds whole packets
    EXPECT_FALSE(c.send(addr("239.1.2.3")));  // multicast: replicated from the bytes
    c.below.takes = false;                    // no ring that takes it (UDP, the socket mode)
    EXPECT_FALSE(c.send(c.other));
    EXPECT_EQ(c.counters.tx_packets, 0u);  // what did not go is not counted
    EXPECT_EQ(c.counters.tx_bytes, 0u);
    EXPECT_TRUE(c.below.pieces.empty());
  }
  {
    char path[] = "/tmp/softverbs-gathered-XXXXXX";
    const int fd = ::mkstemp(path);
    ASSERT_GE(fd, 0);
    ::close(fd);
    {
      wire::PcapWriter pcap(path);
      ASSERT_TRUE(pcap.ok());
      Chain c(&pcap);  // a capture shows the bytes
      EXPECT_FALSE(c.send(c.other));
      EXPECT_TRUE(c.below.pieces.empty());
    }
    ::unlink(path);
  }
}

// Rules of the way out: each packet is decided once, on its headers. One
// not hit goes in pieces; a lost one goes nowhere (counted as a fault, not as
// sent); one an action needs the bytes of is refused, and the built packet
// that follows carries out the same decision without a second one.
TEST(GatheredSend, RulesOfTheWayOutDecideOnTheHeadersOnce) {
  Chain c;
  c.filter.load(true, false);
  ASSERT_TRUE(c.send(c.other));
  ASSERT_EQ(c.filter.seen.size(), 1u);
  EXPECT_EQ(c.filter.seen[0].bth.psn, 9u);
  EXPECT_EQ(c.filter.seen[0].bth.dest_qp, 0x42u);
  EXPECT_EQ(c.filter.seen[0].reth.rkey, 0x77u);
  EXPECT_EQ(c.filter.seen[0].payload.size(), c.payload.size());
  EXPECT_EQ(c.below.pieces.size(), 1u);

  c.filter.next = {faults::FaultAction::drop};
  EXPECT_TRUE(c.send(c.other));
  EXPECT_EQ(c.filter.seen.size(), 2u);
  EXPECT_EQ(c.below.pieces.size(), 1u);
  EXPECT_EQ(c.counters.faults_dropped, 1u);
  EXPECT_EQ(c.counters.tx_packets, 1u);

  c.filter.next = {faults::FaultAction::duplicate};
  EXPECT_FALSE(c.send(c.other));
  EXPECT_EQ(c.filter.seen.size(), 3u);
  c.faulty.send(c.other, c.expected, 0, false);  // the sender builds it
  EXPECT_EQ(c.filter.seen.size(), 3u) << "decided a second time";
  EXPECT_EQ(c.below.whole.size(), 2u);
  EXPECT_EQ(c.counters.faults_duplicated, 1u);

  // Not hit, but the link below takes no pieces: built, it is not decided again.
  c.below.takes = false;
  EXPECT_FALSE(c.send(c.other));
  EXPECT_EQ(c.filter.seen.size(), 4u);
  c.faulty.send(c.other, c.expected, 0, false);
  EXPECT_EQ(c.filter.seen.size(), 4u);
  EXPECT_EQ(c.below.whole.size(), 3u);

  // A decision kept for one packet is not used for another.
  c.filter.next = {faults::FaultAction::duplicate};
  EXPECT_FALSE(c.send(c.other));
  Bytes other = c.expected;
  other[11] ^= 1;  // another PSN
  c.faulty.send(c.other, other, 0, false);
  EXPECT_EQ(c.filter.seen.size(), 6u);
  EXPECT_EQ(c.below.whole.size(), 4u);
}

}  // namespace
}  // namespace softverbs::fabric

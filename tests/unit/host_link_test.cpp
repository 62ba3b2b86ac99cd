// HostLink (fabric/host_link.hpp), the lossless same-host path, on real
// AF_UNIX sockets in one process: exact delivery with the sender's address,
// the UDP fallback for an address without a name, a burst far beyond the
// receiver's queue arriving complete, the bounded wait turning into a counted
// drop when the receiver never reads, and two links that fill each other's
// queues finishing without a drop; the shared-memory rings: the socket mode
// alongside, packets without their ICRC on a ring (and given one on any other
// way), packets in pieces into a ring (refused wherever the whole packet is
// needed), a sleeping receiver woken through its connection, a polling one not
// woken (the lease) and served after its lease, and a hostile
// sender's ring costing that sender its connection, not the receiver.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fabric/host_link.hpp"
#include "fabric/host_ring.hpp"
#include "fabric/scheduler.hpp"
#include "wire/headers.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::fabric {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

// Addresses only this process uses: abstract names are host-wide, and other
// test processes run at the same time. 10/8 with the PID in the low bits.
in_addr test_addr(int k) {
  in_addr a{};
  a.s_addr = htonl((10u << 24) | ((static_cast<uint32_t>(::getpid()) * 8u + static_cast<uint32_t>(k)) & 0xffffffu));
  return a;
}

// A UC SEND of `payload` bytes, told apart by its PSN (ICRC left 0: nothing
// here checks it).
Bytes packet(uint32_t psn, size_t payload = 8) {
  wire::PacketHeaders h;
  h.bth.opcode = wire::opcode::uc_send_only;
  h.bth.dest_qp = 0x42;
  h.bth.psn = psn & 0xffffff;
  Bytes data(payload, static_cast<uint8_t>(psn));
  Bytes out(payload + 128);
  out.resize(wire::build(h, std::span<const uint8_t>(data), out, nullptr));
  return out;
}

// Whether p's ICRC holds for a packet from `from` to `to` as devices send it
// (emu::Device::flow: ID 0, DF, port 4791 both ways).
bool icrc_holds(std::span<const uint8_t> p, in_addr from, in_addr to) {
  wire::Ipv4Flow flow;
  std::memcpy(flow.saddr.data(), &from.s_addr, 4);
  std::memcpy(flow.daddr.data(), &to.s_addr, 4);
  flow.sport = wire::kRoceV2UdpPort;
  wire::PacketView v;
  return wire::parse(p, v, wire::IcrcFlow{flow}) == wire::ParseError::ok;
}

uint32_t psn_of(std::span<const uint8_t> p) {
  wire::PacketView v;
  EXPECT_EQ(wire::parse(p, v), wire::ParseError::ok);
  return v.bth.psn;
}

// An RC ACK, told apart by its PSN: an answer to the receiver's own request.
Bytes ack(uint32_t psn) {
  wire::PacketHeaders h;
  h.bth.opcode = wire::opcode::rc_acknowledge;
  h.bth.dest_qp = 0x42;
  h.bth.psn = psn & 0xffffff;
  Bytes out(128);
  out.resize(wire::build(h, std::span<const uint8_t>(), out, nullptr));
  return out;
}

// Receives on the draining thread; ready() comes from the scheduler's thread.
class Collector final : public Receiver {
 public:
  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> p, wire::IpFields ip = {}) override {
    std::lock_guard lock(mu);
    ips.push_back(ip);
    srcs.push_back(src.s_addr);
    sports.push_back(sport);
    psns.push_back(psn_of(p));
    last.assign(p.begin(), p.end());
  }
  void ready() override { ++readies; }
  // A thread ending its lease looks at the rings through here (the device's
  // serialisation: here every delivery is on the test's thread).
  bool try_poll() override {
    (void)link->poll_shared();
    return true;
  }
  size_t count() {
    std::lock_guard lock(mu);
    return psns.size();
  }
  std::mutex mu;
  std::vector<wire::IpFields> ips;
  std::vector<in_addr_t> srcs;
  std::vector<uint16_t> sports;
  std::vector<uint32_t> psns;
  Bytes last;
  std::atomic<int> readies{0};
  Link* link = nullptr;
};

// What reaches the UDP side.
class UdpStandIn final : public Link {
 public:
  void attach(Receiver& r) override { up = &r; }
  void send(in_addr dst, std::span<const uint8_t> p, uint8_t = 0, bool = true) override {
    std::lock_guard lock(mu);
    sent.push_back(dst.s_addr);
    last.assign(p.begin(), p.end());
  }
  bool drain() override { return false; }
  void watch() override {}
  void inject(in_addr src, uint16_t sport, std::span<const uint8_t> p) override { up->receive(src, sport, p); }
  std::string rx_state() override { return "udp"; }
  std::mutex mu;
  std::vector<in_addr_t> sent;
  Bytes last;
  Receiver* up = nullptr;
};

// One device's end: its UDP stand-in, its HostLink and what it received.
struct End {
  End(RealTimeScheduler& s, int k, std::chrono::milliseconds wait, bool ring = true, in_addr at = {})
      : addr(at.s_addr ? at : test_addr(k)) {
    int fd = HostLink::bind(addr);
    EXPECT_GE(fd, 0) << std::strerror(-fd);
    link = std::make_unique<HostLink>(udp, s, fd, addr, counters, HostLinkOptions{true, wait, ring},
                                      "end" + std::to_string(k));
    link->attach(rx);
    rx.link = link.get();
  }
  // Drains until `n` packets arrived or 30 s passed (a failure, not a wait).
  void drain_until(size_t n) {
    for (int spins = 0; rx.count() < n && spins < 3000000; ++spins)
      if (!link->drain()) std::this_thread::yield();
  }
  in_addr addr;
  UdpStandIn udp;
  LinkCounters counters;
  Collector rx;
  std::unique_ptr<HostLink> link;
};

TEST(HostLinkOptions, ParsesTheVariable) {
  std::string err;
  auto d = parse_host_link(nullptr, &err);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->enabled);
  EXPECT_EQ(d->wait, 100ms);
  auto u = parse_host_link("udp", &err);
  ASSERT_TRUE(u);
  EXPECT_FALSE(u->enabled);
  auto w = parse_host_link("unix:7", &err);
  ASSERT_TRUE(w);
  EXPECT_TRUE(w->enabled);
  EXPECT_EQ(w->wait, 7ms);
  EXPECT_EQ(parse_host_link("unix:0", &err)->wait, 0ms);
  EXPECT_TRUE(w->ring);
  auto so = parse_host_link("socket:9", &err);
  ASSERT_TRUE(so);
  EXPECT_TRUE(so->enabled);
  EXPECT_FALSE(so->ring);
  EXPECT_EQ(so->wait, 9ms);
  EXPECT_FALSE(parse_host_link("socket", &err)->ring);
  for (const char* bad : {"tcp", "unix:", "unix:-1", "unix:1x", "unix:10000000", "UDP", "socket:", "sockets", "socketunix"}) {
    err.clear();
    EXPECT_FALSE(parse_host_link(bad, &err)) << bad;
    EXPECT_NE(err.find("SOFTVERBS_HOST_LINK"), std::string::npos) << bad;
  }
}

TEST(HostLink, NameIsTheAddressInTheAbstractNamespace) {
  in_addr a{};
  inet_pton(AF_INET, "127.0.0.20", &a);
  EXPECT_EQ(HostLink::name_of(a), std::string("\0softverbs/roce/127.0.0.20", 26));
  // A name is held by one socket: the second bind of an address fails.
  int fd = HostLink::bind(test_addr(0));
  ASSERT_GE(fd, 0);
  EXPECT_EQ(HostLink::bind(test_addr(0)), -EADDRINUSE);
  ::close(fd);
  // ... and vanishes with it.
  fd = HostLink::bind(test_addr(0));
  EXPECT_GE(fd, 0);
  ::close(fd);
}

TEST(HostLink, DeliversTheExactBytesFromTheSendersAddress) {
  RealTimeScheduler s;
  End a(s, 1, 100ms), b(s, 2, 100ms);
  const Bytes p = packet(7, 1000);
  a.link->send(b.addr, p, 0x2e);
  b.drain_until(1);
  ASSERT_EQ(b.rx.count(), 1u);
  EXPECT_EQ(b.rx.srcs[0], a.addr.s_addr);
  EXPECT_EQ(b.rx.sports[0], wire::kRoceV2UdpPort);
  EXPECT_EQ(b.rx.last, p);
  // The TOS byte (the traffic class) travels in the prefix.
  EXPECT_EQ(b.rx.ips[0], (wire::IpFields{0x2e, 64}));
  EXPECT_TRUE(a.udp.sent.empty());  // nothing went by UDP
  EXPECT_FALSE(b.link->drain());
}

TEST(HostLink, AnAddressWithoutANameGoesByUdp) {
  RealTimeScheduler s;
  End a(s, 1, 100ms);
  const in_addr nobody = test_addr(5);
  a.link->send(nobody, packet(1));
  a.link->send(nobody, packet(2));  // the answer is remembered
  ASSERT_EQ(a.udp.sent.size(), 2u);
  EXPECT_EQ(a.udp.sent[0], nobody.s_addr);
  // A link without a socket (SOFTVERBS_HOST_LINK=udp) sends everything by UDP.
  End b(s, 2, 100ms);
  UdpStandIn udp;
  LinkCounters counters;
  Collector rx;
  HostLink off(udp, s, -1, test_addr(3), counters, HostLinkOptions{false, 100ms}, "off");
  off.attach(rx);
  off.send(b.addr, packet(3));
  EXPECT_EQ(udp.sent.size(), 1u);
  EXPECT_FALSE(off.drain());
}

TEST(HostLink, APeerThatWentAwayFallsBackToUdp) {
  RealTimeScheduler s;
  End a(s, 1, 100ms);
  auto b = std::make_unique<End>(s, 2, 100ms);
  const in_addr baddr = b->addr;
  a.link->send(baddr, packet(1));
  EXPECT_TRUE(a.udp.sent.empty());
  b.reset();  // its process exited: the name is gone
  a.link->send(baddr, packet(2));
  ASSERT_EQ(a.udp.sent.size(), 1u);
  EXPECT_EQ(a.counters.host_drops, 0u);
}

// 20 000 packets of 4 KiB (80 MB) against a queue of a few hundred datagrams:
// the receiver starts reading only once the sender has found it full, and
// every packet arrives, in order.
TEST(HostLink, ABurstFarBeyondTheReceiversQueueArrivesComplete) {
  RealTimeScheduler s;
  End a(s, 1, 30s), b(s, 2, 30s);
  constexpr uint32_t kPackets = 20000;
  std::thread sender([&] {
    for (uint32_t i = 0; i < kPackets; ++i) a.link->send(b.addr, packet(i, 4096));
  });
  for (int spins = 0; a.link->waits() == 0 && spins < 3000000; ++spins) std::this_thread::yield();
  EXPECT_GT(a.link->waits(), 0u);  // the receiver was full: back-pressure, not loss
  b.drain_until(kPackets);
  sender.join();
  ASSERT_EQ(b.rx.count(), kPackets);
  for (uint32_t i = 0; i < kPackets; ++i) ASSERT_EQ(b.rx.psns[i], i);
  EXPECT_EQ(a.counters.host_drops, 0u);
  EXPECT_TRUE(a.udp.sent.empty());
}

// A receiver that never reads costs the sender one bounded wait, then drops;
// once it reads again, packets go through again.
TEST(HostLink, TheBoundedWaitCountsADropWhenTheReceiverNeverReads) {
  RealTimeScheduler s;
  End a(s, 1, 20ms), b(s, 2, 20ms);
  constexpr uint32_t kPackets = 3000;
  for (uint32_t i = 0; i < kPackets; ++i) a.link->send(b.addr, packet(i, 4096));
  const uint64_t drops = a.counters.host_drops;
  EXPECT_GT(drops, 0u);
  EXPECT_EQ(a.link->waits(), 1u);  // only the first full send waited
  while (b.link->drain()) {
  }
  EXPECT_EQ(b.rx.count() + drops, kPackets);
  // Every packet that arrived came in order, the first ones.
  for (size_t i = 0; i < b.rx.count(); ++i) ASSERT_EQ(b.rx.psns[i], i);
  a.link->send(b.addr, packet(kPackets));
  b.drain_until(b.rx.count() + 1);
  EXPECT_EQ(b.rx.psns.back(), kPackets);
  EXPECT_EQ(a.counters.host_drops, drops);
}

// Two devices whose senders fill each other's queues, each draining its own
// link only when done sending (as a progress thread busy sending cannot
// drain): each waiting sender takes its own incoming datagrams aside, so both
// finish with no drop, and each side gets all the other sent, in order.
TEST(HostLink, TwoSendersFillingEachOtherNeverDeadlock) {
  RealTimeScheduler s;
  End a(s, 1, 30s), b(s, 2, 30s);
  constexpr uint32_t kPackets = 3000;
  std::thread ta([&] {
    for (uint32_t i = 0; i < kPackets; ++i) a.link->send(b.addr, packet(i, 4096));
    a.drain_until(kPackets);
  });
  std::thread tb([&] {
    for (uint32_t i = 0; i < kPackets; ++i) b.link->send(a.addr, packet(i, 4096));
    b.drain_until(kPackets);
  });
  ta.join();
  tb.join();
  EXPECT_EQ(a.counters.host_drops, 0u);
  EXPECT_EQ(b.counters.host_drops, 0u);
  EXPECT_GT(a.link->waits() + b.link->waits(), 0u);
  ASSERT_EQ(a.rx.count(), kPackets);
  ASSERT_EQ(b.rx.count(), kPackets);
  for (uint32_t i = 0; i < kPackets; ++i) {
    ASSERT_EQ(a.rx.psns[i], i);
    ASSERT_EQ(b.rx.psns[i], i);
  }
  // Whoever took packets aside told its receiver through the scheduler.
  for (int spins = 0; a.rx.readies + b.rx.readies == 0 && spins < 3000000; ++spins) std::this_thread::yield();
  EXPECT_GT(a.rx.readies + b.rx.readies, 0);
}

// Packets on the connection itself (SOFTVERBS_HOST_LINK=socket): the same
// order and bytes as through a ring.
TEST(HostLink, TheSocketModeDeliversInOrderToo) {
  RealTimeScheduler s;
  End a(s, 1, 30s, false), b(s, 2, 30s, false);
  for (uint32_t i = 0; i < 500; ++i) a.link->send(b.addr, packet(i, 1024));
  b.drain_until(500);
  ASSERT_EQ(b.rx.count(), 500u);
  for (uint32_t i = 0; i < 500; ++i) ASSERT_EQ(b.rx.psns[i], i);
  EXPECT_NE(b.link->rx_state().find("0 rings"), std::string::npos) << b.link->rx_state();
}

// A ring's receiver takes packets without their ICRC: once it has taken the
// ring up, the sender is told it need not compute one, and such a packet
// arrives marked so; one with its ICRC arrives as before.
TEST(HostLink, ARingCarriesPacketsWithoutTheirIcrc) {
  RealTimeScheduler s;
  End a(s, 1, 30s), b(s, 2, 30s);
  EXPECT_TRUE(a.link->needs_icrc(b.addr));  // no connection yet
  a.link->send(b.addr, packet(1));
  b.drain_until(1);  // takes the ring up
  EXPECT_FALSE(a.link->needs_icrc(b.addr));
  EXPECT_TRUE(a.link->needs_icrc(test_addr(5)));  // nobody there: UDP
  a.link->send(b.addr, packet(2), 0, false);
  a.link->send(b.addr, packet(3), 0, true);
  b.drain_until(3);
  ASSERT_EQ(b.rx.count(), 3u);
  EXPECT_EQ(b.rx.psns, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_FALSE(b.rx.ips[0].icrc_skipped);
  EXPECT_TRUE(b.rx.ips[1].icrc_skipped);
  EXPECT_FALSE(b.rx.ips[2].icrc_skipped);
  EXPECT_TRUE(a.udp.sent.empty());
}

// A packet whose ICRC was left uncomputed but that goes a way that needs one
// (the socket mode's connection, UDP) gets it on the way out.
TEST(HostLink, APacketWithoutIcrcGetsItOnAnyOtherWay) {
  RealTimeScheduler s;
  End a(s, 1, 30s, false), b(s, 2, 30s);
  a.link->send(b.addr, packet(1));
  b.drain_until(1);
  EXPECT_TRUE(a.link->needs_icrc(b.addr));  // no ring: the connection
  a.link->send(b.addr, packet(2, 100), 0, false);
  b.drain_until(2);
  ASSERT_EQ(b.rx.count(), 2u);
  EXPECT_FALSE(b.rx.ips[1].icrc_skipped);
  EXPECT_TRUE(icrc_holds(b.rx.last, a.addr, b.addr));
  const in_addr nobody = test_addr(6);
  a.link->send(nobody, packet(3, 100), 0, false);
  ASSERT_EQ(a.udp.sent.size(), 1u);
  EXPECT_TRUE(icrc_holds(a.udp.last, a.addr, nobody));
}

// A packet in pieces (send_gathered: headers, payload pieces, zero tail) goes
// into a ring whose receiver takes packets without their ICRC: the receiver
// gets the packet build() writes, but for its ICRC field (0), marked as sent
// without one. Where the whole packet or its ICRC is needed (no connection
// yet, the socket mode, UDP, a receiver gone) it is refused and nothing goes:
// the sender then builds it and send()s it.
TEST(HostLink, APacketInPiecesIsTheBuiltPacketWithoutItsIcrc) {
  RealTimeScheduler s;
  End a(s, 1, 30s);
  auto b = std::make_unique<End>(s, 2, 30s);
  const in_addr baddr = b->addr;
  wire::PacketHeaders h;
  h.bth.opcode = wire::opcode::uc_send_only;
  h.bth.dest_qp = 0x42;
  h.bth.psn = 2;
  Bytes payload(1001);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 13 + 1);
  const std::span<const uint8_t> all(payload);
  const std::span<const uint8_t> pieces[3] = {all.first(10), all.subspan(10, 500), all.subspan(510)};
  uint8_t room[wire::kMaxHeaderBytes];
  wire::GatheredPacket g;
  ASSERT_TRUE(wire::gather(h, pieces, room, g));
  EXPECT_FALSE(a.link->send_gathered(baddr, g, 0));  // no connection yet
  a.link->send(baddr, packet(1));
  b->drain_until(1);  // takes the ring up
  ASSERT_TRUE(a.link->send_gathered(baddr, g, 0x2e));
  b->drain_until(2);
  ASSERT_EQ(b->rx.count(), 2u);
  EXPECT_EQ(b->rx.psns, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(b->rx.ips[1], (wire::IpFields{0x2e, 64, true}));
  wire::Ipv4Flow flow;
  std::memcpy(flow.saddr.data(), &a.addr.s_addr, 4);
  std::memcpy(flow.daddr.data(), &baddr.s_addr, 4);
  flow.sport = flow.dport = wire::kRoceV2UdpPort;
  const wire::IcrcFlow icrc{flow};
  Bytes built(2048);
  built.resize(wire::build(h, pieces, built, &icrc));
  const Bytes& got = b->rx.last;
  ASSERT_EQ(got.size(), built.size());
  const size_t icrc_at = built.size() - wire::kIcrcBytes;
  EXPECT_TRUE(std::equal(built.begin(), built.begin() + static_cast<std::ptrdiff_t>(icrc_at), got.begin()));
  EXPECT_EQ(Bytes(got.begin() + static_cast<std::ptrdiff_t>(icrc_at), got.end()), Bytes(4, 0));
  EXPECT_TRUE(a.udp.sent.empty());

  // A payload in more pieces than a record gathers is built first.
  std::vector<std::span<const uint8_t>> many;
  for (size_t i = 0; i < 20; ++i) many.push_back(all.subspan(i * 50, 50));
  wire::GatheredPacket g_many;
  ASSERT_TRUE(wire::gather(h, many, room, g_many));
  EXPECT_FALSE(a.link->send_gathered(baddr, g_many, 0));
  // UDP (no device there) and the socket mode need the ICRC.
  EXPECT_FALSE(a.link->send_gathered(test_addr(6), g, 0));
  End c(s, 3, 30s, false);
  c.link->send(baddr, packet(3));
  b->drain_until(3);
  EXPECT_FALSE(c.link->send_gathered(baddr, g, 0));
  // A receiver that went away: refused, and the packet, built without its
  // ICRC, gets one on the next way (UDP here).
  b.reset();
  EXPECT_FALSE(a.link->send_gathered(baddr, g, 0));
  EXPECT_TRUE(a.udp.sent.empty());
  Bytes no_icrc(2048);
  no_icrc.resize(wire::build(h, pieces, no_icrc, nullptr));
  a.link->send(baddr, no_icrc, 0, false);
  ASSERT_EQ(a.udp.sent.size(), 1u);
  EXPECT_EQ(a.udp.last, built);
  EXPECT_EQ(a.counters.host_drops, 0u);
}

// A receiver whose progress thread sleeps is woken by the first packet in its
// ring (through the connection), not left with it.
TEST(HostLink, ASleepingReceiverIsWoken) {
  auto sched = std::make_unique<RealTimeScheduler>();
  RealTimeScheduler& s = *sched;
  End a(s, 1, 30s), b(s, 2, 30s);
  b.link->watch();
  a.link->send(b.addr, packet(1));
  for (int spins = 0; b.rx.readies == 0 && spins < 3000000; ++spins) std::this_thread::yield();
  EXPECT_GT(b.rx.readies, 0);
  b.drain_until(1);
  ASSERT_EQ(b.rx.count(), 1u);
  EXPECT_NE(b.link->rx_state().find("1 rings"), std::string::npos) << b.link->rx_state();
  s.stop();  // its thread watches b's sockets: stopped before b goes (b's end still uses s)
}

// Waits (bounded) until `cond` holds; false if it never did.
template <class F>
bool eventually(F cond) {
  for (int spins = 0; spins < 3000000; ++spins) {
    if (cond()) return true;
    std::this_thread::yield();
  }
  return cond();
}

// Two ends whose receiver b is watched by the scheduler's thread, after a
// first packet (PSN 1) went from a to b; the thread is stopped before the
// ends go (their destructors still use the scheduler).
struct Watched {
  Watched() {
    b.link->watch();
    a.link->send(b.addr, packet(1));
    b.drain_until(1);
  }
  ~Watched() { s.stop(); }
  RealTimeScheduler s;
  End a{s, 1, 30s}, b{s, 2, 30s};
};

// The lease tests' round: with b's ring armed, b's application polls (`poll`:
// a lease), a sends the packet numbered psn, and `take(held_back)` makes b take
// it, where held_back says whether the send left the wake-up out. A lease
// lasts 1 ms of real time: a test thread descheduled longer than that between
// its poll and its send sees a wake-up, and tries again, at most 20 times.
// True once a packet went without a wake-up; psn is then the next one to send.
// `make` builds the packet (a request by default).
template <class Poll, class Take>
bool sent_under_a_lease(End& a, End& b, uint32_t& psn, Poll poll, Take take, Bytes (*make)(uint32_t) = nullptr) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    // The progress thread armed the ring before it went back to sleep.
    if (!eventually([&] { return b.link->armed_rings() == 1; })) {
      ADD_FAILURE() << "the receiver's ring was never armed";
      return false;
    }
    poll();
    const uint64_t woken = a.link->wakeups();
    a.link->send(b.addr, make ? make(psn) : packet(psn));
    const bool held_back = a.link->wakeups() == woken;
    take(held_back);
    if (b.rx.count() != psn) {
      ADD_FAILURE() << "packet " << psn << " not taken";
      return false;
    }
    ++psn;
    if (held_back) return true;
  }
  return false;
}

// With b's ring armed, `before` runs on b's application thread (a poll, a
// hint), then a sends packet psn (built by `make`): it must wake b, whatever
// the timing. b then takes it, and psn moves on.
template <class Before>
void sent_with_a_wake_up(End& a, End& b, uint32_t& psn, Before before, Bytes (*make)(uint32_t) = nullptr) {
  ASSERT_TRUE(eventually([&] { return b.link->armed_rings() == 1; }));
  before();
  const uint64_t woken = a.link->wakeups();
  a.link->send(b.addr, make ? make(psn) : packet(psn));
  EXPECT_EQ(a.link->wakeups(), woken + 1);
  b.drain_until(psn);
  ASSERT_EQ(b.rx.count(), psn);
  ++psn;
}

// While the receiver's application polls (poll_shared), the sender leaves
// the wake-up out; once the application goes off to work (note_busy), the
// next packet wakes it again.
TEST(HostLink, APollingReceiverIsNotWoken) {
  Watched w;
  RealTimeScheduler& s = w.s;
  End &a = w.a, &b = w.b;
  ASSERT_EQ(b.rx.count(), 1u);
  uint32_t psn = 2;
  EXPECT_TRUE(sent_under_a_lease(
      a, b, psn, [&] { (void)b.link->poll_shared(); },  // the application polls: a lease
      [&](bool held_back) {
        if (held_back) {
          EXPECT_EQ(b.link->armed_rings(), 1u);  // the wake-up is still asked for
        }
        b.drain_until(psn);  // the poller takes the packet
      }));
  sent_with_a_wake_up(a, b, psn, [&] { s.note_busy(); });  // the application goes off to work
}

// A thread that keeps polling reads the clock only every few polls while its
// lease lasts: many polls in a row keep the lease (the sender still leaves
// wake-ups out), and a lease that ended starts again from the true time.
TEST(HostLink, ManyPollsInARowKeepTheLease) {
  Watched w;
  RealTimeScheduler& s = w.s;
  End &a = w.a, &b = w.b;
  uint32_t psn = 2;
  for (int round = 0; round < 2; ++round) {
    EXPECT_TRUE(sent_under_a_lease(
        a, b, psn,
        [&] {
          for (int i = 0; i < 50; ++i) (void)b.link->poll_shared();
        },
        [&](bool) { b.drain_until(psn); }))
        << round;
    s.note_busy();  // the lease ends; the next round's polls start a new one
  }
}

// The application thread that ends its lease (a post, a poll that found
// completions) takes what came under it itself, before note_busy returns,
// instead of waking the progress thread on its CPU.
TEST(HostLink, TheThreadEndingItsLeaseTakesWhatCameUnderIt) {
  Watched w;
  RealTimeScheduler& s = w.s;
  End &a = w.a, &b = w.b;
  uint32_t psn = 2;
  EXPECT_TRUE(sent_under_a_lease(
      a, b, psn, [&] { (void)b.link->poll_shared(); },  // a lease
      [&](bool held_back) {
        s.note_busy();
        if (held_back) {
          EXPECT_EQ(b.rx.count(), psn);  // taken by this thread, no poll, no wait
        } else {
          b.drain_until(psn);  // woken (descheduled past the lease): try again
        }
      }));
}

// A packet that came under a lease without a wake-up is served when the
// lease ends (note_busy: by the thread that ends it) or runs out (no poll: by
// the progress thread).
TEST(HostLink, WhatCameUnderALeaseIsServedAfterIt) {
  Watched w;
  RealTimeScheduler& s = w.s;
  End &a = w.a, &b = w.b;
  ASSERT_TRUE(eventually([&] { return b.link->armed_rings() == 1; }));
  for (bool ended : {true, false}) {
    (void)b.link->poll_shared();
    const int readies = b.rx.readies;
    a.link->send(b.addr, packet(ended ? 2 : 3));
    if (ended) s.note_busy();
    // Served without a poll, whether the send found the lease or not: by the
    // thread that ended the lease (note_busy reads the rings itself) or by
    // the progress thread (its serve() announces it).
    EXPECT_TRUE(eventually([&] { return b.rx.readies > readies || b.rx.count() == (ended ? 2u : 3u); })) << ended;
    b.drain_until(ended ? 2 : 3);
    EXPECT_EQ(b.rx.count(), ended ? 2u : 3u);
    ASSERT_TRUE(eventually([&] { return b.link->armed_rings() == 1; }));
  }
}

// Going off to work (a post, a poll that found completions) ends the lease
// but not the answer lease: the next request wakes the receiver, an ACK does
// not (its thread's next poll reads it); a hint that the thread may block
// (ibv_req_notify_cq) ends that too. An ACK held back is served by the
// progress thread once the answer lease runs out.
TEST(HostLink, AnswersKeepTheirLeaseWhileTheApplicationWorks) {
  Watched w;
  RealTimeScheduler& s = w.s;
  End &a = w.a, &b = w.b;
  uint32_t psn = 2;
  EXPECT_TRUE(sent_under_a_lease(
      a, b, psn,
      [&] {
        (void)b.link->poll_shared();  // a lease
        s.note_busy();                // off to work: nothing came, nothing read
      },
      [&](bool) { b.drain_until(psn); },  // the next poll takes it
      &ack));
  // A request: woken.
  sent_with_a_wake_up(a, b, psn, [&] {
    (void)b.link->poll_shared();
    s.note_busy();
  });
  // May block: an ACK wakes it again.
  sent_with_a_wake_up(
      a, b, psn,
      [&] {
        (void)b.link->poll_shared();
        s.note_may_block();
      },
      &ack);
  // An ACK under the answer lease, and no poll after it: the progress thread
  // serves it when the lease runs out.
  ASSERT_TRUE(eventually([&] { return b.link->armed_rings() == 1; }));
  (void)b.link->poll_shared();
  s.note_busy();
  const int readies = b.rx.readies;
  a.link->send(b.addr, ack(psn));
  EXPECT_TRUE(eventually([&] { return b.rx.readies > readies; }));
  b.drain_until(psn);
  EXPECT_EQ(b.rx.count(), psn);
}

// A sender that passes a ring and then writes nonsense into it (or into the
// ring's counters) is not trusted: the receiver reads nothing out of bounds,
// drops that connection, and keeps serving the others.
TEST(HostLink, AGarbledRingCostsItsSenderTheConnection) {
  RealTimeScheduler s;
  End a(s, 1, 30s), b(s, 2, 30s);
  const int conn = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(conn, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  const std::string name = HostLink::name_of(b.addr);
  std::memcpy(sa.sun_path, name.data(), name.size());
  ASSERT_EQ(::connect(conn, reinterpret_cast<sockaddr*>(&sa),
                      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())),
            0);
  int memfd = -1;
  auto ring = HostRing::create(&memfd);
  ASSERT_TRUE(ring);
  uint8_t msg[8] = {'S', 'V', 2, 0, 1, 2, 3, 4};
  iovec iov{msg, sizeof msg};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = control;
  mh.msg_controllen = sizeof control;
  cmsghdr* cm = CMSG_FIRSTHDR(&mh);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cm), &memfd, sizeof memfd);
  ASSERT_EQ(::sendmsg(conn, &mh, 0), static_cast<ssize_t>(sizeof msg));
  ::close(memfd);
  // One record that is not a packet, then a head far past anything written.
  ASSERT_TRUE(ring->put(Bytes{'x', 'y'}, {}));
  uint64_t head = 1ull << 40;
  std::memcpy(ring->raw().data() + 64, &head, sizeof head);
  for (int i = 0; i < 1000; ++i) b.link->drain();
  EXPECT_EQ(b.rx.count(), 0u);
  EXPECT_TRUE(ring->closed());  // the receiver let go of it
  char c;
  EXPECT_EQ(::recv(conn, &c, 1, MSG_DONTWAIT), 0);  // and of its connection
  ::close(conn);
  // An honest sender still gets through.
  a.link->send(b.addr, packet(7));
  b.drain_until(1);
  ASSERT_EQ(b.rx.count(), 1u);
  EXPECT_EQ(b.rx.psns[0], 7u);
}

// A receiver whose process dies leaves its ring open (nothing closes it): the
// sender learns it from the connection's end, which its own drains watch, and
// its next packet finds another way (here UDP: the name went with the process).
TEST(HostLink, AReceiverThatDiesWithoutClosingItsRingIsNoticed) {
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  const in_addr baddr = test_addr(2);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The receiver: binds its name, tells the parent, takes the ring up, dies.
    RealTimeScheduler cs;
    End b(cs, 2, 30s, true, baddr);  // the parent's address: getpid() differs here
    char c = 'r';
    (void)!::write(to_parent[1], &c, 1);
    (void)!::read(to_child[0], &c, 1);
    for (int i = 0; i < 100000 && b.rx.count() == 0; ++i) b.link->drain();
    ::_exit(b.rx.count() == 1 ? 0 : 1);
  }
  char c = 0;
  ASSERT_EQ(::read(to_parent[0], &c, 1), 1);
  RealTimeScheduler s;
  End a(s, 1, 100ms);
  a.link->send(baddr, packet(1));
  ASSERT_EQ(::write(to_child[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(a.udp.sent.empty());
  a.link->drain();  // sees the connection end
  a.link->send(baddr, packet(2));
  ASSERT_EQ(a.udp.sent.size(), 1u);
  EXPECT_EQ(a.counters.host_drops, 0u);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) ::close(fd);
}

}  // namespace
}  // namespace softverbs::fabric

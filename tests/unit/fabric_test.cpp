// The fabric seams on virtual time: EngineTimer over a scheduler the test
// drives, and the links (LocalLink, FaultyLink, TapLink) with a fake packet
// filter and a fake inner link.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <condition_variable>
#include <chrono>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "fabric/faulty_link.hpp"
#include "fabric/local_link.hpp"
#include "fabric/scheduler.hpp"
#include "fabric/tap_link.hpp"
#include "fabric/timer.hpp"
#include "tests/unit/fake_time.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"
#include "wire/pcap.hpp"

namespace softverbs::fabric {
namespace {

using namespace std::chrono_literals;
using Bytes = std::vector<uint8_t>;

// Virtual time (tests/unit/fake_time.hpp): tasks run only when the test
// advances the clock, each at its moment.
using fake::ManualClock;
using fake::ManualScheduler;

// ---------------------------------------------------------------------------
// EngineTimer

TEST(EngineTimer, FiresAtTheArmedMoment) {
  ManualClock clock;
  ManualScheduler s{clock};
  std::vector<Clock::time_point> fired;
  auto timer = std::make_shared<EngineTimer>(s, [&] { fired.push_back(s.clock().now()); });
  const auto t0 = s.clock().now();
  timer->arm_at(t0 + 10ms);
  s.advance(9ms);
  EXPECT_TRUE(fired.empty());
  s.advance(1ms);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0], t0 + 10ms);
  s.advance(1s);
  EXPECT_EQ(fired.size(), 1u);  // one-shot
}

TEST(EngineTimer, EarlierArmWinsAndFiresOnce) {
  ManualClock clock;
  ManualScheduler s{clock};
  std::vector<Clock::time_point> fired;
  auto timer = std::make_shared<EngineTimer>(s, [&] { fired.push_back(s.clock().now()); });
  const auto t0 = s.clock().now();
  timer->arm_at(t0 + 10ms);
  timer->arm_at(t0 + 20ms);  // later than armed: no change
  timer->arm_at(t0 + 5ms);   // earlier: moves the expiry
  s.advance(1s);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_EQ(fired[0], t0 + 5ms);
  EXPECT_EQ(s.pending(), 0u);
}

TEST(EngineTimer, CallbackMayRearm) {
  ManualClock clock;
  ManualScheduler s{clock};
  std::vector<Clock::time_point> fired;
  std::shared_ptr<EngineTimer> timer;
  timer = std::make_shared<EngineTimer>(s, [&] {
    fired.push_back(s.clock().now());
    if (fired.size() < 3) timer->arm_at(s.clock().now() + 1ms);
  });
  const auto t0 = s.clock().now();
  timer->arm_at(t0 + 1ms);
  s.advance(1s);
  ASSERT_EQ(fired.size(), 3u);
  EXPECT_EQ(fired[2], t0 + 3ms);
  timer->detach();
}

TEST(EngineTimer, DetachPreventsFiring) {
  ManualClock clock;
  ManualScheduler s{clock};
  int fired = 0;
  auto timer = std::make_shared<EngineTimer>(s, [&] { ++fired; });
  timer->arm_at(s.clock().now() + 1ms);
  timer->detach();
  timer->arm_at(s.clock().now() + 2ms);  // ignored once detached
  s.advance(1s);
  EXPECT_EQ(fired, 0);
}

TEST(EngineTimer, DetachWaitsForARunningCallback) {
  ManualClock clock;
  ManualScheduler s{clock};
  std::atomic<bool> entered{false}, release{false}, finished{false}, detached{false};
  auto timer = std::make_shared<EngineTimer>(s, [&] {
    entered = true;
    while (!release) std::this_thread::yield();
    finished = true;
  });
  timer->arm_at(s.clock().now());
  std::thread engine([&] { s.advance(1ms); });
  while (!entered) std::this_thread::yield();
  std::thread owner([&] {
    timer->detach();
    detached = true;
    EXPECT_TRUE(finished);
  });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(detached);
  release = true;
  owner.join();
  engine.join();
  EXPECT_TRUE(detached);
}

// ---------------------------------------------------------------------------
// RealTimeScheduler

TEST(RealTimeScheduler, RunsDeadlinesInOrderAndNotEarly) {
  RealTimeScheduler s;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<int, Clock::time_point>> ran;
  const auto t0 = s.clock().now();
  auto task = [&](int i) {
    return [&, i] {
      std::lock_guard lock(mu);
      ran.emplace_back(i, s.clock().now());
      cv.notify_all();
    };
  };
  // Each call may take a while (the first starts the thread; sanitizers slow
  // them down), so the deadlines are ordered whatever the calls cost: after()
  // counts from its own call, and task 3's deadline from after that. Task 1 is
  // asked for after task 2 but is due before it.
  s.post(task(0));
  s.after(20ms, task(2));
  s.at(t0 + 10ms, task(1));
  s.at(s.clock().now() + 30ms, task(3));
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return ran.size() == 4; }));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ran[i].first, i);
  EXPECT_GE(ran[1].second, t0 + 10ms);
  EXPECT_GE(ran[2].second, t0 + 20ms);
  EXPECT_GE(ran[3].second, t0 + 30ms);
}

// The application threads' hints end the leases of the holders, once per
// hold_leases(): going off to work the leases but for answers, the hints that
// the thread may block every lease.
TEST(RealTimeScheduler, BusyHintsEndTheLeasesHeld) {
  struct Holder final : RealTimeScheduler::LeaseHolder {
    void end_lease(bool answers_too) override { ++(answers_too ? ended_all : ended); }
    int ended = 0;
    int ended_all = 0;
  };
  RealTimeScheduler s;
  EXPECT_TRUE(s.hears_applications());  // not the process's: its owner gives the hints
  Holder a, b;
  s.add_lease_holder(&a);
  s.add_lease_holder(&b);
  s.note_busy();  // nothing held: nobody is called
  s.note_may_block();
  EXPECT_EQ(a.ended + b.ended + a.ended_all + b.ended_all, 0);
  s.hold_leases();
  s.note_busy();
  EXPECT_EQ(a.ended, 1);
  EXPECT_EQ(b.ended, 1);
  s.note_busy();  // ended already
  EXPECT_EQ(a.ended, 1);
  EXPECT_EQ(a.ended_all, 0);
  s.note_may_block();  // the answer leases, still held
  EXPECT_EQ(a.ended_all, 1);
  EXPECT_EQ(b.ended_all, 1);
  s.note_may_block();
  EXPECT_EQ(a.ended_all, 1);
  s.remove_lease_holder(&b);
  s.hold_leases();
  s.wait_readable(-1);  // about to block: every lease, and it returns at once
  EXPECT_EQ(a.ended_all, 2);
  EXPECT_EQ(b.ended_all, 1);
  s.note_busy();  // ended with the rest
  EXPECT_EQ(a.ended, 1);
  s.remove_lease_holder(&a);
}

// stop() joins the thread: what ran before it returned ran, nothing runs after.
TEST(RealTimeScheduler, StopRunsNothingAfterItReturns) {
  RealTimeScheduler s;
  std::atomic<int> ran{0};
  std::promise<void> first;
  s.post([&] {
    ++ran;
    first.set_value();
  });
  ASSERT_EQ(first.get_future().wait_for(10s), std::future_status::ready);
  s.stop();
  s.post([&] { ++ran; });
  s.at(s.clock().now(), [&] { ++ran; });
  s.stop();  // again: nothing to do
  EXPECT_EQ(ran.load(), 1);
}

TEST(RealTimeScheduler, WatchesReadability) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  // Non-blocking reads: the drain stops when the pipe is empty.
  ASSERT_EQ(::fcntl(fds[0], F_SETFL, O_NONBLOCK), 0);
  {
    RealTimeScheduler s;
    std::atomic<int> readies{0};
    s.watch_readable(fds[0], [&] {
      char c;
      while (::read(fds[0], &c, 1) == 1) {
      }
      ++readies;
    });
    for (int round = 1; round <= 2; ++round) {
      ASSERT_EQ(::write(fds[1], "x", 1), 1);
      for (int i = 0; i < 10000 && readies < round; ++i) std::this_thread::sleep_for(1ms);
      EXPECT_EQ(readies, round);
    }
  }  // the scheduler stops before the pipe closes
  ::close(fds[1]);
  ::close(fds[0]);
}

// ---------------------------------------------------------------------------
// Links

in_addr addr(const char* dotted) {
  in_addr a{};
  inet_pton(AF_INET, dotted, &a);
  return a;
}

// A valid RC SEND (ICRC left 0: nothing here checks it), told apart by its PSN.
Bytes packet(uint32_t psn) {
  wire::PacketHeaders h;
  h.bth.opcode = wire::opcode::rc_send_only;
  h.bth.dest_qp = 0x42;
  h.bth.psn = psn;
  const uint8_t payload[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  Bytes out(128);
  out.resize(wire::build(h, std::span<const uint8_t>(payload), out, nullptr));
  return out;
}

uint32_t psn_of(const Bytes& p) {
  wire::PacketView v;
  EXPECT_EQ(wire::parse(p, v), wire::ParseError::ok);
  return v.bth.psn;
}

struct Received {
  in_addr src;
  uint16_t sport;
  Bytes bytes;
  wire::IpFields ip;
};

class RecordingReceiver final : public Receiver {
 public:
  void receive(in_addr src, uint16_t sport, std::span<const uint8_t> p, wire::IpFields ip = {}) override {
    got.push_back({src, sport, Bytes(p.begin(), p.end()), ip});
  }
  void ready() override { ++readies; }
  std::vector<uint32_t> psns() const {
    std::vector<uint32_t> v;
    for (const auto& r : got) v.push_back(psn_of(r.bytes));
    return v;
  }
  std::vector<Received> got;
  int readies = 0;
};

// An inner link the test feeds and reads.
class FakeLink final : public Link {
 public:
  void attach(Receiver& r) override { up = &r; }
  // A packet sent without its ICRC is recorded with ip.icrc_skipped set.
  void send(in_addr dst, std::span<const uint8_t> p, uint8_t = 0, bool icrc = true) override {
    wire::IpFields ip;
    ip.icrc_skipped = !icrc;
    sent.push_back({dst, 0, Bytes(p.begin(), p.end()), ip});
  }
  bool drain() override {
    bool any = !arriving.empty();
    for (auto& d : arriving) up->receive(d.src, d.sport, d.bytes, d.ip);
    arriving.clear();
    return any;
  }
  void watch() override { ++watches; }
  void inject(in_addr src, uint16_t sport, std::span<const uint8_t> p) override { up->receive(src, sport, p); }
  std::string rx_state() override { return "fake"; }
  // As a same-host link with a ring to `no_icrc_for` says (fabric/host_link.hpp).
  bool needs_icrc(in_addr dst) override { return dst.s_addr != no_icrc_for.s_addr; }
  std::vector<uint32_t> sent_psns() const {
    std::vector<uint32_t> v;
    for (const auto& r : sent) v.push_back(psn_of(r.bytes));
    return v;
  }

  Receiver* up = nullptr;
  std::vector<Received> sent, arriving;
  int watches = 0;
  in_addr no_icrc_for{};
};

// Fires the queued decisions, one per packet, then nothing.
class FakeFilter final : public faults::PacketFilter {
 public:
  FakeFilter() { set_active(true, true); }
  faults::FaultDecision decide(const faults::PacketFacts& facts) override {
    seen.push_back(facts.direction);
    if (next.empty()) return {};
    faults::FaultDecision d = next.front();
    next.pop_front();
    return d;
  }
  void queue(faults::FaultAction a, uint32_t delay_us = 0) {
    faults::FaultDecision d;
    d.fired = true;
    d.action = a;
    d.delay_us = delay_us;
    next.push_back(d);
  }
  void queue_none() { next.push_back({}); }
  std::deque<faults::FaultDecision> next;
  std::vector<faults::Direction> seen;
};

TEST(LocalLink, DeliversBetweenLinksOfOneHubAndAnnouncesThroughTheScheduler) {
  ManualClock clock;
  ManualScheduler s{clock};
  LocalHub hub;
  FakeLink outside;
  LocalLink a(hub, addr("127.0.1.1"), s, &outside), b(hub, addr("127.0.1.2"), s);
  RecordingReceiver ra, rb;
  a.attach(ra);
  b.attach(rb);
  a.send(addr("127.0.1.2"), packet(7));
  a.send(addr("127.0.1.2"), packet(8));
  EXPECT_EQ(rb.readies, 0);  // announced on the scheduler's thread
  s.advance(0ms);
  EXPECT_EQ(rb.readies, 1);  // once per non-empty queue
  EXPECT_TRUE(b.drain());
  EXPECT_EQ(rb.psns(), (std::vector<uint32_t>{7, 8}));
  EXPECT_EQ(rb.got[0].src.s_addr, addr("127.0.1.1").s_addr);
  EXPECT_EQ(rb.got[0].sport, wire::kRoceV2UdpPort);
  EXPECT_FALSE(b.drain());
  // Another address goes outside; what arrives outside comes up.
  a.send(addr("127.0.9.9"), packet(9));
  ASSERT_EQ(outside.sent.size(), 1u);
  EXPECT_EQ(outside.sent[0].src.s_addr, addr("127.0.9.9").s_addr);
  outside.arriving.push_back({addr("127.0.9.9"), 4791, packet(10), {}});
  EXPECT_TRUE(a.drain());
  EXPECT_EQ(ra.psns(), (std::vector<uint32_t>{10}));
}

// The TOS byte a packet is sent with arrives with it (a UD receive shows it as
// the GRH traffic class), with the TTL sockets send with; what the outside
// link reports comes up unchanged.
TEST(LocalLink, CarriesTheTosAndTheTtl) {
  ManualClock clock;
  ManualScheduler s{clock};
  LocalHub hub;
  FakeLink outside;
  LocalLink a(hub, addr("127.0.1.1"), s, &outside), b(hub, addr("127.0.1.2"), s);
  RecordingReceiver ra, rb;
  a.attach(ra);
  b.attach(rb);
  a.send(addr("127.0.1.2"), packet(7), 0xb8);
  a.send(addr("127.0.1.2"), packet(8));
  EXPECT_TRUE(b.drain());
  ASSERT_EQ(rb.got.size(), 2u);
  EXPECT_EQ(rb.got[0].ip, (wire::IpFields{0xb8, 64}));
  EXPECT_EQ(rb.got[1].ip, (wire::IpFields{0, 64}));
  outside.arriving.push_back({addr("127.0.9.9"), 4791, packet(9), wire::IpFields{0x2a, 17}});
  EXPECT_TRUE(a.drain());
  ASSERT_EQ(ra.got.size(), 1u);
  EXPECT_EQ(ra.got[0].ip, (wire::IpFields{0x2a, 17}));
}

// Only a unicast packet to a device of this process may go without its ICRC;
// the receiver is told which packets did (IpFields::icrc_skipped).
TEST(LocalLink, SaysWhereTheIcrcIsNeededAndCarriesItsAbsence) {
  ManualClock clock;
  ManualScheduler s{clock};
  LocalHub hub;
  FakeLink outside;
  LocalLink a(hub, addr("127.0.1.1"), s, &outside), b(hub, addr("127.0.1.2"), s);
  RecordingReceiver ra, rb;
  a.attach(ra);
  b.attach(rb);
  EXPECT_FALSE(a.needs_icrc(addr("127.0.1.2")));
  EXPECT_FALSE(a.needs_icrc(addr("127.0.1.1")));  // loopback to itself
  EXPECT_TRUE(a.needs_icrc(addr("127.0.9.9")));   // another process or host
  EXPECT_TRUE(a.needs_icrc(addr("239.1.2.3")));   // multicast: the group is found by the ICRC
  a.send(addr("127.0.1.2"), packet(7), 0, false);
  a.send(addr("127.0.1.2"), packet(8));
  EXPECT_TRUE(b.drain());
  ASSERT_EQ(rb.got.size(), 2u);
  EXPECT_TRUE(rb.got[0].ip.icrc_skipped);
  EXPECT_FALSE(rb.got[1].ip.icrc_skipped);
}

// Beyond this process, the outside link says where the ICRC may be left out
// (a same-host ring that takes it), and gets the packet marked so.
TEST(LocalLink, AsksTheOutsideLinkAboutOtherDestinations) {
  ManualClock clock;
  ManualScheduler s{clock};
  LocalHub hub;
  FakeLink outside;
  outside.no_icrc_for = addr("127.0.9.8");
  LocalLink a(hub, addr("127.0.1.1"), s, &outside);
  RecordingReceiver ra;
  a.attach(ra);
  EXPECT_FALSE(a.needs_icrc(addr("127.0.9.8")));
  EXPECT_TRUE(a.needs_icrc(addr("127.0.9.9")));
  EXPECT_TRUE(a.needs_icrc(addr("239.1.2.3")));  // multicast, whatever the outside link says
  a.send(addr("127.0.9.8"), packet(5), 0, false);
  ASSERT_EQ(outside.sent.size(), 1u);
  EXPECT_TRUE(outside.sent[0].ip.icrc_skipped);
}

struct FaultyFixture : ::testing::Test {
  FaultyFixture() : link(inner, filter, s, counters, "dev0") { link.attach(up); }
  void arrive(uint32_t psn, wire::IpFields ip = {}) { inner.arriving.push_back({addr("127.0.1.9"), 4791, packet(psn), ip}); }

  ManualClock clock;
  ManualScheduler s{clock};
  FakeLink inner;
  FakeFilter filter;
  LinkCounters counters;
  FaultyLink link;
  RecordingReceiver up;
  in_addr peer = addr("127.0.1.9");
};

TEST_F(FaultyFixture, TxDropDuplicateCorrupt) {
  filter.queue(faults::FaultAction::drop);
  link.send(peer, packet(1));
  filter.queue(faults::FaultAction::duplicate);
  link.send(peer, packet(2));
  filter.queue(faults::FaultAction::corrupt);
  link.send(peer, packet(3));
  ASSERT_EQ(inner.sent.size(), 3u);
  EXPECT_EQ(psn_of(inner.sent[0].bytes), 2u);
  EXPECT_EQ(psn_of(inner.sent[1].bytes), 2u);
  EXPECT_NE(inner.sent[2].bytes, packet(3));
  EXPECT_EQ(counters.faults_dropped, 1u);
  EXPECT_EQ(counters.faults_duplicated, 1u);
  EXPECT_EQ(counters.faults_corrupted, 1u);
  EXPECT_EQ(filter.seen, (std::vector<faults::Direction>(3, faults::Direction::tx)));
}

// A packet sent without its ICRC keeps that mark through the fault layer,
// except a corrupted one: it goes on as carrying an ICRC, so the receiver's
// check (against the 0 in its ICRC field) drops it.
TEST_F(FaultyFixture, TxCorruptOfAPacketWithoutIcrcIsChecked) {
  EXPECT_TRUE(link.needs_icrc(peer));  // the inner link's answer
  link.send(peer, packet(1), 0, false);
  filter.queue(faults::FaultAction::duplicate);
  link.send(peer, packet(2), 0, false);
  filter.queue(faults::FaultAction::corrupt);
  link.send(peer, packet(3), 0, false);
  ASSERT_EQ(inner.sent.size(), 4u);
  EXPECT_TRUE(inner.sent[0].ip.icrc_skipped);
  EXPECT_TRUE(inner.sent[1].ip.icrc_skipped);
  EXPECT_TRUE(inner.sent[2].ip.icrc_skipped);
  EXPECT_FALSE(inner.sent[3].ip.icrc_skipped);
}

TEST_F(FaultyFixture, TxDelayGoesThroughTheScheduler) {
  filter.queue(faults::FaultAction::delay, 300);
  link.send(peer, packet(1));
  s.advance(299us);
  EXPECT_TRUE(inner.sent.empty());
  s.advance(1us);
  EXPECT_EQ(inner.sent_psns(), (std::vector<uint32_t>{1}));
  EXPECT_EQ(counters.faults_delayed, 1u);
}

TEST_F(FaultyFixture, TxReorderFollowsTheNextPacketOrTheHold) {
  filter.queue(faults::FaultAction::reorder);
  link.send(peer, packet(1));
  link.send(peer, packet(2));
  EXPECT_EQ(inner.sent_psns(), (std::vector<uint32_t>{2, 1}));
  filter.queue(faults::FaultAction::reorder);
  link.send(peer, packet(3));
  EXPECT_EQ(inner.sent.size(), 2u);
  s.advance(1ms);  // nothing overtook it: it goes after the hold
  EXPECT_EQ(inner.sent_psns(), (std::vector<uint32_t>{2, 1, 3}));
  EXPECT_EQ(counters.faults_reordered, 2u);
}

TEST_F(FaultyFixture, RxDropDuplicateCorrupt) {
  filter.queue(faults::FaultAction::drop);
  arrive(1);
  filter.queue(faults::FaultAction::duplicate);
  arrive(2);
  filter.queue(faults::FaultAction::corrupt);
  arrive(3);
  EXPECT_TRUE(link.drain());
  EXPECT_EQ(up.psns(), (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(counters.faults_dropped, 1u);
  EXPECT_EQ(counters.faults_duplicated, 1u);
  EXPECT_EQ(counters.rx_icrc_errors, 1u);
  EXPECT_EQ(filter.seen, (std::vector<faults::Direction>(3, faults::Direction::rx)));
}

TEST_F(FaultyFixture, RxDelayIsHandedOnFromTheNextDrain) {
  filter.queue(faults::FaultAction::delay, 50);
  arrive(1, wire::IpFields{0x48, 9});
  link.drain();
  EXPECT_TRUE(up.got.empty());
  s.advance(49us);
  EXPECT_EQ(up.readies, 0);
  s.advance(1us);
  EXPECT_EQ(up.readies, 1);  // the receiver is asked to drain
  EXPECT_TRUE(link.drain());
  EXPECT_EQ(up.psns(), (std::vector<uint32_t>{1}));
  EXPECT_EQ(up.got[0].ip, (wire::IpFields{0x48, 9})) << "a held-back packet keeps its IP fields";
  EXPECT_EQ(filter.seen.size(), 1u);  // held-back packets do not meet the rules again
}

TEST_F(FaultyFixture, RxReorder) {
  filter.queue(faults::FaultAction::reorder);
  arrive(1);
  arrive(2);
  link.drain();
  EXPECT_EQ(up.psns(), (std::vector<uint32_t>{2, 1}));
  filter.queue(faults::FaultAction::reorder);
  arrive(3);
  link.drain();
  EXPECT_EQ(up.got.size(), 2u);
  s.advance(1ms);
  EXPECT_GE(up.readies, 1);  // both holds' timers ask; the first drain hands it on
  link.drain();
  EXPECT_EQ(up.psns(), (std::vector<uint32_t>{2, 1, 3}));
  link.drain();
  EXPECT_EQ(up.got.size(), 3u);
}

// A device's receive path in miniature: admits what parses unless closed.
class FakeSink final : public PacketSink {
 public:
  bool admit(in_addr, uint16_t, std::span<const uint8_t> p, wire::PacketView& view, wire::IpFields = {}) override {
    ++admitted;
    return open && wire::parse(p, view) == wire::ParseError::ok;
  }
  void deliver(in_addr, const wire::PacketView& view) override { delivered.push_back(view.bth.psn); }
  bool forge_nak(const wire::PacketView& view, uint8_t syndrome) override {
    naks.emplace_back(view.bth.psn, syndrome);
    return true;
  }
  void ready() override {}
  bool open = true;
  int admitted = 0;
  std::vector<uint32_t> delivered;
  std::vector<std::pair<uint32_t, uint8_t>> naks;
};

TEST(FaultyLink, SitsBetweenTheSinksChecksAndDelivery) {
  ManualClock clock;
  ManualScheduler s{clock};
  FakeLink inner;
  FakeFilter filter;
  LinkCounters counters;
  FaultyLink link(inner, filter, s, counters, "dev0");
  FakeSink sink;
  link.attach(sink);
  faults::FaultDecision nak;
  nak.fired = true;
  nak.action = faults::FaultAction::nak;
  nak.syndrome = 0x61;
  filter.next.push_back(nak);
  link.inject(addr("127.0.1.9"), 4791, packet(5));
  EXPECT_EQ(sink.naks, (std::vector<std::pair<uint32_t, uint8_t>>{{5, 0x61}}));
  EXPECT_TRUE(sink.delivered.empty());
  EXPECT_EQ(counters.faults_naks_forged, 1u);
  // A datagram the sink refuses never meets the rules.
  sink.open = false;
  link.inject(addr("127.0.1.9"), 4791, packet(6));
  EXPECT_EQ(filter.seen.size(), 1u);
  sink.open = true;
  filter.queue(faults::FaultAction::duplicate);
  link.inject(addr("127.0.1.9"), 4791, packet(7));
  EXPECT_EQ(sink.delivered, (std::vector<uint32_t>{7, 7}));
  EXPECT_EQ(sink.admitted, 4);  // the duplicate passes the checks again, as a received packet does
}

TEST(TapLink, CountsWhatGoesOut) {
  ManualClock clock;
  FakeLink inner;
  LinkCounters counters;
  TapLink tap(inner, addr("127.0.1.1"), counters, clock, nullptr, nullptr);
  RecordingReceiver up;
  tap.attach(up);
  tap.send(addr("127.0.1.2"), packet(1));
  inner.arriving.push_back({addr("127.0.1.2"), 4791, packet(2), {}});
  EXPECT_TRUE(tap.drain());
  EXPECT_EQ(counters.tx_packets, 1u);
  EXPECT_EQ(inner.sent.size(), 1u);
  EXPECT_EQ(up.psns(), (std::vector<uint32_t>{2}));
}

// A packet from another process that came without its ICRC (a same-host
// ring) is captured with the ICRC it stands for, which a capture shows.
TEST(TapLink, CapturesAReceivedPacketWithTheIcrcItsSenderLeftOut) {
  char path[] = "/tmp/softverbs-tap-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  ManualClock clock;
  FakeLink inner;
  LinkCounters counters;
  const in_addr self = addr("127.0.1.1"), from = addr("127.0.9.9");
  {
    wire::PcapWriter pcap(path);
    ASSERT_TRUE(pcap.ok());
    TapLink tap(inner, self, counters, clock, &pcap, nullptr);
    RecordingReceiver up;
    tap.attach(up);
    wire::IpFields skipped;
    skipped.icrc_skipped = true;
    inner.arriving.push_back({from, 4791, packet(3), skipped});
    EXPECT_TRUE(tap.drain());
    ASSERT_EQ(up.got.size(), 1u);
    EXPECT_EQ(up.got[0].bytes, packet(3));  // the receiver gets the packet as it came
    EXPECT_TRUE(up.got[0].ip.icrc_skipped);
  }
  std::FILE* f = std::fopen(path, "rb");
  ASSERT_NE(f, nullptr);
  Bytes file(1 << 16);
  file.resize(std::fread(file.data(), 1, file.size(), f));
  std::fclose(f);
  ::unlink(path);
  // The one frame ends with the packet: its last bytes in the file.
  const size_t n = packet(3).size();
  ASSERT_GT(file.size(), n);
  const std::span<const uint8_t> captured(file.data() + file.size() - n, n);
  wire::Ipv4Flow flow;
  std::memcpy(flow.saddr.data(), &from.s_addr, 4);
  std::memcpy(flow.daddr.data(), &self.s_addr, 4);
  flow.sport = 4791;
  wire::PacketView v;
  EXPECT_EQ(wire::parse(captured, v, wire::IcrcFlow{flow}), wire::ParseError::ok);
  EXPECT_EQ(v.bth.psn, 3u);
}

}  // namespace
}  // namespace softverbs::fabric

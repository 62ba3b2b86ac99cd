// The fault engine (faults/engine.hpp) on a manual clock and a scheduler queue
// the test runs: timed rules, clear(), seeded decisions, hit counts, rules on
// CM MADs.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/clock.hpp"
#include "tests/unit/fake_time.hpp"
#include "faults/engine.hpp"
#include "wire/cm_mad.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::faults {
namespace {

using namespace std::chrono_literals;
using fake::ManualClock;
using fake::ManualScheduler;

struct Fixture : ::testing::Test {
  ManualClock clock;
  ManualScheduler scheduler{clock};
  std::vector<FaultDecision> acted;

  void load(FaultEngine& e, const char* toml) {
    std::string error;
    ASSERT_TRUE(e.load(toml, &error)) << error;
  }
  void watch(FaultEngine& e) {
    e.add_actor([this](const FaultDecision& d) { acted.push_back(d); });
  }
  void advance(Clock::duration d) { scheduler.advance(d); }
};

// An RC SEND_ONLY to QP 0x11 with this PSN.
wire::PacketView send_packet(uint32_t psn) {
  constexpr uint8_t kRcSendOnly = 0x04;
  wire::PacketView p;
  p.op = &wire::opcode_info(kRcSendOnly);
  p.bth.opcode = kRcSendOnly;
  p.bth.dest_qp = 0x11;
  p.bth.psn = psn;
  return p;
}

// Which rule fired for each of n packets (-1: none).
std::vector<int> decisions(FaultEngine& e, int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    const wire::PacketView p = send_packet(static_cast<uint32_t>(i));
    const FaultDecision d = e.decide(PacketFacts{Direction::tx, "emu0", &p});
    out.push_back(d.fired ? static_cast<int>(d.rule) : -1);
  }
  return out;
}

using FaultEngineTest = Fixture;

TEST_F(FaultEngineTest, TimedRuleFiresWhenTheClockReachesAtMs) {
  FaultEngine e(clock, scheduler);
  watch(e);
  load(e, "[[rule]]\nname = \"down\"\nat_ms = 100\ndevice = \"emu0\"\naction = \"port_down\"\n");
  advance(99ms);
  EXPECT_TRUE(acted.empty());
  EXPECT_EQ(e.hits("down"), 0u);
  advance(1ms);
  ASSERT_EQ(acted.size(), 1u);
  EXPECT_EQ(acted[0].action, FaultAction::port_down);
  EXPECT_EQ(acted[0].device, "emu0");
  EXPECT_EQ(e.hits("down"), 1u);
  advance(1000ms);  // once only
  EXPECT_EQ(acted.size(), 1u);
}

TEST_F(FaultEngineTest, TimedRulesWaitForAnActor) {
  FaultEngine e(clock, scheduler);
  load(e, "[[rule]]\nat_ms = 50\naction = \"device_fatal\"\n");
  advance(200ms);
  EXPECT_EQ(scheduler.pending(), 0u);
  watch(e);  // at_ms counts from here
  advance(49ms);
  EXPECT_TRUE(acted.empty());
  advance(1ms);
  ASSERT_EQ(acted.size(), 1u);
  EXPECT_EQ(acted[0].action, FaultAction::device_fatal);
}

TEST_F(FaultEngineTest, ClearMakesPendingTimedRulesLapse) {
  FaultEngine e(clock, scheduler);
  watch(e);
  load(e, "[[rule]]\nname = \"t\"\nat_ms = 10\naction = \"port_down\"\n");
  advance(5ms);
  e.clear();
  // A rule loaded after clear() at the same position is not the lapsed one.
  load(e, "[[rule]]\nname = \"t\"\nat_ms = 20\naction = \"port_up\"\n");
  advance(5ms);
  EXPECT_TRUE(acted.empty());
  EXPECT_EQ(e.hits("t"), 0u);
  advance(15ms);
  ASSERT_EQ(acted.size(), 1u);
  EXPECT_EQ(acted[0].action, FaultAction::port_up);
}

TEST_F(FaultEngineTest, SameSeedAndTrafficGiveTheSameDecisions) {
  const char* scenario = "seed = 42\n[[rule]]\nprobability = 0.3\naction = \"drop\"\n";
  FaultEngine a(clock, scheduler), b(clock, scheduler);
  load(a, scenario);
  load(b, scenario);
  const std::vector<int> da = decisions(a, 500);
  EXPECT_EQ(da, decisions(b, 500));
  // ...and the stream is a real one: some fire, some do not.
  const auto fired = std::count(da.begin(), da.end(), 0);
  EXPECT_GT(fired, 100);
  EXPECT_LT(fired, 200);

  FaultEngine c(clock, scheduler);
  load(c, scenario);
  c.set_seed(43);
  EXPECT_NE(da, decisions(c, 500));
}

TEST_F(FaultEngineTest, AddingARuleDoesNotChangeAnothersDecisions) {
  const char* first = "seed = 7\n[[rule]]\nprobability = 0.25\naction = \"drop\"\n";
  FaultEngine alone(clock, scheduler), with_more(clock, scheduler);
  load(alone, first);
  load(with_more, first);
  // A second rule on the same packets, and an unrelated verb rule.
  load(with_more,
       "[[rule]]\nprobability = 0.5\naction = \"duplicate\"\n"
       "[[rule]]\nverb = \"post_send\"\naction = \"fail\"\nerrno = \"EIO\"\n");
  const std::vector<int> da = decisions(alone, 500);
  const std::vector<int> db = decisions(with_more, 500);
  ASSERT_EQ(da.size(), db.size());
  bool second_fired = false;
  for (size_t i = 0; i < da.size(); ++i) {
    EXPECT_EQ(da[i] == 0, db[i] == 0) << "packet " << i;
    second_fired |= db[i] == 1;
  }
  EXPECT_TRUE(second_fired);
}

TEST_F(FaultEngineTest, HitsCountWhatFired) {
  FaultEngine e(clock, scheduler);
  load(e,
       "[[rule]]\nname = \"third\"\nevery = 3\naction = \"drop\"\n"
       "[[rule]]\nname = \"two\"\ncount = 2\naction = \"duplicate\"\n");
  decisions(e, 10);
  EXPECT_EQ(e.hits("third"), 3u);  // packets 3, 6, 9
  EXPECT_EQ(e.hits("two"), 2u);    // the first two the first rule let through
  EXPECT_EQ(e.hits("none"), 0u);
  EXPECT_EQ(e.rule_count(), 2u);
  e.clear();
  EXPECT_EQ(e.hits("third"), 0u);
  EXPECT_FALSE(e.active());
}

TEST_F(FaultEngineTest, VerbRulesAndTheirListeners) {
  FaultEngine e(clock, scheduler);
  std::vector<bool> changes;
  e.add_verbs_listener([&](bool active) { changes.push_back(active); });
  VerbFilter& verbs = e;
  EXPECT_FALSE(verbs.verbs_active());
  load(e, "[[rule]]\nverb = \"post_send\"\nnth = 2\naction = \"fail\"\nerrno = \"EAGAIN\"\n");
  EXPECT_TRUE(verbs.verbs_active());
  const VerbFacts post{VerbPoint::post_send, "emu0", 0x11, 0, std::nullopt};
  EXPECT_FALSE(verbs.decide(post).fired);
  const FaultDecision d = verbs.decide(post);
  ASSERT_TRUE(d.fired);
  EXPECT_EQ(d.action, FaultAction::fail);
  EXPECT_EQ(d.qpn, 0x11u);
  e.clear();
  EXPECT_EQ(changes, (std::vector<bool>{true, false}));
}

// GMPs, one per CM message, each a whole parsed packet (the view points into
// `storage`).
struct Gmps {
  std::vector<std::array<uint8_t, wire::cm::kGmpPacketSize>> storage;
  std::vector<wire::PacketView> views;
  explicit Gmps(const std::vector<wire::cm::Message>& msgs) : storage(msgs.size()) {
    for (size_t i = 0; i < msgs.size(); ++i) {
      std::array<uint8_t, wire::cm::kMadSize> mad{};
      wire::cm::encode(wire::cm::MadHeader{}, msgs[i], mad);
      EXPECT_EQ(wire::cm::build_gmp(mad, static_cast<uint32_t>(i), storage[i], nullptr), wire::cm::kGmpPacketSize);
      wire::PacketView v;
      EXPECT_EQ(wire::parse(storage[i], v), wire::ParseError::ok);
      views.push_back(v);
    }
  }
};

TEST_F(FaultEngineTest, CmRulesMatchTheirMessageOnly) {
  namespace cm = wire::cm;
  const Gmps gmps({cm::Req{}, cm::Mra{}, cm::Rej{}, cm::Rep{}, cm::Rtu{}, cm::Dreq{}, cm::Drep{}, cm::SidrReq{},
                   cm::SidrRep{}});
  const char* names[] = {"REQ", "mra", "Rej", "rep", "RTU", "dreq", "DREP", "sidr_req", "SIDR_REP"};
  for (size_t want = 0; want < gmps.views.size(); ++want) {
    FaultEngine e(clock, scheduler);
    load(e, ("[[rule]]\ncm = \"" + std::string(names[want]) + "\"\naction = \"drop\"\n").c_str());
    for (size_t i = 0; i < gmps.views.size(); ++i) {
      const FaultDecision d = e.decide(PacketFacts{Direction::rx, "emu0", &gmps.views[i]});
      EXPECT_EQ(d.fired, i == want) << names[want] << " against message " << i;
      if (d.fired) {
        EXPECT_EQ(d.action, FaultAction::drop);
      }
    }
    // Not a GMP: an RC SEND to QP 1, and the REQ's MAD sent to QP 2 or as another class.
    wire::PacketView rc = send_packet(0);
    rc.bth.dest_qp = 1;
    rc.payload = gmps.views[want].payload;
    EXPECT_FALSE(e.decide(PacketFacts{Direction::tx, "emu0", &rc}).fired);
    wire::PacketView qp2 = gmps.views[want];
    qp2.bth.dest_qp = 2;
    EXPECT_FALSE(e.decide(PacketFacts{Direction::tx, "emu0", &qp2}).fired);
  }
  // Another management class in the same packet is not a CM MAD.
  std::array<uint8_t, wire::cm::kGmpPacketSize> sa = Gmps({cm::Rtu{}}).storage[0];
  sa[12 + 8 + 1] = 0x03;  // BTH, DETH, then MgmtClass
  wire::PacketView v;
  ASSERT_EQ(wire::parse(sa, v), wire::ParseError::ok);
  FaultEngine e(clock, scheduler);
  load(e, "[[rule]]\ncm = \"RTU\"\naction = \"duplicate\"\n");
  EXPECT_FALSE(e.decide(PacketFacts{Direction::rx, "emu0", &v}).fired);
  EXPECT_TRUE(e.decide(PacketFacts{Direction::rx, "emu0", &gmps.views[4]}).fired);
}

TEST_F(FaultEngineTest, CmRulesCombineWithTheOtherKeys) {
  const Gmps gmps({wire::cm::Req{}, wire::cm::Rep{}});
  FaultEngine e(clock, scheduler);
  load(e,
       "[[rule]]\nname = \"second-req\"\ncm = \"req\"\ndirection = \"tx\"\nnth = 2\naction = \"delay\"\n"
       "delay_ms = 5\n");
  const PacketFacts tx{Direction::tx, "emu0", &gmps.views[0]};
  EXPECT_FALSE(e.decide(PacketFacts{Direction::rx, "emu0", &gmps.views[0]}).fired);  // rx: not counted
  EXPECT_FALSE(e.decide(PacketFacts{Direction::tx, "emu0", &gmps.views[1]}).fired);  // a REP
  EXPECT_FALSE(e.decide(tx).fired);                                                  // the first REQ
  const FaultDecision d = e.decide(tx);
  ASSERT_TRUE(d.fired);
  EXPECT_EQ(d.action, FaultAction::delay);
  EXPECT_EQ(d.delay_us, 5000u);
  EXPECT_EQ(e.hits("second-req"), 1u);
}

TEST_F(FaultEngineTest, CmKeyErrors) {
  struct Case {
    const char* text;
    const char* reason;
  } cases[] = {
      {"[[rule]]\ncm = \"LAP\"\naction = \"drop\"\n",
       "rule 1: cm must name a CM message (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP), not 'LAP'"},
      {"[[rule]]\ncm = 16\naction = \"drop\"\n", "cm must name a CM message"},
      {"[[rule]]\ncm = \"\"\naction = \"drop\"\n", "not ''"},
      {"[[rule]]\ncm = \"REQ\"\ndirection = \"rx\"\naction = \"nak\"\n", "action nak does not apply to CM MADs"},
      {"[[rule]]\nverb = \"post_send\"\ncm = \"REQ\"\naction = \"qp_error\"\n", "'cm' does not apply to a verb rule"},
      {"[[rule]]\nat_ms = 1\ncm = \"REQ\"\naction = \"port_down\"\n", "'cm' does not apply to a timed rule"},
  };
  for (const Case& c : cases) {
    FaultEngine e(clock, scheduler);
    std::string error;
    EXPECT_FALSE(e.load(c.text, &error)) << c.text;
    EXPECT_NE(error.find(c.reason), std::string::npos) << c.text << " -> " << error;
  }
}

}  // namespace
}  // namespace softverbs::faults

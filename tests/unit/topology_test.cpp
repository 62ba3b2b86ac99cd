// fabric/topology: the topology file's parser (every error names its line) and
// the links' run-time state (serialisation, latency, MTU, seeded loss), on
// time points the test chooses.
#include "fabric/topology.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace softverbs::fabric {
namespace {

using namespace std::chrono;

Topology parse_ok(const std::string& text) {
  Topology t;
  std::string error;
  EXPECT_TRUE(parse_topology(text, &t, &error)) << error;
  return t;
}

std::string parse_error(const std::string& text) {
  Topology t;
  std::string error;
  EXPECT_FALSE(parse_topology(text, &t, &error)) << text;
  return error;
}

TEST(Topology, NodesByCountOrByName) {
  Topology t = parse_ok("nodes = 3\n");
  ASSERT_EQ(t.nodes.size(), 3u);
  EXPECT_EQ(t.nodes[2], "emu2");
  EXPECT_EQ(t.seed, 1u);
  EXPECT_TRUE(t.link(0, 1).ideal());
  t = parse_ok("seed = 9\nnodes = [\"a\", \"b\"]\n");
  EXPECT_EQ(t.seed, 9u);
  EXPECT_EQ(t.index_of("b"), 1u);
  EXPECT_FALSE(t.index_of("c"));
}

TEST(Topology, DefaultsAndOverrides) {
  const Topology t = parse_ok(R"(nodes = ["a", "b", "c"]
[default]
latency_us = 2.5
bandwidth_gbps = 100
loss = 0.01
mtu = 4096

[[link]]
between = ["a", "b"]
latency_us = 100

[[link]]
from = "c"
to = "*"
mtu = 1024
loss = 0
)");
  EXPECT_EQ(t.link(1, 2).latency_ns, 2500u);
  EXPECT_EQ(t.link(1, 2).bandwidth_bps, 100000000000u);
  EXPECT_DOUBLE_EQ(t.link(1, 2).loss, 0.01);
  EXPECT_EQ(t.link(1, 2).mtu, 4096u);
  // Both directions of `between`, the other keys from [default].
  EXPECT_EQ(t.link(0, 1).latency_ns, 100000u);
  EXPECT_EQ(t.link(1, 0).latency_ns, 100000u);
  EXPECT_EQ(t.link(0, 1).bandwidth_bps, 100000000000u);
  // `from`/`to`: that direction only; "*" is every node.
  EXPECT_EQ(t.link(2, 0).mtu, 1024u);
  EXPECT_EQ(t.link(2, 1).mtu, 1024u);
  EXPECT_EQ(t.link(2, 1).loss, 0.0);
  EXPECT_EQ(t.link(0, 2).mtu, 4096u);
}

TEST(Topology, ErrorsNameTheLine) {
  EXPECT_EQ(parse_error("nodes = 2\n[default\n").rfind("line 2: ", 0), 0u);
  EXPECT_EQ(parse_error("nodes = 2\n\n[default]\nlatency = 3\n"),
            "line 4: unknown key 'latency' in [default] (latency_us, bandwidth_gbps, loss, mtu)");
  EXPECT_EQ(parse_error("nodes = 2\n[default]\nloss = 1.5\n"), "line 3: 'loss' must be a number from 0 to 1");
  EXPECT_EQ(parse_error("nodes = 2\n[default]\nmtu = 1500\n"),
            "line 3: 'mtu' must be an IB MTU (256, 512, 1024, 2048, 4096) or 0 (no limit)");
  EXPECT_EQ(parse_error("nodes = 2\n[[link]]\nbetween = [\"emu0\", \"emu7\"]\n"), "line 3: 'emu7' is not a node");
  EXPECT_EQ(parse_error("nodes = 2\n\n[[link]]\nfrom = \"emu0\"\n"),
            "line 3: a [[link]] names its ends: 'between = [A, B]', or 'from' and 'to'");
  EXPECT_EQ(parse_error("nodes = 65\n"), "line 1: 'nodes' must be from 1 to 64");
  EXPECT_EQ(parse_error("nodes = [\"a\", \"a\"]\n"), "line 1: node 'a' is listed twice");
  EXPECT_EQ(parse_error("seed = -1\nnodes = 2\n"), "line 1: 'seed' must be a non-negative integer");
  EXPECT_EQ(parse_error("seed = 1\n"), "line 1: 'nodes' is missing (a count, or a list of device names)");
  EXPECT_EQ(parse_error("nodes = 2\nlinks = 3\n"),
            "line 2: unknown key 'links' in the file (seed, nodes, default, link)");
  EXPECT_EQ(parse_error("nodes = [\"a@1.2.3.4\"]\n"),
            "line 1: a node is a device name (no ',', '@', '/', spaces; not '*')");
}

TEST(Topology, LoadNamesTheFile) {
  Topology t;
  std::string error;
  EXPECT_FALSE(load_topology("/nonexistent/fabric.toml", &t, &error));
  EXPECT_EQ(error, "/nonexistent/fabric.toml: cannot be read");
}

// Packets on one link leave one after the other and arrive a latency later.
TEST(SimFabric, SerialisationThenLatency) {
  SimFabric f(parse_ok("nodes = 2\n[default]\nlatency_us = 10\nbandwidth_gbps = 1\nmtu = 1024\n"));
  const Clock::time_point t0{seconds(1)};
  Clock::time_point at;
  // 1000 bytes at 1 Gb/s: 8 us on the wire.
  ASSERT_EQ(f.cross(0, 1, 1000, 900, t0, &at), LinkVerdict::kPass);
  EXPECT_EQ(at - t0, microseconds(18));
  // Sent at the same moment: waits for the first to leave.
  ASSERT_EQ(f.cross(0, 1, 1000, 900, t0, &at), LinkVerdict::kPass);
  EXPECT_EQ(at - t0, microseconds(26));
  // The other direction is a wire of its own.
  ASSERT_EQ(f.cross(1, 0, 1000, 900, t0, &at), LinkVerdict::kPass);
  EXPECT_EQ(at - t0, microseconds(18));
  // Once the wire is free, only its own time.
  ASSERT_EQ(f.cross(0, 1, 125, 100, t0 + seconds(1), &at), LinkVerdict::kPass);
  EXPECT_EQ(at - t0, seconds(1) + microseconds(11));
  // Over the MTU: dropped before the wire, which it does not occupy.
  EXPECT_EQ(f.cross(0, 1, 2000, 2048, t0 + seconds(2), &at), LinkVerdict::kTooBig);
  ASSERT_EQ(f.cross(0, 1, 125, 100, t0 + seconds(2), &at), LinkVerdict::kPass);
  EXPECT_EQ(at - t0, seconds(2) + microseconds(11));
}

// The loss draws depend on the seed and the link only.
TEST(SimFabric, LossIsSeededPerLink) {
  auto pattern = [](uint64_t seed, size_t from, size_t to) {
    SimFabric f(parse_ok("seed = " + std::to_string(seed) + "\nnodes = 3\n[default]\nloss = 0.3\n"));
    std::string s;
    Clock::time_point at;
    for (int i = 0; i < 200; ++i)
      s += f.cross(from, to, 100, 50, Clock::time_point{}, &at) == LinkVerdict::kLost ? 'x' : '.';
    return s;
  };
  const std::string a = pattern(5, 0, 1);
  EXPECT_EQ(a, pattern(5, 0, 1));
  EXPECT_NE(a, pattern(6, 0, 1));
  EXPECT_NE(a, pattern(5, 1, 0));
  const auto lost = std::count(a.begin(), a.end(), 'x');
  EXPECT_GT(lost, 30);
  EXPECT_LT(lost, 90);
}

}  // namespace
}  // namespace softverbs::fabric

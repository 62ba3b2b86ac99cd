// The simulated fabric through the public verbs API (docs/simulation.md, "A
// simulated fabric"): the process runs with SOFTVERBS_TOPOLOGY=pairs.toml, four
// pairs of devices each joined by a link with one property (latency,
// bandwidth, loss, MTU). Registered on real time and on virtual time
// (`virtual.` prefix); exact figures are checked on virtual time only, where
// nothing but the links moves the clock.
#include <gtest/gtest.h>
#include <softverbs/faults.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/support/process.hpp"
#include "tests/topology/fabric_nodes.hpp"

using namespace softverbs::topotest;
using softverbs::testkit::QpPath;

namespace {

bool virtual_time() {
  const char* c = std::getenv("SOFTVERBS_CLOCK");
  return c && std::strcmp(c, "virtual") == 0;
}

// Two nodes of pairs.toml and an RC QP pair between them.
struct Pair {
  Node a, b;
  ibv_qp* qa = nullptr;
  ibv_qp* qb = nullptr;

  Pair(const char* na, const char* nb, const QpPath& path, size_t bytes = 1 << 16) {
    int count = 0;
    ibv_device** list = ibv_get_device_list(&count);
    if (!list) die("ibv_get_device_list");
    for (int i = 0; i < count; ++i) {
      if (std::strcmp(ibv_get_device_name(list[i]), na) == 0) open_node(list[i], &a, 256, bytes);
      if (std::strcmp(ibv_get_device_name(list[i]), nb) == 0) open_node(list[i], &b, 256, bytes);
    }
    ibv_free_device_list(list);
    if (!a.ctx || !b.ctx) die("the devices of pairs.toml are missing");
    qa = rc_qp(a, 128);
    qb = rc_qp(b, 128);
    connect_rc(a, qa, b, qb, path);
  }
  ~Pair() {
    ibv_destroy_qp(qa);
    ibv_destroy_qp(qb);
  }
};

softverbs_counters counters(const std::string& name) {
  softverbs_counters c{};
  EXPECT_EQ(softverbs_device_counters(name.c_str(), &c, sizeof c), 0);
  return c;
}

// The octets of a packet on a link: IPv4 + UDP headers, BTH, the extension
// headers, the payload, the ICRC.
constexpr uint64_t kIpUdp = 28, kBth = 12, kIcrc = 4;

}  // namespace

// A SEND and its ACK each cross the 100 us link: the sender's completion comes
// 200 us after the post (the link has no bandwidth limit, so exactly that on
// virtual time).
TEST(Topology, LatencyShowsInTheRoundTrip) {
  QpPath path;
  path.path_mtu = IBV_MTU_4096;
  Pair p("lat_a", "lat_b", path);
  ASSERT_EQ(post_recv(p.qb, p.b, 1, 0, 4096), 0);
  const uint64_t t0 = device_ns(p.a.ctx);
  ASSERT_EQ(post_send(p.qa, p.a, 2, 0, 64), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_one(p.a.cq, &wc));
  const uint64_t t1 = device_ns(p.a.ctx);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(wait_one(p.b.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_GE(t1 - t0, 200000u);
  if (virtual_time()) {
    EXPECT_EQ(t1 - t0, 200000u);
  }
}

// 1 MiB over a 1 Gb/s link: 256 packets of 4096 bytes leave one after the
// other, 8.39 ms of payload alone.
TEST(Topology, BandwidthPacesAWrite) {
  QpPath path;
  path.path_mtu = IBV_MTU_4096;
  constexpr uint32_t kBytes = 1 << 20;
  Pair p("bw_a", "bw_b", path, kBytes);
  const uint64_t t0 = device_ns(p.a.ctx);
  ASSERT_EQ(post_send(p.qa, p.a, 1, 0, kBytes, reinterpret_cast<uintptr_t>(p.b.buf.data()), p.b.mr->rkey), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_one(p.a.cq, &wc));
  const uint64_t t1 = device_ns(p.a.ctx);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_GE(t1 - t0, 8400000u);
  if (virtual_time()) {
    // The first packet carries a RETH (16 bytes), the ACK an AETH (4); at
    // 1 Gb/s a byte takes 8 ns, and nothing else takes time.
    const uint64_t first = kIpUdp + kBth + 16 + 4096 + kIcrc, other = kIpUdp + kBth + 4096 + kIcrc;
    const uint64_t ack = kIpUdp + kBth + 4 + kIcrc;
    EXPECT_EQ(t1 - t0, (first + 255 * other + ack) * 8);
  }
}

// 5 % loss on one link: RC retransmits what the link lost, and every SEND
// completes in order.
TEST(Topology, LossIsRecoveredByRetransmission) {
  QpPath path;
  path.path_mtu = IBV_MTU_4096;
  path.timeout = 10;  // 4.2 ms: short, so that a lost tail costs little on real time
  Pair p("loss_a", "loss_b", path);
  const softverbs_counters a0 = counters("loss_a"), b0 = counters("loss_b");
  constexpr int kMessages = 100;
  for (int i = 0; i < kMessages; ++i) ASSERT_EQ(post_recv(p.qb, p.b, i, 0, 4096), 0);
  for (int i = 0; i < kMessages; ++i) ASSERT_EQ(post_send(p.qa, p.a, i, 0, 2048), 0);
  for (int i = 0; i < kMessages; ++i) {
    ibv_wc wc{};
    ASSERT_TRUE(wait_one(p.a.cq, &wc)) << i;
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(i));
    ASSERT_TRUE(wait_one(p.b.cq, &wc)) << i;
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.wr_id, static_cast<uint64_t>(i));
  }
  const softverbs_counters a1 = counters("loss_a"), b1 = counters("loss_b");
  EXPECT_GT(a1.topology_loss_drops + b1.topology_loss_drops, a0.topology_loss_drops + b0.topology_loss_drops);
  EXPECT_GT(a1.retransmits, a0.retransmits);
  EXPECT_EQ(a1.topology_mtu_drops, a0.topology_mtu_drops);
}

// A link whose MTU (1024) is smaller than the path MTU the QPs use (4096,
// which the ports allow): the 2048-byte packet is dropped at every try and
// the SEND ends in IBV_WC_RETRY_EXC_ERR; with path MTU 1024 the same SEND
// goes in two packets.
TEST(Topology, PacketsOverTheLinkMtuAreDropped) {
  QpPath path;
  path.path_mtu = IBV_MTU_4096;
  path.timeout = 8;  // 1 ms
  path.retry_cnt = 2;
  {
    Pair p("mtu_a", "mtu_b", path);
    const softverbs_counters a0 = counters("mtu_a");
    ASSERT_EQ(post_recv(p.qb, p.b, 1, 0, 4096), 0);
    ASSERT_EQ(post_send(p.qa, p.a, 2, 0, 2048), 0);
    ibv_wc wc{};
    ASSERT_TRUE(wait_one(p.a.cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
    // The first try and two retries.
    EXPECT_EQ(counters("mtu_a").topology_mtu_drops - a0.topology_mtu_drops, 3u);
  }
  path.path_mtu = IBV_MTU_1024;
  Pair p("mtu_a", "mtu_b", path);
  ASSERT_EQ(post_recv(p.qb, p.b, 1, 0, 4096), 0);
  ASSERT_EQ(post_send(p.qa, p.a, 2, 0, 2048), 0);
  ibv_wc wc{};
  ASSERT_TRUE(wait_one(p.a.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  ASSERT_TRUE(wait_one(p.b.cq, &wc));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.byte_len, 2048u);
}

namespace {

softverbs::test::ProcessResult run_alltoall(const std::string& topology, const char* devices = nullptr) {
  using namespace softverbs::test;
  Env env = Env::inherit().unset_prefix("SOFTVERBS_");
  env.set("SOFTVERBS_TOPOLOGY", std::string(SV_TOPOLOGY_DIR) + "/" + topology).set("SOFTVERBS_CLOCK", "virtual");
  if (devices) env.set("SOFTVERBS_DEVICES", devices);
  return run({SV_TOPOLOGY_ALLTOALL, "4096", "8"}, env, std::chrono::seconds(60));
}

// The output without its wall-time line.
std::string without_wall_time(const std::string& out) { return out.substr(0, out.find("wall time")); }

}  // namespace

// Loss draws come from a seeded stream per link: two runs of the same program
// on virtual time lose the same packets and end at the same virtual time.
TEST(Topology, LossRepeatsForASeed) {
  if (!virtual_time()) GTEST_SKIP() << "a virtual-time property; the virtual. registration checks it";
  const auto first = run_alltoall("lossy4.toml");
  ASSERT_TRUE(first.exited_with(0)) << first.describe();
  const auto second = run_alltoall("lossy4.toml");
  ASSERT_TRUE(second.exited_with(0)) << second.describe();
  EXPECT_NE(first.out.find("loss "), std::string::npos);
  EXPECT_EQ(first.out.find("loss 0,"), std::string::npos) << "2 % loss lost nothing: " << first.out;
  EXPECT_EQ(without_wall_time(first.out), without_wall_time(second.out));
}

// SOFTVERBS_DEVICES must name the topology's nodes: otherwise no device is listed.
TEST(Topology, DevicesThatAreNotTheNodesGiveNoDevices) {
  if (!virtual_time()) GTEST_SKIP() << "checked once, by the virtual. registration";
  const auto r = run_alltoall("lossy4.toml", "emu0,emu1,emu2,other");
  EXPECT_TRUE(r.exited_with(2)) << r.describe();
  EXPECT_NE(r.err.find("devices that are not nodes: other"), std::string::npos) << r.err;
  const auto same = run_alltoall("lossy4.toml", "emu3,emu2,emu1,emu0");
  EXPECT_TRUE(same.exited_with(0)) << same.describe();
}

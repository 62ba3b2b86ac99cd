// A device's multicast receive path after it left a group (emu/device/mcast.cpp):
// the datagrams it was sent as a member that arrive after its last detach (a
// sender's own loopback copies, drained after rdma_leave_multicast, are the usual
// ones) are recognised by their ICRC against the group and counted as packets for
// no QP (rx_unknown_qp), not as ICRC errors; a corrupted one still is an ICRC
// error, and so is one for a group the device never joined. Packets are injected
// into the receive path (Device::inject) of the process's first emulated device.
// Groups 239.209.0.x, used by no other test.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "emu/objects/objects.hpp"
#include "wire/packet.hpp"

namespace softverbs::emu {
namespace {

constexpr uint32_t kMulticastQpn = 0xFFFFFF;
constexpr uint32_t kQpn = 0x123456;  // attached to the group; no such QP on the device

in_addr ipv4(const char* text) {
  in_addr a{};
  inet_pton(AF_INET, text, &a);
  return a;
}

ibv_gid group_gid(in_addr group) {
  ibv_gid g{};
  g.raw[10] = g.raw[11] = 0xff;
  std::memcpy(g.raw + 12, &group.s_addr, 4);
  return g;
}

class McastLeftGroup : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& devices = DeviceRegistry::instance().devices();
    if (devices.empty()) GTEST_SKIP() << "no emulated device";
    dev_ = devices.front();
  }

  // A UD SEND ONLY to the multicast QPN with the ICRC a sender computes for the
  // group (IP destination: the group), one payload byte flipped if corrupt.
  void inject(in_addr group, bool corrupt = false) {
    wire::PacketHeaders h;
    h.bth.opcode = 0x64;  // UD SEND ONLY
    h.bth.dest_qp = kMulticastQpn;
    h.bth.psn = psn_++;
    h.deth.qkey = 0x11111111;
    h.deth.src_qp = 0x42;
    const std::vector<uint8_t> payload(16, 0x5a);
    std::vector<uint8_t> pkt(128);
    wire::IcrcFlow flow{dev_->flow(src_, group)};
    size_t n = wire::build(h, payload, pkt, &flow);
    ASSERT_NE(n, 0u);
    if (corrupt) pkt[n - 8] ^= 0x01;  // the last payload byte, before the ICRC
    dev_->inject(src_, std::span<const uint8_t>(pkt.data(), n));
  }

  uint64_t icrc_errors() { return dev_->counters().rx_icrc_errors.load(); }
  uint64_t unknown_qp() { return dev_->counters().rx_unknown_qp.load(); }

  Device* dev_ = nullptr;
  in_addr src_ = ipv4("127.209.0.9");  // a stranger: no device of this process has it
  uint32_t psn_ = 0;
};

TEST_F(McastLeftGroup, DatagramsAfterTheLeaveAreForNoQpNotCorrupted) {
  const in_addr group = ipv4("239.209.0.1");
  const ibv_gid gid = group_gid(group);
  ASSERT_EQ(dev_->attach_mcast(kQpn, gid, 0), 0);
  uint64_t icrc = icrc_errors(), unknown = unknown_qp();
  ASSERT_NO_FATAL_FAILURE(inject(group));  // a member: handed to the attached QPN
  EXPECT_EQ(icrc_errors(), icrc);
  EXPECT_EQ(unknown_qp(), unknown);

  ASSERT_EQ(dev_->detach_mcast(kQpn, gid, 0), 0);
  ASSERT_NO_FATAL_FAILURE(inject(group));
  EXPECT_EQ(icrc_errors(), icrc) << "a datagram for a group left is not corrupted";
  EXPECT_EQ(unknown_qp(), unknown + 1);

  ASSERT_NO_FATAL_FAILURE(inject(group, /*corrupt=*/true));
  EXPECT_EQ(icrc_errors(), icrc + 1) << "a corrupted one holds for no group";
  EXPECT_EQ(unknown_qp(), unknown + 1);
}

TEST_F(McastLeftGroup, AGroupNeverJoinedStaysAnIcrcError) {
  const uint64_t icrc = icrc_errors(), unknown = unknown_qp();
  ASSERT_NO_FATAL_FAILURE(inject(ipv4("239.209.0.2")));
  EXPECT_EQ(icrc_errors(), icrc + 1);
  EXPECT_EQ(unknown_qp(), unknown);
}

// Joined again, the group is a member's once more: its datagrams go to the QPs.
TEST_F(McastLeftGroup, JoinedAgainTheGroupIsDeliveredAgain) {
  const in_addr group = ipv4("239.209.0.3");
  const ibv_gid gid = group_gid(group);
  ASSERT_EQ(dev_->attach_mcast(kQpn, gid, 0), 0);
  ASSERT_EQ(dev_->detach_mcast(kQpn, gid, 0), 0);
  ASSERT_EQ(dev_->attach_mcast(kQpn, gid, 0), 0);
  const uint64_t icrc = icrc_errors(), unknown = unknown_qp();
  ASSERT_NO_FATAL_FAILURE(inject(group));
  EXPECT_EQ(icrc_errors(), icrc);
  EXPECT_EQ(unknown_qp(), unknown) << "delivered to the group's QPs, not counted as for no QP";
  ASSERT_EQ(dev_->detach_mcast(kQpn, gid, 0), 0);
}

}  // namespace
}  // namespace softverbs::emu

// Which address vectors an emulated device can send to (resolve_av,
// emu/qp/requester.cpp): on RoCE the IPv4-mapped GID (index 1) and the
// link-local GID (index 0: fe80::/64 and the EUI-64 of the port's MAC, as rxe's)
// of an emulated port, both naming its IPv4 address; not a link-local GID whose
// interface identifier is no emulated port's, nor any other IPv6 GID. The
// process's first emulated device is a RoCE one (the default link layer).
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "emu/device/identity.hpp"
#include "emu/objects/objects.hpp"

namespace softverbs::emu {
namespace {

class ResolveAv : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto& devices = DeviceRegistry::instance().devices();
    if (devices.empty()) GTEST_SKIP() << "no emulated device";
    dev_ = devices.front();
    if (dev_->link_layer() != LinkLayer::kEthernet) GTEST_SKIP() << "not a RoCE device";
    inet_pton(AF_INET, "127.210.3.4", &peer_);
  }

  ibv_ah_attr av_of(const ibv_gid& gid) {
    ibv_ah_attr av{};
    av.is_global = 1;
    av.grh.dgid = gid;
    av.grh.hop_limit = 1;
    av.port_num = 1;
    return av;
  }

  Device* dev_ = nullptr;
  in_addr peer_{};
};

TEST_F(ResolveAv, BothGidsOfAnEmulatedRocePortNameItsAddress) {
  for (uint32_t index : {0u, 1u}) {
    ibv_gid gid{};
    ibv_gid_type type{};
    ASSERT_TRUE(gid_of(LinkLayer::kEthernet, peer_, index, &gid, &type));
    in_addr out{};
    EXPECT_TRUE(resolve_av(*dev_, av_of(gid), &out)) << "GID index " << index << ": " << gid_str(gid);
    EXPECT_EQ(out.s_addr, peer_.s_addr) << "GID index " << index << ": " << gid_str(gid);
  }
}

TEST_F(ResolveAv, OtherIpv6GidsAreUnreachable) {
  ibv_gid gid{};
  ibv_gid_type type{};
  ASSERT_TRUE(gid_of(LinkLayer::kEthernet, peer_, 0, &gid, &type));
  in_addr out{};
  ibv_gid foreign = gid;
  foreign.raw[12] = 0x00;  // fe80::…:ff00:… is no EUI-64
  EXPECT_FALSE(resolve_av(*dev_, av_of(foreign), &out)) << gid_str(foreign);
  foreign = gid;
  foreign.raw[8] = 0x12;  // another MAC than 02:00:…
  EXPECT_FALSE(resolve_av(*dev_, av_of(foreign), &out)) << gid_str(foreign);
  ibv_gid global{};
  inet_pton(AF_INET6, "2001:db8::1", global.raw);
  EXPECT_FALSE(resolve_av(*dev_, av_of(global), &out)) << gid_str(global);
}

}  // namespace
}  // namespace softverbs::emu

// What the library and the launcher's sysfs view share (emu/device/identity,
// placement, sysfs): the identity derived from an address, the placement of
// devices on addresses (with a fake bind, so no socket is touched), the
// addresses the launcher hands over, and the sysfs files.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <set>
#include <string>

#include "emu/device/identity.hpp"
#include "emu/device/placement.hpp"
#include "emu/device/sysfs.hpp"

namespace softverbs::emu {
namespace {

in_addr ip(const char* text) {
  in_addr a{};
  EXPECT_EQ(inet_pton(AF_INET, text, &a), 1) << text;
  return a;
}

Config config_of(const char* spec) {
  std::string error;
  auto c = parse_config(spec, nullptr, nullptr, &error);
  EXPECT_TRUE(c) << error;
  return c.value_or(Config{});
}

// A bind that succeeds except on the addresses in `taken`, handing out fd 100, 101, ...
struct FakeBind {
  std::set<std::string> taken;
  std::vector<std::string> tried;
  int next = 100;
  BindFn fn() {
    return [this](in_addr a) {
      tried.push_back(addr_str(a));
      return taken.count(addr_str(a)) ? -EADDRINUSE : next++;
    };
  }
};

TEST(DeviceIdentity, FromTheAddress) {
  Identity id = identity_of(ip("127.0.3.8"));
  EXPECT_EQ(id.mac[0], 0x02);
  EXPECT_EQ(id.mac[5], 8);
  EXPECT_EQ(id.guid, 0x00007ffffe000308ull);
  EXPECT_EQ(id.lid, 0x308);
  EXPECT_EQ(guid_str(id.guid), "0000:7fff:fe00:0308");

  ibv_gid gid{};
  ibv_gid_type type{};
  ASSERT_TRUE(gid_of(LinkLayer::kEthernet, ip("127.0.3.8"), 1, &gid, &type));
  EXPECT_EQ(gid_str(gid), "0000:0000:0000:0000:0000:ffff:7f00:0308");
  EXPECT_EQ(type, IBV_GID_TYPE_ROCE_V2);
  ASSERT_TRUE(gid_of(LinkLayer::kEthernet, ip("127.0.3.8"), 0, &gid, &type));
  EXPECT_EQ(gid_str(gid), "fe80:0000:0000:0000:0000:7fff:fe00:0308");
  // The device's IPv6 address, fd73:7665:7262::/96 with the IPv4 address, after them.
  ASSERT_TRUE(gid_of(LinkLayer::kEthernet, ip("127.0.3.8"), 2, &gid, &type));
  EXPECT_EQ(gid_str(gid), "fd73:7665:7262:0000:0000:0000:7f00:0308");
  EXPECT_EQ(type, IBV_GID_TYPE_ROCE_V2);
  in_addr back{};
  EXPECT_TRUE(ipv4_in_ipv6(gid.raw, &back));
  EXPECT_EQ(addr_str(back), "127.0.3.8");
  gid.raw[5] ^= 1;
  EXPECT_FALSE(ipv4_in_ipv6(gid.raw, &back)) << "another prefix";
  EXPECT_FALSE(gid_of(LinkLayer::kEthernet, ip("127.0.3.8"), 3, &gid, &type));
  ASSERT_TRUE(gid_of(LinkLayer::kInfiniBand, ip("127.0.3.8"), 0, &gid, &type));
  EXPECT_EQ(type, IBV_GID_TYPE_IB);
  EXPECT_FALSE(gid_of(LinkLayer::kInfiniBand, ip("127.0.3.8"), 1, &gid, &type));
  EXPECT_EQ(interface_of(ip("127.0.3.8")), "lo");
}

TEST(DevicePlacement, ExplicitAutomaticAndPreferred) {
  FakeBind bind;
  std::vector<std::string> errors;
  auto placed = place_devices(config_of("a@127.0.0.9,b,c"), 7, {ip("127.0.5.5"), ip("127.0.6.6")}, bind.fn(), &errors);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(addr_str(placed[0].addr), "127.0.0.9");
  EXPECT_EQ(addr_str(placed[1].addr), "127.0.5.5");
  EXPECT_EQ(addr_str(placed[2].addr), "127.0.6.6");
  EXPECT_EQ(placed[1].fd, 101);

  // Without preferred addresses: the search, the same for the same process id.
  FakeBind again;
  auto searched = place_devices(config_of("2"), 7, {}, again.fn(), &errors);
  auto repeated = place_devices(config_of("2"), 7, {}, again.fn(), &errors);
  ASSERT_EQ(searched.size(), 2u);
  EXPECT_EQ(addr_str(searched[0].addr), addr_str(repeated[0].addr));
  EXPECT_EQ(addr_str(searched[1].addr), addr_str(repeated[1].addr));
  EXPECT_NE(addr_str(searched[0].addr), addr_str(searched[1].addr));
}

TEST(DevicePlacement, TakenAndInvalidAddressesAreSkipped) {
  FakeBind bind;
  bind.taken = {"127.0.5.5", "127.0.0.9"};
  std::vector<std::string> errors;
  // a: taken; b: its preferred address is taken, so it searches; c: 0.0.0.0 is
  // outside the automatic range, so it searches; d: LID 0 on InfiniBand.
  auto placed = place_devices(config_of("a@127.0.0.9,b,c,d@127.0.0.0/ib"), 7, {ip("127.0.5.5"), ip("0.0.0.0")},
                              bind.fn(), &errors);
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0].config.name, "b");
  EXPECT_NE(addr_str(placed[0].addr), "127.0.5.5");
  EXPECT_EQ(placed[1].config.name, "c");
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].find("device a: cannot bind 127.0.0.9:4791"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("device d: address 127.0.0.0 gives LID 0x0"), std::string::npos) << errors[1];
}

TEST(DevicePlacement, AddressList) {
  std::vector<in_addr> list;
  EXPECT_TRUE(parse_addr_list(nullptr, &list));
  EXPECT_TRUE(list.empty());
  ASSERT_TRUE(parse_addr_list("127.0.1.2,0.0.0.0", &list));
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(addr_str(list[0]), "127.0.1.2");
  EXPECT_FALSE(parse_addr_list("127.0.1.2,x", &list));
  EXPECT_TRUE(list.empty());
}

TEST(DeviceSysfs, FilesOfARoceAndAnInfiniBandDevice) {
  Config c = config_of("r@127.0.3.8,i@127.0.4.9/ib");
  std::map<std::string, SysfsNode> nodes;
  for (const SysfsNode& n : sysfs_nodes({{c.devices[0], ip("127.0.3.8"), 0, "lo"}, {c.devices[1], ip("127.0.4.9"), 1, "lo"}}))
    EXPECT_TRUE(nodes.emplace(n.path, n).second) << n.path << " twice";
  auto text = [&](const std::string& path) { return nodes.count(path) ? nodes.at(path).text : "(missing " + path + ")"; };
  EXPECT_EQ(text("infiniband/r/node_guid"), "0000:7fff:fe00:0308\n");
  EXPECT_EQ(text("infiniband/r/node_type"), "1: CA\n");
  EXPECT_EQ(text("infiniband/r/ports/1/state"), "4: ACTIVE\n");
  EXPECT_EQ(text("infiniband/r/ports/1/link_layer"), "Ethernet\n");
  EXPECT_EQ(text("infiniband/r/ports/1/lid"), "0x0\n");
  EXPECT_EQ(text("infiniband/r/ports/1/gids/1"), "0000:0000:0000:0000:0000:ffff:7f00:0308\n");
  EXPECT_EQ(text("infiniband/r/ports/1/gids/15"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_EQ(text("infiniband/r/ports/1/gid_attrs/types/1"), "RoCE v2\n");
  EXPECT_EQ(text("infiniband/r/ports/1/gid_attrs/ndevs/1"), "lo\n");
  EXPECT_EQ(text("infiniband/r/ports/1/gids/2"), "fd73:7665:7262:0000:0000:0000:7f00:0308\n");
  EXPECT_EQ(text("infiniband/r/ports/1/gid_attrs/types/2"), "RoCE v2\n");
  EXPECT_EQ(text("infiniband/r/ports/1/gid_attrs/ndevs/2"), "lo\n");
  EXPECT_FALSE(nodes.count("infiniband/r/ports/1/gid_attrs/types/3"));
  EXPECT_EQ(text("infiniband/r/ports/1/pkeys/0"), "0xffff\n");
  ASSERT_TRUE(nodes.count("infiniband/r/device/net/lo"));
  EXPECT_EQ(nodes.at("infiniband/r/device/net/lo").kind, SysfsNode::Kind::kLink);
  EXPECT_EQ(nodes.at("infiniband/r/device/net/lo").text, "/sys/class/net/lo");
  EXPECT_EQ(text("infiniband_verbs/uverbs0/ibdev"), "r\n");
  EXPECT_EQ(text("infiniband_verbs/uverbs1/ibdev"), "i\n");
  EXPECT_EQ(text("infiniband/i/ports/1/lid"), "0x409\n");
  EXPECT_EQ(text("infiniband/i/ports/1/sm_lid"), "0x1\n");
  EXPECT_EQ(text("infiniband/i/ports/1/link_layer"), "InfiniBand\n");
  EXPECT_EQ(text("infiniband/i/ports/1/gid_attrs/types/0"), "IB/RoCE v1\n");
  EXPECT_FALSE(nodes.count("infiniband/i/ports/1/gid_attrs/ndevs/0"));
  EXPECT_TRUE(nodes.count("infiniband/i/ports/1/pkeys/127"));
}

}  // namespace
}  // namespace softverbs::emu

namespace softverbs::emu {
namespace {

// SOFTVERBS_VENDOR_PART_ID (docs/configuration.md): a 32-bit number, decimal or
// 0x-hexadecimal, blanks around it ignored; anything else is refused.
TEST(VendorPartId, ParsesDecimalAndHexadecimal) {
  EXPECT_EQ(parse_vendor_part_id("4123"), 4123u);
  EXPECT_EQ(parse_vendor_part_id(" 0x101b\t"), 4123u);
  EXPECT_EQ(parse_vendor_part_id("0X101B"), 4123u);
  EXPECT_EQ(parse_vendor_part_id("4294967295"), 4294967295u);
  EXPECT_EQ(parse_vendor_part_id("0"), 0u);
  for (const char* bad : {"", " ", "0x", "-1", "4294967296", "12ab", "0x1g", "+5", "4123 4123"})
    EXPECT_FALSE(parse_vendor_part_id(bad)) << "'" << bad << "'";
}

TEST(VendorPartId, DevicesDefaultToSoftverbsOwnId) {
  std::string error;
  auto c = parse_config("a,b", nullptr, nullptr, &error);
  ASSERT_TRUE(c) << error;
  for (const DeviceConfig& d : c->devices) EXPECT_EQ(d.vendor_part_id, caps::kVendorPartId);
}

}  // namespace
}  // namespace softverbs::emu

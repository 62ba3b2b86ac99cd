// An emulated device's identity from its address (identity.hpp): one
// derivation for the device and for the sysfs view the launcher writes.
#include "emu/device/identity.hpp"

#include <arpa/inet.h>
#include <endian.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <cstdio>
#include <cstring>

#include "emu/device/caps.hpp"

namespace softverbs::emu {

Identity identity_of(in_addr addr) {
  Identity id{};
  uint32_t a = ntohl(addr.s_addr);
  id.mac[0] = 0x02;
  id.mac[1] = 0x00;
  id.mac[2] = static_cast<uint8_t>(a >> 24);
  id.mac[3] = static_cast<uint8_t>(a >> 16);
  id.mac[4] = static_cast<uint8_t>(a >> 8);
  id.mac[5] = static_cast<uint8_t>(a);
  // EUI-64 of the MAC: ff:fe in the middle, the universal/local bit flipped.
  id.guid = (static_cast<uint64_t>(id.mac[0] ^ 0x02) << 56) | (static_cast<uint64_t>(id.mac[1]) << 48) |
            (static_cast<uint64_t>(id.mac[2]) << 40) | (0xfffeull << 24) | (static_cast<uint64_t>(id.mac[3]) << 16) |
            (static_cast<uint64_t>(id.mac[4]) << 8) | id.mac[5];
  id.lid = static_cast<uint16_t>(a & 0xffff);
  return id;
}

ibv_gid ipv6_gid_of(in_addr addr) {
  ibv_gid gid{};
  std::memcpy(gid.raw, kIpv6Prefix, sizeof kIpv6Prefix);
  std::memcpy(gid.raw + 12, &addr.s_addr, 4);
  return gid;
}

bool ipv4_in_ipv6(const uint8_t raw[16], in_addr* out) {
  if (std::memcmp(raw, kIpv6Prefix, sizeof kIpv6Prefix) != 0) return false;
  std::memcpy(&out->s_addr, raw + 12, 4);
  return out->s_addr != 0;
}

int gid_count(LinkLayer ll) { return ll == LinkLayer::kEthernet ? 3 : 1; }

bool gid_of(LinkLayer ll, in_addr addr, uint32_t index, ibv_gid* gid, ibv_gid_type* type) {
  std::memset(gid, 0, sizeof *gid);
  if (index >= static_cast<uint32_t>(gid_count(ll))) return false;
  uint8_t* raw = gid->raw;
  if (ll == LinkLayer::kEthernet && index == 1) {
    // The IPv4-mapped GID of the device address (::ffff:a.b.c.d).
    raw[10] = 0xff;
    raw[11] = 0xff;
    std::memcpy(raw + 12, &addr.s_addr, 4);
  } else if (ll == LinkLayer::kEthernet && index == 2) {
    // The device's IPv6 address: a kernel port lists a GID for each IP
    // address of its netdev, after the IPv4 one here so that index 1 stays.
    *gid = ipv6_gid_of(addr);
  } else {
    // The default subnet prefix fe80::/64 and the GUID: on RoCE the link-local
    // GID of the MAC (EUI-64), on InfiniBand the port GID.
    raw[0] = 0xfe;
    raw[1] = 0x80;
    uint64_t g = htobe64(identity_of(addr).guid);
    std::memcpy(raw + 8, &g, 8);
  }
  *type = ll == LinkLayer::kEthernet ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_IB;
  return true;
}

bool addr_of_port_gid(const ibv_gid& gid, in_addr* addr) {
  // fe80:0000:0000:0000 then the EUI-64 of 02:00:a:b:c:d, which is
  // 00:00:a:ff:fe:b:c:d (identity_of).
  static const uint8_t head[11] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x00};
  const uint8_t* g = gid.raw;
  if (std::memcmp(g, head, 10) != 0 || g[11] != 0xff || g[12] != 0xfe) return false;
  const uint8_t b[4] = {g[10], g[13], g[14], g[15]};
  std::memcpy(&addr->s_addr, b, 4);
  return true;
}

std::string guid_str(uint64_t g) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%04x:%04x:%04x:%04x", static_cast<unsigned>((g >> 48) & 0xffff),
                static_cast<unsigned>((g >> 32) & 0xffff), static_cast<unsigned>((g >> 16) & 0xffff),
                static_cast<unsigned>(g & 0xffff));
  return buf;
}

std::string gid_str(const ibv_gid& gid) {
  std::string s;
  char buf[8];
  for (int i = 0; i < 16; i += 2) {
    std::snprintf(buf, sizeof buf, "%s%02x%02x", i ? ":" : "", gid.raw[i], gid.raw[i + 1]);
    s += buf;
  }
  return s;
}

std::string addr_str(in_addr a) {
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

bool sysfs_attr_of(const std::string& name, in_addr addr, const std::string& attr, std::string* value) {
  if (attr == "board_id")
    *value = caps::kBoardId;
  else if (attr == "fw_ver")
    *value = caps::kFwVer;
  else if (attr == "hw_rev")
    *value = std::to_string(caps::kHwVer);
  else if (attr == "hca_type")
    *value = "softverbs-emu";
  else if (attr == "node_type")
    *value = "1: CA";
  else if (attr == "node_guid" || attr == "sys_image_guid")
    *value = guid_str(identity_of(addr).guid);
  else if (attr == "node_desc")
    *value = "softverbs emulated device " + name + " (" + addr_str(addr) + ")";
  else
    return false;
  return true;
}

std::string interface_of(in_addr addr) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  const bool loopback = (ntohl(addr.s_addr) >> 24) == 127;
  std::string name;
  for (ifaddrs* i = list; i && name.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    // All of 127/8 is routed to the loopback interface, which holds only 127.0.0.1.
    if (reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == addr.s_addr ||
        (loopback && (i->ifa_flags & IFF_LOOPBACK)))
      name = i->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

}  // namespace softverbs::emu

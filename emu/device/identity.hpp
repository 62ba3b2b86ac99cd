// What an emulated device's identity is made of, derived from its IPv4 address
// alone: MAC, GUID, LID, GID table, node description and the other attributes
// a kernel device shows in sysfs. The device (device.cpp) and the launcher's
// sysfs view (emu/device/sysfs.cpp, tools/sysfs_view.cpp) both call these, so
// what a program reads from /sys/class/infiniband is what the verbs report.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <cstdint>
#include <string>

#include "emu/device/config.hpp"

namespace softverbs::emu {

struct Identity {
  uint8_t mac[6];  // locally administered, carries the address: 02:00:a:b:c:d
  uint64_t guid;   // host order: the MAC's EUI-64 (IBTA 4.1.1 / RFC 4291 appendix A)
  uint16_t lid;    // the address's low 16 bits (unicast for 127.0.1.1-127.0.191.255)
};

Identity identity_of(in_addr addr);

// The device's IPv6 address (docs/rdma-cm.md, "Addresses"): the unique-local
// fd73:7665:7262::a.b.c.d (RFC 4193; the global ID is "sverb" in ASCII), which
// carries the IPv4 address in its last 32 bits so that any process of the host
// finds the owner from the address alone, as it does for the IPv4 one.
inline constexpr uint8_t kIpv6Prefix[12] = {0xfd, 0x73, 0x76, 0x65, 0x72, 0x62, 0, 0, 0, 0, 0, 0};
ibv_gid ipv6_gid_of(in_addr addr);
// The IPv4 address inside a device IPv6 address (false for any other address,
// and for the prefix with 0.0.0.0, which no device has).
bool ipv4_in_ipv6(const uint8_t raw[16], in_addr* out);

// GID table of port 1: how many entries are in use, and entry `index` of it
// (false for an empty slot). RoCEv2: 0 is the link-local GID of the MAC, 1 the
// IPv4-mapped GID of the address, 2 the device's IPv6 address (all RoCE v2);
// InfiniBand: 0 is fe80::/64 + the GUID.
int gid_count(LinkLayer ll);
bool gid_of(LinkLayer ll, in_addr addr, uint32_t index, ibv_gid* gid, ibv_gid_type* type);
// The inverse for the fe80::/64 GID of an emulated port (entry 0 of either link
// layer): the address its GUID carries. False for any other GID, so that only
// GIDs an emulated device on this host can own resolve.
bool addr_of_port_gid(const ibv_gid& gid, in_addr* addr);

// "xxxx:xxxx:xxxx:xxxx", as the kernel prints node_guid.
std::string guid_str(uint64_t guid);
// "xxxx:xxxx:...:xxxx" (8 groups), as the kernel prints ports/N/gids/I.
std::string gid_str(const ibv_gid& gid);
std::string addr_str(in_addr addr);

// The device-level sysfs attributes (board_id, fw_ver, hw_rev, hca_type,
// node_type, node_guid, sys_image_guid, node_desc) of device `name` at `addr`,
// without the newline; false for any other name.
bool sysfs_attr_of(const std::string& name, in_addr addr, const std::string& attr, std::string* value);

// The network interface that holds `addr`: the loopback interface for 127/8,
// otherwise the interface with that address (getifaddrs). Empty if none.
std::string interface_of(in_addr addr);

}  // namespace softverbs::emu

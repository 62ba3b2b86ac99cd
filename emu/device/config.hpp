// The emulated devices a process gets, read from the environment
// (docs/configuration.md is the reference for every variable).
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "emu/device/caps.hpp"
#include "fabric/topology.hpp"

namespace softverbs::emu {

enum class LinkLayer { kEthernet, kInfiniBand };

struct DeviceConfig {
  std::string name;
  std::optional<in_addr> addr;  // empty: claim a free loopback address
  LinkLayer link_layer = LinkLayer::kEthernet;
  ibv_mtu active_mtu = IBV_MTU_4096;
  uint32_t vendor_part_id = caps::kVendorPartId;  // SOFTVERBS_VENDOR_PART_ID
};

struct Config {
  std::vector<DeviceConfig> devices;
  // SOFTVERBS_TOPOLOGY's simulated fabric between the devices, when set.
  std::optional<fabric::Topology> topology;
};

// Parses SOFTVERBS_DEVICES / SOFTVERBS_LINK_LAYER / SOFTVERBS_MTU. The grammar:
//   SOFTVERBS_DEVICES = N | ENTRY[,ENTRY...]     (default: "1")
//   ENTRY             = NAME[@IPV4][/eth|/ib]
// A number N gives N devices named emu0..emu(N-1) with automatic addresses.
// On a malformed value, returns nullopt and fills *error.
std::optional<Config> parse_config(const char* devices, const char* link_layer, const char* mtu,
                                   std::string* error);

// SOFTVERBS_VENDOR_PART_ID: a decimal or 0x-prefixed hexadecimal 32-bit number.
std::optional<uint32_t> parse_vendor_part_id(std::string_view text);

// parse_config() applied to the process environment, with SOFTVERBS_VENDOR_PART_ID
// given to every device and SOFTVERBS_TOPOLOGY's fabric read (its nodes are the
// devices when SOFTVERBS_DEVICES is unset, and must be its names when it is set).
std::optional<Config> config_from_env(std::string* error);

// Reads SOFTVERBS_PERSONALITY, if set, and makes it the active personality
// (config_from_env does; the launcher's sysfs view with --devices too). False
// with *error naming the variable when it cannot be loaded.
bool personality_from_env(std::string* error);

std::optional<ibv_mtu> parse_mtu(std::string_view text);

}  // namespace softverbs::emu

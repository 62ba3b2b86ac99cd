#include "emu/device/config.hpp"

#include <arpa/inet.h>

#include <charconv>
#include <cstdlib>
#include <set>

#include "core/env.hpp"
#include "emu/device/personality.hpp"

namespace softverbs::emu {
namespace {

constexpr int kMaxDevices = 64;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<LinkLayer> parse_link_layer(std::string_view text) {
  if (text == "eth" || text == "ethernet" || text == "roce") return LinkLayer::kEthernet;
  if (text == "ib" || text == "infiniband") return LinkLayer::kInfiniBand;
  return std::nullopt;
}

bool valid_name(std::string_view name) {
  // Device names become sysfs-like path components and are printed by tools.
  if (name.empty() || name.size() >= IBV_SYSFS_NAME_MAX) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::optional<ibv_mtu> parse_mtu(std::string_view text) {
  text = trim(text);
  if (text == "256") return IBV_MTU_256;
  if (text == "512") return IBV_MTU_512;
  if (text == "1024") return IBV_MTU_1024;
  if (text == "2048") return IBV_MTU_2048;
  if (text == "4096") return IBV_MTU_4096;
  return std::nullopt;
}

std::optional<Config> parse_config(const char* devices, const char* link_layer, const char* mtu,
                                   std::string* error) {
  LinkLayer default_ll = LinkLayer::kEthernet;
  if (link_layer && *link_layer) {
    auto ll = parse_link_layer(trim(link_layer));
    if (!ll) {
      *error = std::string("SOFTVERBS_LINK_LAYER: expected eth or ib, got '") + link_layer + "'";
      return std::nullopt;
    }
    default_ll = *ll;
  }
  ibv_mtu default_mtu = IBV_MTU_4096;
  if (mtu && *mtu) {
    auto m = parse_mtu(mtu);
    if (!m) {
      *error = std::string("SOFTVERBS_MTU: expected 256, 512, 1024, 2048 or 4096, got '") + mtu + "'";
      return std::nullopt;
    }
    default_mtu = *m;
  }

  Config config;
  std::string_view spec = devices && *devices ? trim(devices) : std::string_view("1");
  int count = 0;
  auto [end, ec] = std::from_chars(spec.data(), spec.data() + spec.size(), count);
  if (ec == std::errc() && end == spec.data() + spec.size()) {
    if (count < 0 || count > kMaxDevices) {
      *error = "SOFTVERBS_DEVICES: the number of devices must be 0.." + std::to_string(kMaxDevices);
      return std::nullopt;
    }
    for (int i = 0; i < count; ++i)
      config.devices.push_back({"emu" + std::to_string(i), std::nullopt, default_ll, default_mtu});
    return config;
  }

  std::set<std::string> names;
  std::set<in_addr_t> addrs;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view entry = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    DeviceConfig dev{{}, std::nullopt, default_ll, default_mtu};
    size_t slash = entry.find('/');
    if (slash != std::string_view::npos) {
      auto ll = parse_link_layer(entry.substr(slash + 1));
      if (!ll) {
        *error = "SOFTVERBS_DEVICES: unknown link layer in '" + std::string(entry) + "' (eth or ib)";
        return std::nullopt;
      }
      dev.link_layer = *ll;
      entry = entry.substr(0, slash);
    }
    size_t at = entry.find('@');
    if (at != std::string_view::npos) {
      std::string text(entry.substr(at + 1));
      if (text != "auto") {
        in_addr a{};
        if (inet_pton(AF_INET, text.c_str(), &a) != 1 || a.s_addr == 0) {
          *error = "SOFTVERBS_DEVICES: '" + text + "' is not an IPv4 address";
          return std::nullopt;
        }
        if (!addrs.insert(a.s_addr).second) {
          *error = "SOFTVERBS_DEVICES: address " + text + " is given to two devices";
          return std::nullopt;
        }
        dev.addr = a;
      }
      entry = entry.substr(0, at);
    }
    if (!valid_name(entry)) {
      *error = "SOFTVERBS_DEVICES: invalid device name '" + std::string(entry) +
               "' (letters, digits, '_' and '-', at most 63 characters)";
      return std::nullopt;
    }
    dev.name = std::string(entry);
    if (!names.insert(dev.name).second) {
      *error = "SOFTVERBS_DEVICES: device name '" + dev.name + "' appears twice";
      return std::nullopt;
    }
    config.devices.push_back(std::move(dev));
    if (config.devices.size() > kMaxDevices) {
      *error = "SOFTVERBS_DEVICES: at most " + std::to_string(kMaxDevices) + " devices";
      return std::nullopt;
    }
  }
  return config;
}

std::optional<uint32_t> parse_vendor_part_id(std::string_view text) {
  text = trim(text);
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  uint32_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

namespace {

// SOFTVERBS_TOPOLOGY: the file's nodes, as SOFTVERBS_DEVICES text when that is
// unset (the names only: automatic addresses).
bool read_topology(const char* path, std::optional<fabric::Topology>* out, std::string* devices_text,
                   std::string* error) {
  fabric::Topology t;
  if (!fabric::load_topology(path, &t, error)) {
    *error = "SOFTVERBS_TOPOLOGY: " + *error;
    return false;
  }
  for (const std::string& n : t.nodes) *devices_text += (devices_text->empty() ? "" : ",") + n;
  *out = std::move(t);
  return true;
}

// The devices of SOFTVERBS_DEVICES are the topology's nodes, in any order.
bool devices_match(const Config& c, const fabric::Topology& t, std::string* error) {
  std::set<std::string> devs, nodes(t.nodes.begin(), t.nodes.end());
  for (const DeviceConfig& d : c.devices) devs.insert(d.name);
  if (devs == nodes && c.devices.size() == t.nodes.size()) return true;
  std::string missing, extra;
  for (const std::string& n : nodes)
    if (!devs.count(n)) missing += (missing.empty() ? "" : ", ") + n;
  for (const std::string& d : devs)
    if (!nodes.count(d)) extra += (extra.empty() ? "" : ", ") + d;
  *error = "SOFTVERBS_TOPOLOGY: its nodes are not the devices of SOFTVERBS_DEVICES";
  if (!missing.empty()) *error += "; nodes without a device: " + missing;
  if (!extra.empty()) *error += "; devices that are not nodes: " + extra;
  return false;
}

}  // namespace

bool personality_from_env(std::string* error) {
  const char* spec = env::personality();
  if (!spec || !*spec) return true;
  Personality persona;
  if (!load_personality(spec, &persona, error)) {
    *error = "SOFTVERBS_PERSONALITY: " + *error;
    return false;
  }
  set_personality(persona);
  return true;
}

std::optional<Config> config_from_env(std::string* error) {
  std::optional<fabric::Topology> topology;
  std::string topology_devices;
  if (const char* path = env::topology(); path && *path) {
    if (!read_topology(path, &topology, &topology_devices, error)) return std::nullopt;
  }
  const char* devices = env::devices();
  if (topology && !devices) devices = topology_devices.c_str();
  std::optional<Config> config = parse_config(devices, env::link_layer(), env::mtu(), error);
  if (!config) return config;
  if (topology) {
    if (!devices_match(*config, *topology, error)) return std::nullopt;
    config->topology = std::move(topology);
  }
  // SOFTVERBS_PERSONALITY: read before any device exists, so every device and
  // object sees one personality for the life of the process. A bad one lists no
  // devices, as a bad SOFTVERBS_DEVICES does: running as ConnectX when rxe was
  // asked for would pass tests meant to fail.
  if (!personality_from_env(error)) return std::nullopt;
  for (DeviceConfig& d : config->devices) d.vendor_part_id = personality().vendor_part_id;
  const char* part = env::vendor_part_id();
  if (!part || !*part) return config;
  std::optional<uint32_t> id = parse_vendor_part_id(part);
  if (!id) {
    *error = std::string("SOFTVERBS_VENDOR_PART_ID: expected a number 0..4294967295 (decimal or 0x...), got '") +
             part + "'";
    return std::nullopt;
  }
  for (DeviceConfig& d : config->devices) d.vendor_part_id = *id;
  return config;
}

}  // namespace softverbs::emu

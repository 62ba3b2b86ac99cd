// Where each configured emulated device lives: its address and its bound
// RoCEv2 socket. The library places its devices with this at the first device
// listing; the launcher (`softverbs run`) places them the same way beforehand
// to describe them in the program's sysfs view, and hands the automatic
// addresses it found to the program in SOFTVERBS_AUTO_ADDRS, which this tries
// first, so that both agree (docs/configuration.md).
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "emu/device/config.hpp"

namespace softverbs::emu {

inline constexpr uint16_t kRoceV2Port = 4791;
// Automatic addresses come from 127.0.1.1 .. 127.0.191.255 so that the low 16 bits
// are a valid unicast LID (0x0001..0xBFFF) for the InfiniBand link-layer mode.
inline constexpr uint32_t kAutoFirst = 0x7f000101;
inline constexpr uint32_t kAutoLast = 0x7f00bfff;

struct Placed {
  DeviceConfig config;
  in_addr addr{};
  int fd = -1;  // what bind() returned for addr
};

// Binds a RoCEv2 endpoint at addr: a socket >= 0, or -errno.
using BindFn = std::function<int(in_addr)>;

// The library's own bind: a nonblocking UDP socket on addr:4791 with the
// options the device's link uses (fabric/udp_link.cpp).
int bind_roce_endpoint(in_addr addr);

// The devices of `config` that can be created, in order: an explicit address
// must bind (and give a unicast LID on InfiniBand); an automatic one is the
// k-th entry of `preferred` if it is in the automatic range and binds, else the
// first address that binds, searching the range from a point derived from
// `pid`. A device that cannot be placed is left out and its reason appended to
// *errors (one line each, without the level).
std::vector<Placed> place_devices(const Config& config, uint32_t pid, const std::vector<in_addr>& preferred,
                                  const BindFn& bind, std::vector<std::string>* errors);

// SOFTVERBS_AUTO_ADDRS: IPv4 addresses separated by commas. Returns false (and
// an empty list) if any entry is not an address.
bool parse_addr_list(const char* text, std::vector<in_addr>* out);

}  // namespace softverbs::emu

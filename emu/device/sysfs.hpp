// The sysfs description of emulated devices: the files a kernel RDMA device
// has under /sys/class/infiniband (device attributes, port 1's state, rate,
// LIDs, GIDs and their types and interfaces, P_Keys, device/net/IFNAME) and
// /sys/class/infiniband_verbs, with the values the device itself reports
// (identity.hpp, caps.hpp). The launcher writes them into the program's view
// of /sys/class (tools/sysfs_view.cpp); this only says what they are.
#pragma once

#include <netinet/in.h>

#include <string>
#include <vector>

#include "emu/device/config.hpp"

namespace softverbs::emu {

// One emulated device as the library will create it: its configuration, the
// address it is placed on, its position in the device list (uverbsN) and the
// network interface holding the address ("" if none).
struct ViewDevice {
  DeviceConfig config;
  in_addr addr{};
  int index = 0;
  std::string ifname;
};

struct SysfsNode {
  enum class Kind { kDir, kFile, kLink };
  Kind kind;
  std::string path;  // relative to /sys/class, e.g. "infiniband/emu0/ports/1/state"
  std::string text;  // a file's content (with its newline) or a link's target
};

// Every directory, file and symbolic link, parents before children.
std::vector<SysfsNode> sysfs_nodes(const std::vector<ViewDevice>& devices);

}  // namespace softverbs::emu

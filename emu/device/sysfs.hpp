// The sysfs description of emulated devices: the files a kernel RDMA device
// has under /sys/class/infiniband (device attributes, port 1's state, rate,
// LIDs, GIDs and their types and interfaces, P_Keys, the port and hw counters,
// device/net/IFNAME) and
// /sys/class/infiniband_verbs, with the values the device itself reports
// (identity.hpp, caps.hpp). The launcher writes them into the program's view
// of /sys/class (tools/sysfs_view.cpp); this only says what they are.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <utility>
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

// What a device's ports/1/counters (IBTA PortCounters, as the kernel names
// them) and ports/1/hw_counters (rxe's names) show: packets and bytes where
// they are sent and received, the transport's events where they happen
// (docs/compatibility.md, "Counters"). Zero in a new view: the devices are new.
struct CounterValues {
  uint64_t tx_bytes = 0, rx_bytes = 0;  // IPv4 datagram octets (IP, UDP, BTH .. ICRC)
  uint64_t tx_packets = 0, rx_packets = 0, tx_multicast = 0, rx_multicast = 0;
  uint64_t rx_errors = 0;    // ICRC errors and malformed packets
  uint64_t tx_discards = 0;  // packets the lossless same-host path had to drop
  uint64_t link_downed = 0;  // the port went down
  uint64_t dup_requests = 0, out_of_seq_requests = 0;  // responder
  uint64_t rnr_naks_received = 0, rnr_naks_sent = 0, seq_naks_received = 0;
  uint64_t retry_exceeded = 0, rnr_retry_exceeded = 0, retransmits = 0;
  uint64_t sends_completed = 0, recvs_completed = 0;  // work requests completed successfully
};

// How often (ms) a process rewrites its devices' counter files in a view
// (emu/device/sysfs_counters.cpp); hw_counters/lifespan shows it.
inline constexpr int kCounterRefreshMs = 100;

// The counter files under a device's ports/1 directory ("counters/port_xmit_data",
// "hw_counters/sent_pkts", ...) with their text (no newline).
std::vector<std::pair<std::string, std::string>> counter_files(const CounterValues& v);

}  // namespace softverbs::emu

// The sysfs files of emulated devices (sysfs.hpp). Formats follow the kernel's
// drivers/infiniband/core/sysfs.c as tools parse them: "N: NAME" for states and
// the node type, "0x%x" LIDs, "%d Gb/sec (WIDTH SPEED)" rates, 8-group GIDs.
#include "emu/device/sysfs.hpp"

#include <algorithm>
#include <cstdio>

#include "emu/device/caps.hpp"
#include "emu/device/identity.hpp"
#include "emu/device/personality.hpp"

namespace softverbs::emu {
namespace {

std::string hex(uint32_t v, int width = 0) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", width, v);
  return buf;
}

class Builder {
 public:
  explicit Builder(std::vector<SysfsNode>* out) : out_(out) {}
  void dir(const std::string& path) { out_->push_back({SysfsNode::Kind::kDir, path, {}}); }
  void file(const std::string& path, const std::string& text) {
    out_->push_back({SysfsNode::Kind::kFile, path, text + "\n"});
  }
  void link(const std::string& path, const std::string& target) {
    out_->push_back({SysfsNode::Kind::kLink, path, target});
  }

 private:
  std::vector<SysfsNode>* out_;
};

// The kernel's rate line for an active width and speed (IBTA 14.2.5.6,
// PortInfo LinkWidthActive and LinkSpeedActive): the lanes times the lane's
// nominal rate in Gb/s, with ".5" where it is a half, then "(NX SPEED)". An
// unknown speed reads as SDR, as the kernel does; an unknown width makes the
// kernel's read fail (EINVAL), so the file is left out (empty result).
std::string rate_line(uint8_t width, uint8_t speed) {
  int lanes = 0;
  switch (width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return {};
  }
  // Per-lane rate in tenths of Gb/s.
  const char* name = "SDR";
  int tenths = 25;
  switch (speed) {
    case 2: name = "DDR"; tenths = 50; break;
    case 4: name = "QDR"; tenths = 100; break;
    case 8: name = "FDR10"; tenths = 100; break;
    case 16: name = "FDR"; tenths = 140; break;
    case 32: name = "EDR"; tenths = 250; break;
    case 64: name = "HDR"; tenths = 500; break;
    case 128: name = "NDR"; tenths = 1000; break;
    default: break;
  }
  const int rate = tenths * lanes;
  return std::to_string(rate / 10) + (rate % 10 ? ".5" : "") + " Gb/sec (" + std::to_string(lanes) + "X " +
         name + ")";
}

// ports/1 of a device: what fill_port_attr() reports for an active port.
void port_nodes(Builder& b, const ViewDevice& d, const std::string& port) {
  const bool eth = d.config.link_layer == LinkLayer::kEthernet;
  const Identity id = identity_of(d.addr);
  b.dir(port);
  b.file(port + "/state", "4: ACTIVE");
  b.file(port + "/phys_state", std::to_string(caps::kPhysStateLinkUp) + ": LinkUp");
  // The personality's active width and speed (4X EDR for ConnectX, 1X SDR for rxe).
  if (std::string rate = rate_line(personality().active_width, personality().active_speed); !rate.empty())
    b.file(port + "/rate", rate);
  b.file(port + "/lid", hex(eth ? 0 : id.lid));
  b.file(port + "/sm_lid", hex(eth ? 0 : caps::kSmLid));
  b.file(port + "/sm_sl", "0");
  b.file(port + "/lid_mask_count", "0");
  b.file(port + "/cap_mask", hex(eth ? caps::kPortCapFlagsEth : caps::kPortCapFlagsIb, 8));
  b.file(port + "/link_layer", eth ? "Ethernet" : "InfiniBand");
  b.dir(port + "/gids");
  b.dir(port + "/gid_attrs");
  b.dir(port + "/gid_attrs/types");
  b.dir(port + "/gid_attrs/ndevs");
  // Every slot of the table, as the kernel lists it: unused ones read as zeros;
  // their type and interface files exist but cannot be read (EINVAL) there, so
  // they are left out here.
  for (int i = 0; i < personality().gid_tbl_len; ++i) {
    ibv_gid gid{};
    ibv_gid_type type{};
    const bool used = gid_of(d.config.link_layer, d.addr, static_cast<uint32_t>(i), &gid, &type);
    const std::string n = std::to_string(i);
    b.file(port + "/gids/" + n, gid_str(gid));
    if (!used) continue;
    b.file(port + "/gid_attrs/types/" + n, type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2" : "IB/RoCE v1");
    if (eth && !d.ifname.empty()) b.file(port + "/gid_attrs/ndevs/" + n, d.ifname);
  }
  b.dir(port + "/pkeys");
  const int pkeys = eth ? caps::kPkeyTblLenEth : caps::kPkeyTblLenIb;
  for (int i = 0; i < pkeys; ++i) b.file(port + "/pkeys/" + std::to_string(i), hex(i == 0 ? caps::kDefaultPkey : 0, 4));
  b.dir(port + "/counters");
  b.dir(port + "/hw_counters");
  for (const auto& [file, text] : counter_files(CounterValues{})) b.file(port + "/" + file, text);
}

// IBTA's PortCounters fields are 8, 16 or 32 bits wide and stop at their
// maximum; the data and packet counters are shown 64 bits wide, as the kernel
// shows them from PortCountersExtended.
std::string saturated(uint64_t v, unsigned bits) {
  const uint64_t max = (uint64_t{1} << bits) - 1;
  return std::to_string(v < max ? v : max);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> counter_files(const CounterValues& v) {
  const std::string c = "counters/", h = "hw_counters/";
  const uint64_t tx_unicast = v.tx_packets - std::min(v.tx_packets, v.tx_multicast);
  const uint64_t rx_unicast = v.rx_packets - std::min(v.rx_packets, v.rx_multicast);
  return {
      // The data counters count 4-octet words (IBTA 16.1.3.5).
      {c + "port_xmit_data", std::to_string(v.tx_bytes / 4)},
      {c + "port_rcv_data", std::to_string(v.rx_bytes / 4)},
      {c + "port_xmit_packets", std::to_string(v.tx_packets)},
      {c + "port_rcv_packets", std::to_string(v.rx_packets)},
      {c + "unicast_xmit_packets", std::to_string(tx_unicast)},
      {c + "unicast_rcv_packets", std::to_string(rx_unicast)},
      {c + "multicast_xmit_packets", std::to_string(v.tx_multicast)},
      {c + "multicast_rcv_packets", std::to_string(v.rx_multicast)},
      {c + "port_rcv_errors", saturated(v.rx_errors, 16)},
      {c + "port_xmit_discards", saturated(v.tx_discards, 16)},
      {c + "link_downed", saturated(v.link_downed, 8)},
      // A port with no physical layer, switch or VLs has nothing to count here.
      {c + "symbol_error", "0"},
      {c + "link_error_recovery", "0"},
      {c + "port_rcv_remote_physical_errors", "0"},
      {c + "port_rcv_switch_relay_errors", "0"},
      {c + "port_xmit_constraint_errors", "0"},
      {c + "port_rcv_constraint_errors", "0"},
      {c + "local_link_integrity_errors", "0"},
      {c + "excessive_buffer_overrun_errors", "0"},
      {c + "VL15_dropped", "0"},
      {c + "port_xmit_wait", "0"},
      // rxe's hw counters, with the meaning rxe gives each.
      {h + "sent_pkts", std::to_string(v.tx_packets)},
      {h + "rcvd_pkts", std::to_string(v.rx_packets)},
      {h + "duplicate_request", std::to_string(v.dup_requests)},
      {h + "out_of_seq_request", std::to_string(v.out_of_seq_requests)},
      {h + "rcvd_rnr_err", std::to_string(v.rnr_naks_received)},
      {h + "send_rnr_err", std::to_string(v.rnr_naks_sent)},
      {h + "rcvd_seg_drop", std::to_string(v.seq_naks_received)},
      {h + "ack_deferred", "0"},  // rxe's rescheduled completer: no such thing here
      {h + "retry_exceeded_err", std::to_string(v.retry_exceeded)},
      {h + "retry_rnr_exceeded_err", std::to_string(v.rnr_retry_exceeded)},
      {h + "completer_retry_err", std::to_string(v.retransmits)},
      {h + "send_err", std::to_string(v.tx_discards)},
      {h + "link_downed", std::to_string(v.link_downed)},
      {h + "rdma_sends", std::to_string(v.sends_completed)},
      {h + "rdma_recvs", std::to_string(v.recvs_completed)},
      {h + "lifespan", std::to_string(kCounterRefreshMs)},
  };
}

std::vector<SysfsNode> sysfs_nodes(const std::vector<ViewDevice>& devices) {
  std::vector<SysfsNode> out;
  Builder b(&out);
  b.dir("infiniband");
  b.dir("infiniband_verbs");
  b.file("infiniband_verbs/abi_version", "6");
  for (const ViewDevice& d : devices) {
    const std::string dev = "infiniband/" + d.config.name;
    b.dir(dev);
    for (const char* attr :
         {"node_type", "node_guid", "sys_image_guid", "fw_ver", "hw_rev", "hca_type", "board_id", "node_desc"}) {
      std::string value;
      sysfs_attr_of(d.config.name, d.addr, attr, &value);
      b.file(dev + "/" + attr, value);
    }
    // device/net/IFNAME: how tools map an RDMA device to its network interface.
    b.dir(dev + "/device");
    b.dir(dev + "/device/net");
    if (!d.ifname.empty()) b.link(dev + "/device/net/" + d.ifname, "/sys/class/net/" + d.ifname);
    b.dir(dev + "/ports");
    port_nodes(b, d, dev + "/ports/1");
    const std::string uverbs = "infiniband_verbs/uverbs" + std::to_string(d.index);
    b.dir(uverbs);
    b.file(uverbs + "/ibdev", d.config.name);
    b.file(uverbs + "/abi_version", "1");
  }
  return out;
}

}  // namespace softverbs::emu

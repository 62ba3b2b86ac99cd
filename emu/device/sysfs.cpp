// The sysfs files of emulated devices (sysfs.hpp). Formats follow the kernel's
// drivers/infiniband/core/sysfs.c as tools parse them: "N: NAME" for states and
// the node type, "0x%x" LIDs, "%d Gb/sec (WIDTH SPEED)" rates, 8-group GIDs.
#include "emu/device/sysfs.hpp"

#include <cstdio>

#include "emu/device/caps.hpp"
#include "emu/device/identity.hpp"

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

// ports/1 of a device: what fill_port_attr() reports for an active port.
void port_nodes(Builder& b, const ViewDevice& d, const std::string& port) {
  const bool eth = d.config.link_layer == LinkLayer::kEthernet;
  const Identity id = identity_of(d.addr);
  b.dir(port);
  b.file(port + "/state", "4: ACTIVE");
  b.file(port + "/phys_state", std::to_string(caps::kPhysStateLinkUp) + ": LinkUp");
  // 4X at 25.78125 Gb/s per lane (EDR): the kernel's rate line for caps' width and speed.
  static_assert(caps::kActiveWidth == 2 && caps::kActiveSpeed == 32, "the rate line below names 4X EDR");
  b.file(port + "/rate", "100 Gb/sec (4X EDR)");
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
  for (int i = 0; i < caps::kGidTblLen; ++i) {
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
}

}  // namespace

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

// The emulated device: its attributes and GID table (from identity.hpp), and
// the process's device list, placed on addresses by placement.hpp.
#include <arpa/inet.h>
#include <endian.h>
#include <fcntl.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/device/fault_actions.hpp"
#include "emu/device/identity.hpp"
#include "emu/device/placement.hpp"
#include "emu/device/sysfs_counters.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"
#include "core/env.hpp"
#include "core/log.hpp"
#include "fabric/faulty_link.hpp"
#include "fabric/host_link.hpp"
#include "fabric/outside_link.hpp"
#include "fabric/scheduler.hpp"
#include "fabric/virtual_time.hpp"
#include "fabric/tap_link.hpp"
#include "fabric/topology_link.hpp"
#include "fabric/udp_link.hpp"
#include "faults/process.hpp"
#include "wire/pcap.hpp"

namespace softverbs::emu {

Device::Device(const DeviceConfig& config, int index, in_addr addr, const Clock& clock, Scheduler& scheduler,
               faults::PacketFilter& packets, faults::VerbFilter& verbs)
    : config_(config),
      index_(index),
      addr_(addr),
      clock_(clock),
      scheduler_(scheduler),
      packet_filter_(packets),
      verb_filter_(verbs) {
  handle_.owner = this;
  ibv_device& d = handle_.pub.device;
  d.node_type = IBV_NODE_CA;
  d.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(d.name, sizeof d.name, "%s", config_.name.c_str());
  std::snprintf(d.dev_name, sizeof d.dev_name, "uverbs%d", index);
  std::snprintf(d.dev_path, sizeof d.dev_path, "/sys/class/infiniband_verbs/uverbs%d", index);
  std::snprintf(d.ibdev_path, sizeof d.ibdev_path, "/sys/class/infiniband/%s", config_.name.c_str());
  // ops stays NULL: rdma-core providers (libmlx5, libefa) compare it with their own
  // table and reject the device, which is what they must do with a foreign device.

  // On virtual time the numbers below start from the device's index instead of
  // its address, which the process picks among the free ones at run time: a
  // run then repeats its QP numbers and keys, and so its trace (simulation.md,
  // "Determinism").
  const uint32_t a = fabric::virtual_clock() ? static_cast<uint32_t>(index) + 1 : ntohl(addr.s_addr);
  const Identity id = identity_of(addr);
  std::memcpy(mac_, id.mac, sizeof mac_);
  guid_ = id.guid;
  lid_ = id.lid;
  // Memory keys of different devices differ too (the 8-bit key part starts from
  // the address), so a key used on the wrong side fails as it would on hardware.
  next_mr_key_ = static_cast<uint8_t>(a * 37u + 11u);
  // QP numbers start at a value derived from the address, so that two devices do
  // not hand out the same numbers (a confusion of local and remote QPN shows up).
  next_qpn_ = ((a & 0xffff) << 8) & 0xffffff;
  if (next_qpn_ < 2) next_qpn_ = 2;
}

Device::~Device() = default;

__be64 Device::guid_be() const { return htobe64(guid_); }

void Device::fill_device_attr(ibv_device_attr* attr) const {
  std::memset(attr, 0, sizeof *attr);
  // The active personality (SOFTVERBS_PERSONALITY) gives the values.
  const Personality& p = personality();
  std::snprintf(attr->fw_ver, sizeof attr->fw_ver, "%s", p.fw_ver.c_str());
  attr->node_guid = guid_be();
  attr->sys_image_guid = guid_be();
  attr->max_mr_size = p.max_mr_size;
  attr->page_size_cap = p.page_size_cap;
  attr->vendor_id = p.vendor_id;
  attr->vendor_part_id = config_.vendor_part_id;
  attr->hw_ver = p.hw_ver;
  attr->max_qp = p.max_qp;
  attr->max_qp_wr = p.max_qp_wr;
  attr->device_cap_flags = p.device_cap_flags;
  attr->max_sge = p.max_sge;
  attr->max_sge_rd = p.max_sge_rd;
  attr->max_cq = p.max_cq;
  attr->max_cqe = p.max_cqe;
  attr->max_mr = p.max_mr;
  attr->max_pd = p.max_pd;
  attr->max_qp_rd_atom = p.max_qp_rd_atom;
  attr->max_ee_rd_atom = caps::kMaxEeRdAtom;
  attr->max_res_rd_atom = p.max_res_rd_atom;
  attr->max_qp_init_rd_atom = p.max_qp_init_rd_atom;
  attr->max_ee_init_rd_atom = caps::kMaxEeInitRdAtom;
  attr->atomic_cap = p.atomic_cap;
  attr->max_ee = 0;
  attr->max_rdd = 0;
  attr->max_mw = p.max_mw;
  attr->max_raw_ipv6_qp = 0;
  attr->max_raw_ethy_qp = 0;
  attr->max_mcast_grp = p.max_mcast_grp;
  attr->max_mcast_qp_attach = p.max_mcast_qp_attach;
  attr->max_total_mcast_qp_attach = p.max_total_mcast_qp_attach;
  attr->max_ah = p.max_ah;
  attr->max_fmr = 0;
  attr->max_map_per_fmr = 0;
  attr->max_srq = p.max_srq;
  attr->max_srq_wr = p.max_srq_wr;
  attr->max_srq_sge = p.max_srq_sge;
  attr->max_pkeys = p.max_pkeys ? p.max_pkeys : pkey_tbl_len();
  attr->local_ca_ack_delay = p.local_ca_ack_delay;
  attr->phys_port_cnt = caps::kPhysPortCnt;
}

uint16_t Device::pkey_tbl_len() const {
  return config_.link_layer == LinkLayer::kEthernet ? caps::kPkeyTblLenEth : caps::kPkeyTblLenIb;
}

void Device::fill_port_attr(ibv_port_attr* attr) const {
  std::memset(attr, 0, sizeof *attr);
  const bool eth = config_.link_layer == LinkLayer::kEthernet;
  const Personality& p = personality();
  // A port taken down by the fault layer looks like a lost link (polling); a
  // failed device's port is disabled.
  attr->state = port_active() ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  attr->max_mtu = p.max_mtu;
  attr->active_mtu = config_.active_mtu;
  attr->gid_tbl_len = p.gid_tbl_len;
  attr->port_cap_flags = eth ? caps::kPortCapFlagsEth : caps::kPortCapFlagsIb;
  attr->max_msg_sz = p.max_msg_sz;
  attr->pkey_tbl_len = pkey_tbl_len();
  attr->lid = eth ? 0 : lid_;
  attr->sm_lid = eth ? 0 : caps::kSmLid;
  attr->lmc = 0;
  attr->max_vl_num = p.max_vl_num;
  attr->sm_sl = 0;
  attr->subnet_timeout = eth ? 0 : caps::kSubnetTimeout;
  attr->active_width = p.active_width;
  attr->active_speed = p.active_speed;
  attr->phys_state = port_active() ? caps::kPhysStateLinkUp
                     : fatal()     ? caps::kPhysStateDisabled
                                   : caps::kPhysStatePolling;
  attr->link_layer = eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
}

int Device::gid_count() const { return emu::gid_count(config_.link_layer); }

bool Device::gid_entry(uint32_t index, ibv_gid_entry* entry) const {
  std::memset(entry, 0, sizeof *entry);
  ibv_gid_type type{};
  if (!gid_of(config_.link_layer, addr_, index, &entry->gid, &type)) return false;
  entry->gid_index = index;
  entry->port_num = 1;
  entry->gid_type = type;
  entry->ndev_ifindex = config_.link_layer == LinkLayer::kEthernet ? 1 : 0;  // the loopback interface
  return true;
}

bool Device::sysfs_attr(const std::string& attr, std::string* value) const {
  return sysfs_attr_of(config_.name, addr_, attr, value);
}

uint32_t Device::register_qp(Qp* qp) {
  std::lock_guard lock(mu_);
  for (;;) {
    uint32_t qpn = next_qpn_;
    next_qpn_ = (next_qpn_ + 1) & 0xffffff;
    if (next_qpn_ < 2) next_qpn_ = 2;  // QP0 and QP1 are the special QPs
    if (qpn >= 2 && !qps_.count(qpn)) {
      QpSlot& slot = qp_table_.get(qpn);  // may throw: nothing registered then
      qps_[qpn] = qp;
      slot.qp.store(qp, std::memory_order_release);
      return qpn;
    }
  }
}

void Device::unregister_qp(uint32_t qpn) {
  QpSlot* slot = nullptr;
  {
    std::lock_guard lock(mu_);
    qps_.erase(qpn);
    slot = qp_table_.find(qpn);
    if (slot) slot->qp.store(nullptr, std::memory_order_seq_cst);  // against QpPin's pin, then load
  }
  // The threads that pinned the QP before it left the table (receive_direct)
  // finish with it; they never wait for anything a destroying thread holds.
  if (slot)
    while (slot->pins.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
  // Taking the receive lock waits for a packet being handed to the QP.
  std::lock_guard rx(rx_mu_);
}

Qp* Device::find_qp(uint32_t qpn) {
  const QpSlot* slot = qp_table_.find(qpn & 0xffffff);
  return slot ? slot->qp.load(std::memory_order_acquire) : nullptr;
}

uint32_t Device::register_mr(Mr* mr) {
  std::lock_guard lock(mu_);
  // A key is a 24-bit index and an 8-bit variant that changes on every use of the
  // index, so a stale key from a deregistered region does not match a new one.
  // Indexes are handed out round robin; max_mr + max_mw keep at least a quarter
  // of the index space free (caps.hpp), so the search is short on average.
  for (;;) {
    uint32_t index = next_mr_index_;
    next_mr_index_ = (next_mr_index_ + 1) & 0xffffff;
    if (next_mr_index_ == 0) next_mr_index_ = 1;
    if (index_taken(index)) continue;
    PtrSlot<Mr>& slot = mrs_.get(index);  // may throw: nothing registered then
    const uint32_t key = (index << 8) | next_mr_key_;
    ++next_mr_key_;
    mr->key = key;
    slot.ptr.store(mr, std::memory_order_release);  // with its key
    return key;
  }
}

bool Device::index_taken(uint32_t index) const {
  const PtrSlot<Mr>* r = mrs_.find(index);
  const PtrSlot<Mw>* w = mws_.find(index);
  return (r && r->ptr.load(std::memory_order_relaxed)) || (w && w->ptr.load(std::memory_order_relaxed));
}

Mr* Device::find_mr_locked(uint32_t key) {
  // No lock of the table: the caller's mr_lock() keeps the region from being
  // deregistered (deregister_mr takes it exclusively).
  const PtrSlot<Mr>* slot = mrs_.find(key >> 8);
  Mr* mr = slot ? slot->ptr.load(std::memory_order_acquire) : nullptr;
  return mr && mr->key == key ? mr : nullptr;
}

int Device::deregister_mr(Mr* mr) {
  std::unique_lock mr_lock(mr_mu_);  // waits for transfers using the region
  if (mr->bound_windows) return EINVAL;
  std::lock_guard lock(mu_);
  if (PtrSlot<Mr>* slot = mrs_.find(mr->key >> 8)) slot->ptr.store(nullptr, std::memory_order_release);
  return 0;
}

uint32_t Device::register_mw(Mw* mw) {
  std::lock_guard lock(mu_);
  // The same index sequence as the regions', skipping any index a region or a
  // window already uses. max_mw is counted by the window's Charge.
  for (;;) {
    uint32_t index = next_mr_index_;
    next_mr_index_ = (next_mr_index_ + 1) & 0xffffff;
    if (next_mr_index_ == 0) next_mr_index_ = 1;
    if (index_taken(index)) continue;
    mws_.get(index).ptr.store(mw, std::memory_order_release);  // get may throw: nothing registered then
    return index;
  }
}

void Device::unregister_mw(uint32_t index) {
  std::lock_guard lock(mu_);
  if (PtrSlot<Mw>* slot = mws_.find(index & 0xffffff)) slot->ptr.store(nullptr, std::memory_order_release);
}

Mw* Device::find_mw_locked(uint32_t rkey) {
  const PtrSlot<Mw>* slot = mws_.find(rkey >> 8);
  return slot ? slot->ptr.load(std::memory_order_acquire) : nullptr;
}

// ---- object counts ---------------------------------------------------------

int Device::limit_of(ObjectType type) noexcept {
  switch (type) {
    case ObjectType::pd: return personality().max_pd;
    case ObjectType::mr: return personality().max_mr;
    case ObjectType::cq: return personality().max_cq;
    case ObjectType::srq: return personality().max_srq;
    case ObjectType::qp: return personality().max_qp;
    case ObjectType::ah: return personality().max_ah;
    case ObjectType::mw: return personality().max_mw;
    case ObjectType::dm:    // bounded by max_dm_size instead
    case ObjectType::xrcd:  // no attribute of ibv_device_attr
      break;
  }
  return INT_MAX;
}

Charge Device::charge(ObjectType type) {
  std::atomic<int>& n = live_[static_cast<size_t>(type)];
  const int limit = limit_of(type);
  int cur = n.load(std::memory_order_relaxed);
  do {
    if (cur >= limit) return Charge{};
  } while (!n.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed));
  return Charge(this, type);
}

void Device::discharge(ObjectType type) noexcept {
  live_[static_cast<size_t>(type)].fetch_sub(1, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------

DeviceRegistry& DeviceRegistry::instance() {
  static DeviceRegistry* registry = new DeviceRegistry;  // lives until exit, like the devices
  return *registry;
}

namespace {

void log_counters_at_exit() {
  for (Device* d : DeviceRegistry::instance().devices()) {
    const Device::Counters& c = d->counters();
    SV_LOG(kInfo,
           "device %s: tx %lu rx %lu icrc_err %lu malformed %lu unknown_qp %lu dropped %lu retransmits %lu "
           "timeouts %lu naks_sent %lu naks_rcvd %lu rnr_sent %lu rnr_rcvd %lu duplicates %lu host_drops %lu "
           "topology_loss %lu topology_mtu %lu",
           d->name().c_str(), c.tx_packets.load(), c.rx_packets(), c.rx_icrc_errors.load(), c.rx_malformed.load(),
           c.rx_unknown_qp.load(), c.rx_dropped.load(), c.retransmits.load(), c.timeouts.load(), c.naks_sent.load(),
           c.naks_received.load(), c.rnr_naks_sent.load(), c.rnr_naks_received.load(), c.duplicates.load(),
           c.host_drops.load(), c.topology_loss_drops.load(), c.topology_mtu_drops.load());
  }
}

// Headers a RoCEv2 packet adds to its payload: IPv4 20, UDP 8, BTH 12, the
// largest extension header run and the ICRC. The kernel's rxe reserves 80 bytes,
// and so does this, so both pick the same path MTU on the same interface.
constexpr int kRoceHeaderReserve = 80;

// The largest IB MTU, up to `wanted`, whose packets fit the MTU of the network
// interface that holds addr (loopback: 65536, so any; a 1500-byte Ethernet: 1024),
// as a RoCE device's active MTU follows its netdev's.
ibv_mtu mtu_for_interface_of(in_addr addr, ibv_mtu wanted, const std::string& name) {
  const std::string ifname = interface_of(addr);
  if (ifname.empty()) return wanted;
  int if_mtu = 0;
  const int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s >= 0) {
    ifreq req{};
    std::strncpy(req.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
    if (::ioctl(s, SIOCGIFMTU, &req) == 0) if_mtu = req.ifr_mtu;
    ::close(s);
  }
  if (if_mtu <= 0) return wanted;
  ibv_mtu fit = wanted;
  while (fit > IBV_MTU_256 && (128 << fit) + kRoceHeaderReserve > if_mtu) fit = static_cast<ibv_mtu>(fit - 1);
  if (fit != wanted)
    SV_LOG(kInfo, "device %s: active MTU %d, the largest that fits the interface's MTU of %d", name.c_str(), 128 << fit,
           if_mtu);
  return fit;
}

}  // namespace

const std::vector<Device*>& DeviceRegistry::devices() {
  std::call_once(once_, [this] {
    if (log_enabled(LogLevel::kInfo)) std::atexit(log_counters_at_exit);
    // The devices consult the process's fault engine and carry out its timed
    // rules (docs/faults.md).
    faults::FaultEngine& engine = faults::process_engine();
    auto config = config_from_env(&error_);
    if (!config) {
      SV_LOG(kError, "%s; no emulated devices", error_.c_str());
      return;
    }
    // The engine's time (SOFTVERBS_CLOCK): real time (the process's progress
    // thread and the system clocks) or virtual time. The sockets to other
    // processes are watched by the progress thread in either case.
    Scheduler& scheduler = fabric::process_scheduler();
    fabric::RealTimeScheduler& sockets = fabric::RealTimeScheduler::instance();
    // SOFTVERBS_AUTO_ADDRS: the automatic addresses the launcher described in
    // the program's sysfs view, tried first.
    std::vector<in_addr> preferred;
    if (!parse_addr_list(env::auto_addrs(), &preferred))
      SV_LOG(kWarn, "SOFTVERBS_AUTO_ADDRS=%s: expected IPv4 addresses separated by commas; ignored",
             env::auto_addrs());
    std::vector<std::string> errors;
    std::vector<Placed> placed =
        place_devices(*config, static_cast<uint32_t>(::getpid()), preferred, bind_roce_endpoint, &errors);
    for (const std::string& e : errors) SV_LOG(kError, "%s", e.c_str());
    // The simulated fabric's links join the devices' chains (connect()).
    if (config->topology) sim_fabric_ = std::make_unique<fabric::SimFabric>(std::move(*config->topology));
    int index = 0;
    for (const Placed& p : placed) {
      const DeviceConfig& dc = p.config;
      const in_addr addr = p.addr;
      const int fd = p.fd;
      SV_LOG(kInfo, "device %s: %s:%u (%s)", dc.name.c_str(), addr_str(addr).c_str(), kRoceV2Port,
             dc.link_layer == LinkLayer::kEthernet ? "RoCEv2" : "InfiniBand link layer");
      DeviceConfig fitted = dc;
      fitted.active_mtu = mtu_for_interface_of(addr, dc.active_mtu, dc.name);
      owned_.push_back(std::make_unique<Device>(fitted, index++, addr, scheduler.clock(), scheduler, engine, engine));
      connect(*owned_.back(), fd, sockets);
      devices_.push_back(owned_.back().get());
    }
    if (!devices_.empty()) engine.add_actor([this](const faults::FaultDecision& d) { apply_timed_fault(devices_, d); });
    // A sysfs view describing these devices gets current counter files.
    refresh_view_counters(devices_, scheduler);
  });
  return devices_;
}

// The device's way to the network, outermost first: the packet-fault layer,
// the tap (counters, capture), the queue to devices of this process, the
// lossless path to devices of other processes of this host, the UDP socket.
void DeviceRegistry::connect(Device& dev, int udp_fd, fabric::RealTimeScheduler& scheduler) {
  auto udp = std::make_unique<fabric::UdpLink>(scheduler, udp_fd, dev.name());
  const fabric::HostLinkOptions& host_options = fabric::host_link_options();
  int host_fd = -1;
  if (host_options.enabled) {
    // The UDP bind already claimed the address, so its name is free unless
    // something other than a device holds it; the device then uses UDP only.
    host_fd = fabric::HostLink::bind(dev.addr());
    if (host_fd < 0)
      SV_LOG(kWarn, "device %s: no lossless same-host path (%s); UDP only", dev.name().c_str(),
             std::strerror(-host_fd));
  }
  auto host = std::make_unique<fabric::HostLink>(*udp, scheduler, host_fd, dev.addr(), dev.counters(), host_options,
                                                 dev.name());
  // Under virtual time the packets that leave or enter the process pace the
  // clock (fabric/outside_link.hpp).
  std::unique_ptr<fabric::OutsideLink> outside;
  fabric::Link* beyond = host.get();
  if (fabric::virtual_clock()) {
    outside = std::make_unique<fabric::OutsideLink>(*host, fabric::VirtualScheduler::instance());
    beyond = outside.get();
  }
  // Under virtual time every in-process packet is a step of the virtual
  // scheduler, so none goes without bytes (fabric::Link::send_direct).
  auto local = std::make_unique<fabric::LocalLink>(hub_, dev.addr(), dev.scheduler(), beyond, !fabric::virtual_clock());
  // With SOFTVERBS_TOPOLOGY, packets to the other nodes cross its links
  // (fabric/topology_link.hpp), below the fault layer and the tap.
  std::unique_ptr<fabric::TopologyLink> topo;
  fabric::Link* below_tap = local.get();
  if (sim_fabric_) {
    // Every device is a node: config_from_env() checked the names.
    const size_t node = *sim_fabric_->topology().index_of(dev.name());
    sim_fabric_->add_node(node, dev.addr());
    topo = std::make_unique<fabric::TopologyLink>(*local, *sim_fabric_, node, dev.scheduler(), dev.counters());
    below_tap = topo.get();
  }
  auto tap = std::make_unique<fabric::TapLink>(*below_tap, dev.addr(), dev.counters(), dev.clock(),
                                               wire::PcapWriter::instance(), &hub_);
  auto faulty = std::make_unique<fabric::FaultyLink>(*tap, dev.packet_filter(), dev.scheduler(),
                                                     dev.counters(), dev.name());
  dev.connect(*faulty);
  links_.push_back(std::move(udp));
  links_.push_back(std::move(host));
  if (outside) links_.push_back(std::move(outside));
  links_.push_back(std::move(local));
  if (topo) links_.push_back(std::move(topo));
  links_.push_back(std::move(tap));
  links_.push_back(std::move(faulty));
}

Device* DeviceRegistry::find_by_addr(in_addr addr) {
  for (Device* d : devices())
    if (d->addr().s_addr == addr.s_addr) return d;
  return nullptr;
}

Device* DeviceRegistry::find(ibv_device* dev) {
  for (Device* d : devices())
    if (d->ibv() == dev) return d;
  return nullptr;
}

}  // namespace softverbs::emu

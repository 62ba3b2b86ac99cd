// Multicast on a device: the groups its QPs are attached to
// (ibv_attach_mcast/ibv_detach_mcast), the announcement of its membership to
// the host, and the delivery of a multicast packet to the attached QPs.
//
// The kernel's rules are kept: uverbs lists a QP's attachments by (GID, LID),
// so a repeated attach succeeds and a detach of a pair not attached is EINVAL;
// the limits of caps.hpp give ENOMEM, as mlx5 does when its tables are full.
// How a multicast packet reaches the member devices: docs/wire.md §1.6.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"

namespace softverbs::emu {
namespace {

fabric::McastGid key_of(const ibv_gid& gid) {
  fabric::McastGid g;
  std::memcpy(g.data(), gid.raw, g.size());
  return g;
}

// An IPv4 group's address, if the GID is IPv4-mapped (::ffff:a.b.c.d).
bool ipv4_group(const fabric::McastGid& g, in_addr* out) {
  static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(g.data(), v4mapped, 12) != 0) return false;
  std::memcpy(&out->s_addr, g.data() + 12, 4);
  return true;
}

// How many groups a device remembers having left. Datagrams sent to it as a
// member arrive after its leave only while they are in flight or in its socket
// buffer, so a few of the latest groups are enough.
constexpr size_t kLeftGroupsKept = 16;

}  // namespace

int Device::attach_mcast(uint32_t qpn, const ibv_gid& gid, uint16_t lid) {
  const fabric::McastGid key = key_of(gid);
  std::lock_guard lock(mcast_mu_);
  auto it = mcast_.find(key);
  if (it != mcast_.end()) {
    auto& a = it->second.attached;
    if (std::find(a.begin(), a.end(), std::make_pair(qpn, lid)) != a.end()) return 0;
    if (a.size() >= static_cast<size_t>(personality().max_mcast_qp_attach)) return ENOMEM;
  } else if (mcast_.size() >= static_cast<size_t>(personality().max_mcast_grp)) {
    return ENOMEM;
  }
  if (mcast_attachments_ >= static_cast<size_t>(personality().max_total_mcast_qp_attach)) return ENOMEM;
  McastGroup& g = mcast_[key];
  in_addr v4;
  if (g.attached.empty() && ipv4_group(key, &v4))
    std::erase_if(left_groups_, [&](in_addr a) { return a.s_addr == v4.s_addr; });
  if (!g.membership) g.membership = std::make_unique<fabric::McastMembership>(key, addr_);
  g.attached.emplace_back(qpn, lid);
  ++mcast_attachments_;
  return 0;
}

int Device::detach_mcast(uint32_t qpn, const ibv_gid& gid, uint16_t lid) {
  std::lock_guard lock(mcast_mu_);
  auto it = mcast_.find(key_of(gid));
  if (it == mcast_.end()) return EINVAL;
  auto& a = it->second.attached;
  auto at = std::find(a.begin(), a.end(), std::make_pair(qpn, lid));
  if (at == a.end()) return EINVAL;
  a.erase(at);
  --mcast_attachments_;
  // The last QP gone, the device leaves the group: its name disappears.
  if (a.empty()) {
    in_addr v4;
    if (ipv4_group(it->first, &v4)) {
      left_groups_.push_back(v4);
      if (left_groups_.size() > kLeftGroupsKept) left_groups_.pop_front();
    }
    mcast_.erase(it);
  }
  return 0;
}

bool Device::mcast_attached(uint32_t qpn) {
  std::lock_guard lock(mcast_mu_);
  for (const auto& [gid, g] : mcast_)
    for (const auto& [q, lid] : g.attached)
      if (q == qpn) return true;
  return false;
}

wire::ParseError Device::admit_mcast(std::span<const uint8_t> packet, wire::Ipv4Flow flow, wire::PacketView& view) {
  // The sender computed the ICRC over the IP header it would put on the wire,
  // whose destination is the group (RoCEv2: the IP header replaces the GRH); a
  // UDP socket does not show that header, so the group is found by the ICRC.
  if (packet.size() < wire::Bth::kSize) return wire::ParseError::icrc_mismatch;
  const uint32_t dest_qp = (uint32_t{packet[5]} << 16) | (uint32_t{packet[6]} << 8) | packet[7];
  if (dest_qp != wire::kMulticastQpn) return wire::ParseError::icrc_mismatch;
  // The groups left lately are tried too: a datagram the device was sent as a
  // member that arrives after it left is not corrupted. It then finds no group
  // in deliver_mcast(), which counts it with the packets for a QP the device
  // does not have (rx_unknown_qp), not as an ICRC error.
  std::vector<in_addr> groups;
  {
    std::lock_guard lock(mcast_mu_);
    for (const auto& [gid, g] : mcast_) {
      in_addr a;
      if (ipv4_group(gid, &a)) groups.push_back(a);
    }
    groups.insert(groups.end(), left_groups_.rbegin(), left_groups_.rend());
  }
  for (in_addr group : groups) {
    std::memcpy(flow.daddr.data(), &group.s_addr, 4);
    wire::ParseError err = wire::parse(packet, view, wire::IcrcFlow{flow});
    if (err == wire::ParseError::icrc_mismatch) continue;
    rx_group_ = group;
    return err;
  }
  return wire::ParseError::icrc_mismatch;
}

void Device::deliver_mcast(in_addr src, const wire::PacketView& pkt) {
  std::vector<uint32_t> qpns;
  if (rx_group_.s_addr != 0) {
    std::lock_guard lock(mcast_mu_);
    auto it = mcast_.find(fabric::mcast_gid_of(rx_group_));
    if (it != mcast_.end())
      for (const auto& [qpn, lid] : it->second.attached)
        if (std::find(qpns.begin(), qpns.end(), qpn) == qpns.end()) qpns.push_back(qpn);
  }
  if (qpns.empty()) {
    counters_.rx_unknown_qp.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Every attached QP gets the packet, the sending QP too if it is attached
  // (multicast loopback, as mlx5 and rxe do), unless that QP was created with
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: then it alone is skipped, and the other
  // QPs of this device, of its contexts or not, still get the datagram. That
  // is the kernel's definition of the flag (IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK:
  // sends from the QP are not looped back to its own receive queue; mlx4 marks
  // the QP's own entry of the group, mlx5 sets block_lb_mc in the QP's context).
  // The sender is this device (same address) and the DETH's source QP.
  // Under the receive lock a found QP cannot be destroyed meanwhile.
  const bool from_self = src.s_addr == addr_.s_addr;
  for (uint32_t qpn : qpns) {
    Qp* qp = find_qp(qpn);
    if (!qp) continue;
    if (from_self && qp->blocks_self_mcast() && pkt.deth.src_qp == qpn) continue;
    qp->receive(pkt, src, rx_group_);
  }
}

}  // namespace softverbs::emu

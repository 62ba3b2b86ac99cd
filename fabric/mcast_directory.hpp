// Host-wide multicast membership: which devices of this host (in any process)
// have a QP attached to a group, so that a sender can hand one copy of a
// multicast packet to each of them (docs/wire.md §1.6).
//
// A device that has a QP attached to a group holds an abstract AF_UNIX socket
// named "softverbs/mcast/<group GID>/<device address>". Abstract names need no
// file system and no privileges, are listed in /proc/net/unix for every process
// of the network namespace to read, and vanish when the socket is closed or its
// process ends, so a member that crashes leaves no stale entry. Nothing is ever
// sent to these sockets: the name is the membership.
#pragma once

#include <netinet/in.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace softverbs::fabric {

using McastGid = std::array<uint8_t, 16>;

// The IPv4-mapped GID (::ffff:a.b.c.d) of an IPv4 group address.
McastGid mcast_gid_of(in_addr group);
// "softverbs/mcast/<GID in IPv6 text>/<device address>" (without the leading NUL).
std::string mcast_name(const McastGid& group, in_addr device);

// One device's announced membership of one group, for as long as it lives.
class McastMembership {
 public:
  McastMembership(const McastGid& group, in_addr device);
  ~McastMembership();
  McastMembership(const McastMembership&) = delete;
  McastMembership& operator=(const McastMembership&) = delete;
  // False if the name could not be bound (another process announces the same
  // device address: then that name already makes the address a member).
  bool announced() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// The addresses of the devices of this host that are members of the group,
// each once, read from /proc/net/unix at the call.
std::vector<in_addr> mcast_members(const McastGid& group);

}  // namespace softverbs::fabric

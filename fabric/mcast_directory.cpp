// The multicast membership directory: abstract AF_UNIX names as announcements,
// /proc/net/unix as the list (fabric/mcast_directory.hpp).
#include "fabric/mcast_directory.hpp"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>

#include "core/log.hpp"

namespace softverbs::fabric {
namespace {

constexpr char kPrefix[] = "softverbs/mcast/";

std::string group_text(const McastGid& group) {
  char buf[INET6_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET6, group.data(), buf, sizeof buf);
  return buf;
}

}  // namespace

McastGid mcast_gid_of(in_addr group) {
  McastGid g{};
  g[10] = g[11] = 0xff;
  std::memcpy(g.data() + 12, &group.s_addr, 4);
  return g;
}

std::string mcast_name(const McastGid& group, in_addr device) {
  char dev[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &device, dev, sizeof dev);
  return std::string(kPrefix) + group_text(group) + "/" + dev;
}

McastMembership::McastMembership(const McastGid& group, in_addr device) {
  const std::string name = mcast_name(group, device);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  // Abstract namespace: sun_path starts with a NUL and the length says where
  // the name ends (no terminating NUL), which is how /proc/net/unix shows it
  // ("@" then the name).
  if (name.size() + 1 > sizeof sa.sun_path) return;
  std::memcpy(sa.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), len) < 0) {
    SV_LOG(kDebug, "multicast: cannot announce %s: %s", name.c_str(), std::strerror(errno));
    ::close(fd);
    return;
  }
  fd_ = fd;
}

McastMembership::~McastMembership() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<in_addr> mcast_members(const McastGid& group) {
  // Each line of /proc/net/unix ends with the socket's path, an abstract one
  // as "@name"; names contain no spaces, so the last field is the path.
  const std::string want = "@" + std::string(kPrefix) + group_text(group) + "/";
  std::vector<in_addr> out;
  std::ifstream in("/proc/net/unix");
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.rfind(' ');
    if (at == std::string::npos || line.compare(at + 1, want.size(), want) != 0) continue;
    in_addr a{};
    if (::inet_pton(AF_INET, line.c_str() + at + 1 + want.size(), &a) != 1) continue;
    if (std::none_of(out.begin(), out.end(), [&](in_addr b) { return b.s_addr == a.s_addr; })) out.push_back(a);
  }
  return out;
}

}  // namespace softverbs::fabric

// The launcher's sysfs view (sysfs_view.hpp): placing the devices as the
// library will, and mounting their description over /sys/class in a mount
// namespace private to the program.
#include "tools/sysfs_view.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "emu/device/identity.hpp"
#include "emu/device/placement.hpp"
#include "tools/launcher_env.hpp"

namespace softverbs::tools {
namespace {

constexpr const char* kClass = "/sys/class";

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// The entries of a directory (no "." and ".."), and for symbolic links their targets.
std::vector<std::pair<std::string, std::string>> entries_of(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    char target[4096];
    ssize_t n = ::readlink((dir + "/" + name).c_str(), target, sizeof target - 1);
    out.emplace_back(name, n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string());
  }
  ::closedir(d);
  return out;
}

bool write_text(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

// A mount namespace of our own. Root (or a holder of CAP_SYS_ADMIN) needs
// nothing else, and keeps its identity and capabilities; anyone else gets a
// user namespace too, in which its uid and gid map to themselves, so the
// program sees its own ids and, after exec, holds no capability.
bool unshare_mounts(std::string* error) {
  if (test_no_unshare()) {
    errno = EPERM;
    *error = errno_text("unshare (SOFTVERBS_TEST_NO_UNSHARE)");
    return false;
  }
  if (::geteuid() == 0 && ::unshare(CLONE_NEWNS) == 0) return true;
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    *error = errno_text("unshare(CLONE_NEWUSER | CLONE_NEWNS)");
    return false;
  }
  // An unprivileged process may map only its own ids, and its gid only after
  // giving up setgroups (user_namespaces(7)).
  const std::string uid_line = std::to_string(uid) + " " + std::to_string(uid) + " 1\n";
  const std::string gid_line = std::to_string(gid) + " " + std::to_string(gid) + " 1\n";
  if (!write_text("/proc/self/uid_map", uid_line) || !write_text("/proc/self/setgroups", "deny") ||
      !write_text("/proc/self/gid_map", gid_line)) {
    *error = errno_text("mapping the user and group ids");
    return false;
  }
  return true;
}

// The port counter directories stay writable under the read-only view: each is
// a small tmpfs of its own, refilled with its files, which the library rewrites
// while the program runs (emu/device/sysfs_counters.cpp).
bool mount_counter_dirs(const std::vector<emu::SysfsNode>& nodes, std::string* error) {
  for (const emu::SysfsNode& d : nodes) {
    if (d.kind != emu::SysfsNode::Kind::kDir) continue;
    if (!d.path.ends_with("/counters") && !d.path.ends_with("/hw_counters")) continue;
    const std::string at = std::string(kClass) + "/" + d.path;
    if (::mount("softverbs", at.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") != 0) {
      *error = errno_text("mount tmpfs on " + at);
      return false;
    }
    std::vector<emu::SysfsNode> files;
    for (const emu::SysfsNode& f : nodes)
      if (f.kind == emu::SysfsNode::Kind::kFile && f.path.starts_with(d.path + "/")) files.push_back(f);
    if (!write_nodes(kClass, files, error)) return false;
  }
  return true;
}

// Mounts the tmpfs over /sys/class and fills it: the real classes bound back
// (through a descriptor of the real directory, which the tmpfs hides), the
// real RDMA devices' links kept, and the nodes.
bool mount_view(const std::vector<emu::SysfsNode>& nodes, std::string* error) {
  const auto classes = entries_of(kClass);
  const auto real_ib = entries_of(std::string(kClass) + "/infiniband");
  const auto real_verbs = entries_of(std::string(kClass) + "/infiniband_verbs");
  int real = ::open(kClass, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (real < 0) {
    *error = errno_text(std::string("open ") + kClass);
    return false;
  }
  if (::mount("softverbs", kClass, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755") != 0) {
    *error = errno_text(std::string("mount tmpfs on ") + kClass);
    ::close(real);
    return false;
  }
  bool ok = true;
  const std::string via = "/proc/self/fd/" + std::to_string(real) + "/";
  for (const auto& [name, target] : classes) {
    if (name == "infiniband" || name == "infiniband_verbs") continue;  // written below
    const std::string at = std::string(kClass) + "/" + name;
    if (!target.empty()) {
      ok = ::symlink(target.c_str(), at.c_str()) == 0;
    } else {
      ok = ::mkdir(at.c_str(), 0755) == 0 && ::mount((via + name).c_str(), at.c_str(), nullptr, MS_BIND | MS_REC,
                                                     nullptr) == 0;
    }
    if (!ok) {
      *error = errno_text("bind " + std::string(kClass) + "/" + name);
      break;
    }
  }
  ::close(real);
  if (ok) ok = write_nodes(kClass, nodes, error);
  // Real RDMA devices (a kernel driver's) stay listed beside the emulated ones;
  // on a name both use, the emulated device is the one described.
  std::set<std::string> taken;
  for (const emu::SysfsNode& n : nodes) taken.insert(n.path);
  for (const auto& [dir, list] : {std::pair{std::string("infiniband"), real_ib},
                                  std::pair{std::string("infiniband_verbs"), real_verbs}})
    for (const auto& [name, target] : list)
      if (ok && !target.empty() && !taken.count(dir + "/" + name))
        ::symlink(target.c_str(), (std::string(kClass) + "/" + dir + "/" + name).c_str());
  if (ok) ok = mount_counter_dirs(nodes, error);
  if (ok && ::mount(nullptr, kClass, nullptr, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
    *error = errno_text("remount read-only");
    ok = false;
  }
  if (!ok) ::umount2(kClass, MNT_DETACH);  // back to the real /sys/class
  return ok;
}

}  // namespace

std::vector<emu::ViewDevice> plan_view(const emu::Config& config, uint32_t pid, std::string* auto_addrs) {
  std::vector<std::string> errors;  // the library reports them itself
  const std::vector<emu::Placed> placed = emu::place_devices(config, pid, {}, emu::bind_roce_endpoint, &errors);
  std::vector<emu::ViewDevice> out;
  auto_addrs->clear();
  for (const emu::DeviceConfig& dc : config.devices) {
    const emu::Placed* p = nullptr;
    for (const emu::Placed& q : placed)
      if (q.config.name == dc.name) p = &q;
    if (!dc.addr) {
      if (!auto_addrs->empty()) *auto_addrs += ",";
      *auto_addrs += p ? emu::addr_str(p->addr) : "0.0.0.0";
    }
    if (!p) continue;
    out.push_back({p->config, p->addr, static_cast<int>(out.size()), emu::interface_of(p->addr)});
  }
  for (const emu::Placed& p : placed) ::close(p.fd);
  return out;
}

bool write_nodes(const std::string& root, const std::vector<emu::SysfsNode>& nodes, std::string* error) {
  for (const emu::SysfsNode& n : nodes) {
    const std::string path = root + "/" + n.path;
    bool ok = true;
    switch (n.kind) {
      case emu::SysfsNode::Kind::kDir:
        ok = ::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST;
        break;
      case emu::SysfsNode::Kind::kLink:
        ok = ::symlink(n.text.c_str(), path.c_str()) == 0;
        break;
      case emu::SysfsNode::Kind::kFile: {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out << n.text;
        ok = static_cast<bool>(out);
        if (!ok) errno = EIO;
        break;
      }
    }
    if (!ok) {
      *error = errno_text("write " + path);
      return false;
    }
  }
  return true;
}

bool enter_view(const std::vector<emu::SysfsNode>& nodes, std::string* error) {
  if (!unshare_mounts(error)) return false;
  // Mounts made here must not reach the caller's namespace (a shared root
  // would carry them back): receive, never send.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) {
    *error = errno_text("mount --make-rslave /");
    return false;
  }
  return mount_view(nodes, error);
}

}  // namespace softverbs::tools

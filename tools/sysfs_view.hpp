// The sysfs view of `softverbs run` (docs/configuration.md, "The sysfs view"):
// the program runs in a mount namespace of its own whose /sys/class is a tmpfs
// holding every real class (bind mounts) plus infiniband/ and
// infiniband_verbs/ describing the emulated devices the library will create,
// so programs that read sysfs themselves find them. No root needed: an
// unprivileged caller gets a user namespace that maps its own uid and gid.
#pragma once

#include <netinet/in.h>

#include <string>
#include <vector>

#include "emu/device/config.hpp"
#include "emu/device/sysfs.hpp"

namespace softverbs::tools {

// The devices the library will create from `config` in process `pid`, placed
// as it places them (emu/device/placement.hpp; the sockets are closed again),
// and in *auto_addrs the value for SOFTVERBS_AUTO_ADDRS: the automatic
// addresses found, in order ("0.0.0.0" for a device that found none).
std::vector<emu::ViewDevice> plan_view(const emu::Config& config, uint32_t pid, std::string* auto_addrs);

// Writes `nodes` under `root` (a directory that exists). False with *error set
// on the first failure.
bool write_nodes(const std::string& root, const std::vector<emu::SysfsNode>& nodes, std::string* error);

// Enters a mount namespace (and a user namespace when not privileged) and
// mounts the view over /sys/class. False, with *error saying which step
// failed, if namespaces are refused or a mount fails; /sys/class is then as
// before.
bool enter_view(const std::vector<emu::SysfsNode>& nodes, std::string* error);

}  // namespace softverbs::tools

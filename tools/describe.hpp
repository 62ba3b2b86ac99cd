// What `softverbs devices` and `softverbs faults check` print: a fault rule in
// words, a device configuration as a table row, and the addresses on which UDP
// port 4791 (RoCEv2) is bound on this host now.
#pragma once

#include <netinet/in.h>

#include <string>
#include <string_view>
#include <vector>

#include "emu/device/config.hpp"
#include "emu/device/host.hpp"
#include "faults/rule.hpp"

namespace softverbs::tools {

// "rule NAME: on WHAT, WHEN: ACTION", e.g. "rule drop-1pct: on packets of any
// device, any direction, with probability 0.01: drop".
std::string describe_rule(const faults::FaultRule& rule);

using emu::roce_ports_bound;  // emu/device/host.hpp

std::string to_string(in_addr addr);
std::string_view to_string(emu::LinkLayer link_layer);
// 256, 512, ... for IBV_MTU_256, IBV_MTU_512, ...
int mtu_bytes(ibv_mtu mtu);

}  // namespace softverbs::tools

// What `softverbs devices` and `softverbs faults check` print: a fault rule in
// words, a device configuration as a table row, and the addresses on which UDP
// port 4791 (RoCEv2) is bound on this host now.
#pragma once

#include <netinet/in.h>

#include <string>
#include <string_view>
#include <vector>

#include "emu/device/config.hpp"
#include "faults/rule.hpp"

namespace softverbs::tools {

// "rule NAME: on WHAT, WHEN: ACTION", e.g. "rule drop-1pct: on packets of any
// device, any direction, with probability 0.01: drop".
std::string describe_rule(const faults::FaultRule& rule);

// The IPv4 addresses with a UDP socket bound to port 4791, read from the
// text of /proc/net/udp (passed in, so that it can be tested): "0100007F:12B7"
// is 127.0.0.1:4791 (the address is the kernel's network-order word printed
// in host order). Each address once, in the order of the table.
std::vector<in_addr> roce_ports_bound(std::string_view proc_net_udp);

std::string to_string(in_addr addr);
std::string_view to_string(emu::LinkLayer link_layer);
// 256, 512, ... for IBV_MTU_256, IBV_MTU_512, ...
int mtu_bytes(ibv_mtu mtu);

}  // namespace softverbs::tools

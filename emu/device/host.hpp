// The RoCEv2 endpoints of this host as the kernel lists them: which IPv4
// addresses have a UDP socket bound to port 4791 (each emulated device of any
// process binds its address there). The launcher's `devices` command prints
// them; the connection manager uses them for address resolution
// (docs/rdma-cm.md, "Addresses").
#pragma once

#include <netinet/in.h>

#include <string_view>
#include <vector>

namespace softverbs::emu {

// The IPv4 addresses with a UDP socket bound to port 4791, read from the
// text of /proc/net/udp (passed in, so that it can be tested): "0100007F:12B7"
// is 127.0.0.1:4791 (the address is the kernel's network-order word printed
// in host order). Each address once, in the order of the table.
std::vector<in_addr> roce_ports_bound(std::string_view proc_net_udp);

// roce_ports_bound() of this host's /proc/net/udp now (empty if unreadable).
std::vector<in_addr> roce_ports_bound_now();

}  // namespace softverbs::emu

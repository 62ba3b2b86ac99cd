// Placing the configured devices on addresses (placement.hpp): the one search
// both the library and the launcher run.
#include "emu/device/placement.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "emu/device/identity.hpp"
#include "fabric/udp_link.hpp"

namespace softverbs::emu {
namespace {

bool in_auto_range(in_addr a) {
  uint32_t h = ntohl(a.s_addr);
  return h >= kAutoFirst && h <= kAutoLast;
}

std::string port_str() { return std::to_string(kRoceV2Port); }

}  // namespace

int bind_roce_endpoint(in_addr addr) { return fabric::UdpLink::bind(addr); }

std::vector<Placed> place_devices(const Config& config, uint32_t pid, const std::vector<in_addr>& preferred,
                                  const BindFn& bind, std::vector<std::string>* errors) {
  std::vector<Placed> placed;
  const uint32_t span = kAutoLast - kAutoFirst + 1;
  uint32_t probe = (pid * 2654435761u) % span;
  size_t automatic = 0;  // automatic devices seen so far: the index into `preferred`
  for (const DeviceConfig& dc : config.devices) {
    Placed p{dc, {}, -1};
    if (dc.addr) {
      p.addr = *dc.addr;
      if (dc.link_layer == LinkLayer::kInfiniBand) {
        uint32_t lid = ntohl(p.addr.s_addr) & 0xffff;
        if (lid == 0 || lid >= 0xc000) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "%x", lid);
          errors->push_back("device " + dc.name + ": address " + addr_str(p.addr) + " gives LID 0x" + hex +
                            ", not a unicast LID; device not created");
          continue;
        }
      }
      p.fd = bind(p.addr);
      if (p.fd < 0) {
        errors->push_back("device " + dc.name + ": cannot bind " + addr_str(p.addr) + ":" + port_str() + ": " +
                          std::strerror(-p.fd) + "; device not created");
        continue;
      }
      placed.push_back(p);
      continue;
    }
    const size_t k = automatic++;
    if (k < preferred.size() && in_auto_range(preferred[k])) {
      p.addr = preferred[k];
      p.fd = bind(p.addr);
      if (p.fd >= 0) {
        placed.push_back(p);
        continue;
      }
    }
    // Addresses in use are skipped. So many in a row means the port is held on
    // every address (a wildcard bind of UDP 4791, as the kernel's rdma_rxe
    // does): no point trying the whole range.
    constexpr uint32_t kGiveUpAfter = 256;
    uint32_t tries = 0;
    int fd = -1;
    for (; tries < span && fd < 0; ++tries) {
      p.addr.s_addr = htonl(kAutoFirst + probe);
      probe = (probe + 1) % span;
      fd = bind(p.addr);
      if (fd < 0 && (fd != -EADDRINUSE || tries + 1 >= kGiveUpAfter)) break;
    }
    if (fd < 0) {
      if (fd == -EADDRINUSE)
        errors->push_back("device " + dc.name + ": UDP port " + port_str() + " is in use on " +
                          std::to_string(tries + 1) +
                          " loopback addresses in a row: something holds it on every address (a kernel RoCE "
                          "driver such as rdma_rxe binds 0.0.0.0:" +
                          port_str() + "); run the program in a network namespace of its own");
      else
        errors->push_back("device " + dc.name + ": no loopback address for its RoCEv2 endpoint: " +
                          std::strerror(-fd));
      continue;
    }
    p.fd = fd;
    placed.push_back(p);
  }
  return placed;
}

bool parse_addr_list(const char* text, std::vector<in_addr>* out) {
  out->clear();
  if (!text) return true;
  std::string_view s(text);
  while (!s.empty()) {
    size_t comma = s.find(',');
    std::string entry(s.substr(0, comma));
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
    in_addr a{};
    if (inet_pton(AF_INET, entry.c_str(), &a) != 1) {
      out->clear();
      return false;
    }
    out->push_back(a);
  }
  return true;
}

}  // namespace softverbs::emu

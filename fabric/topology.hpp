// A simulated fabric between the devices of one process (SOFTVERBS_TOPOLOGY,
// docs/simulation.md "A simulated fabric"): the topology file's format and its
// parser, and the run-time state of its links (a serialisation queue and a
// seeded loss stream per directed link) that fabric/topology_link.hpp consults.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/clock.hpp"

namespace softverbs::fabric {

// What one directed link does to a packet. Zero latency and zero bandwidth
// (unlimited) with no loss and no MTU is an ideal link: packets pass at once.
struct LinkProps {
  uint64_t latency_ns = 0;
  uint64_t bandwidth_bps = 0;  // bits per second; 0: unlimited (no serialisation time)
  double loss = 0.0;           // probability that a packet is lost, [0, 1]
  uint32_t mtu = 0;            // largest payload in bytes (an IB MTU); 0: no limit

  bool ideal() const { return latency_ns == 0 && bandwidth_bps == 0 && loss == 0.0 && mtu == 0; }
  // Nanoseconds a packet of `bytes` occupies the link.
  uint64_t serialisation_ns(uint64_t bytes) const {
    return bandwidth_bps == 0 ? 0 : (bytes * 8 * 1000000000ull + bandwidth_bps - 1) / bandwidth_bps;
  }
};

// A parsed topology file: the nodes (device names) and the properties of every
// directed link between two of them.
struct Topology {
  // As many as SOFTVERBS_DEVICES allows (emu/device/config.cpp).
  static constexpr size_t kMaxNodes = 64;

  uint64_t seed = 1;
  std::vector<std::string> nodes;
  LinkProps defaults;
  // props[from * nodes.size() + to]; the diagonal is unused (a device's packets
  // to itself cross no link).
  std::vector<LinkProps> props;

  std::optional<size_t> index_of(std::string_view name) const;
  const LinkProps& link(size_t from, size_t to) const { return props[from * nodes.size() + to]; }
};

// Parses a topology file's text; false with "line N: ..." in *error.
bool parse_topology(std::string_view text, Topology* out, std::string* error);
// Reads and parses the file at path; errors name the file.
bool load_topology(const std::string& path, Topology* out, std::string* error);

// What the links of the fabric dropped, counted on the sending device
// (LinkCounters::topology_*).
enum class LinkVerdict { kPass, kLost, kTooBig };

// The fabric at run time: the topology, the addresses its nodes got, and per
// directed link the moment its wire is free and its loss stream. Devices join
// it (add_node) before any traffic, as LocalHub's, so lookups take no lock.
class SimFabric {
 public:
  explicit SimFabric(Topology topology);

  const Topology& topology() const { return topology_; }
  void add_node(size_t index, in_addr addr);
  // The node at addr, if it is one.
  std::optional<size_t> node_at(in_addr addr) const;

  // A packet of `bytes` on the wire (IPv4 datagram octets) with `payload`
  // bytes of payload, sent now from node `from` to node `to`: whether it
  // arrives and, if it does, when (*arrival). A lost packet takes its time on
  // the wire; one over the MTU never gets on it (a switch port drops it).
  LinkVerdict cross(size_t from, size_t to, uint64_t bytes, uint64_t payload, Clock::time_point now,
                    Clock::time_point* arrival);

 private:
  struct Wire {
    std::mutex mu;
    Clock::time_point free_at{};  // when the last packet has left
    uint64_t rng = 0;             // the loss stream's state (splitmix64)
  };

  Topology topology_;
  std::vector<std::pair<in_addr_t, size_t>> addrs_;
  std::unique_ptr<Wire[]> wires_;
};

}  // namespace softverbs::fabric

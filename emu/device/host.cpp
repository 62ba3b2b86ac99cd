// The RoCEv2 endpoints bound on this host (emu/device/host.hpp).
#include "emu/device/host.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace softverbs::emu {
namespace {

// The RoCEv2 UDP port (IBTA Annex A17, 4791) as /proc/net/udp prints it.
constexpr std::string_view kRocePortHex = "12B7";

}  // namespace

std::vector<in_addr> roce_ports_bound(std::string_view text) {
  std::vector<in_addr> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    // "  sl  local_address rem_address ...": the second field is ADDR:PORT.
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view rest = line.substr(colon + 1);
    rest.remove_prefix(std::min(rest.find_first_not_of(' '), rest.size()));
    std::string_view local = rest.substr(0, rest.find(' '));
    size_t sep = local.find(':');
    if (sep != 8 || local.substr(sep + 1) != kRocePortHex) continue;
    uint32_t word = 0;
    auto [end, ec] = std::from_chars(local.data(), local.data() + sep, word, 16);
    if (ec != std::errc() || end != local.data() + sep) continue;
    in_addr a{};
    a.s_addr = word;
    bool seen = std::any_of(out.begin(), out.end(), [&](const in_addr& b) { return b.s_addr == a.s_addr; });
    if (!seen) out.push_back(a);
  }
  return out;
}

std::vector<in_addr> roce_ports_bound_now() {
  std::ifstream in("/proc/net/udp");
  if (!in) return {};
  std::ostringstream text;
  text << in.rdbuf();
  return roce_ports_bound(text.str());
}

}  // namespace softverbs::emu

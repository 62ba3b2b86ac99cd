// SOFTVERBS_HOST_LINK: the options of the same-host path (fabric/host_link.hpp),
// parsed once per process; docs/configuration.md lists the values.
#include <string>

#include "core/env.hpp"
#include "core/log.hpp"
#include "fabric/host_link.hpp"

namespace softverbs::fabric {

std::optional<HostLinkOptions> parse_host_link(const char* text, std::string* error) {
  HostLinkOptions o;
  if (!text || !*text) return o;
  std::string v(text);
  if (v == "udp") {
    o.enabled = false;
    return o;
  }
  if (v.rfind("socket", 0) == 0) {
    o.ring = false;
    v = "unix" + v.substr(6);
  }
  if (v == "unix") return o;
  if (v.rfind("unix:", 0) == 0 && v.size() > 5 && v.size() <= 5 + 6 &&
      v.find_first_not_of("0123456789", 5) == std::string::npos) {
    o.wait = std::chrono::milliseconds(std::stoul(v.substr(5)));
    return o;
  }
  if (error)
    *error = "SOFTVERBS_HOST_LINK=" + std::string(text) +
             ": expected unix, unix:MILLISECONDS (0-999999), socket, socket:MILLISECONDS or udp";
  return std::nullopt;
}

const HostLinkOptions& host_link_options() {
  static const HostLinkOptions options = [] {
    std::string error;
    auto o = parse_host_link(env::host_link(), &error);
    if (o) return *o;
    SV_LOG(kError, "%s; using unix", error.c_str());
    return HostLinkOptions{};
  }();
  return options;
}

}  // namespace softverbs::fabric

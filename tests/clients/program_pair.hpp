// Two programs that talk to each other over RDMA on one host: a server started first,
// a client started once the server listens on its TCP port, both bounded in time, and
// the pieces both sides' output is checked with (softverbs' own info lines, the
// address lines the programs print).
//
//   Env env = client_env().set("SOFTVERBS_LOG", "info");
//   PairResult r = run_pair([](uint16_t port) { return argv_with(port); }, env, env, 30s);
//   ASSERT_TRUE(r.both_succeeded()) << r.describe();
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tests/clients/clients.hpp"

namespace softverbs::test {

inline constexpr milliseconds kListenTimeout{20000};  // a server creating its device on a loaded machine
inline constexpr milliseconds kPeerGrace{5000};       // how long one side may outlive the other's failure

// A TCP port nothing listens on at the moment: the kernel's choice for a socket bound
// to port 0. Another process may take it before the server does; run_pair() retries.
inline uint16_t unused_tcp_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

struct PairResult {
  uint16_t port = 0;
  bool listened = false;  // the server had its port open before the client started
  pid_t server_pid = -1, client_pid = -1;
  ProcessResult server, client;

  bool both_succeeded() const { return listened && server.exited_with(0) && client.exited_with(0); }

  // perftest times the host's CPU clock before it reports, and gives up ("Can't
  // produce a report", then the peer loses its final exchange) when that timing is
  // too noisy, which a loaded machine can cause. Nothing about the device: such a
  // run is repeated.
  bool host_clock_unmeasured() const {
    for (const ProcessResult* p : {&server, &client})
      if (p->err.find("Can't produce a report") != std::string::npos &&
          p->err.find("Correlation coefficient r^2") != std::string::npos)
        return true;
    return false;
  }

  std::string describe() const {
    std::ostringstream o;
    o << "TCP port " << port << (listened ? "" : " (the server never listened on it)") << "\n=== server ===\n"
      << server.describe() << "\n=== client ===\n"
      << client.describe();
    return o.str();
  }
};

// Runs argv(port) as a server, waits until it listens on port, then runs argv(port)
// plus "127.0.0.1" as the client; both are read concurrently so that neither blocks
// on a full pipe. Each process is killed `limit` after its start at the latest; once
// one side has failed the other gets kPeerGrace more. A server that cannot listen
// because another process took the port is retried on another port, and so is a run
// perftest could not report on for want of a clock measurement (at most 3 runs).
inline PairResult run_pair(const std::function<std::vector<std::string>(uint16_t)>& argv, const Env& server_env,
                           const Env& client_env, milliseconds limit) {
  PairResult r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = PairResult{};
    r.port = unused_tcp_port();
    Process server(argv(r.port), server_env, shown_env(server_env));
    r.server_pid = server.pid();
    auto server_deadline = Clock::now() + limit;
    r.listened = server.wait_for_listen(r.port, std::min(limit, kListenTimeout));
    if (!r.listened) {
      r.server = server.wait(kPeerGrace);
      bool port_taken = r.server.out.find("Couldn't listen to port") != std::string::npos ||
                        r.server.err.find("Couldn't listen to port") != std::string::npos ||
                        r.server.err.find("Address already in use") != std::string::npos;
      if (port_taken) continue;
      return r;
    }
    std::vector<std::string> client_argv = argv(r.port);
    client_argv.push_back("127.0.0.1");
    Process client(std::move(client_argv), client_env, shown_env(client_env));
    r.client_pid = client.pid();
    auto client_deadline = Clock::now() + limit;

    // Both run until both have exited or a deadline passes. When one side fails,
    // the other (typically a server still waiting) is not waited for beyond the
    // grace period.
    BothResult both = wait_both(client, client_deadline, server, server_deadline, kPeerGrace);
    r.client = std::move(both.a);
    r.server = std::move(both.b);
    if (!r.both_succeeded() && r.host_clock_unmeasured()) continue;
    return r;
  }
  return r;
}

// The lines of text, without their line ends.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) v.push_back(line);
  return v;
}

// What softverbs says about its device at SOFTVERBS_LOG=info: where it is, and the
// packet counters printed when the process exits.
struct DeviceReport {
  std::string name;
  std::string address;  // dotted quad, without the ":4791"
  std::string link;     // "RoCEv2" or "InfiniBand link layer"
  std::map<std::string, uint64_t> counters;

  // Low 16 bits of the address: the LID of an InfiniBand-link-layer device.
  uint16_t lid() const {
    in_addr a{};
    if (::inet_pton(AF_INET, address.c_str(), &a) != 1) return 0;
    return static_cast<uint16_t>(ntohl(a.s_addr) & 0xffff);
  }
  uint64_t counter(const std::string& name_) const {
    auto it = counters.find(name_);
    return it == counters.end() ? 0 : it->second;
  }
  std::string describe_counters() const {
    std::string s;
    for (const auto& [k, v] : counters) s += (s.empty() ? "" : " ") + k + "=" + std::to_string(v);
    return s.empty() ? "<no counters line>" : s;
  }
};

inline constexpr std::string_view kInfoPrefix = "softverbs info: ";

// The device lines of a process's stderr at SOFTVERBS_LOG=info, one entry per device,
// in order of appearance:
//   softverbs info: device emu0: 127.0.121.180:4791 (RoCEv2)
//   softverbs info: device emu0: tx 1008 rx 1008 icrc_err 0 malformed 0 ... duplicates 0
inline std::vector<DeviceReport> parse_device_reports(const std::string& err) {
  std::vector<DeviceReport> devices;
  for (const std::string& line : lines_of(err)) {
    std::string_view l(line);
    if (!l.starts_with(kInfoPrefix)) continue;
    l.remove_prefix(kInfoPrefix.size());
    if (!l.starts_with("device ")) continue;
    l.remove_prefix(7);
    size_t colon = l.find(": ");
    if (colon == std::string_view::npos) continue;
    std::string name(l.substr(0, colon));
    std::string_view rest = l.substr(colon + 2);
    DeviceReport* d = nullptr;
    for (DeviceReport& x : devices)
      if (x.name == name) d = &x;
    if (!d) {
      devices.push_back({name, "", "", {}});
      d = &devices.back();
    }
    if (rest.starts_with("tx ")) {
      std::istringstream words{std::string(rest)};
      std::string key;
      uint64_t value = 0;
      while (words >> key >> value) d->counters[key] = value;
      continue;
    }
    size_t port = rest.find(":4791 (");
    if (port == std::string_view::npos || !rest.ends_with(")")) continue;
    d->address = std::string(rest.substr(0, port));
    size_t open = port + 7;
    d->link = std::string(rest.substr(open, rest.size() - 1 - open));
  }
  return devices;
}

// The lines of stderr that are neither softverbs info lines nor in `allowed` (exact
// lines the program is known to print there when all is well).
// An allowed line ending in '*' allows every line that starts with the rest.
inline std::vector<std::string> unexpected_stderr(const std::string& err,
                                                  const std::vector<std::string>& allowed = {}) {
  std::vector<std::string> v;
  for (const std::string& line : lines_of(err)) {
    if (line.starts_with(kInfoPrefix)) continue;
    bool ok = false;
    for (const std::string& a : allowed)
      ok = ok || (a.ends_with('*') ? line.starts_with(std::string_view(a).substr(0, a.size() - 1)) : line == a);
    if (!ok) v.push_back(line);
  }
  return v;
}

// The lines of text that contain one of the words.
inline std::vector<std::string> lines_containing(const std::string& text, const std::vector<std::string>& words) {
  std::vector<std::string> v;
  for (const std::string& line : lines_of(text)) {
    for (const std::string& w : words) {
      if (line.find(w) != std::string::npos) {
        v.push_back(line);
        break;
      }
    }
  }
  return v;
}

// One process's single emulated device, checked for the receive errors that never
// happen between two correct endpoints on one host: corrupted (ICRC), unparseable
// and wrong-transport packets.
inline ::testing::AssertionResult clean_device_report(const ProcessResult& r, const std::string& side,
                                                      DeviceReport* out = nullptr) {
  std::vector<DeviceReport> devs = parse_device_reports(r.err);
  if (devs.size() != 1)
    return ::testing::AssertionFailure() << side << ": expected one 'softverbs info: device' report on stderr, found "
                                         << devs.size();
  const DeviceReport& d = devs[0];
  if (out) *out = d;
  if (d.address.empty())
    return ::testing::AssertionFailure() << side << ": no 'device " << d.name << ": A:4791 (...)' line";
  if (d.counters.empty())
    return ::testing::AssertionFailure() << side << ": no packet counters line for device " << d.name
                                         << " (printed at exit with SOFTVERBS_LOG=info)";
  for (const char* key : {"tx", "rx", "icrc_err", "malformed", "dropped", "retransmits", "duplicates"})
    if (!d.counters.count(key))
      return ::testing::AssertionFailure() << side << ": counter " << key << " missing: " << d.describe_counters();
  for (const char* key : {"icrc_err", "malformed", "dropped"})
    if (d.counter(key) != 0)
      return ::testing::AssertionFailure()
             << side << ": " << key << " = " << d.counter(key) << " (" << d.describe_counters() << ")";
  return ::testing::AssertionSuccess();
}

}  // namespace softverbs::test

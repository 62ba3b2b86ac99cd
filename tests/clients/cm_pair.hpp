// Two rdma_cm programs on one host, each process on an emulated device of its own
// at an explicit address: the server's SOFTVERBS_DEVICES=s@S, the client's c@C, with
// S and C loopback addresses nobody holds (their UDP port 4791 is free), so that
// runs of several tests at once never meet.
//
//   using Argv = std::vector<std::string>;
//   CmPair r = run_cm_pair({.server = [](const CmAddrs& a) -> Argv { return {"rping", "-s", "-a", a.server}; },
//                           .client = [](const CmAddrs& a) -> Argv { return {"rping", "-c", "-a", a.server}; }});
//   ASSERT_TRUE(r.both_succeeded()) << r.describe();
//
// The client starts once the server's device exists (its "device s: S:4791" info
// line). The server listens a moment later, and a REQ that arrives before that is
// rejected with "invalid service ID" (IBTA Table 109, reason 8; a SIDR REQ gets
// status 1, Table 120), as the kernel's CM answers it: such a run is repeated, as is
// a run that lost its address to another process or one perftest could not time the
// host's clock in (at most kCmAttempts). perftest -R meets the first case often: its
// client connects a second time right after a handshake on its first connection,
// while the server only then creates its second listener (and perftest 4.5-0.17's
// own retry reuses the ids it has just destroyed, so it never succeeds). ctest runs
// these pairs alone (RUN_SERIAL, tests/clients/CMakeLists.txt).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/clients/program_pair.hpp"

namespace softverbs::test {

inline constexpr int kCmAttempts = 10;

// A loopback address in 127.77.0.0/16 (outside the automatic device range
// 127.0.1.1-127.0.191.255) whose RoCEv2 UDP port is free right now.
inline std::string unused_device_address() {
  static std::atomic<uint32_t> counter{0};
  std::mt19937 rng(static_cast<uint32_t>(::getpid()) * 2654435761u + counter.fetch_add(1) * 40503u);
  for (int i = 0; i < 256; ++i) {
    uint32_t host = 0x7f4d0000u | (1 + rng() % 0xfffeu);  // 127.77.x.y, never .0.0 or .255.255
    int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(host);
    a.sin_port = htons(4791);
    bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) {
      char text[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
      return text;
    }
  }
  return "127.77.0.1";
}

struct CmAddrs {
  std::string server, client;  // the devices' addresses
  uint16_t port = 0;           // a port number for the rdma_cm service, for programs that take one
};

struct CmPairSpec {
  std::function<std::vector<std::string>(const CmAddrs&)> server, client;
  milliseconds limit{60000};
  // The server never exits by itself (cmtime's): once the client has exited it is
  // sent SIGTERM, and then SIGKILL after kPeerGrace.
  bool kill_server = false;
  // No SOFTVERBS_DEVICES on either side: each gets its automatic device, and the
  // server's address is the one its info line reports.
  bool automatic_devices = false;
  // Called once the server's device exists, right before the client starts.
  std::function<void(const CmAddrs&)> before_client = nullptr;
  // Non-empty: the client captures its packets there (SOFTVERBS_PCAP).
  std::string client_pcap = "";
  // The devices' link layer suffix in SOFTVERBS_DEVICES ("/ib"); empty: the default.
  std::string link = "";
};

struct CmPair {
  CmAddrs addrs;
  bool server_ready = false;   // the server's device existed before the client started
  bool server_killed = false;  // kill_server: the server was still running and was stopped
  int attempts = 0;
  std::vector<std::string> retried;  // why earlier attempts were repeated
  ProcessResult server, client;

  // rping's own end-of-run race (rdmacm_test.cpp, kRpingStderr): its CM thread's
  // next rdma_get_cm_event finds the channel its main thread has just destroyed
  // (EBADF, with rdma-core's library as with ours) and calls exit(-1), which may
  // come before the main thread's exit(0). Counted as success only for rping and
  // only when that is the last thing it printed; the tests still check the pings.
  static bool ended_by_rping_race(const ProcessResult& p) {
    if (!p.exited_with(255) || p.command.find("rping") == std::string::npos) return false;
    const std::string line = "rdma_get_cm_event: Bad file descriptor\n";
    size_t at = p.err.rfind(line);
    if (at == std::string::npos) return false;
    // Only softverbs' own exit-time lines may follow it.
    for (size_t i = at + line.size(); i < p.err.size();) {
      size_t end = p.err.find('\n', i);
      if (p.err.compare(i, 15, "softverbs info:") != 0) return false;
      i = end == std::string::npos ? p.err.size() : end + 1;
    }
    return true;
  }
  static bool ended_well(const ProcessResult& p) { return p.exited_with(0) || ended_by_rping_race(p); }
  bool client_succeeded() const { return server_ready && ended_well(client); }
  bool both_succeeded() const {
    return client_succeeded() && (server_killed ? server.term_signal != 0 : ended_well(server));
  }

  std::string describe() const {
    std::string s = "server device s@" + addrs.server + ", client device c@" + addrs.client + ", port " +
                    std::to_string(addrs.port) + ", attempt " + std::to_string(attempts);
    if (!server_ready) s += " (the server's device never appeared)";
    if (server_killed) s += " (the server was stopped after the client)";
    for (const std::string& why : retried) s += "\nrepeated: " + why;
    return s + "\n=== server ===\n" + server.describe() + "\n=== client ===\n" + client.describe();
  }
};

// A client refused because the server was not listening yet: the kernel's and our
// CM reject such a REQ with reason 8 (RDMA_CM_EVENT_REJECTED, status 8; a synchronous
// rdma_connect fails with ECONNREFUSED) and answer such a SIDR REQ with status 1
// (RDMA_CM_EVENT_UNREACHABLE, status 1); the programs say so in their own words
// (perftest's first connection: "Unexpected CM event bl blka 8").
inline bool rejected_before_listen(const ProcessResult& client) {
  static const std::regex sign(
      R"(REJECTED|Connection refused|UNREACHABLE[;,] error:? 1\b|Unexpected CM event bl blka 8\b)");
  return std::regex_search(client.out + client.err, sign);
}

inline bool lost_address(const ProcessResult& p) { return p.err.find("device not created") != std::string::npos; }

inline std::string device_line_address(const std::string& err, const std::string& device) {
  for (const DeviceReport& d : parse_device_reports(err))
    if (d.name == device) return d.address;
  return "";
}

// Runs until the client has exited and the server too (or was stopped: kill_server,
// or a client that was rejected before the server listened and will be run again).
// A side that fails leaves the other kPeerGrace at most.
inline void wait_cm_pair(const CmPairSpec& spec, Process& server, Clock::time_point server_deadline, Process& client,
                         CmPair& r) {
  auto client_deadline = Clock::now() + spec.limit;
  while (client.running() && Clock::now() < client_deadline) {
    client.pump(milliseconds(5));
    server.pump(milliseconds(5));
    if (!server.running() && !server.snapshot().exited_with(0))
      client_deadline = std::min(client_deadline, Clock::now() + kPeerGrace);
  }
  auto left = [](Clock::time_point deadline) {
    auto now = Clock::now();
    return now >= deadline ? milliseconds(0) : std::chrono::duration_cast<milliseconds>(deadline - now);
  };
  r.client = client.wait(left(client_deadline));
  const bool client_ok = r.client.exited_with(0);
  if (server.running() && (spec.kill_server || (!client_ok && rejected_before_listen(r.client)))) {
    // Nothing more will come to it: a rejected client's server still waits for a REQ.
    r.server_killed = spec.kill_server;
    server.signal(SIGTERM);
    r.server = server.wait(kPeerGrace);
    return;
  }
  r.server = server.wait(client_ok ? left(server_deadline) : std::min(left(server_deadline), kPeerGrace));
}

inline CmPair run_cm_pair(const CmPairSpec& spec) {
  CmPair r;
  std::vector<std::string> retried;
  for (int attempt = 1; attempt <= kCmAttempts; ++attempt) {
    r = CmPair{};
    r.attempts = attempt;
    r.retried = retried;
    Env senv = client_env().set("SOFTVERBS_LOG", "info"), cenv = senv;
    const std::string sdev = spec.automatic_devices ? "emu0" : "s";
    if (!spec.automatic_devices) {
      r.addrs.server = unused_device_address();
      do r.addrs.client = unused_device_address();
      while (r.addrs.client == r.addrs.server);
      senv.set("SOFTVERBS_DEVICES", "s@" + r.addrs.server + spec.link);
      cenv.set("SOFTVERBS_DEVICES", "c@" + r.addrs.client + spec.link);
    }
    if (!spec.client_pcap.empty()) cenv.set("SOFTVERBS_PCAP", spec.client_pcap);
    r.addrs.port = unused_tcp_port();

    Process server(spec.server(r.addrs), senv, shown_env(senv));
    auto server_deadline = Clock::now() + spec.limit;
    const std::string ready = "device " + sdev + ": " + (spec.automatic_devices ? "" : r.addrs.server + ":4791");
    r.server_ready = server.wait_for_output(ready, std::min(spec.limit, kListenTimeout));
    if (!r.server_ready) {
      r.server = server.wait(kPeerGrace);
      if (lost_address(r.server) && attempt < kCmAttempts) {
        retried.push_back("the server's address was taken");
        continue;
      }
      return r;
    }
    if (spec.automatic_devices) {
      // The whole line is there once its end is: "device emu0: A:4791 (RoCEv2)".
      server.wait_for_output(":4791 (", kListenTimeout);
      r.addrs.server = device_line_address(server.snapshot().err, sdev);
    }

    if (spec.before_client) spec.before_client(r.addrs);
    Process client(spec.client(r.addrs), cenv, shown_env(cenv));
    wait_cm_pair(spec, server, server_deadline, client, r);
    if (r.both_succeeded() || attempt == kCmAttempts) return r;
    PairResult clock_check;
    clock_check.server = r.server;
    clock_check.client = r.client;
    if (lost_address(r.client)) {
      retried.push_back("the client's address was taken");
    } else if (!r.client.exited_with(0) && rejected_before_listen(r.client)) {
      retried.push_back("the client was rejected: its REQ came before the server listened");
      // Whether the server listens in time depends on how fast the machine runs both
      // sides at this moment: a burst of load makes several runs in a row lose.
      // Backing off (0.1 s, 0.2 s, ...) lets such a burst pass.
      std::this_thread::sleep_for(milliseconds(100 * attempt));
    } else if (clock_check.host_clock_unmeasured()) {
      retried.push_back("perftest could not time the host's clock");
    } else {
      return r;
    }
  }
  return r;
}

}  // namespace softverbs::test

// perftest's RC and UC benchmarks, the Debian binaries, as a server and a client
// process on one host, each with its own emulated device: RoCEv2 with GID index 1
// (-x 1) and InfiniBand link layer with LID addressing.
//
// A run passes when both sides exit with 0, print no error, exchanged matching
// addresses, the client's results table has one sane row per message size (and the
// server's too, for the tests whose server measures), and neither device received a
// corrupted, unparseable or wrong-transport packet.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <optional>
#include <ostream>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/clients/program_pair.hpp"

namespace softverbs::test {

inline constexpr milliseconds kPerftestLimit{60000};

// perftest prints this on stderr for any device whose vendor it does not know.
inline const std::vector<std::string> kPerftestStderr = {
    "Device not recognized to implement inline feature. Disabling it",
    // The latency tests time the host's CPU clock first; on a busy machine the
    // fit is poor and they say so. It is about the host, not the device.
    "Correlation coefficient r^2: *", "Conflicting CPU frequency values detected*"};

enum class Link { roce, ib };

struct PerftestCase {
  std::string name;
  std::string program;
  std::vector<std::string> args;  // besides -p PORT
  Link link = Link::roce;
  std::vector<uint64_t> sizes;  // the rows of the results table, in order
  uint64_t iters = 0;
  std::string connection = "RC";
  std::string title;  // a word of the test's title line, e.g. "CMP_AND_SWAP"; empty: not checked
  size_t qps = 1;     // -q: one address line per QP on each side
  // SOFTVERBS_VENDOR_PART_ID for both sides; empty: the default id.
  std::string vendor_part_id;
  // What perftest reports as "ibv_wr* API": it uses ibv_wr_start/ibv_wr_complete
  // (ON) only for the part ids of ConnectX-4 and later, BlueField and EFA.
  std::string wr_api() const { return vendor_part_id.empty() ? "OFF" : "ON"; }

  bool latency() const { return program.ends_with("_lat"); }
  // The servers that take part in the measurement print the same table; the others
  // print at most the last row (ib_write_bw, ib_read_bw, ib_atomic_bw) or none
  // (ib_read_lat, ib_atomic_lat).
  bool server_reports() const {
    return program == "ib_send_bw" || program == "ib_send_lat" || program == "ib_write_lat";
  }
};

// " local address: LID 0000 QPN 0x365400 PSN 0x954aae RKey 0x00012f VAddr 0x007f96cb6c4000"
// followed, with a GID, by " GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:54:84".
struct PerftestAddress {
  std::string lid;  // as printed: "0000" or "0x2310"
  uint32_t qpn = 0, psn = 0;
  std::string gid;  // the 16 fields after "GID: ", empty when not printed
};

struct Row {
  uint64_t bytes = 0, iters = 0;
  std::vector<double> values;  // bw: peak, average, msg rate; lat: t_min, t_max, t_typical, t_avg, ...
};

struct PerftestOutput {
  std::vector<PerftestAddress> local, remote;
  std::vector<Row> rows;
  std::map<std::string, std::string> header;  // " Link type       : Ethernet" -> "Link type" = "Ethernet"
  std::string title;
};

inline PerftestOutput parse_perftest(const std::string& out) {
  static const std::regex address(R"(^ (local|remote) address: LID (\S+) QPN 0x([0-9a-f]+) PSN 0x([0-9a-f]+)\b.*$)");
  static const std::regex gid(R"(^ GID: ((\d+:){15}\d+)\s*$)");
  PerftestOutput p;
  std::vector<PerftestAddress>* last = nullptr;
  bool in_table = false;
  for (const std::string& line : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(line, m, address)) {
      last = m[1] == "local" ? &p.local : &p.remote;
      last->push_back({m[2], static_cast<uint32_t>(std::stoul(m[3], nullptr, 16)),
                       static_cast<uint32_t>(std::stoul(m[4], nullptr, 16)), ""});
      continue;
    }
    if (std::regex_match(line, m, gid) && last && !last->empty()) {
      last->back().gid = m[1];
      continue;
    }
    if (line.find(" Test") != std::string::npos && line.starts_with("    ") && p.title.empty()) {
      p.title = trim(line);
      continue;
    }
    if (line.find("#bytes") != std::string::npos) {
      in_table = true;
      continue;
    }
    if (in_table) {
      std::istringstream f(line);
      Row r;
      if (!(f >> r.bytes >> r.iters)) {
        in_table = false;
        continue;
      }
      for (double v; f >> v;) r.values.push_back(v);
      p.rows.push_back(r);
      continue;
    }
    // Header fields, two to a line at most: " Number of qps   : 1\t\tTransport type : IB".
    std::istringstream parts(line);
    for (std::string part; std::getline(parts, part, '\t');) {
      size_t colon = part.find(" : ");
      if (colon == std::string::npos) colon = part.find(": ");
      if (colon == std::string::npos) continue;
      std::string key = trim(part.substr(0, colon)), value = trim(part.substr(part.find(':', colon) + 1));
      if (!key.empty() && !value.empty()) p.header.emplace(key, value);
    }
  }
  return p;
}

// The dotted quad of an IPv4-mapped GID as perftest prints it: "...:255:255:127:00:54:84".
inline std::string gid_ipv4(const std::string& gid) {
  std::vector<int> f;
  std::istringstream in(gid);
  for (std::string part; std::getline(in, part, ':');) f.push_back(std::stoi(part));
  if (f.size() != 16) return "<not 16 fields: " + gid + ">";
  return std::to_string(f[12]) + "." + std::to_string(f[13]) + "." + std::to_string(f[14]) + "." +
         std::to_string(f[15]);
}

inline std::vector<uint64_t> all_sizes() {  // -a: 2 .. 2^23
  std::vector<uint64_t> v;
  for (int i = 1; i <= 23; ++i) v.push_back(uint64_t{1} << i);
  return v;
}

inline void PrintTo(const PerftestCase& c, std::ostream* os) { *os << c.name; }

inline std::string perftest_path(const PerftestCase& c) { return "/usr/bin/" + c.program; }

inline std::vector<std::string> perftest_argv(const PerftestCase& c, uint16_t port) {
  std::vector<std::string> v{perftest_path(c), "-p", std::to_string(port)};
  v.insert(v.end(), c.args.begin(), c.args.end());
  return v;
}

inline Env perftest_env(const PerftestCase& c) {
  Env e = client_env().set("SOFTVERBS_LOG", "info");
  if (c.link == Link::ib) e.set("SOFTVERBS_LINK_LAYER", "ib");
  if (!c.vendor_part_id.empty()) e.set("SOFTVERBS_VENDOR_PART_ID", c.vendor_part_id);
  return e;
}

// `err`: that side's standard error. perftest calibrates its cycle counter
// against gettimeofday for every report and, when the fit is poor (a busy
// CPU), says "Correlation coefficient r^2: ... < 0.9" and divides by 0: that
// report's times are "inf" (perftest's get_clock.c). Such a latency row has
// no times to check; every other row is checked.
inline void check_rows(const PerftestCase& c, const std::vector<Row>& rows, const std::string& side,
                       const std::string& all, const std::string& err = "") {
  std::vector<uint64_t> sizes;
  for (const Row& r : rows) sizes.push_back(r.bytes);
  EXPECT_EQ(sizes, c.sizes) << side << ": the results table has the wrong sizes\n" << all;
  const bool uncalibrated = err.find("Correlation coefficient r^2") != std::string::npos;
  for (const Row& r : rows) {
    EXPECT_EQ(r.iters, c.iters) << side << " size " << r.bytes << "\n" << all;
    if (c.latency() && uncalibrated && r.values.empty()) continue;  // perftest's own "inf" report
    if (c.latency()) {
      // t_min t_max t_typical t_avg t_stdev 99% 99.9%
      ASSERT_GE(r.values.size(), 4u) << side << "\n" << all;
      EXPECT_GT(r.values[0], 0.0) << side << " size " << r.bytes << ": t_min\n" << all;
      EXPECT_LE(r.values[0], r.values[2]) << side << " size " << r.bytes << ": t_min <= t_typical\n" << all;
      EXPECT_LE(r.values[2], r.values[1]) << side << " size " << r.bytes << ": t_typical <= t_max\n" << all;
      EXPECT_GT(r.values[3], 0.0) << side << " size " << r.bytes << ": t_avg\n" << all;
    } else {
      // BW peak, BW average, MsgRate
      ASSERT_EQ(r.values.size(), 3u) << side << "\n" << all;
      EXPECT_GE(r.values[1], 0.0) << side << " size " << r.bytes << "\n" << all;
      EXPECT_GT(r.values[2], 0.0) << side << " size " << r.bytes << ": message rate\n" << all;
    }
  }
}

// Runs c as a server and a client and checks both sides (see the top of
// this file).
inline void run_and_check(const PerftestCase& c) {
  const Env e = perftest_env(c);
  PairResult r = run_pair([&](uint16_t port) { return perftest_argv(c, port); }, e, e, kPerftestLimit);
  const std::string all = r.describe();
  ASSERT_TRUE(r.both_succeeded()) << all;

  for (const auto& [side, p] : {std::pair{"server", &r.server}, std::pair{"client", &r.client}}) {
    auto extra = unexpected_stderr(p->err, kPerftestStderr);
    EXPECT_TRUE(extra.empty()) << side << ": unexpected stderr:\n" << join_lines(extra) << all;
    auto bad = lines_containing(p->out + p->err, {"Completion with error", "Failed", "failed", "Couldn't", "Unable",
                                                  "ERROR", "Error", "error"});
    EXPECT_TRUE(bad.empty()) << side << ":\n" << join_lines(bad) << all;
  }

  DeviceReport sdev, cdev;
  ASSERT_TRUE(clean_device_report(r.server, "server", &sdev)) << all;
  ASSERT_TRUE(clean_device_report(r.client, "client", &cdev)) << all;

  PerftestOutput s = parse_perftest(r.server.out), cl = parse_perftest(r.client.out);
  for (const auto& [side, o] : {std::pair{"server", &s}, std::pair{"client", &cl}}) {
    EXPECT_EQ(o->header["Connection type"], c.connection) << side << "\n" << all;
    EXPECT_EQ(o->header["Link type"], c.link == Link::ib ? "IB" : "Ethernet") << side << "\n" << all;
    EXPECT_EQ(o->header["Device"], "emu0") << side << "\n" << all;
    EXPECT_EQ(o->header["ibv_wr* API"], c.wr_api()) << side << ": the post API perftest chose\n" << all;
    if (c.link == Link::roce) {
      EXPECT_EQ(o->header["GID index"], "1") << side << "\n" << all;
    }
    if (!c.title.empty()) {
      EXPECT_NE(o->title.find(c.title), std::string::npos) << side << ": " << o->title;
    }
    ASSERT_EQ(o->local.size(), c.qps) << side << "\n" << all;
    ASSERT_EQ(o->remote.size(), c.qps) << side << "\n" << all;
  }

  // What one side sent is what the other received, and it names the right device.
  for (size_t q = 0; q < c.qps; ++q) {
    EXPECT_EQ(s.local[q].qpn, cl.remote[q].qpn) << all;
    EXPECT_EQ(s.local[q].psn, cl.remote[q].psn) << all;
    EXPECT_EQ(cl.local[q].qpn, s.remote[q].qpn) << all;
    EXPECT_EQ(cl.local[q].psn, s.remote[q].psn) << all;
  }
  for (const auto& [side, a, dev] : {std::tuple{"server", s.local[0], sdev}, std::tuple{"client", cl.local[0], cdev}}) {
    if (c.link == Link::roce) {
      EXPECT_EQ(a.lid, "0000") << side << "\n" << all;
      EXPECT_EQ(gid_ipv4(a.gid), dev.address) << side << ": GID " << a.gid << "\n" << all;
    } else {
      EXPECT_EQ(std::stoul(a.lid, nullptr, 16), dev.lid())
          << side << ": LID " << a.lid << " must be the low 16 bits of " << dev.address << "\n"
          << all;
      EXPECT_EQ(a.gid, "") << side << ": no GID is used with LID addressing\n" << all;
    }
  }

  check_rows(c, cl.rows, "client", all, r.client.err);
  if (c.server_reports()) check_rows(c, s.rows, "server", all, r.server.err);

  // Traffic flowed both ways (requests one way, acknowledgements or responses back),
  // except for UC bandwidth tests, which nothing answers.
  const bool one_way = (c.connection == "UC" || c.connection == "UD") && c.program.ends_with("_bw");
  EXPECT_GT(cdev.counter("tx"), 0u) << cdev.describe_counters();
  EXPECT_GT(sdev.counter("rx"), 0u) << sdev.describe_counters();
  if (!one_way) {
    EXPECT_GT(sdev.counter("tx"), 0u) << sdev.describe_counters();
    EXPECT_GT(cdev.counter("rx"), 0u) << cdev.describe_counters();
  }
  if (c.connection == "UC") {
    // Nothing is retransmitted on UC.
    EXPECT_EQ(sdev.counter("retransmits") + cdev.counter("retransmits"), 0u)
        << sdev.describe_counters() << " / " << cdev.describe_counters();
  }
}

class PerftestTransfer : public ::testing::TestWithParam<PerftestCase> {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(perftest_path(GetParam()), "perftest")); }
};

inline PerftestCase make_case(std::string name, std::string program, std::vector<std::string> args, Link link,
                              std::vector<uint64_t> sizes, uint64_t iters, std::string connection = "RC",
                              std::string title = "") {
  PerftestCase c;
  c.name = std::move(name);
  c.program = std::move(program);
  c.args = std::move(args);
  c.link = link;
  c.sizes = std::move(sizes);
  c.iters = iters;
  c.connection = std::move(connection);
  c.title = std::move(title);
  return c;
}

}  // namespace softverbs::test

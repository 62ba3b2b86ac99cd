// The sysfs view of `softverbs run` and `softverbs sysfs` (docs/configuration.md,
// "The sysfs view"): what a program run through the launcher reads under
// /sys/class/infiniband agrees with what the library reports in that program
// (ibv_devinfo -v, ibstat), the real classes stay, the fallback without
// namespaces is one line at info level, and --no-sysfs leaves the program's
// namespaces alone.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/process.hpp"

namespace softverbs::test {
namespace {

using namespace std::chrono_literals;

Env clean_env() { return Env::inherit().unset_prefix("SOFTVERBS_").unset("LD_LIBRARY_PATH"); }

// `softverbs run OPTIONS -- sh -c SCRIPT`.
ProcessResult launch(std::vector<std::string> options, const std::string& script, const Env& env = clean_env()) {
  options.insert(options.begin(), {SV_CLI, "run"});
  for (const char* a : {"--", "sh", "-c"}) options.push_back(a);
  options.push_back(script);
  return run(std::move(options), env, 30s);
}

// Namespaces may be refused on this host: then the view tests have nothing to check.
#define SKIP_WITHOUT_VIEW()                                                                      \
  do {                                                                                           \
    ProcessResult probe = launch({"--log", "info", "--devices", "0"}, "true");                   \
    if (probe.err.find("no sysfs view") != std::string::npos) GTEST_SKIP() << probe.err;         \
  } while (0)

// True if UDP ip:4791 can be bound now (for tests that give a device a fixed address).
bool roce_port_free(const char* ip) {
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(4791);
  ::inet_pton(AF_INET, ip, &sa.sin_addr);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  ::close(fd);
  return ok;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// A GID as sysfs prints it (8 groups) in ibv_devinfo's form (inet_ntop).
std::string gid_as_devinfo(const std::string& sysfs) {
  in6_addr a{};
  if (::inet_pton(AF_INET6, sysfs.c_str(), &a) != 1) return "(not a GID: " + sysfs + ")";
  char buf[INET6_ADDRSTRLEN];
  ::inet_ntop(AF_INET6, &a, buf, sizeof buf);
  return buf;
}

struct LibraryDevice {
  std::string node_guid;
  std::map<int, std::string> gids;  // index -> "::ffff:127.0.0.9"
};

// hca_id -> node_guid and GIDs, from `ibv_devinfo -v`.
std::map<std::string, LibraryDevice> parse_devinfo(const std::string& text) {
  std::map<std::string, LibraryDevice> out;
  std::string current;
  const std::regex hca(R"(^hca_id:\s+(\S+))"), guid(R"(^\s+node_guid:\s+(\S+))"),
      gid(R"(^\s+GID\[\s*(\d+)\]:\s+([^,]+),)");
  for (const std::string& line : lines_of(text)) {
    std::smatch m;
    if (std::regex_search(line, m, hca)) current = m[1];
    else if (std::regex_search(line, m, guid)) out[current].node_guid = m[1];
    else if (std::regex_search(line, m, gid)) out[current].gids[std::stoi(m[1])] = m[2];
  }
  return out;
}

TEST(SysfsView, TheDefaultDeviceAsTheLibraryReportsIt) {
  SKIP_WITHOUT_VIEW();
  const std::string dev = "/sys/class/infiniband/emu0";
  ProcessResult r = launch({}, "cat " + dev + "/ports/1/gids/1 " + dev + "/node_guid; ls -l " + dev +
                                   "/device/net/; echo ===; ibv_devinfo -v");
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  std::vector<std::string> lines = lines_of(r.out.substr(0, r.out.find("===")));
  ASSERT_GE(lines.size(), 4u) << r.out;
  EXPECT_TRUE(std::regex_match(lines[0], std::regex("0000:0000:0000:0000:0000:ffff:7f00:[0-9a-f]{4}"))) << lines[0];
  EXPECT_NE(r.out.find("lo -> /sys/class/net/lo"), std::string::npos) << r.out;
  auto library = parse_devinfo(r.out.substr(r.out.find("===")));
  ASSERT_TRUE(library.count("emu0")) << r.out;
  EXPECT_EQ(library["emu0"].node_guid, lines[1]);
  EXPECT_EQ(library["emu0"].gids[1], gid_as_devinfo(lines[0]));
}

TEST(SysfsView, FixedAndAutomaticAddressesAgreeWithTheLibrary) {
  SKIP_WITHOUT_VIEW();
  if (!roce_port_free("127.0.0.217")) GTEST_SKIP() << "127.0.0.217:4791 is in use";
  ProcessResult r = launch({"--devices", "a@127.0.0.217,b"},
                           "ls /sys/class/infiniband; for d in a b; do p=/sys/class/infiniband/$d; "
                           "echo $d $(cat $p/node_guid $p/ports/1/gids/0 $p/ports/1/gids/1 $p/ports/1/gid_attrs/types/1); "
                           "done; cat /sys/class/infiniband_verbs/uverbs1/ibdev; echo ===; ibv_devinfo -v");
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  std::vector<std::string> lines = lines_of(r.out.substr(0, r.out.find("===")));
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0], "a");
  EXPECT_EQ(lines[1], "b");
  EXPECT_EQ(lines[4], "b");
  auto library = parse_devinfo(r.out.substr(r.out.find("===")));
  ASSERT_EQ(library.size(), 2u) << r.out;
  for (int i : {2, 3}) {
    std::istringstream fields(lines[i]);
    std::string name, guid, gid0, gid1, type1, type2;
    fields >> name >> guid >> gid0 >> gid1 >> type1 >> type2;
    ASSERT_TRUE(library.count(name)) << lines[i];
    EXPECT_EQ(library[name].node_guid, guid) << name;
    EXPECT_EQ(library[name].gids[0], gid_as_devinfo(gid0)) << name;
    EXPECT_EQ(library[name].gids[1], gid_as_devinfo(gid1)) << name;
    EXPECT_EQ(type1 + " " + type2, "RoCE v2") << name;
  }
  EXPECT_EQ(library["a"].gids[1], "::ffff:127.0.0.217");
}

TEST(SysfsView, IbstatListsTheDevices) {
  SKIP_WITHOUT_VIEW();
  if (!std::filesystem::exists("/usr/sbin/ibstat")) GTEST_SKIP() << "ibstat (infiniband-diags) is not installed";
  ProcessResult r = launch({"--devices", "emu0,emu1/ib"},
                           "ibstat -l; cat /sys/class/infiniband/emu1/node_guid; ibstat emu1; echo ===; ibv_devinfo");
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  std::vector<std::string> lines = lines_of(r.out);
  ASSERT_GE(lines.size(), 3u) << r.out;
  EXPECT_EQ(lines[0], "emu0");
  EXPECT_EQ(lines[1], "emu1");
  std::string guid = lines[2];
  guid.erase(std::remove(guid.begin(), guid.end(), ':'), guid.end());
  EXPECT_NE(r.out.find("Node GUID: 0x" + guid), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("State: Active"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Link layer: InfiniBand"), std::string::npos) << r.out;
  // The LID ibstat reads is the one the library reports.
  std::smatch lid;
  const std::string devinfo = r.out.substr(r.out.find("==="));
  ASSERT_TRUE(std::regex_search(devinfo, lid, std::regex(R"(port_lid:\s+(\d+))"))) << devinfo;
  const std::string emu1 = devinfo.substr(devinfo.find("hca_id:\temu1"));
  std::smatch lid1;
  ASSERT_TRUE(std::regex_search(emu1, lid1, std::regex(R"(port_lid:\s+(\d+))"))) << emu1;
  EXPECT_NE(r.out.find("Base lid: " + lid1[1].str() + "\n"), std::string::npos) << r.out;
}

TEST(SysfsView, RealClassesStayAndTheViewIsReadOnly) {
  SKIP_WITHOUT_VIEW();
  ProcessResult r = launch({}, "cat /sys/class/net/lo/ifindex; ls /sys/class | grep -c .; "
                               "touch /sys/class/infiniband/x 2>/dev/null && echo writable || echo read-only");
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  size_t classes = 0;
  bool had_ib = false, had_verbs = false;
  for (const auto& e : std::filesystem::directory_iterator("/sys/class")) {
    ++classes;
    had_ib |= e.path().filename() == "infiniband";
    had_verbs |= e.path().filename() == "infiniband_verbs";
  }
  EXPECT_EQ(r.out, "1\n" + std::to_string(classes + !had_ib + !had_verbs) + "\nread-only\n");
}

// The port counters of the view start at zero and follow the traffic of the
// process that owns the device: ibv_rc_pingpong between two processes, one of
// which holds the view's emu0 (the other gets a device of the same name on
// another address, which the view does not describe). The owner rewrites the
// files while it runs and once more at exit, so the shell reads final values.
// The client is run again, at most ten times, while the server is not
// listening yet.
TEST(SysfsView, PortCountersFollowTheTraffic) {
  SKIP_WITHOUT_VIEW();
  if (!std::filesystem::exists("/usr/bin/ibv_rc_pingpong")) GTEST_SKIP() << "ibverbs-utils is not installed";
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  const std::string pp = "ibv_rc_pingpong -d emu0 -g 1 -n 20 -p " + port;
  const std::string script =
      "d=/sys/class/infiniband/emu0/ports/1; cat $d/counters/port_xmit_packets $d/hw_counters/rdma_sends; " + pp +
      " >/dev/null 2>&1 & s=$!; ok=0; for t in 1 2 3 4 5 6 7 8 9 10; do if " + pp +
      " localhost >/dev/null 2>&1; then ok=1; break; fi; sleep 0.2; done; wait $s; echo $ok; "
      "for f in counters/port_xmit_packets counters/port_rcv_packets counters/port_xmit_data counters/port_rcv_data "
      "hw_counters/sent_pkts hw_counters/rcvd_pkts hw_counters/rdma_sends hw_counters/rdma_recvs "
      "hw_counters/lifespan counters/symbol_error; do cat $d/$f; done; "
      "touch /sys/class/infiniband/emu0/x 2>/dev/null && echo writable || echo read-only";
  ProcessResult r = launch({}, script);
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  std::vector<std::string> v = lines_of(r.out);
  ASSERT_EQ(v.size(), 14u) << r.out;
  EXPECT_EQ(v[0], "0") << "a new device has sent nothing";
  EXPECT_EQ(v[1], "0");
  ASSERT_EQ(v[2], "1") << "ibv_rc_pingpong failed: " << r.out;
  const uint64_t tx = std::stoull(v[3]), rx = std::stoull(v[4]), tx_words = std::stoull(v[5]),
                 rx_words = std::stoull(v[6]);
  EXPECT_GE(tx, 20u);
  EXPECT_GE(rx, 20u);
  // Data counters are 4-octet words of whole datagrams: at least the IPv4, UDP,
  // BTH and ICRC headers of each packet, and the 4096-byte messages on top.
  EXPECT_GE(tx_words * 4, 44 * tx + 20 * 4096);
  EXPECT_GE(rx_words * 4, 44 * rx + 20 * 4096);
  EXPECT_EQ(v[7], v[3]) << "sent_pkts is port_xmit_packets";
  EXPECT_EQ(v[8], v[4]) << "rcvd_pkts is port_rcv_packets";
  EXPECT_EQ(v[9], "20") << "20 sends completed";
  EXPECT_EQ(v[10], "20") << "20 receives completed";
  EXPECT_EQ(v[11], "100") << "lifespan: the refresh period in ms";
  EXPECT_EQ(v[12], "0");
  EXPECT_EQ(v[13], "read-only") << "only the counter directories are writable";
}

TEST(SysfsView, FallbackWithoutNamespacesIsOneInfoLine) {
  const std::string script =
      "test -e /sys/class/infiniband/emu0 && echo present || echo absent; echo ${SOFTVERBS_AUTO_ADDRS-unset}";
  Env env = clean_env().set("SOFTVERBS_TEST_NO_UNSHARE", "1");
  ProcessResult info = launch({"--log", "info"}, script, env);
  ASSERT_TRUE(info.exited_with(0)) << info.describe();
  EXPECT_EQ(info.out, "absent\nunset\n");
  EXPECT_EQ(info.err,
            "softverbs info: no sysfs view (unshare (SOFTVERBS_TEST_NO_UNSHARE): Operation not permitted): programs "
            "that read /sys/class/infiniband will not find the devices\n");
  ProcessResult quiet = launch({}, script, env);
  ASSERT_TRUE(quiet.exited_with(0)) << quiet.describe();
  EXPECT_EQ(quiet.out, "absent\nunset\n");
  EXPECT_EQ(quiet.err, "");
}

TEST(SysfsView, NoSysfsLeavesTheNamespacesAlone) {
  const std::string own = std::filesystem::read_symlink("/proc/self/ns/mnt").string();
  const std::string script = "readlink /proc/self/ns/mnt; echo ${SOFTVERBS_AUTO_ADDRS-unset}";
  ProcessResult off = launch({"--no-sysfs"}, script);
  ASSERT_TRUE(off.exited_with(0)) << off.describe();
  EXPECT_EQ(off.out, own + "\nunset\n");
  SKIP_WITHOUT_VIEW();
  ProcessResult on = launch({}, script);
  ASSERT_TRUE(on.exited_with(0)) << on.describe();
  std::vector<std::string> lines = lines_of(on.out);
  ASSERT_EQ(lines.size(), 2u) << on.out;
  EXPECT_NE(lines[0], own);
  EXPECT_TRUE(std::regex_match(lines[1], std::regex(R"(127\.0\.\d+\.\d+)"))) << lines[1];
}

// An unprivileged caller gets a user namespace that maps its own ids: as root,
// the launcher is run as uid/gid 1000 of a user namespace (unshare(1)).
TEST(SysfsView, UnprivilegedCallerKeepsItsIds) {
  std::vector<std::string> prefix;
  std::string uid = std::to_string(::getuid()), gid = std::to_string(::getgid());
  if (::geteuid() == 0) {
    ProcessResult can = run({"unshare", "--user", "--map-user=1000", "--map-group=1000", "true"}, clean_env(), 20s);
    if (!can.exited_with(0)) GTEST_SKIP() << "no user namespace for the test: " << can.describe();
    prefix = {"unshare", "--user", "--map-user=1000", "--map-group=1000"};
    uid = gid = "1000";
  }
  std::vector<std::string> args = prefix;
  for (const char* a : {SV_CLI, "run", "--log", "info", "--", "sh", "-c",
                        "id -u; id -g; cat /sys/class/infiniband/emu0/ports/1/gid_attrs/types/1"})
    args.push_back(a);
  ProcessResult r = run(args, clean_env(), 30s);
  // Where user namespaces are refused (e.g. inside a chroot) the launcher falls
  // back (SysfsView.FallbackWithoutNamespacesIsOneInfoLine tests that): nothing to check here then.
  if (r.err.find("no sysfs view") != std::string::npos) GTEST_SKIP() << r.err;
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, uid + "\n" + gid + "\nRoCE v2\n");
}

TEST(SysfsCommand, WritesTheFilesUnderDirClass) {
  if (!roce_port_free("127.0.0.218")) GTEST_SKIP() << "127.0.0.218:4791 is in use";
  const std::string dir = testing::TempDir() + "softverbs-sysfs-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  ProcessResult r = run({SV_CLI, "sysfs", "--devices", "a@127.0.0.218,b", dir}, clean_env(), 20s);
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(lines[0], "wrote 2 devices into " + dir + "/class/infiniband");
  EXPECT_TRUE(std::regex_match(lines[1], std::regex(R"(export SOFTVERBS_AUTO_ADDRS=127\.0\.\d+\.\d+)"))) << lines[1];
  auto read = [&](const std::string& path) {
    std::ifstream in(dir + "/class/" + path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  EXPECT_EQ(read("infiniband/a/node_guid"), "0000:7fff:fe00:00da\n");
  EXPECT_EQ(read("infiniband/a/ports/1/gids/1"), "0000:0000:0000:0000:0000:ffff:7f00:00da\n");
  EXPECT_EQ(read("infiniband_verbs/uverbs1/ibdev"), "b\n");
  EXPECT_EQ(std::filesystem::read_symlink(dir + "/class/infiniband/b/device/net/lo"), "/sys/class/net/lo");
  // The rate line follows the personality's active width and speed (the kernel's format).
  EXPECT_EQ(read("infiniband/a/ports/1/rate"), "100 Gb/sec (4X EDR)\n");
  std::filesystem::remove_all(dir);
  ProcessResult rxe = run({SV_CLI, "sysfs", "--devices", "a@127.0.0.218", dir},
                          clean_env().set("SOFTVERBS_PERSONALITY", "rxe"), 20s);
  ASSERT_TRUE(rxe.exited_with(0)) << rxe.describe();
  EXPECT_EQ(read("infiniband/a/ports/1/rate"), "2.5 Gb/sec (1X SDR)\n");
  std::filesystem::remove_all(dir);

  ProcessResult bad = run({SV_CLI, "sysfs", "--devices", "a,a", dir}, clean_env(), 20s);
  EXPECT_TRUE(bad.exited_with(2)) << bad.describe();
  EXPECT_EQ(bad.err, "softverbs: SOFTVERBS_DEVICES: device name 'a' appears twice\n");
}

}  // namespace
}  // namespace softverbs::test

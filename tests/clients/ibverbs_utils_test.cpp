// ibverbs-utils' ibv_devices and ibv_devinfo, the Debian binaries, on our library.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstdlib>
#include <set>
#include <string>

#include "tests/clients/clients.hpp"

namespace softverbs::test {
namespace {

constexpr const char* kIbvDevices = "/usr/bin/ibv_devices";
constexpr const char* kIbvDevinfo = "/usr/bin/ibv_devinfo";

ProcessResult run_tool(std::vector<std::string> argv, const Env& env) { return run_client(std::move(argv), env); }

// A run that must succeed silently: exit 0 (fatal otherwise) and nothing on stderr.
void expect_clean_success(const ProcessResult& r) {
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_TRUE(loader_errors(r.err).empty()) << join_lines(loader_errors(r.err)) << r.describe();
  EXPECT_EQ(r.err, "") << "stderr must be empty\n" << r.describe();
}

class IbvDevices : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(kIbvDevices, "ibverbs-utils")); }
};

TEST_F(IbvDevices, ListsTheDefaultDevice) {
  ProcessResult r = run_tool({kIbvDevices}, client_env());
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  EXPECT_NE(r.out.find("node GUID"), std::string::npos) << r.describe();
  auto devs = parse_ibv_devices(r.out);
  ASSERT_EQ(devs.size(), 1u) << r.describe();
  EXPECT_EQ(devs[0].name, "emu0");
  EXPECT_TRUE(is_hex(devs[0].guid, 16)) << "GUID '" << devs[0].guid << "' is not 16 hex digits";
  EXPECT_NE(devs[0].guid, "0000000000000000");
}

TEST_F(IbvDevices, ListsThreeNumberedDevices) {
  ProcessResult r = run_tool({kIbvDevices}, client_env().set("SOFTVERBS_DEVICES", "3"));
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  auto devs = parse_ibv_devices(r.out);
  ASSERT_EQ(devs.size(), 3u) << r.describe();
  std::set<std::string> guids;
  for (size_t i = 0; i < devs.size(); ++i) {
    EXPECT_EQ(devs[i].name, "emu" + std::to_string(i));
    EXPECT_TRUE(is_hex(devs[i].guid, 16)) << devs[i].guid;
    guids.insert(devs[i].guid);
  }
  EXPECT_EQ(guids.size(), 3u) << "node GUIDs must be distinct\n" << r.describe();
}

TEST_F(IbvDevices, ListsNamedDevices) {
  ProcessResult r = run_tool({kIbvDevices}, client_env().set("SOFTVERBS_DEVICES", "foo@127.0.9.9,bar"));
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  auto devs = parse_ibv_devices(r.out);
  ASSERT_EQ(devs.size(), 2u) << r.describe();
  EXPECT_EQ(devs[0].name, "foo");
  EXPECT_EQ(devs[1].name, "bar");
  for (const auto& d : devs) EXPECT_TRUE(is_hex(d.guid, 16)) << d.guid;
  EXPECT_NE(devs[0].guid, devs[1].guid);
}

TEST_F(IbvDevices, NoDevicesIsAnEmptyList) {
  // Like rdma-core with the RDMA subsystem present but no device: the header only.
  ProcessResult r = run_tool({kIbvDevices}, client_env().set("SOFTVERBS_DEVICES", "0"));
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  EXPECT_NE(r.out.find("node GUID"), std::string::npos) << r.describe();
  EXPECT_TRUE(parse_ibv_devices(r.out).empty()) << r.describe();
}

class IbvDevinfo : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(installed(kIbvDevinfo, "ibverbs-utils")); }

  // Runs ibv_devinfo ARGS; a silent success with exactly one device block or a fatal failure.
  void one_device(std::vector<std::string> args, const Env& env, DevinfoDevice* device, ProcessResult* result) {
    args.insert(args.begin(), kIbvDevinfo);
    *result = run_tool(args, env);
    ASSERT_NO_FATAL_FAILURE(expect_clean_success(*result));
    auto devs = parse_devinfo(result->out);
    ASSERT_EQ(devs.size(), 1u) << result->describe();
    *device = devs.front();
  }
};

TEST_F(IbvDevinfo, DescribesTheDefaultDevice) {
  ProcessResult r;
  DevinfoDevice d;
  ASSERT_NO_FATAL_FAILURE(one_device({}, client_env(), &d, &r));
  EXPECT_EQ(d.hca_id, "emu0") << r.describe();
  EXPECT_EQ(d.get("transport"), "InfiniBand (0)");
  EXPECT_TRUE(is_hex_groups(d.get("node_guid"), 4)) << d.get("node_guid");
  EXPECT_NE(d.get("node_guid"), "0000:0000:0000:0000");
  EXPECT_TRUE(d.has("board_id")) << "board_id comes from ibv_read_sysfs_file(ibdev_path, \"board_id\")\n"
                                 << r.describe();
  EXPECT_NE(d.get("board_id"), "");
  EXPECT_EQ(d.get("phys_port_cnt"), "1");
  EXPECT_EQ(d.get("port"), "1");
  EXPECT_EQ(d.get("state"), "PORT_ACTIVE (4)");
  EXPECT_EQ(d.get("link_layer"), "Ethernet");
  EXPECT_EQ(d.get("port_lid"), "0") << "RoCE ports have no LID";
}

TEST_F(IbvDevinfo, VerboseShowsTheDeviceAddressAsRoceV2Gid) {
  ProcessResult r;
  DevinfoDevice d;
  ASSERT_NO_FATAL_FAILURE(one_device({"-v"}, client_env().set("SOFTVERBS_DEVICES", "emu0@127.1.9.10"), &d, &r));
  EXPECT_EQ(d.hca_id, "emu0");
  EXPECT_EQ(d.get("state"), "PORT_ACTIVE (4)");
  EXPECT_EQ(d.get("link_layer"), "Ethernet");
  EXPECT_TRUE(d.has("board_id")) << r.describe();
  EXPECT_TRUE(d.has("max_qp")) << r.describe();
  EXPECT_TRUE(d.has("num_comp_vectors")) << r.describe();
  auto gids = d.gids();
  ASSERT_TRUE(gids.count(1)) << "no GID[  1] line\n" << r.describe();
  EXPECT_EQ(gids[1], "::ffff:127.1.9.10, RoCE v2") << r.describe();
  for (const auto& [index, text] : gids)
    EXPECT_TRUE(text.ends_with(", RoCE v1") || text.ends_with(", RoCE v2"))
        << "GID[" << index << "] = " << text << ": an Ethernet port's GIDs carry their RoCE type";
}

TEST_F(IbvDevinfo, VerboseAutomaticAddressIsLoopback) {
  ProcessResult r;
  DevinfoDevice d;
  ASSERT_NO_FATAL_FAILURE(one_device({"-v"}, client_env(), &d, &r));
  auto gids = d.gids();
  ASSERT_TRUE(gids.count(1)) << r.describe();
  // An IPv4-mapped address in 127/8, printed by inet_ntop, and the RoCE v2 type.
  const std::string& gid = gids[1];
  constexpr std::string_view kPrefix = "::ffff:", kSuffix = ", RoCE v2";
  ASSERT_TRUE(gid.starts_with(kPrefix) && gid.ends_with(kSuffix)) << "GID[  1] = " << gid << "\n" << r.describe();
  std::string v4 = gid.substr(kPrefix.size(), gid.size() - kPrefix.size() - kSuffix.size());
  in_addr a{};
  EXPECT_EQ(::inet_pton(AF_INET, v4.c_str(), &a), 1) << "GID[  1] = " << gid;
  EXPECT_EQ(ntohl(a.s_addr) >> 24, 127u) << "GID[  1] = " << gid << ": not a loopback address";
}

TEST_F(IbvDevinfo, InfiniBandLinkLayer) {
  ProcessResult r;
  Env env = client_env().set("SOFTVERBS_DEVICES", "emu0@127.1.2.3").set("SOFTVERBS_LINK_LAYER", "ib");
  DevinfoDevice d;
  ASSERT_NO_FATAL_FAILURE(one_device({"-v"}, env, &d, &r));
  EXPECT_EQ(d.get("link_layer"), "InfiniBand") << r.describe();
  EXPECT_EQ(d.get("state"), "PORT_ACTIVE (4)");
  // The LID is the low 16 bits of the device's address: 2.3 -> 0x0203.
  EXPECT_EQ(d.get("port_lid"), std::to_string(0x0203)) << r.describe();
  auto gids = d.gids();
  ASSERT_TRUE(gids.count(0)) << "no GID[  0] line\n" << r.describe();
  EXPECT_TRUE(gids[0].starts_with("fe80:0000:0000:0000:") && is_hex_groups(gids[0], 8))
      << "GID[  0] = " << gids[0] << ": an IB port's GID 0 is the link-local prefix plus the port GUID, "
      << "printed in hex groups without a RoCE suffix";
}

TEST_F(IbvDevinfo, InfiniBandAutomaticAddressGivesAUnicastLid) {
  ProcessResult r;
  DevinfoDevice d;
  ASSERT_NO_FATAL_FAILURE(one_device({}, client_env().set("SOFTVERBS_LINK_LAYER", "ib"), &d, &r));
  EXPECT_EQ(d.get("link_layer"), "InfiniBand") << r.describe();
  int lid = std::atoi(d.get("port_lid").c_str());
  EXPECT_GT(lid, 0) << r.describe();
  EXPECT_LT(lid, 0xc000) << "not a unicast LID\n" << r.describe();
}

TEST_F(IbvDevinfo, SelectsTheSecondOfTwoDevices) {
  ProcessResult r;
  DevinfoDevice d;
  ASSERT_NO_FATAL_FAILURE(one_device({"-d", "emu1"}, client_env().set("SOFTVERBS_DEVICES", "2"), &d, &r));
  EXPECT_EQ(d.hca_id, "emu1") << r.describe();
  EXPECT_EQ(d.get("state"), "PORT_ACTIVE (4)");
}

TEST_F(IbvDevinfo, WithoutDeviceArgumentDescribesEveryDevice) {
  ProcessResult r = run_tool({kIbvDevinfo}, client_env().set("SOFTVERBS_DEVICES", "2"));
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  auto devs = parse_devinfo(r.out);
  ASSERT_EQ(devs.size(), 2u) << r.describe();
  EXPECT_EQ(devs[0].hca_id, "emu0");
  EXPECT_EQ(devs[1].hca_id, "emu1");
  EXPECT_NE(devs[0].get("node_guid"), devs[1].get("node_guid"));
}

TEST_F(IbvDevinfo, ListOption) {
  ProcessResult r = run_tool({kIbvDevinfo, "-l"}, client_env().set("SOFTVERBS_DEVICES", "2"));
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  EXPECT_EQ(r.out, "2 HCAs found:\n\temu0\n\temu1\n\n") << r.describe();
}

TEST_F(IbvDevinfo, UnknownDeviceFailsLikeRdmaCore) {
  // devinfo.c: fprintf(stderr, "IB device '%s' wasn't found\n") and main returns -1.
  ProcessResult r = run_tool({kIbvDevinfo, "-d", "nosuch"}, client_env());
  EXPECT_TRUE(r.exited_with(255)) << r.describe();
  EXPECT_EQ(r.out, "") << r.describe();
  EXPECT_EQ(r.err, "IB device 'nosuch' wasn't found\n") << r.describe();
}

TEST_F(IbvDevinfo, NoDevices) {
  ProcessResult r = run_tool({kIbvDevinfo}, client_env().set("SOFTVERBS_DEVICES", "0"));
  EXPECT_TRUE(r.exited_with(255)) << r.describe();
  EXPECT_EQ(r.err, "No IB devices found\n") << r.describe();
}

TEST(IbverbsUtils, DevicesAndDevinfoShowTheSameNodeGuid) {
  // ibv_devices prints be64toh(ibv_get_device_guid()), ibv_devinfo the node_guid of
  // ibv_query_device (big-endian in the struct): two paths to the same 64 bits.
  ASSERT_TRUE(installed(kIbvDevices, "ibverbs-utils"));
  ASSERT_TRUE(installed(kIbvDevinfo, "ibverbs-utils"));
  Env env = client_env().set("SOFTVERBS_DEVICES", "emu0@127.1.9.12");
  ProcessResult list = run_tool({kIbvDevices}, env);
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(list));
  auto devs = parse_ibv_devices(list.out);
  ASSERT_EQ(devs.size(), 1u) << list.describe();
  ProcessResult info = run_tool({kIbvDevinfo}, env);
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(info));
  auto blocks = parse_devinfo(info.out);
  ASSERT_EQ(blocks.size(), 1u) << info.describe();
  std::string grouped = blocks[0].get("node_guid");
  std::string plain;
  for (char c : grouped)
    if (c != ':') plain += c;
  EXPECT_EQ(plain, devs[0].guid) << list.describe() << "\n" << info.describe();
}

TEST(Launcher, RunsDevinfoOnOurLibrary) {
  ASSERT_TRUE(installed(kIbvDevinfo, "ibverbs-utils"));
  ASSERT_EQ(::access(kLauncher, X_OK), 0) << kLauncher << " is missing or not executable";
  // No LD_LIBRARY_PATH from the test: the launcher provides it. rdma-core's own library
  // finds no device here, so an emulated device in the output proves ours was loaded.
  ProcessResult r = run_client({kLauncher, "run", "--", "ibv_devinfo", "-v"}, clean_env());
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  auto devs = parse_devinfo(r.out);
  ASSERT_EQ(devs.size(), 1u) << r.describe();
  EXPECT_EQ(devs[0].hca_id, "emu0");
  EXPECT_EQ(devs[0].get("state"), "PORT_ACTIVE (4)");
  EXPECT_EQ(devs[0].get("link_layer"), "Ethernet");
  EXPECT_TRUE(devs[0].has("board_id")) << r.describe();
  EXPECT_TRUE(devs[0].gids().count(1)) << r.describe();
}

TEST(Launcher, PassesSoftverbsVariablesThrough) {
  ASSERT_TRUE(installed(kIbvDevinfo, "ibverbs-utils"));
  ASSERT_EQ(::access(kLauncher, X_OK), 0) << kLauncher << " is missing or not executable";
  ProcessResult r = run_client({kLauncher, "run", "--", kIbvDevinfo, "-l"}, clean_env().set("SOFTVERBS_DEVICES", "3"));
  ASSERT_NO_FATAL_FAILURE(expect_clean_success(r));
  EXPECT_EQ(r.out, "3 HCAs found:\n\temu0\n\temu1\n\temu2\n\n") << r.describe();
}

TEST(Loader, UtilsResolveLibibverbsToOurs) {
  // ld.so in list mode (what ldd does): which file satisfies each DT_NEEDED.
  for (const char* tool : {kIbvDevices, kIbvDevinfo}) {
    ASSERT_TRUE(installed(tool, "ibverbs-utils"));
    ProcessResult r = run_client({tool}, client_env().set("LD_TRACE_LOADED_OBJECTS", "1"));
    EXPECT_TRUE(r.exited_with(0)) << r.describe();
    EXPECT_NE(r.out.find(std::string("libibverbs.so.1 => ") + kLibDir + "/libibverbs.so.1"), std::string::npos)
        << r.describe();
    EXPECT_TRUE(loader_errors(r.err).empty()) << r.describe();
  }
}

}  // namespace
}  // namespace softverbs::test

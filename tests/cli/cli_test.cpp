// The `softverbs` command (tools/softverbs.cpp, docs/configuration.md
// "Launcher"): each command, each way of giving it bad input (one line on
// stderr, exit status 2; 1 for an invalid scenario under `faults check`; 127
// for a command that is not found), the environment `run` gives the command,
// and the words `devices`, `faults check` and `trace` print.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "faults/scenario.hpp"
#include "gtest/gtest.h"
#include "tests/support/process.hpp"
#include "tools/describe.hpp"

namespace softverbs::test {
namespace {

using namespace std::chrono_literals;

// The environment without softverbs' variables, so that the caller's do not leak in.
Env clean_env() { return Env::inherit().unset_prefix("SOFTVERBS_").unset("LD_LIBRARY_PATH"); }

ProcessResult cli(std::vector<std::string> args, const Env& env = clean_env()) {
  args.insert(args.begin(), SV_CLI);
  return run(std::move(args), env, 20s);
}

// Bad input: a non-zero status and exactly one line, "softverbs: ...", on stderr.
void expect_one_line_error(const ProcessResult& r, int status, const std::string& containing) {
  EXPECT_TRUE(r.exited_with(status)) << r.describe();
  EXPECT_EQ(r.err.rfind("softverbs: ", 0), 0u) << r.describe();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.describe();
  EXPECT_NE(r.err.find(containing), std::string::npos) << "expected '" << containing << "' in: " << r.describe();
  EXPECT_EQ(r.out, "") << r.describe();
}

std::string temp_file(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir() + "softverbs-cli-" + std::to_string(::getpid()) + "-" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Cli, HelpOfEveryCommand) {
  ProcessResult top = cli({"--help"});
  ASSERT_TRUE(top.exited_with(0)) << top.describe();
  for (const char* command : {"run", "devices", "sysfs", "faults", "trace", "env", "libdir"})
    EXPECT_NE(top.out.find(command), std::string::npos) << command << " missing from: " << top.out;
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"run", "--help"}, {"devices", "--help"}, {"sysfs", "--help"}, {"faults", "--help"}, {"faults", "check", "--help"},
           {"trace", "--help"}, {"env", "--help"}, {"libdir", "--help"}}) {
    ProcessResult r = cli(args);
    EXPECT_TRUE(r.exited_with(0)) << r.describe();
    EXPECT_NE(r.out.find("Usage: softverbs " + args[0]), std::string::npos) << r.describe();
  }
  ProcessResult run_help = cli({"run", "--help"});
  for (const char* option : {"--devices", "--faults", "--pcap", "--log", "--no-sysfs"})
    EXPECT_NE(run_help.out.find(option), std::string::npos) << option << " missing from: " << run_help.out;
}

TEST(Cli, Version) {
  ProcessResult r = cli({"--version"});
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, std::string(SV_VERSION) + "\n");
}

TEST(Cli, UnknownCommand) { expect_one_line_error(cli({"bogus"}), 2, "unknown command 'bogus'"); }

TEST(Cli, NoCommand) { expect_one_line_error(cli({}), 2, "subcommand is required"); }

TEST(Cli, UnknownOption) {
  expect_one_line_error(cli({"run", "--bogus", "true"}), 2, "--bogus");
  expect_one_line_error(cli({"devices", "--bogus"}), 2, "--bogus");
  expect_one_line_error(cli({"--bogus"}), 2, "--bogus");
}

TEST(Cli, BadDevices) {
  expect_one_line_error(cli({"run", "--devices", "a@1.2.3", "--", "true"}), 2,
                        "--devices: SOFTVERBS_DEVICES: '1.2.3' is not an IPv4 address");
  expect_one_line_error(cli({"devices", "--devices", "a,a"}), 2, "device name 'a' appears twice");
  expect_one_line_error(cli({"devices"}, clean_env().set("SOFTVERBS_DEVICES", "99")), 2,
                        "the number of devices must be 0..64");
}

TEST(Cli, BadLog) {
  expect_one_line_error(cli({"run", "--log", "loud", "--", "true"}), 2, "--log: loud not in");
}

TEST(Cli, BadScenarioFile) {
  std::string bad = temp_file("bad.toml", "[[rule]]\naction = \"explode\"\n");
  expect_one_line_error(cli({"run", "--faults", bad, "--", "true"}), 2, "--faults: " + bad + ": rule 1");
  expect_one_line_error(cli({"faults", "check", bad}), 1, bad + ": rule 1");
  expect_one_line_error(cli({"faults", "check", bad + ".missing"}), 1, "cannot read");
  expect_one_line_error(cli({"faults", "check"}), 2, "FILE is required");
  std::filesystem::remove(bad);
}

TEST(Cli, MissingCommand) {
  expect_one_line_error(cli({"run"}), 2, "no command given");
  expect_one_line_error(cli({"run", "--devices", "2", "--"}), 2, "no command given");
}

TEST(Cli, CommandNotFound) {
  expect_one_line_error(cli({"run", "--", "softverbs-no-such-program"}), 127,
                        "softverbs-no-such-program: No such file or directory");
}

TEST(Cli, RunSetsTheEnvironment) {
  // Relative to the working directory, to see it made absolute.
  std::string faults = std::filesystem::relative(SV_DROP_SCENARIO).string();
  ProcessResult r = cli({"run", "--devices", "a@127.0.0.9/ib", "--faults", faults, "--pcap", "x-%p.pcap", "--log",
                         "debug", "--", "sh", "-c",
                         "echo \"$LD_LIBRARY_PATH|$SOFTVERBS_DEVICES|$SOFTVERBS_FAULTS|$SOFTVERBS_PCAP|$SOFTVERBS_LOG\""},
                        clean_env().set("LD_LIBRARY_PATH", "/elsewhere"));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  std::string scenario = std::filesystem::absolute(faults).lexically_normal().string();
  EXPECT_EQ(r.out, std::string(SV_LIB_DIR) + ":/elsewhere|a@127.0.0.9/ib|" + scenario + "|x-%p.pcap|debug\n");
}

TEST(Cli, RunWithoutOptionsAsBefore) {
  // `run -- CMD` and `run CMD`: only LD_LIBRARY_PATH changes (and
  // SOFTVERBS_AUTO_ADDRS, with the sysfs view: sysfs_view_test.cpp), and the
  // command's own arguments reach it untouched even when they look like the launcher's.
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"run", "--", "env"}, {"run", "env"}}) {
    ProcessResult r = cli(args, clean_env().set("SOFTVERBS_DEVICES", "3"));
    EXPECT_TRUE(r.exited_with(0)) << r.describe();
    EXPECT_NE(r.out.find("\nLD_LIBRARY_PATH=" + std::string(SV_LIB_DIR) + "\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("\nSOFTVERBS_DEVICES=3\n"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("SOFTVERBS_LOG"), std::string::npos) << r.out;
  }
  ProcessResult r = cli({"run", "sh", "-c", "echo \"$*\"", "sh", "--devices", "x@y", "--", "--log"});
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, "--devices x@y -- --log\n");
  ProcessResult status = cli({"run", "--", "sh", "-c", "exit 7"});
  EXPECT_TRUE(status.exited_with(7)) << status.describe();
}

TEST(Cli, LibdirOfTheBuildTree) {
  ProcessResult r = cli({"libdir"});
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, std::string(SV_LIB_DIR) + "\n");
  ProcessResult overridden = cli({"libdir"}, clean_env().set("SOFTVERBS_LIBDIR", "/opt/x/lib"));
  EXPECT_EQ(overridden.out, "/opt/x/lib\n");
  ProcessResult env = cli({"env"});
  EXPECT_TRUE(env.exited_with(0)) << env.describe();
  EXPECT_EQ(env.out, "export LD_LIBRARY_PATH=\"" + std::string(SV_LIB_DIR) + "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\"\n");
}

TEST(Cli, DoesNotLinkLibibverbs) {
  ProcessResult r = run({"/usr/bin/readelf", "-d", SV_CLI}, clean_env(), 20s);
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_NE(r.out.find("NEEDED"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("libibverbs"), std::string::npos) << r.out;
}

TEST(Cli, DevicesFromOptionAndEnvironment) {
  ProcessResult r = cli({"devices", "--devices", "a@127.0.0.10,b/ib"}, clean_env().set("SOFTVERBS_MTU", "1024"));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_NE(r.out.find("SOFTVERBS_DEVICES=a@127.0.0.10,b/ib (--devices): 2 devices\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  a: Ethernet (RoCEv2), MTU 1024, fixed address 127.0.0.10"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  b: InfiniBand, MTU 1024, automatic address"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("UDP port 4791 bound on this host now:"), std::string::npos) << r.out;

  ProcessResult e = cli({"devices"}, clean_env().set("SOFTVERBS_DEVICES", "2").set("SOFTVERBS_LINK_LAYER", "ib"));
  EXPECT_TRUE(e.exited_with(0)) << e.describe();
  EXPECT_NE(e.out.find("SOFTVERBS_DEVICES=2 (environment): 2 devices\n"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("  emu1: InfiniBand, MTU 4096, automatic address"), std::string::npos) << e.out;

  ProcessResult d = cli({"devices"});
  EXPECT_NE(d.out.find("SOFTVERBS_DEVICES unset or empty (means 1): 1 device\n  emu0:"), std::string::npos) << d.out;
}

// Without SOFTVERBS_DEVICES, a topology's nodes are the devices, for the command
// as for the library; with both, the library's check applies.
TEST(Cli, DevicesFromATopology) {
  ProcessResult r = cli({"devices"}, clean_env().set("SOFTVERBS_TOPOLOGY", SV_TOPOLOGY_PAIRS));
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_NE(r.out.find(std::string("SOFTVERBS_TOPOLOGY=") + SV_TOPOLOGY_PAIRS + " (environment: its nodes): 8 devices\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  mtu_b: Ethernet (RoCEv2)"), std::string::npos) << r.out;
  ProcessResult bad = cli({"devices"}, clean_env().set("SOFTVERBS_TOPOLOGY", SV_TOPOLOGY_PAIRS).set("SOFTVERBS_DEVICES", "2"));
  EXPECT_TRUE(bad.exited_with(2)) << bad.describe();
}

TEST(Cli, DevicesShowsATakenAddress) {
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(4791);
  ::inet_pton(AF_INET, "127.0.0.213", &sa.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    GTEST_SKIP() << "127.0.0.213:4791 is in use";
  }
  ProcessResult r = cli({"devices", "--devices", "x@127.0.0.213"});
  ::close(fd);
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_NE(r.out.find("fixed address 127.0.0.213 (UDP port 4791 is taken there now"), std::string::npos) << r.out;
  std::string bound = r.out.substr(r.out.find("UDP port 4791 bound on this host now:"));
  EXPECT_NE(bound.find(" 127.0.0.213"), std::string::npos) << r.out;
}

TEST(Cli, FaultsCheckInWords) {
  ProcessResult r = cli({"faults", "check", SV_DROP_SCENARIO});
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, std::string(SV_DROP_SCENARIO) + ": valid, 1 rule\n" +
                       "rule drop-1pct: on packets of any device, any direction, with probability 0.01: drop\n");
  EXPECT_EQ(r.err, "");
}

TEST(Cli, RuleWords) {
  faults::Scenario s;
  std::string error;
  ASSERT_TRUE(faults::parse_scenario(R"(seed = 4
[[rule]]
name = "nak-3"
direction = "rx"
device = "emu1"
class = "send"
nth = 3
action = "nak"
[[rule]]
verb = "post_send"
opcode = "IBV_WR_RDMA_WRITE"
every = 2
count = 5
action = "fail"
errno = "ENOMEM"
[[rule]]
at_ms = 100
action = "port_down"
duration_ms = 50
[[rule]]
name = "lose-rep"
cm = "rep"
direction = "tx"
count = 1
action = "drop"
[[rule]]
name = "primary-path"
direction = "tx"
mig_req = false
action = "drop"
)",
                                     0, &s, &error))
      << error;
  ASSERT_EQ(s.rules.size(), 5u);
  EXPECT_EQ(tools::describe_rule(s.rules[0]),
            "rule nak-3: on packets of device emu1, received (rx), class send, on match number 3: nak with syndrome 0x60");
  EXPECT_EQ(tools::describe_rule(s.rules[1]),
            "rule rule2: on post_send of any device, opcode IBV_WR_RDMA_WRITE, on every 2th match, at most 5 times: "
            "fail with ENOMEM");
  EXPECT_EQ(tools::describe_rule(s.rules[2]),
            "rule rule3: on a timer, 100 ms after loading, for any device, once: port_down on port 1, up again after "
            "50 ms");
  EXPECT_EQ(tools::describe_rule(s.rules[3]),
            "rule lose-rep: on packets of any device, sent (tx), CM REP MADs (UD SEND ONLY to QP 1, class 0x07), at "
            "most 1 times: drop");
  EXPECT_EQ(tools::describe_rule(s.rules[4]),
            "rule primary-path: on packets of any device, sent (tx), MigReq 0 (path migration armed), on every match: drop");
}

TEST(Cli, RocePortsFromProcNetUdp) {
  const char* text =
      "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n"
      "  12: 0A00007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0 0\n"
      "  13: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0 0\n"
      "  14: 00000000:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0 0\n"
      "  15: 0A00007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0 0\n";
  std::vector<in_addr> bound = tools::roce_ports_bound(text);
  ASSERT_EQ(bound.size(), 2u);
  EXPECT_EQ(tools::to_string(bound[0]), "127.0.0.10");
  EXPECT_EQ(tools::to_string(bound[1]), "0.0.0.0");
}

// A small trace as SOFTVERBS_TRACE writes it: one QP of device d0 posts two
// sends; the first's packet is lost, resent after an ACK timeout, and both complete.
constexpr const char* kTrace = R"({"displayTimeUnit":"ns","traceEvents":[
{"name":"process_name","cat":"__metadata","ph":"M","ts":0.000,"pid":1,"tid":0,"args":{"name":"d0"}},
{"name":"create_qp","cat":"verb","ph":"i","s":"t","ts":1.000,"pid":1,"tid":7,"args":{"dev":"d0","qpn":7}},
{"name":"post_send","cat":"wr","ph":"i","s":"t","ts":10.000,"pid":1,"tid":7,"args":{"dev":"d0","qpn":7,"wr":1,"wr_id":5,"opcode":"SEND","len":8}},
{"name":"wr","cat":"wr","ph":"s","ts":10.000,"pid":1,"tid":7,"id":1},
{"name":"RC_SEND_ONLY","cat":"packet","ph":"i","s":"t","ts":11.000,"pid":1,"tid":7,"args":{"dev":"d0","dir":"tx","qpn":7,"dqpn":9,"psn":0,"opcode":"RC_SEND_ONLY","len":40,"fault":"drop"}},
{"name":"ack_timeout fired","cat":"timer","ph":"i","s":"t","ts":20.000,"pid":1,"tid":7,"args":{"dev":"d0","qpn":7,"timer":"ack_timeout","what":"fired"}},
{"name":"RC_SEND_ONLY","cat":"packet","ph":"i","s":"t","ts":21.000,"pid":1,"tid":7,"args":{"dev":"d0","dir":"tx","qpn":7,"dqpn":9,"psn":0,"opcode":"RC_SEND_ONLY","len":40,"fault":"none","frame":1}},
{"name":"RC_ACKNOWLEDGE","cat":"packet","ph":"i","s":"t","ts":25.000,"pid":1,"tid":7,"args":{"dev":"d0","dir":"rx","qpn":7,"dqpn":7,"psn":0,"opcode":"RC_ACKNOWLEDGE","len":20,"fault":"none"}},
{"name":"completion","cat":"wr","ph":"i","s":"t","ts":30.000,"pid":1,"tid":7,"args":{"dev":"d0","qpn":7,"wr":1,"wr_id":5,"status":"IBV_WC_SUCCESS","opcode":"SEND","byte_len":0}},
{"name":"wr","cat":"wr","ph":"f","ts":30.000,"pid":1,"tid":7,"id":1,"bp":"e"},
{"name":"post_send","cat":"wr","ph":"i","s":"t","ts":40.000,"pid":1,"tid":7,"args":{"dev":"d0","qpn":7,"wr":2,"wr_id":6,"opcode":"SEND","len":8}},
{"name":"completion","cat":"wr","ph":"i","s":"t","ts":140.000,"pid":1,"tid":7,"args":{"dev":"d0","qpn":7,"wr":2,"wr_id":6,"status":"IBV_WC_RETRY_EXC_ERR","opcode":"SEND","byte_len":0}},
{"name":"IBV_EVENT_PORT_ERR","cat":"event","ph":"i","s":"t","ts":150.000,"pid":1,"tid":0,"args":{"dev":"d0","kind":"async"}}
]}
)";

TEST(Cli, TraceSummary) {
  ProcessResult r = cli({"trace", temp_file("trace.json", kTrace)});
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out,
            "12 records, 1 device, 1.000 to 150.000 us\n"
            "d0:\n"
            "  events: IBV_EVENT_PORT_ERR 1\n"
            "d0 QP 7:\n"
            "  verbs: create_qp 1\n"
            "  posted: SEND 2\n"
            "  packets: sent 2, received 1, retransmitted 1\n"
            "  faults: drop 1\n"
            "  timers: ack_timeout fired 1\n"
            "  timeouts: 1, rnr waits: 0\n"
            "  completions: IBV_WC_RETRY_EXC_ERR 1, IBV_WC_SUCCESS 1\n"
            "  latency post->completion (us): n 2, p50 20.000, p90 100.000, p99 100.000, max 100.000\n");
}

TEST(Cli, TraceFilters) {
  const std::string file = temp_file("filter.json", kTrace);
  ProcessResult r = cli({"trace", "--kind", "packet", "--from", "20", "--to", "30", "--records", file});
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out,
            "      21.000  d0  QP 7  packet  RC_SEND_ONLY dir=tx dqpn=9 fault=none frame=1 len=40 opcode=RC_SEND_ONLY "
            "psn=0\n"
            "      25.000  d0  QP 7  packet  RC_ACKNOWLEDGE dir=rx dqpn=7 fault=none len=20 opcode=RC_ACKNOWLEDGE psn=0\n");
  r = cli({"trace", "--qp", "8", "--records", file});
  EXPECT_TRUE(r.exited_with(0) && r.out.empty()) << r.describe();
  r = cli({"trace", "--device", "d0", "--kind", "event", file});
  EXPECT_EQ(r.out, "1 records, 1 device, 150.000 to 150.000 us\nd0:\n  events: IBV_EVENT_PORT_ERR 1\n");
  // A filtered trace keeps the track names and the matching records as written.
  const std::string out = testing::TempDir() + "softverbs-cli-" + std::to_string(::getpid()) + "-wr.json";
  r = cli({"trace", "--kind", "wr", "--to", "35", "-o", out, file});
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(R"("name":"process_name")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("ph":"s","ts":10.000)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("ph":"f","ts":30.000)"), std::string::npos) << text;
  EXPECT_EQ(text.find("RC_SEND_ONLY"), std::string::npos) << text;
  EXPECT_EQ(text.find("IBV_WC_RETRY_EXC_ERR"), std::string::npos) << text;
  r = cli({"trace", out});
  EXPECT_NE(r.out.find("  completions: IBV_WC_SUCCESS 1\n"), std::string::npos) << r.describe();
  std::filesystem::remove(out);
}

// A trace another tool wrote need not put one record on a line: it reads the same.
TEST(Cli, TraceOtherLayout) {
  std::string flat = kTrace;
  std::replace(flat.begin(), flat.end(), '\n', ' ');
  ProcessResult one = cli({"trace", temp_file("lines.json", kTrace)});
  ProcessResult r = cli({"trace", temp_file("flat.json", flat)});
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, one.out);
  // Pretty-printed, with the array opened on the first line and a record over several lines.
  std::string pretty = kTrace;
  pretty.replace(pretty.find("\n{\"name\":\"process_name\""), 9, "\n{\n  \"name\":\n");
  r = cli({"trace", temp_file("pretty.json", pretty)});
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, one.out);
  // Members after the array.
  std::string more = kTrace;
  more.replace(more.rfind("]}"), 2, "],\n\"otherData\":{\"x\":1}}");
  r = cli({"trace", temp_file("more.json", more)});
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.out, one.out);
}

TEST(Cli, TraceBadInput) {
  expect_one_line_error(cli({"trace", "/nonexistent/trace.json"}), 1, "cannot read /nonexistent/trace.json");
  expect_one_line_error(cli({"trace", temp_file("half.json", R"({"traceEvents":[{"name":"x",)")}), 1, "not JSON");
  expect_one_line_error(cli({"trace", temp_file("other.json", R"({"events":[]})")}), 1, "not a trace");
  // The line layout the writer uses, broken after the first record or left open.
  expect_one_line_error(cli({"trace", temp_file("mid.json", "{\"traceEvents\":[\n{\"name\":\"a\"},\n{\"name\":\n]}\n")}),
                        1, "not JSON");
  expect_one_line_error(cli({"trace", temp_file("open.json", "{\"traceEvents\":[\n{\"name\":\"a\"},\n")}), 1,
                        "not JSON");
  expect_one_line_error(cli({"trace", temp_file("tail.json", "{\"traceEvents\":[\n{\"name\":\"a\"}\n]} x\n")}), 1,
                        "not JSON");
  expect_one_line_error(cli({"trace", temp_file("scalar.json", "{\"traceEvents\":[\n1\n]}\n")}), 1, "not an object");
  expect_one_line_error(cli({"trace", "--kind", "packets", temp_file("t.json", kTrace)}), 2, "--kind");
  expect_one_line_error(cli({"trace", "--records", "-o", "x.json", temp_file("t.json", kTrace)}), 2, "excludes");
}

}  // namespace
}  // namespace softverbs::test

// Debian's pyverbs (python3-pyverbs, Cython modules linked BIND_NOW against
// libibverbs.so.1, librdmacm.so.1, libmlx5.so.1 and libefa.so.1) on our library.
// Only the system interpreter has it: /usr/bin/python3, not whatever python3 is on PATH.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdlib.h>

#include <map>
#include <sstream>
#include <string>

#include "tests/clients/clients.hpp"

namespace softverbs::test {
namespace {

constexpr const char* kPython = "/usr/bin/python3";
constexpr const char* kPyverbsInit = "/usr/lib/python3/dist-packages/pyverbs/__init__.py";

class Pyverbs : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(installed(kPython, "python3"));
    ASSERT_EQ(::access(kPyverbsInit, R_OK), 0)
        << kPyverbsInit << " is missing: install the Debian package python3-pyverbs (apt-get install python3-pyverbs)";
  }
};

// key=value lines.
std::map<std::string, std::string> parse_values(const std::string& out) {
  std::map<std::string, std::string> values;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) values[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return values;
}

// The number printed for key, or -1 when it is missing or not a number.
long number(const std::map<std::string, std::string>& values, const std::string& key) {
  auto it = values.find(key);
  if (it == values.end() || it->second.empty()) return -1;
  char* end = nullptr;
  long n = std::strtol(it->second.c_str(), &end, 10);
  return *end == '\0' ? n : -1;
}

TEST_F(Pyverbs, ModulesImport) {
  ProcessResult r =
      run_client({kPython, "-c",
                  "import pyverbs.device, pyverbs.pd, pyverbs.cq, pyverbs.qp, pyverbs.mr, pyverbs.srq, "
                  "pyverbs.addr, pyverbs.cmid, pyverbs.providers.mlx5.mlx5dv, pyverbs.providers.efa.efadv"},
                 client_env());
  EXPECT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_TRUE(loader_errors(r.err).empty()) << join_lines(loader_errors(r.err));
  EXPECT_EQ(r.err, "") << r.describe();
}

constexpr const char* kControlPathScript = R"(
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.pd import PD
from pyverbs.mr import MR
from pyverbs.cq import CQ
from pyverbs.qp import QP, QPInitAttr, QPCap

def out(key, value):
    print(f"{key}={value}", flush=True)

with open("/proc/self/maps") as maps:
    paths = {line.split()[-1] for line in maps if line.rstrip().endswith("libibverbs.so.1")}
out("libibverbs", ",".join(sorted(paths)))
out("devices", ",".join(dev.name.decode() for dev in d.get_device_list()))

ctx = d.Context(name="emu0")
attr = ctx.query_device()
out("phys_port_cnt", attr.phys_port_cnt)
out("max_qp", attr.max_qp)
out("max_cqe", attr.max_cqe)
out("node_guid_set", int(attr.node_guid != 0))
attr_ex = ctx.query_device_ex()
out("ex_matches", int(attr_ex.orig_attr.max_qp == attr.max_qp and attr_ex.phys_port_cnt_ex == attr.phys_port_cnt))
port = ctx.query_port(1)
out("port_state", port.state)
out("link_layer", port.link_layer)
out("gid_tbl_len", port.gid_tbl_len)
out("gid", ctx.query_gid(1, 1))
out("gid_type", ctx.query_gid_type(1, 1))
entry = ctx.query_gid_ex(1, 1)
out("gid_ex_type", entry.gid_type)
out("gid_ex", entry.gid_str())

pd = PD(ctx)
mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)
out("mr_length", mr.length)
out("mr_buf_set", int(mr.buf != 0))
out("mr_keys_set", int(mr.lkey != 0 or mr.rkey != 0))
cq = CQ(ctx, 16)
out("cqe", cq.cqe)
cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
out("qp_num", qp.qp_num)
out("qp_state", qp.qp_state)
out("qp_type", qp.qp_type)
qp.close()
cq.close()
mr.close()
pd.close()
ctx.close()
out("done", 1)
)";

TEST_F(Pyverbs, ControlPath) {
  ProcessResult r = run_client({kPython, "-c", kControlPathScript},
                               client_env().set("SOFTVERBS_DEVICES", "emu0@127.1.9.11"), kRunTimeout);
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  EXPECT_EQ(r.err, "") << r.describe();
  auto v = parse_values(r.out);
  ASSERT_EQ(v["done"], "1") << r.describe();

  char ours[PATH_MAX];
  std::string lib = std::string(kLibDir) + "/libibverbs.so.1";
  ASSERT_NE(::realpath(lib.c_str(), ours), nullptr) << lib;
  EXPECT_EQ(v["libibverbs"], ours) << "the interpreter must have loaded our library and only it";

  EXPECT_EQ(v["devices"], "emu0");
  EXPECT_EQ(v["phys_port_cnt"], "1");
  EXPECT_GT(number(v, "max_qp"), 0);
  EXPECT_GE(number(v, "max_cqe"), 16);
  EXPECT_EQ(v["node_guid_set"], "1");
  EXPECT_EQ(v["ex_matches"], "1") << "query_device_ex (inline, through the verbs_context slot) disagrees with "
                                     "query_device";
  EXPECT_EQ(v["port_state"], std::to_string(IBV_PORT_ACTIVE));
  EXPECT_EQ(v["link_layer"], std::to_string(IBV_LINK_LAYER_ETHERNET));
  EXPECT_GE(number(v, "gid_tbl_len"), 2);
  // GID 1 is the device address 127.1.9.11 as an IPv4-mapped RoCEv2 GID.
  EXPECT_EQ(v["gid"], "0000:0000:0000:0000:0000:ffff:7f01:090b");
  EXPECT_EQ(v["gid_ex"], v["gid"]);
  EXPECT_EQ(v["gid_type"], "1") << "ibv_query_gid_type: IBV_GID_TYPE_SYSFS_ROCE_V2";
  EXPECT_EQ(v["gid_ex_type"], std::to_string(IBV_GID_TYPE_ROCE_V2));

  EXPECT_EQ(v["mr_length"], "4096");
  EXPECT_EQ(v["mr_buf_set"], "1");
  EXPECT_EQ(v["mr_keys_set"], "1");
  EXPECT_GE(number(v, "cqe"), 16);
  EXPECT_GT(number(v, "qp_num"), 1) << "QP numbers 0 and 1 are the special QPs";
  EXPECT_EQ(v["qp_state"], std::to_string(IBV_QPS_RESET));
  EXPECT_EQ(v["qp_type"], std::to_string(IBV_QPT_RC));
}

}  // namespace
}  // namespace softverbs::test

// The dynamic export table of our librdmacm.so.1 against rdma-core 44's
// (tests/abi/rdmacm_exports.txt, the distribution library's objdump -T; and the
// library itself where installed), and how it finds its libibverbs.so.1.
//
// What must hold:
//   - every symbol of the reference at its default version in its node, none
//     missing, and no other defined symbol (no C++ symbol, nothing unversioned);
//   - the nodes RDMACM_1.0 to 1.3 with rdma-core's parent chain, SONAME
//     librdmacm.so.1;
//   - DT_NEEDED libibverbs.so.1, and of libibverbs only the private
//     softverbs_private_cm_providers@SOFTVERBS_PRIVATE_0.1: the CM providers are
//     reached there, never copied in;
//   - loaded through the launcher's library directory (LD_LIBRARY_PATH, as
//     `softverbs run` sets it) or by its path alone, its libibverbs.so.1 is ours.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>

#include "tests/abi/elf_exports.hpp"

namespace {

constexpr const char* kOurs = SV_RDMACM_FILE;
constexpr const char* kReference = SV_RDMACM_REFERENCE;
constexpr const char* kReal = SV_REAL_RDMACM_FILE;

// name -> node of the reference table.
std::map<std::string, std::string> reference() {
  std::map<std::string, std::string> out;
  std::ifstream in(kReference);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string node, name;
    if (words >> node >> name && node != name) out[name] = node;
  }
  return out;
}

class RdmacmExports : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ours_ = new elf::ElfExports(elf::read_exports(kOurs)); }
  static void TearDownTestSuite() {
    delete ours_;
    ours_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(ours_->error.empty()) << kOurs << ": " << ours_->error; }
  static inline elf::ElfExports* ours_ = nullptr;
};

TEST_F(RdmacmExports, EverySymbolOfRdmaCore44InItsNodeAndNothingElse) {
  const auto ref = reference();
  ASSERT_EQ(ref.size(), 68u) << "could not read " << kReference;
  std::ostringstream diff;
  int problems = 0;
  std::set<std::string> seen;
  for (const elf::Symbol& s : ours_->defined) {
    if (s.ndx == "ABS") continue;  // the nodes' own symbols, checked below
    auto it = ref.find(s.name);
    if (it == ref.end()) {
      diff << "  extra:   " << s.describe() << "\n";
      ++problems;
    } else if (!s.is_default || s.version != it->second) {
      diff << "  version: " << s.describe() << ", reference @@" << it->second << "\n";
      ++problems;
    } else if (s.type != "FUNC" || s.bind != "GLOBAL" || s.vis != "DEFAULT") {
      diff << "  kind:    " << s.describe() << "\n";
      ++problems;
    }
    seen.insert(s.name);
  }
  for (const auto& [name, node] : ref)
    if (!seen.count(name)) {
      diff << "  missing: " << name << "@@" << node << "\n";
      ++problems;
    }
  EXPECT_EQ(problems, 0) << kOurs << " differs from " << kReference << ":\n" << diff.str();
}

TEST_F(RdmacmExports, VersionNodesAndSoname) {
  EXPECT_EQ(ours_->soname, "librdmacm.so.1");
  const std::vector<std::string> order = {"librdmacm.so.1", "RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"};
  EXPECT_EQ(ours_->node_order, order);
  EXPECT_TRUE(ours_->nodes["RDMACM_1.0"].parents.empty());
  EXPECT_EQ(ours_->nodes["RDMACM_1.1"].parents, std::vector<std::string>{"RDMACM_1.0"});
  EXPECT_EQ(ours_->nodes["RDMACM_1.2"].parents, std::vector<std::string>{"RDMACM_1.1"});
  EXPECT_EQ(ours_->nodes["RDMACM_1.3"].parents, std::vector<std::string>{"RDMACM_1.2"});
  // Each node's own symbol (readelf prints it unversioned).
  std::set<std::string> abs;
  for (const elf::Symbol& s : ours_->defined)
    if (s.ndx == "ABS") abs.insert(s.key());
  EXPECT_EQ(abs, (std::set<std::string>{"RDMACM_1.0", "RDMACM_1.1", "RDMACM_1.2", "RDMACM_1.3"}));
}

TEST_F(RdmacmExports, SameTableAsTheInstalledRdmaCore) {
  struct stat st {};
  if (::stat(kReal, &st) != 0) GTEST_SKIP() << kReal << " is not installed (librdmacm1)";
  const elf::ElfExports real = elf::read_exports(kReal);
  ASSERT_TRUE(real.error.empty()) << real.error;
  std::set<std::string> ours_keys, real_keys;
  for (const elf::Symbol& s : ours_->defined) ours_keys.insert(s.key());
  for (const elf::Symbol& s : real.defined)
    if (s.is_default || s.ndx == "ABS") real_keys.insert(s.key());
  EXPECT_EQ(ours_keys, real_keys);
  EXPECT_EQ(ours_->nodes, real.nodes);
}

TEST_F(RdmacmExports, NeedsLibibverbsAndOnlyItsPrivateCmEntry) {
  EXPECT_NE(std::find(ours_->needed.begin(), ours_->needed.end(), "libibverbs.so.1"), ours_->needed.end())
      << "DT_NEEDED libibverbs.so.1 is missing";
  // The CM goes through the private entry; rsockets are a library over the
  // public verbs, and call only exports rdma-core 44's librdmacm imports too,
  // at the same versions (the rest of the data path is inline in verbs.h).
  const std::set<std::string> rsocket_verbs = {"ibv_ack_cq_events@IBVERBS_1.1",
                                               "ibv_alloc_pd@IBVERBS_1.1",
                                               "ibv_create_ah@IBVERBS_1.1",  // datagram rsockets
                                               "ibv_create_comp_channel@IBVERBS_1.0",
                                               "ibv_create_cq@IBVERBS_1.1",
                                               "ibv_dealloc_pd@IBVERBS_1.1",
                                               "ibv_dereg_mr@IBVERBS_1.1",
                                               "ibv_destroy_ah@IBVERBS_1.1",  // datagram rsockets
                                               "ibv_destroy_comp_channel@IBVERBS_1.0",
                                               "ibv_destroy_cq@IBVERBS_1.1",
                                               "ibv_get_cq_event@IBVERBS_1.1",
                                               "ibv_query_device@IBVERBS_1.1",
                                               "ibv_query_gid@IBVERBS_1.1",   // datagram rsockets
                                               "ibv_query_port@IBVERBS_1.1",  // datagram rsockets
                                               "ibv_reg_mr@IBVERBS_1.1"};
  std::set<std::string> private_entries;
  for (const elf::Symbol& s : ours_->undefined) {
    if (s.name.rfind("ibv_", 0) == 0)
      EXPECT_TRUE(rsocket_verbs.count(s.key())) << "a verb rsockets do not use is called directly: " << s.key();
    else if (s.version.rfind("SOFTVERBS", 0) == 0 || s.version.rfind("IBVERBS", 0) == 0)
      private_entries.insert(s.key());
  }
  EXPECT_EQ(private_entries, std::set<std::string>{"softverbs_private_cm_providers@SOFTVERBS_PRIVATE_0.1"});
}

// Runs the probe, which loads `what` with dlopen and prints where
// rdma_create_event_channel and libibverbs' ibv_get_device_list came from.
std::map<std::string, std::string> probe(const std::string& command) {
  std::map<std::string, std::string> out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return out;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    std::string l(line);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    auto eq = l.find('=');
    if (eq != std::string::npos) out[l.substr(0, eq)] = l.substr(eq + 1);
  }
  ::pclose(p);
  return out;
}

std::string real_path(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : path;
}

std::string our_dir() {
  std::string ours = real_path(kOurs);
  return ours.substr(0, ours.rfind('/'));
}

TEST(RdmacmLoading, ThroughTheLaunchersLibraryDirectoryBothLibrariesAreOurs) {
  // `softverbs run` prepends the library directory to LD_LIBRARY_PATH; the
  // program names only the soname.
  auto r = probe(std::string(SV_SOFTVERBS_CLI) + " run -- " + SV_RDMACM_PROBE + " librdmacm.so.1");
  EXPECT_EQ(r["rdmacm"], real_path(kOurs)) << r["error"];
  EXPECT_EQ(r["ibverbs"], real_path(our_dir() + "/libibverbs.so.1")) << r["error"];
}

TEST(RdmacmLoading, ByItsPathAloneItsRunPathFindsOurLibibverbs) {
  auto r = probe(std::string("env -u LD_LIBRARY_PATH ") + SV_RDMACM_PROBE + " " + kOurs);
  EXPECT_EQ(r["rdmacm"], real_path(kOurs)) << r["error"];
  EXPECT_EQ(r["ibverbs"], real_path(our_dir() + "/libibverbs.so.1")) << r["error"];
}

}  // namespace

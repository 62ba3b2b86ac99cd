// The dynamic export table of our libibverbs.so.1 compared with the distribution's
// rdma-core 44 library, read with readelf from both files.
//
// What must match, because the dynamic loader checks it for every BIND_NOW program:
//   - every default version (name@@NODE) of the real library, with the same symbol type;
//   - the version nodes and their parent chain, and the SONAME;
//   - the data object verbs_allow_disassociate_destroy (a 1-byte bool in .bss: libmlx5
//     and libefa write to it, so it cannot be a function);
// and nothing else may be exported. Hidden compatibility versions (name@NODE) of the
// real library are allowed but not required: only binaries linked against the 2006
// libibverbs 1.0 reference them.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/abi/elf_exports.hpp"

namespace {

constexpr const char* kOurs = SV_IBVERBS_FILE;
constexpr const char* kReal = SV_REAL_IBVERBS_FILE;
using elf::ElfExports;
using elf::kReadelf;
using elf::read_exports;
using elf::Symbol;

class ExportTable : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ours_ = std::make_unique<ElfExports>(read_exports(kOurs));
    struct stat st {};
    if (::stat(kReal, &st) != 0) {
      real_ = std::make_unique<ElfExports>();
      real_->error = std::string(kReal) +
                     " is missing: libibverbs1 (rdma-core's library, the reference) is not installed; "
                     "install the Debian package libibverbs1 (apt-get install libibverbs1)";
    } else {
      real_ = std::make_unique<ElfExports>(read_exports(kReal));
    }
  }
  static void TearDownTestSuite() {
    ours_.reset();
    real_.reset();
  }
  void SetUp() override {
    ASSERT_TRUE(real_->error.empty()) << real_->error;
    ASSERT_TRUE(ours_->error.empty()) << "our library " << kOurs << ": " << ours_->error;
  }

  static std::map<std::string, Symbol> by_key(const ElfExports& e) {
    std::map<std::string, Symbol> m;
    for (const Symbol& s : e.defined) m.emplace(s.key(), s);
    return m;
  }
  static std::map<std::string, Symbol> defaults_by_name(const ElfExports& e) {
    std::map<std::string, Symbol> m;
    for (const Symbol& s : e.defined)
      if (s.is_default && !is_own(s)) m.emplace(s.name, s);
    return m;
  }
  // softverbs' control API lives in a version node of its own, next to rdma-core's
  // (include/softverbs/faults.h); it is checked on its own below. So is the one
  // private function librdmacm.so.1 calls (core/cm_provider.hpp), in a node after it.
  static constexpr const char* kOwnNode = "SOFTVERBS_0.1";
  static constexpr const char* kPrivateNode = "SOFTVERBS_PRIVATE_0.1";
  static bool is_own(const Symbol& s) { return s.version == kOwnNode || s.version == kPrivateNode; }
  static bool is_own_node(const std::string& name) { return name == kOwnNode || name == kPrivateNode; }
  static const Symbol* find_default(const ElfExports& e, const std::string& name) {
    for (const Symbol& s : e.defined)
      if (s.is_default && s.name == name) return &s;
    return nullptr;
  }

  static inline std::unique_ptr<ElfExports> ours_;
  static inline std::unique_ptr<ElfExports> real_;
};

TEST_F(ExportTable, DefaultVersionsMatchNameByName) {
  auto real = defaults_by_name(*real_);
  auto ours = defaults_by_name(*ours_);
  std::ostringstream diff;
  int problems = 0;
  for (const auto& [name, r] : real) {
    auto it = ours.find(name);
    if (it == ours.end()) {
      diff << "  missing:  " << r.key() << " " << r.type << "\n";
      ++problems;
      continue;
    }
    const Symbol& o = it->second;
    if (o.version != r.version) {
      diff << "  version:  " << name << " is @@" << o.version << " in ours, @@" << r.version << " in the real one\n";
      ++problems;
    }
    if (o.type != r.type || o.bind != r.bind || o.vis != r.vis) {
      diff << "  kind:     " << name << " is " << o.type << " " << o.bind << " " << o.vis << " in ours, " << r.type
           << " " << r.bind << " " << r.vis << " in the real one\n";
      ++problems;
    }
  }
  for (const auto& [name, o] : ours) {
    if (!real.count(name)) {
      diff << "  extra:    " << o.key() << " " << o.type << "\n";
      ++problems;
    }
  }
  EXPECT_EQ(problems, 0) << "default-version exports of " << kOurs << " differ from " << kReal << ":\n" << diff.str();
  EXPECT_EQ(ours.size(), real.size());
}

TEST_F(ExportTable, NothingElseIsExported) {
  // Every defined symbol of ours must exist, with the same version binding, in the real
  // library: no stray C++ symbols, no unversioned globals, no invented versions.
  auto real = by_key(*real_);
  std::ostringstream diff;
  int problems = 0;
  for (const Symbol& o : ours_->defined) {
    if (is_own(o) && o.name.rfind("softverbs_", 0) == 0 && o.type == "FUNC" && o.bind == "GLOBAL") continue;
    if (o.ndx == "ABS" && is_own_node(o.name)) continue;
    if (o.name.rfind("_Z", 0) == 0) {
      diff << "  C++ symbol:     " << o.describe() << "\n";
      ++problems;
    } else if (o.version.empty() && !real.count(o.key())) {
      diff << "  unversioned:    " << o.describe() << "\n";
      ++problems;
    } else if (!real.count(o.key())) {
      diff << "  not in real:    " << o.describe() << "\n";
      ++problems;
    }
  }
  EXPECT_EQ(problems, 0) << kOurs << " exports symbols the real library does not:\n" << diff.str();
}

TEST_F(ExportTable, HiddenCompatVersionsAreOnlyThoseOfTheRealLibrary) {
  auto real = by_key(*real_);
  std::ostringstream diff;
  int problems = 0;
  for (const Symbol& o : ours_->defined) {
    if (o.is_default || o.version.empty()) continue;
    auto it = real.find(o.key());
    if (it == real.end()) {
      diff << "  " << o.describe() << "\n";
      ++problems;
    } else if (it->second.type != o.type) {
      diff << "  " << o.key() << " is " << o.type << ", real " << it->second.type << "\n";
      ++problems;
    }
  }
  EXPECT_EQ(problems, 0) << "hidden versions in ours that the real library does not have:\n" << diff.str();
}

TEST_F(ExportTable, VersionNodesAndParentChainMatch) {
  std::ostringstream diff;
  int problems = 0;
  for (const auto& [name, r] : real_->nodes) {
    auto it = ours_->nodes.find(name);
    if (it == ours_->nodes.end()) {
      diff << "  missing node " << name << "\n";
      ++problems;
      continue;
    }
    if (it->second.parents != r.parents) {
      auto join = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& p : v) s += (s.empty() ? "" : ",") + p;
        return s.empty() ? std::string("(none)") : s;
      };
      diff << "  node " << name << ": parent " << join(it->second.parents) << " in ours, " << join(r.parents)
           << " in the real one\n";
      ++problems;
    }
    if (it->second.flags != r.flags) {
      diff << "  node " << name << ": flags '" << it->second.flags << "' in ours, '" << r.flags
           << "' in the real one\n";
      ++problems;
    }
  }
  for (const auto& [name, o] : ours_->nodes) {
    if (is_own_node(name)) {
      EXPECT_TRUE(o.parents.empty()) << name << " must not inherit rdma-core's nodes";
      continue;
    }
    if (!real_->nodes.count(name)) {
      diff << "  extra node " << name << "\n";
      ++problems;
    }
  }
  EXPECT_FALSE(real_->nodes.empty()) << "no version definitions parsed from " << kReal;
  EXPECT_EQ(problems, 0) << "version definitions (" << kReadelf << " -V) differ:\n" << diff.str();
  std::vector<std::string> our_order = ours_->node_order;
  ASSERT_GE(our_order.size(), 2u);
  EXPECT_EQ(our_order.back(), kPrivateNode) << "the private node comes last";
  if (our_order.back() == kPrivateNode) our_order.pop_back();
  EXPECT_EQ(our_order.back(), kOwnNode) << "softverbs' own node comes after rdma-core's";
  if (our_order.back() == kOwnNode) our_order.pop_back();
  EXPECT_EQ(our_order, real_->node_order) << "version definitions are not in the same order";

  // The ABS symbols named after each node (how readelf lists the nodes in .dynsym).
  std::set<std::string> real_abs, our_abs;
  for (const Symbol& s : real_->defined)
    if (s.ndx == "ABS") real_abs.insert(s.key());
  for (const Symbol& s : ours_->defined)
    if (s.ndx == "ABS" && !is_own_node(s.name)) our_abs.insert(s.key());
  EXPECT_EQ(our_abs, real_abs);
}

TEST_F(ExportTable, OwnControlApiIsInItsOwnNode) {
  // Exactly the functions of include/softverbs/faults.h, all in SOFTVERBS_0.1.
  std::set<std::string> own;
  for (const Symbol& s : ours_->defined)
    if (s.name.rfind("softverbs_", 0) == 0 && s.name.rfind("softverbs_private_", 0) != 0) {
      EXPECT_EQ(s.version, kOwnNode) << s.describe();
      EXPECT_TRUE(s.is_default) << s.describe();
      own.insert(s.name);
    }
  const std::set<std::string> expected = {
      "softverbs_device_counters", "softverbs_device_fatal",  "softverbs_fault_hits",
      "softverbs_faults_clear",    "softverbs_faults_load",   "softverbs_faults_load_file",
      "softverbs_faults_log",      "softverbs_faults_seed",   "softverbs_port_set_state",
      "softverbs_qp_force_error",  "softverbs_raise_async_event"};
  EXPECT_EQ(own, expected);
}

TEST_F(ExportTable, PrivateNodeHoldsOnlyTheCmProviderList) {
  // Exactly one function, in its own node: what librdmacm.so.1 links against.
  std::set<std::string> in_private;
  for (const Symbol& s : ours_->defined) {
    if (s.name.rfind("softverbs_private_", 0) == 0) {
      EXPECT_EQ(s.version, kPrivateNode) << s.describe();
      EXPECT_TRUE(s.is_default) << s.describe();
      EXPECT_EQ(s.type, "FUNC") << s.describe();
    }
    if (s.version == kPrivateNode && s.ndx != "ABS") in_private.insert(s.name);
  }
  EXPECT_EQ(in_private, std::set<std::string>{"softverbs_private_cm_providers"});
}

TEST_F(ExportTable, Soname) {
  EXPECT_EQ(real_->soname, "libibverbs.so.1");
  EXPECT_EQ(ours_->soname, "libibverbs.so.1");
  ASSERT_FALSE(ours_->node_order.empty());
  EXPECT_EQ(ours_->node_order.front(), "libibverbs.so.1") << "the BASE version definition names the file";
}

TEST_F(ExportTable, DisassociateDestroyIsAOneByteBssObject) {
  for (const ElfExports* e : {real_.get(), ours_.get()}) {
    const char* which = e == real_.get() ? kReal : kOurs;
    const Symbol* s = find_default(*e, "verbs_allow_disassociate_destroy");
    ASSERT_NE(s, nullptr) << which << " does not export verbs_allow_disassociate_destroy";
    EXPECT_EQ(s->version, "IBVERBS_PRIVATE_34") << which;
    EXPECT_EQ(s->type, "OBJECT") << which << ": " << s->describe();
    EXPECT_EQ(s->size, 1u) << which << ": " << s->describe();
    EXPECT_EQ(s->section, ".bss") << which << ": " << s->describe();
  }
}

TEST_F(ExportTable, TheOnlyDataObjectIsDisassociateDestroy) {
  // Everything else is a function in both libraries; a FUNC exported as OBJECT (or the
  // reverse) breaks copy relocations and PLT binding in the programs that import it.
  for (const Symbol& s : ours_->defined) {
    if (s.ndx == "ABS") continue;
    if (s.name == "verbs_allow_disassociate_destroy") continue;
    EXPECT_EQ(s.type, "FUNC") << s.describe();
  }
}

}  // namespace

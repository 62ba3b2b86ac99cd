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

namespace {

constexpr const char* kOurs = SV_IBVERBS_FILE;
constexpr const char* kReal = SV_REAL_IBVERBS_FILE;
constexpr const char* kReadelf = SV_READELF;

struct CommandOutput {
  int status = -1;  // exit code, or -1 when the command could not run
  std::string out;
};

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

CommandOutput run_readelf(const std::string& args, const std::string& file) {
  CommandOutput r;
  std::string cmd = shell_quote(kReadelf) + " " + args + " " + shell_quote(file) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = ::pclose(p);
  r.status = (st != -1 && WIFEXITED(st)) ? WEXITSTATUS(st) : -1;
  return r;
}

std::vector<std::string> words_of(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The word after `key` in words, or "".
std::string word_after(const std::vector<std::string>& words, const std::string& key) {
  for (size_t i = 0; i + 1 < words.size(); ++i)
    if (words[i] == key) return words[i + 1];
  return "";
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

struct Symbol {
  std::string name;
  std::string version;  // empty: unversioned
  bool is_default = false;
  std::string type, bind, vis, ndx;
  std::string section;  // the name of section ndx, when it is a section
  unsigned long long size = 0;

  std::string key() const { return name + (version.empty() ? "" : (is_default ? "@@" : "@") + version); }
  std::string describe() const {
    return key() + " (" + type + " " + bind + " " + vis + ", size " + std::to_string(size) + ", section " +
           (section.empty() ? ndx : section) + ")";
  }
};

struct VersionNode {
  std::string flags;
  std::vector<std::string> parents;
};

// Everything the test needs to know about one ELF file, or an error message.
struct ElfExports {
  std::string error;
  std::vector<Symbol> defined;                 // every defined dynamic symbol
  std::map<std::string, std::string> section;  // section index -> name
  std::map<std::string, VersionNode> nodes;    // version definitions (including the BASE one)
  std::vector<std::string> node_order;
  std::string soname;
};

std::string readelf_problem(const std::string& what, const CommandOutput& r) {
  if (r.status == -1 || r.status == 127)
    return std::string("cannot run ") + kReadelf + " (" + what + "): install the Debian package binutils";
  return std::string(kReadelf) + " " + what + " failed with status " + std::to_string(r.status) + ":\n" + r.out;
}

ElfExports read_exports(const std::string& file) {
  ElfExports e;
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    e.error = file + " does not exist";
    return e;
  }

  CommandOutput syms = run_readelf("--dyn-syms -W", file);
  if (syms.status != 0) {
    e.error = readelf_problem("--dyn-syms", syms);
    return e;
  }
  //    155: 0000000000020281     1 OBJECT  GLOBAL DEFAULT   24 verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34
  //   Num:  Value            Size Type    Bind   Vis      Ndx Name
  for (const std::string& line : lines_of(syms.out)) {
    std::vector<std::string> w = words_of(line);
    if (w.size() < 8 || w[0].size() < 2 || w[0].back() != ':') continue;
    if (w[0].find_first_not_of("0123456789") != w[0].size() - 1) continue;
    Symbol s;
    try {
      s.size = std::stoull(w[2], nullptr, 0);
    } catch (const std::exception&) {
      continue;
    }
    s.type = w[3];
    s.bind = w[4];
    s.vis = w[5];
    s.ndx = w[6];
    const std::string& full = w[7];
    if (s.ndx == "UND" || s.bind == "LOCAL") continue;
    size_t at = full.find('@');
    if (at == std::string::npos) {
      s.name = full;
    } else {
      s.name = full.substr(0, at);
      s.is_default = full.compare(at, 2, "@@") == 0;
      s.version = full.substr(at + (s.is_default ? 2 : 1));
    }
    e.defined.push_back(s);
  }
  if (e.defined.empty()) {
    e.error = std::string("no defined dynamic symbols parsed from ") + kReadelf + " --dyn-syms output:\n" + syms.out;
    return e;
  }

  CommandOutput sections = run_readelf("-S -W", file);
  if (sections.status != 0) {
    e.error = readelf_problem("-S", sections);
    return e;
  }
  //   [24] .bss              NOBITS          0000000000020280 ...
  for (const std::string& line : lines_of(sections.out)) {
    size_t open = line.find('['), close = line.find(']');
    if (open == std::string::npos || close == std::string::npos || close < open) continue;
    std::vector<std::string> index = words_of(line.substr(open + 1, close - open - 1));
    std::vector<std::string> rest = words_of(line.substr(close + 1));
    if (index.size() != 1 || index[0].find_first_not_of("0123456789") != std::string::npos || rest.empty()) continue;
    e.section[index[0]] = rest[0];
  }
  for (Symbol& s : e.defined) {
    auto it = e.section.find(s.ndx);
    if (it != e.section.end()) s.section = it->second;
  }

  CommandOutput versions = run_readelf("-V -W", file);
  if (versions.status != 0) {
    e.error = readelf_problem("-V", versions);
    return e;
  }
  //   0x0038: Rev: 1  Flags: none  Index: 3  Cnt: 2  Name: IBVERBS_1.1
  //   0x0054: Parent 1: IBVERBS_1.0
  bool in_defs = false;
  std::string current;
  for (const std::string& line : lines_of(versions.out)) {
    if (line.find("Version definition section") != std::string::npos) {
      in_defs = true;
      continue;
    }
    if (in_defs && line.find("section '") != std::string::npos) in_defs = false;
    if (!in_defs) continue;
    std::vector<std::string> w = words_of(line);
    if (line.find(" Rev: ") != std::string::npos && !word_after(w, "Name:").empty()) {
      current = word_after(w, "Name:");
      size_t flags = line.find("Flags:"), index = line.find("Index:");
      std::vector<std::string> f;
      if (flags != std::string::npos && index != std::string::npos && index > flags)
        f = words_of(line.substr(flags + 6, index - flags - 6));
      std::string joined;
      for (const auto& x : f) joined += (joined.empty() ? "" : " ") + x;
      e.nodes[current].flags = joined;
      e.node_order.push_back(current);
    } else if (w.size() >= 4 && w[1] == "Parent" && !current.empty()) {
      e.nodes[current].parents.push_back(w.back());
    }
  }

  CommandOutput dynamic = run_readelf("-d -W", file);
  if (dynamic.status != 0) {
    e.error = readelf_problem("-d", dynamic);
    return e;
  }
  //  0x000000000000000e (SONAME)             Library soname: [libibverbs.so.1]
  for (const std::string& line : lines_of(dynamic.out)) {
    if (line.find("(SONAME)") == std::string::npos) continue;
    size_t open = line.find('['), close = line.rfind(']');
    if (open != std::string::npos && close != std::string::npos && close > open)
      e.soname = line.substr(open + 1, close - open - 1);
  }
  return e;
}

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
  // (include/softverbs/faults.h); it is checked on its own below.
  static constexpr const char* kOwnNode = "SOFTVERBS_0.1";
  static bool is_own(const Symbol& s) { return s.version == kOwnNode; }
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
    if (o.ndx == "ABS" && o.name == kOwnNode) continue;
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
    if (name == kOwnNode) {
      EXPECT_TRUE(o.parents.empty()) << kOwnNode << " must not inherit rdma-core's nodes";
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
  ASSERT_FALSE(our_order.empty());
  EXPECT_EQ(our_order.back(), kOwnNode) << "softverbs' own node comes after rdma-core's";
  if (our_order.back() == kOwnNode) our_order.pop_back();
  EXPECT_EQ(our_order, real_->node_order) << "version definitions are not in the same order";

  // The ABS symbols named after each node (how readelf lists the nodes in .dynsym).
  std::set<std::string> real_abs, our_abs;
  for (const Symbol& s : real_->defined)
    if (s.ndx == "ABS") real_abs.insert(s.key());
  for (const Symbol& s : ours_->defined)
    if (s.ndx == "ABS" && s.name != kOwnNode) our_abs.insert(s.key());
  EXPECT_EQ(our_abs, real_abs);
}

TEST_F(ExportTable, OwnControlApiIsInItsOwnNode) {
  // Exactly the functions of include/softverbs/faults.h, all in SOFTVERBS_0.1.
  std::set<std::string> own;
  for (const Symbol& s : ours_->defined)
    if (s.name.rfind("softverbs_", 0) == 0) {
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

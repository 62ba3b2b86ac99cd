// readelf's view of a shared library's dynamic exports, for the export-table
// tests of libibverbs.so.1 and librdmacm.so.1: the defined dynamic symbols with
// their versions, the version definitions with their parents, the SONAME and the
// DT_NEEDED entries. SV_READELF names the readelf to run.
#pragma once

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace elf {

constexpr const char* kReadelf = SV_READELF;

struct CommandOutput {
  int status = -1;  // exit code, or -1 when the command could not run
  std::string out;
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

inline CommandOutput run_readelf(const std::string& args, const std::string& file) {
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

inline std::vector<std::string> words_of(const std::string& line) {
  std::vector<std::string> words;
  std::istringstream in(line);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The word after `key` in words, or "".
inline std::string word_after(const std::vector<std::string>& words, const std::string& key) {
  for (size_t i = 0; i + 1 < words.size(); ++i)
    if (words[i] == key) return words[i + 1];
  return "";
}

inline std::vector<std::string> lines_of(const std::string& text) {
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
  bool operator==(const VersionNode&) const = default;
};

// Everything the test needs to know about one ELF file, or an error message.
struct ElfExports {
  std::string error;
  std::vector<Symbol> defined;                 // every defined dynamic symbol
  std::map<std::string, std::string> section;  // section index -> name
  std::map<std::string, VersionNode> nodes;    // version definitions (including the BASE one)
  std::vector<std::string> node_order;
  std::string soname;
  std::vector<std::string> needed;             // DT_NEEDED, in order
  std::vector<Symbol> undefined;               // undefined dynamic symbols, with versions
};

inline std::string readelf_problem(const std::string& what, const CommandOutput& r) {
  if (r.status == -1 || r.status == 127)
    return std::string("cannot run ") + kReadelf + " (" + what + "): install the Debian package binutils";
  return std::string(kReadelf) + " " + what + " failed with status " + std::to_string(r.status) + ":\n" + r.out;
}

inline ElfExports read_exports(const std::string& file) {
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
    if (s.bind == "LOCAL") continue;
    size_t at = full.find('@');
    if (at == std::string::npos) {
      s.name = full;
    } else {
      s.name = full.substr(0, at);
      s.is_default = full.compare(at, 2, "@@") == 0;
      s.version = full.substr(at + (s.is_default ? 2 : 1));
    }
    // readelf prints an undefined symbol's version as name@VERSION (N).
    if (s.ndx == "UND")
      e.undefined.push_back(s);
    else
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
    const bool soname = line.find("(SONAME)") != std::string::npos;
    const bool needed = line.find("(NEEDED)") != std::string::npos;
    if (!soname && !needed) continue;
    size_t open = line.find('['), close = line.rfind(']');
    if (open == std::string::npos || close == std::string::npos || close <= open) continue;
    (soname ? e.soname : e.needed.emplace_back()) = line.substr(open + 1, close - open - 1);
  }
  return e;
}

}  // namespace elf

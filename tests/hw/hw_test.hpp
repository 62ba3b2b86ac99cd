// Helpers shared by the hw backend tests. Each test binary runs in one fixed
// environment (pinned by tests/hw/CMakeLists.txt): the backend reads its
// variables once per process, so every scenario is a process of its own.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace hwtest {

// The file that defines the code or data at addr (any link namespace), or "".
inline std::string file_of(const void* addr) {
  Dl_info info{};
  if (!addr || !dladdr(addr, &info) || !info.dli_fname) return "";
  return info.dli_fname;
}

inline bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  return !a.empty() && !b.empty() && ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 &&
         sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Skips the test unless the process runs with the environment its ctest
// registration gives it (running the binary by hand runs nothing wrong).
#define HWTEST_REQUIRE_ENV(name, value)                                                        \
  do {                                                                                         \
    if (::hwtest::env(name) != (value))                                                        \
      GTEST_SKIP() << "needs " << (name) << "=" << (value) << " (run it through ctest -L hw)"; \
  } while (0)

// name -> version node, from a version script's "NODE {" ... "name;" blocks
// (abi/verbs/libibverbs.map, abi/rdmacm/librdmacm.map).
inline std::map<std::string, std::string> read_version_script(const char* path) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  std::string line, node;
  auto is_ident = [](const std::string& w) {
    return !w.empty() &&
           w.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.") == std::string::npos;
  };
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string first, second;
    words >> first >> second;
    if (second == "{" && is_ident(first)) {
      node = first;  // "IBVERBS_1.1 {"
    } else if (!node.empty() && first.size() > 1 && first.back() == ';' && second.empty()) {
      first.pop_back();  // "ibv_alloc_pd;" (but not "local: *;" or "} IBVERBS_1.0;")
      if (is_ident(first)) out[first] = node;
    }
  }
  return out;
}

}  // namespace hwtest

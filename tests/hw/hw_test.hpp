// Helpers shared by the hw backend tests. Each test binary runs in one fixed
// environment (pinned by tests/hw/CMakeLists.txt): the backend reads its
// variables once per process, so every scenario is a process of its own.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
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

}  // namespace hwtest

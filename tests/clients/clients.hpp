// Shared pieces of the client-program tests: the environment that makes a Debian
// binary load our libibverbs.so.1, the check that a program is installed, and parsers
// for ibverbs-utils output.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "tests/support/process.hpp"

namespace softverbs::test {

inline constexpr const char* kLibDir = SV_LIB_DIR;              // holds our libibverbs.so.1
inline constexpr const char* kLauncher = SV_LAUNCHER;           // softverbs run -- CMD
inline constexpr const char* kChildPreload = SV_CHILD_PRELOAD;  // empty unless a sanitizer build
inline constexpr milliseconds kRunTimeout{20000};               // generous: a loaded CI machine

// The environment of this process without anything that changes which libraries a
// program loads or how softverbs behaves; the test adds what it means to set.
inline Env clean_env() {
  Env env = Env::inherit();
  for (const char* name :
       {"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_BIND_NOT", "LD_DEBUG", "LD_AUDIT", "SYSFS_PATH", "VERBS_LOG_LEVEL",
        "VERBS_LOG_FILE", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONWARNINGS"})
    env.unset(name);
  env.unset_prefix("SOFTVERBS_").unset_prefix("RDMAV_").unset_prefix("IBV_").unset_prefix("MLX5_");
  env.set("LC_ALL", "C");
  if (*kChildPreload) {
    // A sanitizer build of the library: its runtime must come first. The programs
    // themselves are not instrumented and do not free everything at exit.
    env.set("LD_PRELOAD", kChildPreload);
    for (const char* options : {"ASAN_OPTIONS", "LSAN_OPTIONS"}) {
      auto current = env.get(options);
      env.set(options, current && !current->empty() ? *current + ":detect_leaks=0" : "detect_leaks=0");
    }
  }
  return env;
}

// clean_env() plus LD_LIBRARY_PATH pointing at our library.
inline Env client_env() { return clean_env().set("LD_LIBRARY_PATH", kLibDir); }

// The variables a client test sets, as they appear in front of commands in messages.
inline std::string shown_env(const Env& env) {
  return env.describe({"SOFTVERBS_", "LD_LIBRARY_PATH", "LD_TRACE_LOADED_OBJECTS"});
}

// run() with the test's variables shown in the command line of failure messages.
inline ProcessResult run_client(std::vector<std::string> argv, const Env& env, milliseconds timeout = kRunTimeout) {
  return run(std::move(argv), env, timeout, shown_env(env));
}

// Success if path is an executable file; otherwise names the Debian package to install.
inline ::testing::AssertionResult installed(const std::string& path, const std::string& package) {
  if (::access(path.c_str(), X_OK) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << path << " is not installed: install the Debian package " << package
                                       << " (apt-get install " << package << ")";
}

// Lines of stderr in which the dynamic loader complains (missing library, symbol or
// version, or an unversioned library where versions are expected).
inline std::vector<std::string> loader_errors(const std::string& err) {
  static const char* const kPatterns[] = {
      "symbol lookup error",
      "error while loading shared libraries",
      "cannot open shared object",
      "no version information",
      "version `",
      "undefined symbol",
      "relocation error",
  };
  std::vector<std::string> found;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    for (const char* p : kPatterns) {
      if (line.find(p) != std::string::npos) {
        found.push_back(line);
        break;
      }
    }
  }
  return found;
}

// Whether s is `groups` groups of four lower-case hex digits separated by ':'.
inline bool is_hex_groups(std::string_view s, size_t groups) {
  if (s.size() != groups * 5 - 1) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = i % 5 == 4 ? c == ':' : ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
    if (!ok) return false;
  }
  return true;
}

// Whether s is exactly `digits` lower-case hex digits.
inline bool is_hex(std::string_view s, size_t digits) {
  return s.size() == digits && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

inline std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

inline std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return std::string(s);
}

// One "hca_id:" block of ibv_devinfo output as key -> values (in order of appearance),
// e.g. "state" -> {"PORT_ACTIVE (4)"}, "GID[  1]" -> {"::ffff:127.1.9.10, RoCE v2"}.
struct DevinfoDevice {
  std::string hca_id;
  std::multimap<std::string, std::string> fields;

  std::string get(const std::string& key) const {
    auto it = fields.find(key);
    return it == fields.end() ? std::string("<no " + key + " line>") : it->second;
  }
  bool has(const std::string& key) const { return fields.count(key) != 0; }
  // The GID lines, by index.
  std::map<int, std::string> gids() const {
    std::map<int, std::string> g;
    for (const auto& [k, v] : fields) {
      if (!k.starts_with("GID[") || !k.ends_with("]")) continue;
      std::string index = trim(std::string_view(k).substr(4, k.size() - 5));
      if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos) g[std::stoi(index)] = v;
    }
    return g;
  }
};

inline std::vector<DevinfoDevice> parse_devinfo(const std::string& out) {
  std::vector<DevinfoDevice> devices;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = trim(std::string_view(line).substr(0, colon));
    std::string value = trim(std::string_view(line).substr(colon + 1));
    if (key.empty()) continue;
    if (key == "hca_id") {
      devices.push_back({value, {}});
      continue;
    }
    if (!devices.empty()) devices.back().fields.emplace(key, value);
  }
  return devices;
}

struct DevicesLine {
  std::string name;
  std::string guid;
};

// The device lines of ibv_devices ("    emu0            \t00007ffffe005834").
inline std::vector<DevicesLine> parse_ibv_devices(const std::string& out) {
  std::vector<DevicesLine> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || (line[0] != ' ' && line[0] != '\t')) continue;
    std::istringstream words(line);
    std::string name, guid, extra;
    if (!(words >> name >> guid) || (words >> extra)) continue;
    if (name == "device" || name == "------") continue;  // the two header lines
    v.push_back({name, guid});
  }
  return v;
}

}  // namespace softverbs::test

// The launcher's library directory and its own environment variables
// (docs/configuration.md, "Launcher variable").
#include "tools/launcher_env.hpp"

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace softverbs::tools {

std::string libdir() {
  if (const char* dir = std::getenv("SOFTVERBS_LIBDIR"); dir && *dir) return dir;
  // /proc/self/exe is the program itself with every symbolic link resolved, so
  // a link to the launcher (e.g. in ~/bin) still finds the prefix it came from.
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  // Lexically, like `cd DIR && pwd`: links inside the library path are kept.
  return (self.parent_path() / kRelativeLibdir).lexically_normal().string();
}

std::string ld_library_path() {
  const char* value = std::getenv("LD_LIBRARY_PATH");
  return value ? value : "";
}

std::string ld_preload() {
  const char* value = std::getenv("LD_PRELOAD");
  return value ? value : "";
}

}  // namespace softverbs::tools

namespace softverbs::tools {

bool test_no_unshare() {
  const char* value = std::getenv("SOFTVERBS_TEST_NO_UNSHARE");
  return value && *value;
}

}  // namespace softverbs::tools

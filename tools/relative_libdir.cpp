// The library directory relative to the launcher binary: compiled once per
// binary with SV_RELATIVE_LIBDIR set by tools/CMakeLists.txt (a build tree and
// an installed prefix lay the directories out differently).
#include "tools/launcher_env.hpp"

namespace softverbs::tools {

const char* const kRelativeLibdir = SV_RELATIVE_LIBDIR;

}  // namespace softverbs::tools

// Where the launcher finds softverbs' libraries, and the launcher's own
// environment variables (SOFTVERBS_LIBDIR, LD_LIBRARY_PATH, LD_PRELOAD,
// SOFTVERBS_TEST_NO_UNSHARE). The library's variables are read through
// core/env.hpp; these belong to the launcher alone, so they are read here (tests/layout allows this one file besides
// core/env.cpp).
#pragma once

#include <string>

namespace softverbs::tools {

// The path of the library directory relative to the directory of the running
// program, fixed at build time ("../lib" in a build tree, "../lib/softverbs"
// in an installed prefix). Defined by the build, once per launcher binary.
extern const char* const kRelativeLibdir;

// SOFTVERBS_LIBDIR if set and non-empty; otherwise kRelativeLibdir resolved
// against the directory of /proc/self/exe (symbolic links resolved). Empty if
// the program's own path cannot be read.
std::string libdir();

// The current LD_LIBRARY_PATH, or "" when unset.
std::string ld_library_path();

// The current LD_PRELOAD, or "" when unset (`run --rsockets` adds to it).
std::string ld_preload();

}  // namespace softverbs::tools

namespace softverbs::tools {

// SOFTVERBS_TEST_NO_UNSHARE set and non-empty: `run` behaves as if namespaces
// were refused (EPERM), so the suite can exercise the fallback on any host.
bool test_no_unshare();

}  // namespace softverbs::tools

// The forwarding table (hw/symbols.hpp) against the version script of our own
// export table (abi/verbs/libibverbs.map), which reproduces rdma-core 44's default
// versions: dlvsym with any other version would miss the real function or find
// a compatibility variant with other semantics.
#include "hw/symbols.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace {

// name -> version node, from the map's "NODE {" ... "name;" blocks.
std::map<std::string, std::string> read_version_script(const char* path) {
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

TEST(SymbolTable, EveryForwardedFunctionHasItsDefaultVersion) {
  const auto versions = read_version_script(SV_VERBS_MAP);
  ASSERT_GT(versions.size(), 140u) << "could not read " << SV_VERBS_MAP;
  std::set<std::string> seen;
  for (const auto& sym : softverbs::hw::kForwardedSymbols) {
    SCOPED_TRACE(sym.name);
    EXPECT_TRUE(seen.insert(sym.name).second) << "listed twice";
    auto it = versions.find(sym.name);
    ASSERT_NE(it, versions.end()) << "not exported by libibverbs.so.1";
    EXPECT_EQ(it->second, sym.version);
    // Required means present in every rdma-core: the 1.0 and 1.1 nodes only.
    const std::string v = sym.version;
    EXPECT_EQ(sym.required, v == "IBVERBS_1.0" || v == "IBVERBS_1.1");
  }
}

}  // namespace

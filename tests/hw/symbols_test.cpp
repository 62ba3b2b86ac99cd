// The forwarding table (hw/symbols.hpp) against the version script of our own
// export table (abi/verbs/libibverbs.map), which reproduces rdma-core 44's default
// versions: dlvsym with any other version would miss the real function or find
// a compatibility variant with other semantics.
#include "hw/symbols.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "hw_test.hpp"

namespace {

TEST(SymbolTable, EveryForwardedFunctionHasItsDefaultVersion) {
  const auto versions = hwtest::read_version_script(SV_VERBS_MAP);
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

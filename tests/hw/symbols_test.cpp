// The verb list (core/verbs.def) and the hw backend's real-symbol table
// (hw/symbols.hpp) against the version script of our own export table
// (abi/verbs/libibverbs.map), which reproduces rdma-core 44's default versions:
// every verb a provider answers must be exported at its row's version, and
// dlvsym with any other version would miss the real function or find a
// compatibility variant with other semantics.
#include "hw/symbols.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "hw_test.hpp"

namespace {

// Required means present in every rdma-core: the 1.0 and 1.1 nodes only.
bool in_every_release(const std::string& version) { return version == "IBVERBS_1.0" || version == "IBVERBS_1.1"; }

struct VerbRow {
  const char* method;
  const char* symbol;
  const char* version;
  bool required;
};

// Every row of core/verbs.def, of each kind.
constexpr VerbRow kVerbRows[] = {
#define SV_VERB(name, symbol, version, need, ...) \
  {#name, #symbol, version, softverbs::Need::need == softverbs::Need::required},
#include "core/verbs.def"
};

TEST(SymbolTable, EveryVerbIsExportedAtItsVersion) {
  const auto versions = hwtest::read_version_script(SV_VERBS_MAP);
  ASSERT_GT(versions.size(), 140u) << "could not read " << SV_VERBS_MAP;
  std::set<std::string> methods, symbols;
  for (const VerbRow& row : kVerbRows) {
    SCOPED_TRACE(row.method);
    EXPECT_TRUE(methods.insert(row.method).second) << "method listed twice";
    EXPECT_TRUE(symbols.insert(row.symbol).second) << "symbol listed twice";
    auto it = versions.find(row.symbol);
    ASSERT_NE(it, versions.end()) << row.symbol << " is not exported by libibverbs.so.1";
    EXPECT_EQ(it->second, row.version) << row.symbol;
    EXPECT_EQ(row.required, in_every_release(row.version)) << row.symbol;
  }
}

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
    EXPECT_EQ(sym.required, in_every_release(sym.version));
  }
}

}  // namespace

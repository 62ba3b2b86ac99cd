// The CM forwarding table (hw/cm_symbols.hpp) against the version script of
// librdmacm's export table (abi/rdmacm/librdmacm.map, rdma-core 44's default
// versions), and the split of that export table between the provider-dispatched
// functions (forwarded) and the library-level ones (core/cm_provider.hpp).
#include "hw/cm_symbols.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "hw_test.hpp"

namespace {

// The library-level exports: implemented by the ABI layer over the provider
// methods and the public verbs, never forwarded (core/cm_provider.hpp).
const std::set<std::string> kLibraryLevel = {
    "rdma_event_str", "rdma_get_src_port", "rdma_get_dst_port",
    "rdma_create_qp", "rdma_create_srq",   "rdma_join_multicast",
};

bool is_rsocket(const std::string& name) { return name[0] == 'r' && name.rfind("rdma_", 0) != 0; }

TEST(CmSymbolTable, EveryForwardedFunctionHasItsDefaultVersion) {
  const auto versions = hwtest::read_version_script(SV_RDMACM_MAP);
  ASSERT_EQ(versions.size(), 68u) << "could not read " << SV_RDMACM_MAP;
  std::set<std::string> seen;
  for (const auto& sym : softverbs::hw::kCmForwardedSymbols) {
    SCOPED_TRACE(sym.name);
    EXPECT_TRUE(seen.insert(sym.name).second) << "listed twice";
    auto it = versions.find(sym.name);
    ASSERT_NE(it, versions.end()) << "not exported by librdmacm.so.1";
    EXPECT_EQ(it->second, sym.version);
    // Required means present in every rdma-core librdmacm: the 1.0 node only.
    EXPECT_EQ(sym.required, std::string(sym.version) == "RDMACM_1.0");
  }
}

TEST(CmSymbolTable, EveryExportIsForwardedOrLibraryLevel) {
  const auto versions = hwtest::read_version_script(SV_RDMACM_MAP);
  std::set<std::string> forwarded;
  for (const auto& sym : softverbs::hw::kCmForwardedSymbols) forwarded.insert(sym.name);
  for (const auto& [name, node] : versions) {
    SCOPED_TRACE(name + "@" + node);
    const bool library = kLibraryLevel.count(name) || is_rsocket(name);
    EXPECT_NE(library, forwarded.count(name) != 0) << "must be exactly one of forwarded and library-level";
  }
  for (const auto& name : kLibraryLevel) EXPECT_TRUE(versions.count(name)) << name << " is not exported";
}

TEST(CmSymbolTable, TheMapIsTheRealLibrarysExportTable) {
  // Every name of the map resolves in the real library at its node.
  void* lib = dlopen(SV_REAL_RDMACM, RTLD_LAZY | RTLD_LOCAL);
  if (!lib) {
    ::testing::Test::RecordProperty("real_rdmacm", "absent");
    return;  // the distribution's librdmacm is not installed: the map alone is checked
  }
  for (const auto& [name, node] : hwtest::read_version_script(SV_RDMACM_MAP))
    EXPECT_NE(dlvsym(lib, name.c_str(), node.c_str()), nullptr) << name << "@" << node;
  dlclose(lib);
}

}  // namespace

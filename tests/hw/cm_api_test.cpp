// softverbs' librdmacm.so.1 with the hw backend, as a program linked against
// rdma-core's librdmacm meets it: cm_api_probe (built with -lrdmacm against the
// distribution's library) runs once directly, on the real rdma-core, and once
// through `softverbs run` (the environment of its ctest entry selects
// SOFTVERBS_BACKEND=hw), where its librdmacm.so.1 is ours and every CM call
// crosses our exported API, the CM provider list and the hw passthrough into
// the real librdmacm. Its answers must be the real library's.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdio>
#include <map>
#include <string>

#include "hw_test.hpp"

namespace {

std::map<std::string, std::string> run_probe(const std::string& command) {
  std::map<std::string, std::string> out;
  FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    std::string l(line);
    if (!l.empty() && l.back() == '\n') l.pop_back();
    auto eq = l.find('=');
    if (eq != std::string::npos) out[l.substr(0, eq)] = l.substr(eq + 1);
  }
  out["status"] = std::to_string(::pclose(p));
  return out;
}

std::string real_path(const char* path) {
  char buf[PATH_MAX];
  return ::realpath(path, buf) ? std::string(buf) : std::string(path);
}

const std::string kDirect = std::string("env -u LD_LIBRARY_PATH ") + SV_CM_API_PROBE;
const std::string kThroughUs = std::string(SV_SOFTVERBS_CLI) + " run -- " + SV_CM_API_PROBE;

TEST(HwCmApi, ThroughOurLibrdmacmTheRealLibraryAnswers) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_BACKEND", "hw");
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", "");
  auto real = run_probe(kDirect);
  auto ours = run_probe(kThroughUs);
  ASSERT_EQ(real["status"], "0");
  ASSERT_EQ(ours["status"], "0");
  EXPECT_EQ(real["library"], real_path(SV_REAL_RDMACM));
  EXPECT_EQ(ours["library"], real_path(SV_RDMACM_FILE));
  for (const char* call : {"create_event_channel", "create_id", "getaddrinfo", "get_devices", "event_str"})
    EXPECT_EQ(ours[call], real[call]) << call << " (result errno count)";
  // This machine class has no kernel CM: librdmacm 44 answers ENODEV.
  if (real["create_event_channel"].rfind("0 ", 0) == 0) {
    EXPECT_EQ(real["create_event_channel"], "0 19 0");
    EXPECT_EQ(real["get_devices"], "0 19 0");
  }
}

TEST(HwCmApiOverEmu, TheRealLibrdmacmListsTheHwProvidersDevicesThroughOurs) {
  // The real librdmacm over the hw-test copy of our libibverbs.so.1: its
  // rdma_get_devices opens the two emulated devices the hw verbs provider lists
  // (SOFTVERBS_DEVICES=hw_roce/eth,hw_ib/ib), which only the real library,
  // reached through ours, can answer.
  HWTEST_REQUIRE_ENV("SOFTVERBS_BACKEND", "hw");
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", SV_HWTEST_LIB);
  auto ours = run_probe(kThroughUs);
  ASSERT_EQ(ours["status"], "0");
  EXPECT_EQ(ours["library"], real_path(SV_RDMACM_FILE));
  EXPECT_EQ(ours["get_devices"], "1 0 2");
  EXPECT_EQ(ours["event_str"], "RDMA_CM_EVENT_ESTABLISHED");
}

}  // namespace

// The hw backend without a usable real library: a missing file, a library that
// is not rdma-core's, softverbs' own file, a relative path. Each time the device
// list is empty (not NULL), the reason is logged, and nothing else changes.
// Each suite runs in its own process (tests/hw/CMakeLists.txt).
#include <infiniband/verbs.h>

#include <cerrno>
#include <string>

#include "hw_test.hpp"

namespace {

// Lists devices with stderr captured: the first list is what loads the library.
std::string list_devices_capturing_log(int* num, bool* non_null) {
  ::testing::internal::CaptureStderr();
  ibv_device** list = ibv_get_device_list(num);
  std::string log = ::testing::internal::GetCapturedStderr();
  *non_null = list != nullptr;
  if (list) ibv_free_device_list(list);
  return log;
}

void expect_no_devices_and_log(const std::string& needle) {
  int num = -1;
  bool non_null = false;
  const std::string log = list_devices_capturing_log(&num, &non_null);
  EXPECT_TRUE(non_null) << "an empty list, as on a machine without RDMA devices";
  EXPECT_EQ(num, 0);
  EXPECT_NE(log.find(needle), std::string::npos) << "log was: " << log;

  // Later lists are just as empty and quiet (the library is tried once).
  ::testing::internal::CaptureStderr();
  ibv_device** again = ibv_get_device_list(&num);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(num, 0);
  ibv_free_device_list(again);

  // Verbs that do not need a device still behave.
  EXPECT_EQ(ibv_fork_init(), 0);
  EXPECT_STREQ(ibv_wc_status_str(IBV_WC_SUCCESS), "success");
}

TEST(MissingLibrary, NoDevicesAndADebugMessage) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", "/nonexistent/libibverbs.so.1");
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "debug");
  expect_no_devices_and_log("hw: cannot use /nonexistent/libibverbs.so.1: No such file or directory");
}

TEST(FakeLibrary, NoDevicesAndADebugMessage) {
  // A real shared library, loadable, that is not rdma-core's libibverbs.
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", SV_FAKE_LIB);
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "debug");
  expect_no_devices_and_log("no ibv_get_device_list@IBVERBS_1.1 in it (not rdma-core's libibverbs.so.1)");
}

TEST(FakeLibrary, NothingIsLoggedAtTheDefaultLevel) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", SV_FAKE_LIB);
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "");
  int num = -1;
  bool non_null = false;
  EXPECT_EQ(list_devices_capturing_log(&num, &non_null), "");
  EXPECT_TRUE(non_null);
  EXPECT_EQ(num, 0);
}

TEST(OwnLibrary, RefusedWithAMessageAtTheDefaultLevel) {
  // Our own file (directly, or through a symbolic link to it) would load
  // softverbs again instead of rdma-core: refused before loading anything.
  const std::string path = hwtest::env("SOFTVERBS_HW_LIBIBVERBS");
  if (!hwtest::same_file(path, SV_IBVERBS_FILE)) GTEST_SKIP() << "needs SOFTVERBS_HW_LIBIBVERBS = our library";
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "");
  expect_no_devices_and_log("hw: " + path + " is softverbs' own libibverbs.so.1, not rdma-core's; no hw devices");
}

TEST(RelativePath, RefusedWithAMessageAtTheDefaultLevel) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", "libibverbs.so.1");
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "");
  expect_no_devices_and_log("SOFTVERBS_HW_LIBIBVERBS=libibverbs.so.1: not an absolute path; no hw devices");
}

TEST(BothWithoutLibrary, EmulatedDevicesStillListed) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_BACKEND", "both");
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", "/nonexistent/libibverbs.so.1");
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(num, 1);
  EXPECT_STREQ(ibv_get_device_name(list[0]), "solo");
  ibv_context* ctx = ibv_open_device(list[0]);
  EXPECT_NE(ctx, nullptr);
  if (ctx) {
    EXPECT_EQ(ibv_close_device(ctx), 0);
  }
  ibv_free_device_list(list);
}

}  // namespace

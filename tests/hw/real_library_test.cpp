// The distribution's rdma-core behind the passthrough (SOFTVERBS_HW_LIBIBVERBS
// unset). On a machine without RDMA devices it loads into its namespace and
// lists nothing, and the debug log says why; on a machine with devices each one
// opens and answers queries.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "hw_test.hpp"

namespace {

TEST(RealLibrary, LoadsAndListsTheMachinesDevices) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_BACKEND", "hw");
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", "");
  HWTEST_REQUIRE_ENV("SOFTVERBS_LOG", "debug");
  ::testing::internal::CaptureStderr();
  int num = -1;
  ibv_device** list = ibv_get_device_list(&num);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_NE(list, nullptr);
  EXPECT_NE(log.find(std::string("hw: loaded ") + SV_REAL_LIB + " into its own link namespace"), std::string::npos)
      << log;
  if (num == 0) {
    // rdma-core says ENOSYS ("Function not implemented") without kernel support.
    EXPECT_NE(log.find(std::string("hw: ") + SV_REAL_LIB + " lists no devices"), std::string::npos) << log;
  }
  for (int i = 0; i < num; ++i) {
    SCOPED_TRACE(ibv_get_device_name(list[i]));
    ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) {
      ADD_FAILURE() << "ibv_open_device: " << std::strerror(errno);
      continue;
    }
    ibv_device_attr attr{};
    EXPECT_EQ(ibv_query_device(ctx, &attr), 0);
    ibv_port_attr port{};
    EXPECT_EQ(ibv_query_port(ctx, 1, &port), 0);
    EXPECT_EQ(ibv_close_device(ctx), 0);
  }
  ibv_free_device_list(list);
}

}  // namespace

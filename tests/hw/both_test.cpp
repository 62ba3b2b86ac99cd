// SOFTVERBS_BACKEND=both over the hw-test copy: this library's emulated devices
// first, then the devices of the library behind the passthrough, each kind
// served by its own provider.
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "hw_test.hpp"

namespace {

TEST(Both, EmulatedDevicesFirstThenPassthroughDevices) {
  HWTEST_REQUIRE_ENV("SOFTVERBS_BACKEND", "both");
  HWTEST_REQUIRE_ENV("SOFTVERBS_HW_LIBIBVERBS", SV_HWTEST_LIB);
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  ASSERT_NE(list, nullptr);
  // The same SOFTVERBS_DEVICES configures both copies: two devices each.
  ASSERT_EQ(num, 4);
  for (int i = 0; i < num; ++i) {
    SCOPED_TRACE(i);
    ibv_context* ctx = ibv_open_device(list[i]);
    ASSERT_NE(ctx, nullptr) << std::strerror(errno);
    const std::string owner = hwtest::file_of(reinterpret_cast<void*>(ctx->ops.post_send));
    if (i < 2)
      EXPECT_TRUE(hwtest::same_file(owner, SV_IBVERBS_FILE)) << owner;
    else
      EXPECT_TRUE(hwtest::same_file(owner, SV_HWTEST_LIB)) << owner;

    // A verb on each reaches its own provider and works end to end.
    ibv_pd* pd = ibv_alloc_pd(ctx);
    ASSERT_NE(pd, nullptr);
    ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_wc wc{};
    EXPECT_EQ(ibv_poll_cq(cq, 1, &wc), 0);
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
    EXPECT_EQ(ibv_dealloc_pd(pd), 0);
    EXPECT_EQ(ibv_close_device(ctx), 0);
  }
  ibv_free_device_list(list);
}

}  // namespace

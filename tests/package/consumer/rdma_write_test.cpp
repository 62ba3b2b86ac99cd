// An RDMA WRITE between two emulated devices, and the same WRITE on a network
// that loses every packet, with <softverbs/testing.hpp>.
#include <softverbs/testing.hpp>

#include <cstring>

namespace svt = softverbs::testing;

TEST(RdmaWrite, DataArrives) {
  svt::Devices devices(2, "eth");
  auto pair = svt::connect_rc(devices[0], devices[1]);

  std::memcpy(pair.a.data(), "hello, rdma", 12);
  ASSERT_EQ(svt::post_write(pair.a, 12), 0);
  EXPECT_COMPLETION(pair.a.cq, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE);
  EXPECT_STREQ(reinterpret_cast<const char*>(pair.b.data()), "hello, rdma");
}

TEST(RdmaWrite, FailsWhenEveryPacketIsLost) {
  svt::Devices devices(2, "eth");
  svt::PairOptions options;
  options.timeout = 1;    // the shortest local ACK timeout
  options.retry_cnt = 1;  // one retry, then IBV_WC_RETRY_EXC_ERR
  auto pair = svt::connect_rc(devices[0], devices[1], options);

  svt::Scenario lossy(R"(
[[rule]]
name = "lose-everything"
action = "drop"
)");
  ASSERT_EQ(svt::post_write(pair.a, 12), 0);
  EXPECT_COMPLETION(pair.a.cq, IBV_WC_RETRY_EXC_ERR, IBV_WC_RDMA_WRITE);
  EXPECT_GE(lossy.hits("lose-everything"), 2u);  // the first try and the retry
}

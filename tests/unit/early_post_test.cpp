// SOFTVERBS_POST_BEFORE_RTS: the values that choose between ConnectX's queueing
// of work requests posted before RTS and the IBTA's refusal (emu/qp/qp.hpp).
#include <gtest/gtest.h>

#include "emu/qp/qp.hpp"

namespace softverbs::emu {
namespace {

TEST(EarlyPost, ValuesAreQueueAndRefuse) {
  EXPECT_EQ(parse_early_post("queue"), EarlyPost::queue);
  EXPECT_EQ(parse_early_post("refuse"), EarlyPost::refuse);
}

TEST(EarlyPost, AnythingElseIsNoValue) {
  for (const char* bad : {"", "Queue", "refuse ", "ibta", "1"}) {
    SCOPED_TRACE(bad);
    EXPECT_FALSE(parse_early_post(bad).has_value());
  }
  EXPECT_FALSE(parse_early_post(nullptr).has_value());
}

}  // namespace
}  // namespace softverbs::emu

// The inline room an emulated send queue is granted (caps::granted_inline_data):
// what was asked, at least the SGEs' descriptors (16 bytes each, as rxe grants
// exactly), never more than the device's maximum.
#include <gtest/gtest.h>

#include "emu/device/caps.hpp"

namespace softverbs::emu {
namespace {

ibv_qp_cap cap_of(uint32_t sges, uint32_t inline_data) {
  ibv_qp_cap c{};
  c.max_send_wr = 4;
  c.max_send_sge = sges;
  c.max_inline_data = inline_data;
  return c;
}

TEST(InlineRoom, AtLeastTheSgesDescriptors) {
  EXPECT_EQ(caps::granted_inline_data(cap_of(1, 0)), 16u);  // rdma_xclient's RC QP
  EXPECT_EQ(caps::granted_inline_data(cap_of(2, 0)), 32u);
  EXPECT_EQ(caps::granted_inline_data(cap_of(2, 20)), 32u);
  EXPECT_EQ(caps::granted_inline_data(cap_of(0, 0)), 0u);
}

TEST(InlineRoom, WhatWasAskedWhenLarger) {
  EXPECT_EQ(caps::granted_inline_data(cap_of(1, 64)), 64u);
  EXPECT_EQ(caps::granted_inline_data(cap_of(0, caps::kMaxInlineData)), caps::kMaxInlineData);
}

TEST(InlineRoom, NeverBeyondTheMaximum) {
  EXPECT_LE(caps::granted_inline_data(cap_of(static_cast<uint32_t>(caps::kMaxSge), 0)), caps::kMaxInlineData);
  EXPECT_EQ(caps::granted_inline_data(cap_of(64, 0)), caps::kMaxInlineData);
}

}  // namespace
}  // namespace softverbs::emu

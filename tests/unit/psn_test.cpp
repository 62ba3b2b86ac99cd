// 24-bit PSN arithmetic across the wrap (docs/wire.md §2.3).
#include "wire/psn.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace softverbs::wire {
namespace {

static_assert(psn_add(kPsnMask, 1) == 0);
static_assert(psn_sub(0, 1) == kPsnMask);
static_assert(psn_diff(0, kPsnMask) == 1);
static_assert(psn_lt(kPsnMask, 0));

TEST(Psn, MaskAndValidity) {
  EXPECT_EQ(psn_mask(0x12345678u), 0x345678u);
  EXPECT_TRUE(psn_is_valid(kPsnMask));
  EXPECT_FALSE(psn_is_valid(kPsnSpace));
}

TEST(Psn, AddAndSubWrap) {
  EXPECT_EQ(psn_add(0xFFFFFE, 1), 0xFFFFFFu);
  EXPECT_EQ(psn_add(0xFFFFFE, 2), 0u);
  EXPECT_EQ(psn_add(0xFFFFFE, 5), 3u);
  EXPECT_EQ(psn_add(5, kPsnSpace), 5u);
  EXPECT_EQ(psn_add(0xFFFFFF, 0xFFFFFFFFu), 0xFFFFFEu);
  EXPECT_EQ(psn_sub(3, 5), 0xFFFFFEu);
  EXPECT_EQ(psn_sub(0, kPsnMask), 1u);
}

TEST(Psn, DiffIsSignedWithinHalfSpace) {
  EXPECT_EQ(psn_diff(10, 10), 0);
  EXPECT_EQ(psn_diff(2, 0xFFFFFE), 4);
  EXPECT_EQ(psn_diff(0xFFFFFE, 2), -4);
  EXPECT_EQ(psn_diff(kPsnHalfSpace - 1, 0), static_cast<std::int32_t>(kPsnHalfSpace - 1));
  // Exactly half the space apart is "behind", as in rxe's psn_compare().
  EXPECT_EQ(psn_diff(kPsnHalfSpace, 0), -static_cast<std::int32_t>(kPsnHalfSpace));
  EXPECT_EQ(psn_diff(0, kPsnHalfSpace), -static_cast<std::int32_t>(kPsnHalfSpace));
  EXPECT_EQ(psn_diff(kPsnHalfSpace + 1, 0), -static_cast<std::int32_t>(kPsnHalfSpace - 1));
  // Bits above the 24-bit field do not matter.
  EXPECT_EQ(psn_diff(0xAB000005u, 0x12000003u), 2);
}

TEST(Psn, ComparisonsAcrossTheWrap) {
  const std::uint32_t before_wrap = 0xFFFFF0;
  const std::uint32_t after_wrap = 0x000010;
  EXPECT_TRUE(psn_lt(before_wrap, after_wrap));
  EXPECT_TRUE(psn_le(before_wrap, after_wrap));
  EXPECT_TRUE(psn_gt(after_wrap, before_wrap));
  EXPECT_TRUE(psn_ge(after_wrap, before_wrap));
  EXPECT_FALSE(psn_gt(before_wrap, after_wrap));
  EXPECT_TRUE(psn_le(after_wrap, after_wrap));
  EXPECT_TRUE(psn_ge(after_wrap, after_wrap));
  EXPECT_EQ(psn_compare(before_wrap, after_wrap), -1);
  EXPECT_EQ(psn_compare(after_wrap, before_wrap), 1);
  EXPECT_EQ(psn_compare(after_wrap, after_wrap), 0);
}

TEST(Psn, RandomPairsAgreeWithDefinition) {
  std::mt19937 rng(1);
  for (int i = 0; i < 20000; ++i) {
    const std::uint32_t a = rng() & kPsnMask;
    const std::uint32_t n = rng() % kPsnHalfSpace;  // 0 .. 2^23-1 ahead
    const std::uint32_t b = psn_add(a, n);
    ASSERT_EQ(psn_diff(b, a), static_cast<std::int32_t>(n));
    ASSERT_EQ(psn_diff(a, b), -static_cast<std::int32_t>(n));
    ASSERT_EQ(psn_sub(b, n), a);
  }
}

TEST(Psn, Window) {
  EXPECT_TRUE(psn_in_window(0xFFFFFF, 0xFFFFFE, 3));
  EXPECT_TRUE(psn_in_window(0, 0xFFFFFE, 3));
  EXPECT_FALSE(psn_in_window(1, 0xFFFFFE, 3));
  EXPECT_FALSE(psn_in_window(0xFFFFFD, 0xFFFFFE, 3));
  EXPECT_FALSE(psn_in_window(5, 5, 0));
  EXPECT_TRUE(psn_in_window(5, 6, kPsnSpace));
}

}  // namespace
}  // namespace softverbs::wire

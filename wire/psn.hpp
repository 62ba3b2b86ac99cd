// 24-bit packet sequence number arithmetic (IBTA Vol1 ch.9, BTH PSN field).
//
// A PSN lives in [0, 2^24) and all arithmetic wraps modulo 2^24. Ordering is
// only meaningful for PSNs less than half the space apart: IBTA splits the PSN
// space into a "valid" and an "invalid" region of 2^23 PSNs each, so a
// requester never has more than 2^23 PSNs outstanding. `b` is "after" `a` when
// it lies within 2^23 ahead of `a`.
#pragma once

#include <cstdint>

namespace softverbs::wire {

inline constexpr std::uint32_t kPsnBits = 24;
inline constexpr std::uint32_t kPsnMask = 0x00FF'FFFFu;
inline constexpr std::uint32_t kPsnSpace = 0x0100'0000u;      // 2^24
inline constexpr std::uint32_t kPsnHalfSpace = 0x0080'0000u;  // 2^23, the valid region

// Reduces any 32-bit value to a PSN.
constexpr std::uint32_t psn_mask(std::uint32_t v) noexcept { return v & kPsnMask; }

// True if `v` fits in the 24-bit field.
constexpr bool psn_is_valid(std::uint32_t v) noexcept { return v <= kPsnMask; }

// psn + n and psn - n, modulo 2^24.
constexpr std::uint32_t psn_add(std::uint32_t psn, std::uint32_t n) noexcept {
  return (psn + n) & kPsnMask;
}
constexpr std::uint32_t psn_sub(std::uint32_t psn, std::uint32_t n) noexcept {
  return (psn - n) & kPsnMask;
}

// Signed distance a - b in [-2^23, 2^23). Positive: a is after b.
// A distance of exactly 2^23 is ambiguous under the IBTA split; it maps to
// -2^23 ("behind"), as the Linux soft-RoCE driver's psn_compare() does.
constexpr std::int32_t psn_diff(std::uint32_t a, std::uint32_t b) noexcept {
  // Move the 24-bit difference into the top of a 32-bit word and let the
  // arithmetic right shift sign-extend it (both well defined since C++20).
  return static_cast<std::int32_t>((a - b) << 8) >> 8;
}

// <0, 0, >0 as a is before, equal to, or after b.
constexpr int psn_compare(std::uint32_t a, std::uint32_t b) noexcept {
  const std::int32_t d = psn_diff(a, b);
  return (d > 0) - (d < 0);
}

constexpr bool psn_lt(std::uint32_t a, std::uint32_t b) noexcept { return psn_diff(a, b) < 0; }
constexpr bool psn_le(std::uint32_t a, std::uint32_t b) noexcept { return psn_diff(a, b) <= 0; }
constexpr bool psn_gt(std::uint32_t a, std::uint32_t b) noexcept { return psn_diff(a, b) > 0; }
constexpr bool psn_ge(std::uint32_t a, std::uint32_t b) noexcept { return psn_diff(a, b) >= 0; }

// True if psn lies in the window of `count` PSNs starting at `first`
// ([first, first + count) modulo 2^24). count may be at most 2^24.
constexpr bool psn_in_window(std::uint32_t psn, std::uint32_t first, std::uint32_t count) noexcept {
  return ((psn - first) & kPsnMask) < count || count >= kPsnSpace;
}

}  // namespace softverbs::wire

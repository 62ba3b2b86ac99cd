// wire::gather, a packet described in pieces instead of built (the headers
// encoded, the payload spans as given, a zero tail): for every supported
// opcode, payload lengths around the pad and payloads in several pieces, the
// pieces put together are exactly what build() writes without an ICRC, the
// payload is not copied, and build()'s refusals are gather()'s.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "tests/unit/random_headers.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::wire {
namespace {

using Bytes = std::vector<uint8_t>;
using Pieces = std::vector<std::span<const uint8_t>>;

Bytes joined(const GatheredPacket& g) {
  Bytes out(g.headers.begin(), g.headers.end());
  for (const auto& piece : g.payload) out.insert(out.end(), piece.begin(), piece.end());
  out.insert(out.end(), g.tail.begin(), g.tail.end());
  return out;
}

TEST(WireGather, PiecesPutTogetherAreTheBuiltPacketWithoutIcrc) {
  std::mt19937_64 rng(7);
  Bytes built(kMaxUdpPayload);
  int checked = 0;
  for (int code = 0; code < 256; ++code) {
    const OpcodeInfo& op = opcode_info(static_cast<uint8_t>(code));
    if (!op.supported) continue;
    for (size_t len : {size_t{0}, size_t{1}, size_t{3}, size_t{6}, size_t{1023}, size_t{4096}}) {
      if (!op.has_payload && len) continue;
      Bytes payload(len);
      for (auto& b : payload) b = static_cast<uint8_t>(rng());
      const PacketHeaders h = random_headers(rng, static_cast<uint8_t>(code));
      const std::span<const uint8_t> all(payload);
      // Whole, and in three uneven pieces with an empty one between.
      const Pieces one = {all};
      const Pieces three = {all.first(len / 3), std::span<const uint8_t>(), all.subspan(len / 3)};
      for (const Pieces* pieces : {&one, &three}) {
        const size_t n = build(h, *pieces, built, nullptr);
        ASSERT_GT(n, 0u) << op.name;
        uint8_t room[kMaxHeaderBytes];
        GatheredPacket g;
        ASSERT_TRUE(gather(h, *pieces, room, g)) << op.name;
        EXPECT_EQ(g.size, n);
        EXPECT_EQ(g.headers.size(), op.header_len);
        EXPECT_EQ(g.payload.data(), pieces->data());  // not copied
        EXPECT_EQ(joined(g), Bytes(built.begin(), built.begin() + static_cast<std::ptrdiff_t>(n)))
            << op.name << " with " << len << " bytes";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(WireGather, RefusesWhatBuildRefuses) {
  uint8_t room[kMaxHeaderBytes];
  GatheredPacket g;
  PacketHeaders h;
  h.bth.opcode = 0xFF;  // not in the table
  EXPECT_FALSE(gather(h, {}, room, g));
  h.bth.opcode = opcode::rc_flush;  // not supported
  EXPECT_FALSE(gather(h, {}, room, g));
  h.bth.opcode = opcode::rc_acknowledge;
  const uint8_t byte = 1;
  const Pieces one = {std::span<const uint8_t>(&byte, 1)};
  EXPECT_FALSE(gather(h, one, room, g));  // payload on an ACK
  h.bth.opcode = opcode::rc_send_only;
  const Bytes big(40000);
  const Pieces two = {big, big};  // past the largest UDP payload
  EXPECT_FALSE(gather(h, two, room, g));
}

}  // namespace
}  // namespace softverbs::wire

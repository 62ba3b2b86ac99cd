// wire::as_received, the view the in-process fast path hands a receiver
// instead of packet bytes: for every supported opcode and random header
// fields (beyond their wire widths too), it equals what parse() reads back
// from the packet build() writes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "tests/unit/random_headers.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::wire {
namespace {

TEST(AsReceived, EqualsParseOfBuildForEveryOpcode) {
  std::mt19937_64 rng(42);
  std::vector<uint8_t> buf(kMaxUdpPayload);
  int checked = 0;
  for (int code = 0; code < 256; ++code) {
    const OpcodeInfo& op = opcode_info(static_cast<uint8_t>(code));
    if (!op.supported) continue;
    for (size_t len : {size_t{0}, size_t{1}, size_t{3}, size_t{64}, size_t{1023}, size_t{4096}}) {
      if (!op.has_payload && len) continue;
      std::vector<uint8_t> payload(len);
      for (auto& b : payload) b = static_cast<uint8_t>(rng());
      const PacketHeaders h = random_headers(rng, static_cast<uint8_t>(code));
      const size_t n = build(h, std::span<const uint8_t>(payload), buf, nullptr);
      ASSERT_GT(n, 0u) << op.name;
      PacketView parsed;
      ASSERT_EQ(parse(std::span<const uint8_t>(buf.data(), n), parsed), ParseError::ok) << op.name;
      PacketView direct;
      ASSERT_TRUE(as_received(h, payload, direct)) << op.name;
      EXPECT_EQ(static_cast<const PacketHeaders&>(direct), static_cast<const PacketHeaders&>(parsed))
          << op.name << " with " << len << " bytes";
      EXPECT_EQ(direct.op, parsed.op);
      EXPECT_EQ(direct.ip, parsed.ip);
      ASSERT_EQ(direct.payload.size(), parsed.payload.size());
      EXPECT_TRUE(std::equal(direct.payload.begin(), direct.payload.end(), parsed.payload.begin()));
      ++checked;
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(AsReceived, RefusesWhatBuildRefuses) {
  PacketView v;
  PacketHeaders h;
  h.bth.opcode = 0xFF;  // not in the table
  EXPECT_FALSE(as_received(h, {}, v));
  h.bth.opcode = opcode::rc_acknowledge;
  const uint8_t byte = 1;
  EXPECT_FALSE(as_received(h, std::span<const uint8_t>(&byte, 1), v));  // payload on an ACK
}

}  // namespace
}  // namespace softverbs::wire

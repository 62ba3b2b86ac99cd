// wire::as_received, the view the in-process fast path hands a receiver
// instead of packet bytes: for every supported opcode and random header
// fields (beyond their wire widths too), it equals what parse() reads back
// from the packet build() writes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::wire {
namespace {

PacketHeaders random_headers(std::mt19937_64& rng, uint8_t opcode) {
  auto u32 = [&] { return static_cast<uint32_t>(rng()); };
  PacketHeaders h;
  h.bth.opcode = opcode;
  h.bth.se = rng() & 1;
  h.bth.migreq = rng() & 1;
  h.bth.pad_cnt = static_cast<uint8_t>(rng() & 3);  // ignored: computed from the payload
  h.bth.pkey = static_cast<uint16_t>(rng());
  h.bth.fecn = rng() & 1;
  h.bth.becn = rng() & 1;
  h.bth.dest_qp = u32();  // wider than 24 bits on purpose
  h.bth.ack_req = rng() & 1;
  h.bth.psn = u32();
  h.deth = {u32(), u32()};
  h.xrceth = {u32()};
  h.reth = {rng(), u32(), u32()};
  h.aeth = {static_cast<uint8_t>(rng()), u32()};
  h.atomic_eth = {rng(), u32(), rng(), rng()};
  h.atomic_ack_eth = {rng()};
  h.imm = {u32()};
  h.ieth = {u32()};
  return h;
}

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

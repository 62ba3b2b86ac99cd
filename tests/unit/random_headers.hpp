// Packet headers with random fields, beyond their wire widths too (the
// 24-bit numbers, the pad count, which build() computes): what the wire tests
// that compare two ways of writing or reading a packet feed both ways.
#pragma once

#include <cstdint>
#include <random>

#include "wire/packet.hpp"

namespace softverbs::wire {

inline PacketHeaders random_headers(std::mt19937_64& rng, uint8_t opcode) {
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

}  // namespace softverbs::wire

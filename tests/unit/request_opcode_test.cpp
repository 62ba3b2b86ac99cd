// wire::request_opcode: the SEND and RDMA WRITE opcodes the requester takes from
// the opcode table, by transport, position and extension headers.
#include <gtest/gtest.h>

#include <cstdint>

#include "wire/opcode.hpp"

namespace softverbs::wire {
namespace {

// The requester's SEND and RDMA WRITE opcodes, by packet position and extras.
TEST(RequestOpcode, SendAndWriteOpcodesOfRcAndUc) {
  using T = Transport;
  using C = OpClass;
  using P = Position;
  struct Row {
    T t;
    C c;
    P p;
    uint16_t extra;
    uint8_t want;
  };
  const Row rows[] = {
      {T::rc, C::send, P::first, 0, opcode::rc_send_first},
      {T::rc, C::send, P::middle, 0, opcode::rc_send_middle},
      {T::rc, C::send, P::last, 0, opcode::rc_send_last},
      {T::rc, C::send, P::only, 0, opcode::rc_send_only},
      {T::rc, C::send, P::last, ext::imm, opcode::rc_send_last_with_immediate},
      {T::rc, C::send, P::only, ext::imm, opcode::rc_send_only_with_immediate},
      {T::rc, C::send, P::last, ext::ieth, opcode::rc_send_last_with_invalidate},
      {T::rc, C::send, P::only, ext::ieth, opcode::rc_send_only_with_invalidate},
      {T::uc, C::send, P::first, 0, opcode::uc_send_first},
      {T::uc, C::send, P::middle, 0, opcode::uc_send_middle},
      {T::uc, C::send, P::last, 0, opcode::uc_send_last},
      {T::uc, C::send, P::only, 0, opcode::uc_send_only},
      {T::uc, C::send, P::last, ext::imm, opcode::uc_send_last_with_immediate},
      {T::uc, C::send, P::only, ext::imm, opcode::uc_send_only_with_immediate},
      {T::rc, C::rdma_write, P::first, 0, opcode::rc_rdma_write_first},
      {T::rc, C::rdma_write, P::middle, 0, opcode::rc_rdma_write_middle},
      {T::rc, C::rdma_write, P::last, 0, opcode::rc_rdma_write_last},
      {T::rc, C::rdma_write, P::only, 0, opcode::rc_rdma_write_only},
      {T::rc, C::rdma_write, P::last, ext::imm, opcode::rc_rdma_write_last_with_immediate},
      {T::rc, C::rdma_write, P::only, ext::imm, opcode::rc_rdma_write_only_with_immediate},
      {T::uc, C::rdma_write, P::first, 0, opcode::uc_rdma_write_first},
      {T::uc, C::rdma_write, P::middle, 0, opcode::uc_rdma_write_middle},
      {T::uc, C::rdma_write, P::last, 0, opcode::uc_rdma_write_last},
      {T::uc, C::rdma_write, P::only, 0, opcode::uc_rdma_write_only},
      {T::uc, C::rdma_write, P::last, ext::imm, opcode::uc_rdma_write_last_with_immediate},
      {T::uc, C::rdma_write, P::only, ext::imm, opcode::uc_rdma_write_only_with_immediate},
      {T::ud, C::send, P::only, 0, opcode::ud_send_only},
      {T::ud, C::send, P::only, ext::imm, opcode::ud_send_only_with_immediate},
  };
  for (const Row& r : rows) {
    const uint8_t got = request_opcode(r.t, r.c, r.p, r.extra);
    EXPECT_EQ(got, r.want) << opcode_info(r.want).name << " got " << opcode_info(got).name;
  }
}

TEST(RequestOpcode, CombinationsWithoutAnOpcodeAreInvalid) {
  static_assert(request_opcode(Transport::rc, OpClass::send, Position::only, ext::imm) ==
                opcode::rc_send_only_with_immediate);
  EXPECT_FALSE(opcode_info(request_opcode(Transport::uc, OpClass::send, Position::last, ext::ieth)).valid);
  EXPECT_FALSE(opcode_info(request_opcode(Transport::rc, OpClass::rdma_write, Position::only, ext::ieth)).valid);
  EXPECT_FALSE(opcode_info(request_opcode(Transport::rc, OpClass::send, Position::first, ext::imm)).valid);
  EXPECT_FALSE(opcode_info(request_opcode(Transport::ud, OpClass::send, Position::first, 0)).valid);
}

// The table request_opcode reads gives, for every combination (out-of-range
// enum values and header sets included), what a walk over the opcode rows
// finds: the first row of that transport, class and position whose optional
// headers are exactly `extra`.
TEST(RequestOpcode, TableAgreesWithTheRows) {
  const uint16_t extras[] = {0, ext::imm, ext::ieth, ext::imm | ext::ieth, ext::reth};
  for (unsigned t = 0; t < 8; ++t)
    for (unsigned c = 0; c < 13; ++c)
      for (unsigned p = 0; p < 7; ++p)
        for (uint16_t x : extras) {
          uint8_t want = 0xFF;
          for (const detail::OpcodeRow& r : detail::kOpcodeRows)
            if (static_cast<unsigned>(detail::transport_of(r.opcode)) == t && static_cast<unsigned>(r.op_class) == c &&
                static_cast<unsigned>(r.position) == p && (r.headers & (ext::imm | ext::ieth)) == x) {
              want = r.opcode;
              break;
            }
          EXPECT_EQ(request_opcode(static_cast<Transport>(t), static_cast<OpClass>(c), static_cast<Position>(p), x),
                    want)
              << t << " " << c << " " << p << " " << x;
        }
}

}  // namespace
}  // namespace softverbs::wire

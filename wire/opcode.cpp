#include "wire/opcode.hpp"

namespace softverbs::wire {

// The header lengths of docs/wire.md §1.4, checked at compile time so a table
// edit cannot silently change the wire format.
static_assert(opcode_info(opcode::rc_send_first).header_len == 12);
static_assert(opcode_info(opcode::rc_send_last_with_immediate).header_len == 16);
static_assert(opcode_info(opcode::rc_rdma_write_first).header_len == 28);
static_assert(opcode_info(opcode::rc_rdma_write_only_with_immediate).header_len == 32);
static_assert(opcode_info(opcode::rc_rdma_read_request).header_len == 28);
static_assert(opcode_info(opcode::rc_rdma_read_response_first).header_len == 16);
static_assert(opcode_info(opcode::rc_rdma_read_response_middle).header_len == 12);
static_assert(opcode_info(opcode::rc_acknowledge).header_len == 16);
static_assert(opcode_info(opcode::rc_atomic_acknowledge).header_len == 24);
static_assert(opcode_info(opcode::rc_compare_swap).header_len == 40);
static_assert(opcode_info(opcode::rc_send_only_with_invalidate).header_len == 16);
static_assert(opcode_info(opcode::rc_flush).header_len == 32);
static_assert(opcode_info(opcode::ud_send_only).header_len == 20);
static_assert(opcode_info(opcode::ud_send_only_with_immediate).header_len == 24);
static_assert(opcode_info(opcode::cnp).header_len == 28);
static_assert(header_offset(opcode_info(opcode::rc_rdma_write_only_with_immediate), ext::imm) ==
              28);
static_assert(header_offset(opcode_info(opcode::rc_atomic_acknowledge), ext::atomic_ack_eth) == 16);
static_assert(header_offset(opcode_info(opcode::ud_send_only_with_immediate), ext::imm) == 20);
static_assert(header_offset(opcode_info(opcode::rc_flush), ext::reth) == 16);
static_assert(!opcode_info(0x15).valid && !opcode_info(0x40).valid && !opcode_info(0x60).valid);
static_assert(next_opcode_valid(opcode::rc_send_first, opcode::rc_send_last_with_invalidate));
static_assert(!next_opcode_valid(opcode::rc_send_first, opcode::rc_rdma_write_last));
static_assert(!next_opcode_valid(kNoPrevOpcode, opcode::uc_send_middle));

std::string_view to_string(Transport t) noexcept {
  switch (t) {
    case Transport::none: return "none";
    case Transport::rc: return "RC";
    case Transport::uc: return "UC";
    case Transport::ud: return "UD";
    case Transport::cnp: return "CNP";
    case Transport::xrc: return "XRC";
  }
  return "?";
}

std::string_view to_string(OpClass c) noexcept {
  switch (c) {
    case OpClass::none: return "none";
    case OpClass::send: return "send";
    case OpClass::rdma_write: return "rdma_write";
    case OpClass::rdma_read_request: return "rdma_read_request";
    case OpClass::rdma_read_response: return "rdma_read_response";
    case OpClass::ack: return "ack";
    case OpClass::atomic: return "atomic";
    case OpClass::atomic_ack: return "atomic_ack";
    case OpClass::flush: return "flush";
    case OpClass::atomic_write: return "atomic_write";
    case OpClass::cnp: return "cnp";
  }
  return "?";
}

std::string_view to_string(Position p) noexcept {
  switch (p) {
    case Position::none: return "none";
    case Position::first: return "first";
    case Position::middle: return "middle";
    case Position::last: return "last";
    case Position::only: return "only";
  }
  return "?";
}

}  // namespace softverbs::wire

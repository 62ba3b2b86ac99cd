// The checks behind the fuzz targets (parse_fuzz.cpp, receive_fuzz.cpp) and
// their deterministic replay (regression_test.cpp). Each check takes one input
// and returns the properties it found violated, one sentence each; an empty list
// means every property held. Memory errors and undefined behaviour are left to
// the sanitizers of the build.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace softverbs::fuzz {

using Bytes = std::vector<std::uint8_t>;

// ---------------------------------------------------------------------------
// wire::parse and wire::build
//
// The input is read twice: as a packet (BTH .. ICRC) handed to parse() with and
// without ICRC verification, and as a description of headers and payload handed
// to build(), whose output must parse back to the same headers.
std::vector<std::string> check_parse(std::span<const std::uint8_t> input);

// ---------------------------------------------------------------------------
// The receive path of two emulated devices (Device::inject), with live RC and UC
// QPs connected across them.
//
// Input layout (all optional; a short input uses defaults):
//   byte 0  scenario: bit 0 which RC QP has requests outstanding (0: on device
//           0, 1: on device 1); bits 1-2 rotation of the receive WQEs; bits 3-4
//           which protection fault the bad receive WQE carries; bits 5-6 how
//           many receive WQEs each QP gets (5, 2, 1, none); bit 7 RNR retry
//           count 1 instead of 0 (the RNR wait runs on a timer, so such
//           inputs are not entirely deterministic)
//   byte 1  which of the outstanding requests are posted (bit i: request i of
//           the list in receive_harness.cpp)
//   byte 2  options (opt:: below)
//   then records, each: ctl (2 bytes, little-endian), length (2 bytes,
//   little-endian), that many packet bytes (BTH .. ICRC), cut at the input's end.
// The ctl bits select the target QP and which fields the harness fixes up
// before the packet is injected (ctl:: below).
inline constexpr std::size_t kReceiveHeaderBytes = 3;
inline constexpr std::size_t kRecordHeaderBytes = 4;

namespace opt {
inline constexpr std::uint8_t responder_rtr = 0x01;      // the RC QP answering the requests stays in RTR
inline constexpr std::uint8_t cas_into_ro = 0x02;        // the CMP_SWAP result goes to a region without local write
inline constexpr std::uint8_t read_into_foreign = 0x04;  // the 2-SGE READ's second SGE is in another PD
inline constexpr std::uint8_t unsignaled = 0x08;         // the requests are not signaled
inline constexpr std::uint8_t mtu_mask = 0x30;           // path MTU 256, 512, 1024, 4096
inline constexpr std::uint8_t uc_rtr = 0x40;             // the UC QPs stay in RTR
}  // namespace opt

namespace ctl {
inline constexpr std::uint16_t target_mask = 0x0003;  // 0 RC dev0, 1 RC dev1, 2 UC dev0, 3 UC dev1
inline constexpr std::uint16_t raw_qpn = 0x0004;      // keep BTH DestQP as given
inline constexpr std::uint16_t raw_psn = 0x0008;      // keep BTH PSN as given
inline constexpr std::uint16_t raw_keys = 0x0010;     // keep RETH / AtomicETH as given
inline constexpr std::uint16_t raw_icrc_a = 0x0020;   // with raw_icrc_b: keep the ICRC as given
inline constexpr std::uint16_t raw_icrc_b = 0x0040;
inline constexpr std::uint16_t raw_bth = 0x0080;      // keep TVer and PadCnt as given
inline constexpr std::uint16_t map_opcode = 0x0100;   // replace the opcode by a valid one for the target
inline constexpr std::uint16_t foreign_src = 0x0200;  // inject from an address that is no device's
inline constexpr std::uint16_t poll_after = 0x0400;   // poll the CQs right after this packet
}  // namespace ctl

// Builds the state once per process (SOFTVERBS_DEVICES=2 is set here), then
// runs one input. Not thread-safe; meant for one fuzzing or test thread.
std::vector<std::string> check_receive(std::span<const std::uint8_t> input);

// Statistics of the receive harness, for the fuzz target's final report.
std::string receive_stats();

// ---------------------------------------------------------------------------
// Seeds: small valid inputs for each target, built with wire::build.
std::vector<Bytes> parse_seeds();
std::vector<Bytes> receive_seeds();

// Writes seeds as files seed-NNN into dir (created if missing). Returns false
// and says why on stderr if a file cannot be written.
bool write_seeds(const std::string& dir, const std::vector<Bytes>& seeds);

// Appends a receive record to an input being built.
void append_record(Bytes& input, std::uint16_t ctl_bits, std::span<const std::uint8_t> packet);

}  // namespace softverbs::fuzz

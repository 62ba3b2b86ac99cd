// Seed inputs for the fuzz targets, built with wire::build so that they
// follow the wire format exactly; the fuzzer starts from them.
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tests/fuzz/harness.hpp"
#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::fuzz {
namespace {

using namespace wire;

Bytes packet(const PacketHeaders& h, std::size_t payload_len, std::uint8_t fill = 0x5A) {
  Bytes payload(payload_len);
  for (std::size_t i = 0; i < payload_len; ++i) payload[i] = static_cast<std::uint8_t>(fill + i * 7);
  Bytes out(kMaxUdpPayload);
  Ipv4Flow flow;
  flow.saddr = {127, 0, 1, 7};
  flow.daddr = {127, 0, 2, 9};
  const IcrcFlow f{flow};
  const std::size_t n = build(h, payload, out, &f);
  out.resize(n);
  return out;
}

PacketHeaders hdr(std::uint8_t opcode, std::uint32_t psn = 0) {
  PacketHeaders h;
  h.bth.opcode = opcode;
  h.bth.psn = psn;
  h.bth.dest_qp = 0x000102;
  return h;
}

// The receive harness' region numbers (receive_harness.cpp, RegionId).
enum : std::uint32_t { kRw = 0, kRo = 1, kWo = 2, kAt = 3, kLocal = 4, kHigh = 7, kForeign = 8, kDead = 9 };

// A request through the harness' fix-ups: PSN delta, region, offset, length.
PacketHeaders rdma(std::uint8_t opcode, std::uint8_t psn_delta, std::uint32_t region, std::uint32_t offset,
                   std::uint32_t len) {
  PacketHeaders h = hdr(opcode, psn_delta);
  h.reth = {offset + 64, region, len};
  return h;
}

PacketHeaders atomic(std::uint8_t opcode, std::uint8_t psn_delta, std::uint32_t region, std::uint32_t offset,
                     std::uint64_t swap_add, std::uint64_t compare) {
  PacketHeaders h = hdr(opcode, psn_delta);
  h.atomic_eth = {offset + 32, region, swap_add, compare};
  return h;
}

PacketHeaders ack(std::uint8_t opcode, std::uint8_t psn_delta, Aeth aeth) {
  PacketHeaders h = hdr(opcode, psn_delta);
  h.aeth = aeth;
  return h;
}

struct Rec {
  std::uint16_t ctl;
  Bytes pkt;
};

Bytes input(std::uint8_t scenario, std::uint8_t requests, std::initializer_list<Rec> recs, std::uint8_t options = 0) {
  Bytes in = {scenario, requests, options};
  for (const Rec& r : recs) append_record(in, r.ctl, r.pkt);
  return in;
}

}  // namespace

void append_record(Bytes& in, std::uint16_t ctl_bits, std::span<const std::uint8_t> pkt) {
  in.push_back(static_cast<std::uint8_t>(ctl_bits));
  in.push_back(static_cast<std::uint8_t>(ctl_bits >> 8));
  in.push_back(static_cast<std::uint8_t>(pkt.size()));
  in.push_back(static_cast<std::uint8_t>(pkt.size() >> 8));
  in.insert(in.end(), pkt.begin(), pkt.end());
}

std::vector<Bytes> parse_seeds() {
  std::vector<Bytes> seeds;
  for (unsigned op = 0; op < 256; ++op) {
    const OpcodeInfo& info = opcode_info(static_cast<std::uint8_t>(op));
    if (!info.supported) continue;
    PacketHeaders h = hdr(static_cast<std::uint8_t>(op), 0x123456);
    h.reth = {0x1000, 0x2233, 300};
    h.atomic_eth = {0x2000, 0x4455, 7, 9};
    h.aeth = Aeth::ack(5);
    h.deth = {0x11111111, 0x42};
    h.imm = {0xAABBCCDD};
    h.ieth = {0x1234};
    seeds.push_back(packet(h, info.has_payload ? 37 : 0));
  }
  // Listed but unsupported, and not listed at all.
  Bytes cnp(Bth::kSize + kCnpReservedBytes + kIcrcBytes, 0);
  cnp[0] = opcode::cnp;
  seeds.push_back(cnp);
  Bytes flush(32 + kIcrcBytes, 0);
  flush[0] = opcode::rc_flush;
  seeds.push_back(flush);
  Bytes unknown(16, 0);
  unknown[0] = 0x15;
  seeds.push_back(unknown);
  return seeds;
}

std::vector<Bytes> receive_seeds() {
  using namespace opcode;
  const std::uint16_t rc0 = 0, rc1 = 1, uc0 = 2, uc1 = 3;
  const std::uint16_t poll = ctl::poll_after;
  std::vector<Bytes> s;
  // Scenario 0: the RC QP of device 0 has its requests outstanding; device 1's
  // RC QP is the responder.
  s.push_back(input(0, 0x7F, {{rc1, packet(hdr(rc_send_only, 0), 100)}}));
  s.push_back(input(0, 0x7F, {{rc1, packet(hdr(rc_send_first, 0), 256)}, {rc1, packet(hdr(rc_send_last, 1), 40)}}));
  s.push_back(input(0, 0x7F,
                    {{rc1, packet(rdma(rc_rdma_write_only, 0, kRw, 8, 64), 64)},
                     {rc1, packet(rdma(rc_rdma_read_request, 1, kRw, 0, 300), 0)}}));
  s.push_back(input(0, 0x7F,
                    {{rc1, packet(rdma(rc_rdma_write_first, 0, kRw, 0, 600), 256)},
                     {rc1, packet(hdr(rc_rdma_write_middle, 1), 256)},
                     {rc1, packet(hdr(rc_rdma_write_last_with_immediate, 2), 88)}}));
  s.push_back(input(0, 0x7F,
                    {{rc1, packet(atomic(rc_compare_swap, 0, kAt, 0, 7, 0), 0)},
                     {rc1, packet(atomic(rc_fetch_add, 1, kAt, 8, 3, 0), 0)},
                     {rc1, packet(atomic(rc_fetch_add, 1, kAt, 8, 3, 0), 0)}}));
  s.push_back(input(0, 0x7F,
                    {{rc1, packet(rdma(rc_rdma_read_request, 0, kWo, 0, 64), 0)},
                     {rc1, packet(rdma(rc_rdma_write_only, 0, kRo, 0, 16), 16)}}));
  s.push_back(input(0, 0x7F,
                    {{rc1, packet(rdma(rc_rdma_read_request, 0, kHigh, 200, 56), 0)},
                     {rc1, packet(rdma(rc_rdma_write_only, 1, kHigh, 0, 32), 32)}}));
  s.push_back(input(0, 0x7F,
                    {{rc1, packet(rdma(rc_rdma_read_request, 0, kForeign, 0, 8), 0)},
                     {rc1, packet(rdma(rc_rdma_read_request, 0, kDead, 0, 8), 0)}}));
  {
    PacketHeaders inv = hdr(rc_send_only_with_invalidate, 0);
    inv.ieth = {0x1234};
    s.push_back(input(0, 0x7F, {{rc1, packet(inv, 8)}, {rc1, packet(hdr(rc_send_only, 0), 8)}}));
  }
  // Responses to device 0's outstanding requests (PSNs from its first one on).
  s.push_back(input(0, 0x7F,
                    {{rc0, packet(ack(rc_acknowledge, 2, Aeth::ack(2)), 0)},
                     {rc0, packet(ack(rc_rdma_read_response_first, 3, Aeth::ack(2)), 256)},
                     {rc0, packet(hdr(rc_rdma_read_response_middle, 4), 256)},
                     {rc0, packet(ack(rc_rdma_read_response_last, 5, Aeth::ack(3)), 88)},
                     {static_cast<std::uint16_t>(rc0 | poll), packet(ack(rc_atomic_acknowledge, 6, Aeth::ack(4)), 0)},
                     {rc0, packet(ack(rc_atomic_acknowledge, 7, Aeth::ack(5)), 0)},
                     {rc0, packet(ack(rc_rdma_read_response_only, 8, Aeth::ack(6)), 64)},
                     {rc0, packet(ack(rc_acknowledge, 9, Aeth::ack(7)), 0)}}));
  s.push_back(input(0, 0x7F,
                    {{rc0, packet(ack(rc_acknowledge, 0, Aeth::nak(0, NakCode::psn_sequence_error)), 0)},
                     {rc0, packet(ack(rc_acknowledge, 0, Aeth::rnr_nak(0, 1)), 0)}}));
  s.push_back(input(0, 0x7F, {{rc0, packet(ack(rc_acknowledge, 3, Aeth::nak(1, NakCode::remote_access_error)), 0)}}));
  s.push_back(input(0, 0x04, {{rc0, packet(ack(rc_rdma_read_response_only, 0, Aeth::ack(0)), 200)}}));
  // Scenario 1: device 1 is the requester; responses to it, requests to device 0.
  s.push_back(input(1, 0x1C,
                    {{rc1, packet(ack(rc_rdma_read_response_first, 0, Aeth::ack(0)), 256)},
                     {rc1, packet(ack(rc_atomic_acknowledge, 3, Aeth::ack(1)), 0)},
                     {rc0, packet(hdr(rc_send_only_with_immediate, 0), 12)}}));
  // UC: sends, writes, a gap in the middle of a message.
  s.push_back(input(0, 0,
                    {{uc1, packet(hdr(uc_send_only, 0), 20)},
                     {uc1, packet(rdma(uc_rdma_write_first, 1, kRw, 0, 300), 256)},
                     {uc1, packet(hdr(uc_rdma_write_last, 2), 44)},
                     {uc0, packet(hdr(uc_send_first, 0), 256)},
                     {uc0, packet(hdr(uc_send_middle, 5), 256)},
                     {uc0, packet(hdr(uc_send_only_with_immediate, 6), 4)}}));
  // Options: a responder still in RTR, local protection faults in the
  // requester's own result buffers, unsignaled requests, a larger MTU.
  s.push_back(input(0, 0x7F, {{rc1, packet(hdr(rc_send_only, 0), 100)}}, opt::responder_rtr));
  s.push_back(input(0, 0x08, {{rc0, packet(ack(rc_atomic_acknowledge, 0, Aeth::ack(0)), 0)}}, opt::cas_into_ro));
  s.push_back(
      input(0, 0x20, {{rc0, packet(ack(rc_rdma_read_response_only, 0, Aeth::ack(0)), 64)}}, opt::read_into_foreign));
  s.push_back(input(0, 0x03, {{rc0, packet(ack(rc_acknowledge, 2, Aeth::ack(1)), 0)}}, opt::unsignaled));
  s.push_back(input(1, 0x04,
                    {{rc1, packet(ack(rc_rdma_read_response_only, 0, Aeth::ack(0)), 600)},
                     {rc0, packet(hdr(rc_send_only, 0), 1000)},
                     {uc1, packet(hdr(uc_send_only, 0), 900)}},
                    0x30));
  // Hostile framing: bad ICRC, unknown QPN, bad TVer, truncated headers.
  {
    Bytes tver = packet(hdr(rc_send_only, 0), 8);
    tver[1] |= 0x03;
    Bytes cut = packet(rdma(rc_rdma_read_request, 0, kRw, 0, 8), 0);
    cut.resize(20);
    s.push_back(
        input(0, 0x7F,
              {{static_cast<std::uint16_t>(rc1 | ctl::raw_icrc_a | ctl::raw_icrc_b), packet(hdr(rc_send_only, 0), 8)},
               {static_cast<std::uint16_t>(rc1 | ctl::raw_qpn), packet(hdr(rc_send_only, 0), 8)},
               {static_cast<std::uint16_t>(rc1 | ctl::raw_bth), tver},
               {rc1, cut},
               {static_cast<std::uint16_t>(rc1 | ctl::foreign_src), packet(hdr(rc_send_only, 0), 8)}}));
  }
  (void)kLocal;
  return s;
}

bool write_seeds(const std::string& dir, const std::vector<Bytes>& seeds) {
  ::mkdir(dir.c_str(), 0755);  // may exist
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "/seed-%03zu", i);
    const std::string path = dir + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) {
      std::fprintf(stderr, "cannot write %s: %s\n", path.c_str(), std::strerror(errno));
      return false;
    }
    std::fwrite(seeds[i].data(), 1, seeds[i].size(), f);
    std::fclose(f);
  }
  return true;
}

}  // namespace softverbs::fuzz

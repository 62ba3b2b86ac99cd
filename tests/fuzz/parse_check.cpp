// The properties of wire::parse and wire::build checked on every input
// of the parse fuzz target (harness.hpp).
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <memory>

#include "tests/fuzz/harness.hpp"
#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"

namespace softverbs::fuzz {
namespace {

using namespace wire;

// Collects violations with a printf-style message.
class Report {
 public:
  explicit Report(std::vector<std::string>& out) : out_(out) {}
  __attribute__((format(printf, 2, 3))) void fail(const char* fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    out_.emplace_back(buf);
  }

 private:
  std::vector<std::string>& out_;
};

IcrcFlow flow_v4() {
  Ipv4Flow f;
  f.saddr = {127, 0, 1, 7};
  f.daddr = {127, 0, 2, 9};
  f.sport = kRoceV2UdpPort;
  return f;
}

IcrcFlow flow_v6() {
  Ipv6Flow f;
  for (std::size_t i = 0; i < f.saddr.size(); ++i) {
    f.saddr[i] = static_cast<std::uint8_t>(0x20 + i);
    f.daddr[i] = static_cast<std::uint8_t>(0xA0 ^ i);
  }
  f.sport = 0xC123;
  return f;
}

// What parse() must answer for `pkt` without ICRC verification, derived from the
// layout rules of packet.hpp independently of its implementation.
ParseError expected_error(std::span<const std::uint8_t> pkt) {
  if (pkt.size() < Bth::kSize + kIcrcBytes) return ParseError::too_short;
  const Bth bth = decode_bth(pkt.first<Bth::kSize>());
  const OpcodeInfo& op = opcode_info(bth.opcode);
  if (bth.tver != 0) return ParseError::bad_tver;
  if (!op.valid) return ParseError::unknown_opcode;
  if (!op.supported) return ParseError::unsupported_opcode;
  if (pkt.size() < op.header_len + kIcrcBytes) return ParseError::truncated_headers;
  const std::size_t body = pkt.size() - op.header_len - kIcrcBytes;
  if (!op.has_payload && body != 0) return ParseError::unexpected_payload;
  if (bth.pad_cnt > body) return ParseError::pad_exceeds_payload;
  return ParseError::ok;
}

const char* name(ParseError e) { return to_string(e).data(); }

// The extension headers of `op` decoded straight from the bytes.
PacketHeaders decode_all(std::span<const std::uint8_t> pkt, const OpcodeInfo& op) {
  PacketHeaders h;
  h.bth = decode_bth(pkt.first<Bth::kSize>());
  auto at = [&](std::uint16_t bit) { return pkt.data() + header_offset(op, bit); };
  if (op.has(ext::deth)) h.deth = decode_deth(ConstHeaderBytes<Deth>(at(ext::deth), Deth::kSize));
  if (op.has(ext::xrceth)) h.xrceth = decode_xrceth(ConstHeaderBytes<Xrceth>(at(ext::xrceth), Xrceth::kSize));
  if (op.has(ext::reth)) h.reth = decode_reth(ConstHeaderBytes<Reth>(at(ext::reth), Reth::kSize));
  if (op.has(ext::atomic_eth))
    h.atomic_eth = decode_atomic_eth(ConstHeaderBytes<AtomicEth>(at(ext::atomic_eth), AtomicEth::kSize));
  if (op.has(ext::aeth)) h.aeth = decode_aeth(ConstHeaderBytes<Aeth>(at(ext::aeth), Aeth::kSize));
  if (op.has(ext::atomic_ack_eth))
    h.atomic_ack_eth =
        decode_atomic_ack_eth(ConstHeaderBytes<AtomicAckEth>(at(ext::atomic_ack_eth), AtomicAckEth::kSize));
  if (op.has(ext::imm)) h.imm = decode_imm(ConstHeaderBytes<Imm>(at(ext::imm), Imm::kSize));
  if (op.has(ext::ieth)) h.ieth = decode_ieth(ConstHeaderBytes<Ieth>(at(ext::ieth), Ieth::kSize));
  return h;
}

const PacketHeaders& headers_of(const PacketView& v) { return v; }

bool same_view(const PacketView& a, const PacketView& b) {
  return headers_of(a) == headers_of(b) && a.op == b.op && a.icrc == b.icrc && a.payload.data() == b.payload.data() &&
         a.payload.size() == b.payload.size();
}

// ---- the input as a packet ------------------------------------------------

void check_as_packet(std::span<const std::uint8_t> pkt, Report& r) {
  PacketView v;
  const ParseError e = parse(pkt, v);
  const ParseError want = expected_error(pkt);
  if (e != want) r.fail("parse() gave %s, the layout rules give %s", name(e), name(want));

  if (pkt.size() < Bth::kSize + kIcrcBytes) {
    if (v.op != &opcode_info(0xFF) || !(headers_of(v) == PacketHeaders{}) || !v.payload.empty())
      r.fail("parse() of a too-short packet left the view filled");
  } else {
    const Bth bth = decode_bth(pkt.first<Bth::kSize>());
    if (!(v.bth == bth)) r.fail("parse() (%s) did not fill the BTH of the packet", name(e));
    if (v.op != &opcode_info(bth.opcode)) r.fail("parse() (%s) did not point op at the opcode's entry", name(e));
    if (v.icrc != load_icrc(pkt.data() + pkt.size() - kIcrcBytes)) r.fail("parse() read the wrong ICRC");
  }

  if (e == ParseError::ok) {
    const OpcodeInfo& op = *v.op;
    const std::size_t body = pkt.size() - op.header_len - kIcrcBytes;
    const auto* lo = pkt.data();
    const auto* hi = pkt.data() + pkt.size() - kIcrcBytes;  // the payload never covers the ICRC
    if (!op.valid || !op.supported) r.fail("parse() accepted opcode 0x%02x, not a supported opcode", op.opcode);
    if (v.payload.size() > 0 && (v.payload.data() < lo || v.payload.data() + v.payload.size() > hi))
      r.fail("payload span [%td, +%zu) lies outside the packet's bytes before the ICRC (%zu)", v.payload.data() - lo,
             v.payload.size(), pkt.size() - kIcrcBytes);
    if (v.payload.data() != lo + op.header_len)
      r.fail("payload starts at %td, not after the %u header bytes", v.payload.data() - lo, op.header_len);
    if (v.payload.size() + v.bth.pad_cnt != body)
      r.fail("payload %zu + pad %u != %zu bytes between headers and ICRC", v.payload.size(), v.bth.pad_cnt, body);
    if (!op.has_payload && !v.payload.empty()) r.fail("payload on %s, which carries none", op.name.data());
    PacketHeaders want_h = decode_all(pkt, op);
    if (!(headers_of(v) == want_h)) r.fail("parse() decoded the extension headers of %s wrongly", op.name.data());
  }

  // With verification: the ICRC decides first; a matching ICRC changes nothing.
  for (const IcrcFlow& flow : {flow_v4(), flow_v6()}) {
    PacketView vv;
    const ParseError ev = parse(pkt, vv, flow);
    if (pkt.size() < Bth::kSize + kIcrcBytes) {
      if (ev != ParseError::too_short) r.fail("verifying parse() of a short packet gave %s", name(ev));
      continue;
    }
    const auto body = pkt.first(pkt.size() - kIcrcBytes);
    bool match = icrc(flow, body) == v.icrc;
    // Over IPv4 an ICRC that holds under some IPv4 ID is a good one (the sender's
    // kernel may have numbered the packet); it must really hold under that ID.
    if (const auto* v4 = std::get_if<Ipv4Flow>(&flow); v4 && !match) {
      if (auto id = solve_ipv4_id(*v4, body, v.icrc)) {
        Ipv4Flow with_id = *v4;
        with_id.id = *id;
        if (icrc_ipv4(with_id, body) != v.icrc)
          r.fail("solve_ipv4_id() gave ID 0x%04x, under which the ICRC fails", *id);
        match = true;
      }
    }
    if (!match && ev != ParseError::icrc_mismatch) r.fail("bad ICRC accepted by verifying parse(): %s", name(ev));
    if (match && (ev != e || !same_view(v, vv)))
      r.fail("verifying parse() with a good ICRC gave %s, plain parse() %s", name(ev), name(e));

    // The same bytes with a correct ICRC parse to the plain result.
    Bytes fixed(pkt.begin(), pkt.end());
    write_icrc(flow, fixed);
    PacketView vf;
    const ParseError ef = parse(fixed, vf, flow);
    if (ef != e) r.fail("after write_icrc(), verifying parse() gave %s instead of %s", name(ef), name(e));
  }

  // Round trip: build() from what parse() decoded.
  if (e != ParseError::ok) return;
  const OpcodeInfo& op = *v.op;
  const IcrcFlow flow = flow_v4();
  const std::size_t size = packet_size(op.opcode, v.payload.size());
  if (size == 0) {
    r.fail("packet_size() refuses %s with %zu payload bytes that parse() accepted", op.name.data(), v.payload.size());
    return;
  }
  auto out = std::make_unique<std::uint8_t[]>(size);  // exact size: ASan sees any write past it
  const std::size_t n = build(headers_of(v), v.payload, std::span<std::uint8_t>(out.get(), size), &flow);
  if (n != size) {
    r.fail("build() of a parsed %s gave %zu bytes, packet_size() %zu", op.name.data(), n, size);
    return;
  }
  const std::span<const std::uint8_t> built(out.get(), n);
  PacketView vb;
  const ParseError eb = parse(built, vb, flow);
  if (eb != ParseError::ok) {
    r.fail("the rebuilt %s does not parse: %s", op.name.data(), name(eb));
    return;
  }
  PacketHeaders want_h = headers_of(v);
  want_h.bth.pad_cnt = static_cast<std::uint8_t>((4 - v.payload.size() % 4) % 4);
  if (!(headers_of(vb) == want_h)) r.fail("the rebuilt %s parses to other headers", op.name.data());
  if (vb.payload.size() != v.payload.size() || !std::equal(vb.payload.begin(), vb.payload.end(), v.payload.begin()))
    r.fail("the rebuilt %s carries another payload", op.name.data());

  // With a canonical pad the rebuilt bytes are the input's, once the bits that
  // build() writes as 0 (reserved bits, pad bytes) are cleared and the ICRC is
  // made to match.
  if (v.bth.pad_cnt == want_h.bth.pad_cnt) {
    Bytes canon(pkt.begin(), pkt.end());
    canon[4] &= 0xC0;  // FECN, BECN; resv6
    canon[8] &= 0x80;  // AckReq; resv7
    if (op.has(ext::deth)) canon[header_offset(op, ext::deth) + 4] = 0;
    if (op.has(ext::xrceth)) canon[header_offset(op, ext::xrceth)] = 0;  // XRCETH resv8
    std::fill_n(canon.end() - kIcrcBytes - v.bth.pad_cnt, v.bth.pad_cnt, std::uint8_t{0});
    write_icrc(flow, canon);
    if (!std::equal(canon.begin(), canon.end(), built.begin(), built.end())) {
      std::size_t at = 0;
      while (at < n && canon[at] == built[at]) ++at;
      r.fail("the rebuilt %s differs from the canonical input at byte %zu", op.name.data(), at);
    }
  }
}

// ---- the input as build() arguments -----------------------------------------

class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> in) : in_(in) {}
  template <class T>
  T take() {
    T v{};
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      v = static_cast<T>((static_cast<std::uint64_t>(v) << 8) | (at_ < in_.size() ? in_[at_] : 0));
      ++at_;
    }
    return v;
  }
  bool take_bool() { return (take<std::uint8_t>() & 1) != 0; }
  std::span<const std::uint8_t> rest() const {
    return at_ < in_.size() ? in_.subspan(at_) : std::span<const std::uint8_t>();
  }

 private:
  std::span<const std::uint8_t> in_;
  std::size_t at_ = 0;
};

void check_build(std::span<const std::uint8_t> input, Report& r) {
  Reader rd(input);
  PacketHeaders h;
  h.bth.opcode = rd.take<std::uint8_t>();
  const std::uint8_t flags = rd.take<std::uint8_t>();
  h.bth.se = flags & 1;
  h.bth.migreq = flags & 2;
  h.bth.fecn = flags & 4;
  h.bth.becn = flags & 8;
  h.bth.ack_req = flags & 16;
  const bool with_flow = (flags & 32) == 0;
  h.bth.pad_cnt = rd.take<std::uint8_t>();  // build() ignores it
  h.bth.tver = (flags & 64) ? rd.take<std::uint8_t>() : 0;
  h.bth.pkey = rd.take<std::uint16_t>();
  h.bth.dest_qp = rd.take<std::uint32_t>();
  h.bth.psn = rd.take<std::uint32_t>();
  const OpcodeInfo& op = opcode_info(h.bth.opcode);
  if (op.has(ext::deth)) h.deth = {rd.take<std::uint32_t>(), rd.take<std::uint32_t>()};
  if (op.has(ext::xrceth)) h.xrceth = {rd.take<std::uint32_t>()};
  if (op.has(ext::reth)) h.reth = {rd.take<std::uint64_t>(), rd.take<std::uint32_t>(), rd.take<std::uint32_t>()};
  if (op.has(ext::atomic_eth))
    h.atomic_eth = {rd.take<std::uint64_t>(), rd.take<std::uint32_t>(), rd.take<std::uint64_t>(),
                    rd.take<std::uint64_t>()};
  if (op.has(ext::aeth)) h.aeth = {rd.take<std::uint8_t>(), rd.take<std::uint32_t>()};
  if (op.has(ext::atomic_ack_eth)) h.atomic_ack_eth = {rd.take<std::uint64_t>()};
  if (op.has(ext::imm)) h.imm = {rd.take<std::uint32_t>()};
  if (op.has(ext::ieth)) h.ieth = {rd.take<std::uint32_t>()};
  const std::uint8_t out_mode = rd.take<std::uint8_t>();
  const std::uint16_t split1 = rd.take<std::uint16_t>();
  const std::uint16_t split2 = rd.take<std::uint16_t>();
  const std::span<const std::uint8_t> payload = rd.rest();

  // The payload in up to three pieces, some possibly empty.
  const std::size_t a = payload.empty() ? 0 : split1 % (payload.size() + 1);
  const std::size_t b = a + (payload.size() - a == 0 ? 0 : split2 % (payload.size() - a + 1));
  std::vector<std::span<const std::uint8_t>> parts = {payload.first(a), payload.subspan(a, b - a), payload.subspan(b)};
  if (out_mode & 0x80) parts.resize(out_mode & 0x40 ? 1 : 0);  // one piece, or none at all
  std::size_t len = 0;
  for (const auto& p : parts) len += p.size();

  const std::size_t size = packet_size(h.bth.opcode, len);
  const bool refusable = !op.supported || (!op.has_payload && len != 0) || len > kMaxUdpPayload;
  if ((size == 0) != refusable) r.fail("packet_size(0x%02x, %zu) = %zu", h.bth.opcode, len, size);
  if (size != 0 && size != op.header_len + len + (4 - len % 4) % 4 + kIcrcBytes)
    r.fail("packet_size(0x%02x, %zu) = %zu does not add up", h.bth.opcode, len, size);

  // The output buffer: exact, short by a few bytes, or roomy.
  std::size_t cap = size;
  switch (out_mode & 3) {
    case 0:
      break;
    case 1:
      cap = size > 0 ? size - 1 - (out_mode >> 2 & 7) % size : 0;
      break;
    case 2:
      cap = size + (out_mode >> 2 & 15);
      break;
    case 3:
      cap = (out_mode >> 2 & 15) * 4;
      break;
  }
  auto out = std::make_unique<std::uint8_t[]>(std::max<std::size_t>(cap, 1));
  std::memset(out.get(), 0xCC, std::max<std::size_t>(cap, 1));
  const IcrcFlow flow = flow_v4();
  const std::size_t n = build(h, std::span<const std::span<const std::uint8_t>>(parts),
                              std::span<std::uint8_t>(out.get(), cap), with_flow ? &flow : nullptr);
  const std::size_t want_n = (size == 0 || cap < size) ? 0 : size;
  if (n != want_n) {
    r.fail("build(0x%02x, %zu payload bytes, %zu-byte buffer) gave %zu, expected %zu", h.bth.opcode, len, cap, n,
           want_n);
    return;
  }
  if (n == 0) return;
  for (std::size_t i = n; i < cap; ++i) {
    if (out[i] != 0xCC) {
      r.fail("build() wrote byte %zu of the buffer, past the %zu-byte packet", i, n);
      break;
    }
  }
  const std::span<const std::uint8_t> pkt(out.get(), n);
  if (!with_flow && load_icrc(pkt.data() + n - kIcrcBytes) != 0) r.fail("build() without a flow wrote an ICRC");

  PacketView v;
  const ParseError e = with_flow ? parse(pkt, v, flow) : parse(pkt, v);
  const ParseError want = (h.bth.tver & 0xF) != 0 ? ParseError::bad_tver : ParseError::ok;
  if (e != want) {
    r.fail("build() output for %s parses as %s, expected %s", op.name.data(), name(e), name(want));
    return;
  }
  if (e != ParseError::ok) return;
  PacketHeaders w;
  w.bth = h.bth;
  w.bth.pad_cnt = static_cast<std::uint8_t>((4 - len % 4) % 4);
  w.bth.tver = 0;
  w.bth.dest_qp &= kQpnMask;
  w.bth.psn &= 0xFFFFFF;
  if (op.has(ext::deth)) w.deth = {h.deth.qkey, h.deth.src_qp & kQpnMask};
  if (op.has(ext::xrceth)) w.xrceth = {h.xrceth.srqn & kQpnMask};
  if (op.has(ext::reth)) w.reth = h.reth;
  if (op.has(ext::atomic_eth)) w.atomic_eth = h.atomic_eth;
  if (op.has(ext::aeth)) w.aeth = {h.aeth.syndrome, h.aeth.msn & 0xFFFFFF};
  if (op.has(ext::atomic_ack_eth)) w.atomic_ack_eth = h.atomic_ack_eth;
  if (op.has(ext::imm)) w.imm = h.imm;
  if (op.has(ext::ieth)) w.ieth = h.ieth;
  if (!(headers_of(v) == w)) r.fail("build() then parse() of %s changed the headers", op.name.data());
  Bytes joined;
  for (const auto& p : parts) joined.insert(joined.end(), p.begin(), p.end());
  if (!std::equal(v.payload.begin(), v.payload.end(), joined.begin(), joined.end()))
    r.fail("build() then parse() of %s changed the payload", op.name.data());
  for (std::size_t i = 0; i < w.bth.pad_cnt; ++i)
    if (pkt[n - kIcrcBytes - 1 - i] != 0) r.fail("build() wrote a non-zero pad byte");
}

}  // namespace

std::vector<std::string> check_parse(std::span<const std::uint8_t> input) {
  std::vector<std::string> out;
  Report r(out);
  check_as_packet(input, r);
  check_build(input, r);
  return out;
}

}  // namespace softverbs::fuzz

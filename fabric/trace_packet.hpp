// The trace's packet records (core/trace.hpp), shared by the two link layers
// that write them: the tap (what goes out, with its capture frame) and the
// fault layer (what comes in, and what it drops before the tap sees it).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/clock.hpp"
#include "core/trace.hpp"
#include "wire/packet.hpp"

namespace softverbs::fabric {

inline void trace_packet(const Clock& clock, const std::string& dev, std::string_view dir,
                         std::span<const uint8_t> bytes, std::string_view fault, uint64_t frame) {
  wire::PacketView v;
  if (wire::parse(bytes, v) != wire::ParseError::ok) return;
  const uint32_t sqpn = (v.op->headers & wire::ext::deth) ? v.deth.src_qp : 0;
  trace::packet(clock, dev,
                {dir, v.op->name, v.bth.psn, v.bth.dest_qp, sqpn, static_cast<uint32_t>(bytes.size()), fault, frame});
}

}  // namespace softverbs::fabric

// The emulated devices' calls into the trace (core/trace.hpp), in the device's
// name and on its clock. Each is one predictable branch when tracing is off.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/trace.hpp"
#include "emu/objects/objects.hpp"

namespace softverbs::emu {

// An object verb: "create_qp" with the QPN, "reg_mr" with the lkey, ...
inline void trace_object(Device& dev, std::string_view verb, uint32_t num) {
  if (trace::on()) trace::object(dev.clock(), dev.name(), verb, num);
}

}  // namespace softverbs::emu

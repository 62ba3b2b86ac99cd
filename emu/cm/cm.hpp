// The emulator's connection manager: rdma_cm over the emulated devices
// (docs/rdma-cm.md). Address resolution maps IP addresses to the devices that
// own them; connections are made with IB CM MADs (wire/cm_mad.hpp) sent to QP1
// over each device's link.
#pragma once

#include "core/cm_provider.hpp"

namespace softverbs::emu {

class EmuCm final : public CmProvider {
 public:
  static EmuCm& instance();
  const char* name() const noexcept override { return "emu"; }
};

}  // namespace softverbs::emu

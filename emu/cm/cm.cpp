#include "emu/cm/cm.hpp"

namespace softverbs::emu {

EmuCm& EmuCm::instance() {
  static EmuCm* cm = new EmuCm;  // lives until exit, like the devices it serves
  return *cm;
}

}  // namespace softverbs::emu

softverbs::CmProvider* softverbs::emu_cm_provider() { return &emu::EmuCm::instance(); }

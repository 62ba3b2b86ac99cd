// Which backends serve this process: SOFTVERBS_BACKEND=emu (default), hw, or both.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "abi/export.hpp"
#include "emu/objects.hpp"
#include "emu/provider.hpp"
#include "hw/provider.hpp"

namespace softverbs {

const std::vector<Provider*>& providers() {
  static const std::vector<Provider*> list = [] {
    std::vector<Provider*> out;
    const char* env = std::getenv("SOFTVERBS_BACKEND");
    std::string backend = env && *env ? env : "emu";
    if (backend == "emu" || backend == "both") out.push_back(&emu::EmuProvider::instance());
    // The real library is loaded by the first hw get_devices(), not here.
    if (backend == "hw" || backend == "both") out.push_back(&hw::HwProvider::instance());
    if (backend != "emu" && backend != "hw" && backend != "both")
      SV_LOG(kError, "SOFTVERBS_BACKEND=%s: expected emu, hw or both; no devices", backend.c_str());
    return out;
  }();
  return list;
}

namespace abi {

const std::vector<emu::Device*>& emu_devices() {
  static const std::vector<emu::Device*> none;
  const auto& list = providers();
  if (std::find(list.begin(), list.end(), &emu::EmuProvider::instance()) == list.end()) return none;
  return emu::DeviceRegistry::instance().devices();
}

}  // namespace abi

}  // namespace softverbs

// Which backends serve this process: SOFTVERBS_BACKEND=emu (default), hw, or both.
#include <cstdlib>
#include <string>

#include "abi/common/export.hpp"

namespace softverbs {

const std::vector<Provider*>& providers() {
  static const std::vector<Provider*> list = [] {
    std::vector<Provider*> out;
    const char* env = std::getenv("SOFTVERBS_BACKEND");
    std::string backend = env && *env ? env : "emu";
    if (backend == "emu" || backend == "both") out.push_back(&emu_provider());
    // The real library is loaded by the first hw get_devices(), not here.
    if (backend == "hw" || backend == "both") out.push_back(&hw_provider());
    if (backend != "emu" && backend != "hw" && backend != "both")
      SV_LOG(kError, "SOFTVERBS_BACKEND=%s: expected emu, hw or both; no devices", backend.c_str());
    return out;
  }();
  return list;
}

}  // namespace softverbs

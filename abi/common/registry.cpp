// Which backends serve this process: SOFTVERBS_BACKEND=emu (default), hw, or both.
#include <string>

#include "abi/common/export.hpp"
#include "core/env.hpp"

namespace softverbs {

const std::vector<Provider*>& providers() {
  static const std::vector<Provider*> list = [] {
    std::vector<Provider*> out;
    const char* env = env::backend();
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

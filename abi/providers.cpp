// Which backends serve this process: SOFTVERBS_BACKEND=emu (default), hw, or both.
#include <cstdlib>
#include <cstring>

#include "abi/export.hpp"
#include "emu/provider.hpp"

namespace softverbs {

const std::vector<Provider*>& providers() {
  static const std::vector<Provider*> list = [] {
    std::vector<Provider*> out;
    const char* env = std::getenv("SOFTVERBS_BACKEND");
    std::string backend = env && *env ? env : "emu";
    if (backend == "emu" || backend == "both") out.push_back(&emu::EmuProvider::instance());
    if (backend == "hw" || backend == "both")
      SV_LOG(kError, "SOFTVERBS_BACKEND=%s: the hw backend is not available in this build", backend.c_str());
    if (backend != "emu" && backend != "hw" && backend != "both")
      SV_LOG(kError, "SOFTVERBS_BACKEND=%s: expected emu, hw or both; no devices", backend.c_str());
    return out;
  }();
  return list;
}

}  // namespace softverbs

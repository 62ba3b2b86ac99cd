// Which connection managers serve this process: the CM of each verbs backend
// that providers() selected (SOFTVERBS_BACKEND), in the same order, so that an
// rdma_cm_id's contexts always belong to a listed verbs provider.
#include "abi/common/export.hpp"
#include "core/cm_provider.hpp"

namespace softverbs {

const std::vector<CmProvider*>& cm_providers() {
  static const std::vector<CmProvider*> list = [] {
    std::vector<CmProvider*> out;
    for (Provider* p : providers()) {
      if (p == &emu_provider()) out.push_back(emu_cm_provider());
      // The hw CM is the real librdmacm, loaded now (a missing one is logged
      // at debug level and leaves the hw backend without a CM).
      if (p == &hw_provider())
        if (CmProvider* cm = hw_cm_provider()) out.push_back(cm);
    }
    return out;
  }();
  return list;
}

}  // namespace softverbs

// The defaults of the provider interface that are not "unsupported": verbs that
// rdma-core's libibverbs derives from other verbs itself, so that a provider
// need not implement them (SV_VERB_DERIVED rows of core/verbs.def).
#include "core/provider.hpp"

namespace softverbs {

// rdma-core 44's ibv_query_gid_type (libibverbs/verbs.c): the GID entry's type,
// with an empty entry (ENODATA) answered as IB/RoCE v1 to keep the API's
// behaviour from before GID entries existed.
int Provider::query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, ibv_gid_type_sysfs* type) {
  ibv_gid_entry entry{};
  int ret = query_gid_ex(context, port_num, index, &entry, 0, sizeof entry);
  if (ret == ENODATA) {
    *type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
    return 0;
  }
  if (ret) {
    errno = ret;
    return -1;
  }
  *type = entry.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
  return 0;
}

}  // namespace softverbs

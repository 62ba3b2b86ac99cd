/* Types from rdma-core 44's private provider interface (libibverbs/driver.h),
 * which Debian does not install. Their layouts are part of the ABI that
 * IBVERBS_PRIVATE_34 consumers (ibv_devinfo, pyverbs, libmlx5, libefa) rely on. */
#pragma once

#include <infiniband/verbs.h>

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum ibv_gid_type_sysfs {
  IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
  IBV_GID_TYPE_SYSFS_ROCE_V2,
};

/* driver.h: exported in IBVERBS_PRIVATE_34 (pyverbs calls it). */
int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num, unsigned int index,
                       enum ibv_gid_type_sysfs* type);

struct verbs_device_ops;
struct verbs_sysfs_dev;

struct sv_list_node {
  struct sv_list_node *next, *prev;
};

/* driver.h: struct verbs_device. Providers compare ->ops with their own table
 * before touching a device, so a foreign device is safely rejected. */
struct verbs_device {
  struct ibv_device device;
  const struct verbs_device_ops* ops;
  unsigned int refcount; /* atomic_int in C */
  struct sv_list_node entry;
  struct verbs_sysfs_dev* sysfs;
  uint64_t core_support;
};

#ifdef __cplusplus
}

static_assert(sizeof(struct ibv_device) == 664);
static_assert(__builtin_offsetof(struct verbs_device, ops) == 664);
static_assert(__builtin_offsetof(struct verbs_device, refcount) == 672);
static_assert(__builtin_offsetof(struct verbs_device, entry) == 680);
static_assert(__builtin_offsetof(struct verbs_device, sysfs) == 696);
static_assert(sizeof(struct verbs_device) == 712);
#endif

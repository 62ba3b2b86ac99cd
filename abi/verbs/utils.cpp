// Provider-independent exports: strings, rate conversions, kernel-struct copies,
// sysfs helpers. Their results are exactly rdma-core 44's.
#include <fcntl.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "abi/common/export.hpp"
#include "core/env.hpp"

namespace {

template <size_t N>
const char* lookup(const char* const (&table)[N], long index) {
  if (index < 0 || static_cast<size_t>(index) >= N || !table[index]) return "unknown";
  return table[index];
}

}  // namespace

SV_EXPORT const char* ibv_node_type_str(enum ibv_node_type node_type) {
  static const char* const names[] = {"unknown",  // IBV_NODE_UNKNOWN (-1) is outside
                                      "InfiniBand channel adapter",
                                      "InfiniBand switch",
                                      "InfiniBand router",
                                      "iWARP NIC",
                                      "usNIC",
                                      "usNIC UDP",
                                      "unspecified"};
  // IBV_NODE_CA is 1: the table is indexed by the enum value.
  return lookup(names, node_type);
}

SV_EXPORT const char* ibv_port_state_str(enum ibv_port_state port_state) {
  static const char* const names[] = {"no state change (NOP)", "down", "init", "armed", "active", "active defer"};
  return lookup(names, port_state);
}

SV_EXPORT const char* ibv_event_type_str(enum ibv_event_type event) {
  static const char* const names[] = {"CQ error",
                                      "local work queue catastrophic error",
                                      "invalid request local work queue error",
                                      "local access violation work queue error",
                                      "communication established",
                                      "send queue drained",
                                      "path migrated",
                                      "path migration request error",
                                      "local catastrophic error",
                                      "port active",
                                      "port error",
                                      "LID change",
                                      "P_Key change",
                                      "SM change",
                                      "SRQ catastrophic error",
                                      "SRQ limit reached",
                                      "last WQE reached",
                                      "client reregistration",
                                      "GID table change",
                                      "WQ fatal"};
  return lookup(names, event);
}

SV_EXPORT const char* ibv_wc_status_str(enum ibv_wc_status status) {
  static const char* const names[] = {"success",
                                      "local length error",
                                      "local QP operation error",
                                      "local EE context operation error",
                                      "local protection error",
                                      "Work Request Flushed Error",
                                      "memory management operation error",
                                      "bad response error",
                                      "local access error",
                                      "remote invalid request error",
                                      "remote access error",
                                      "remote operation error",
                                      "transport retry counter exceeded",
                                      "RNR retry counter exceeded",
                                      "local RDD violation error",
                                      "remote invalid RD request",
                                      "aborted error",
                                      "invalid EE context number",
                                      "invalid EE context state",
                                      "fatal error",
                                      "response timeout error",
                                      "general error",
                                      "TM error",
                                      "TM software rendezvous"};
  return lookup(names, status);
}

namespace {

struct RateRow {
  ibv_rate rate;
  int mult;  // -1: no 2.5 Gb/s multiple
  int mbps;
};

constexpr RateRow kRates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},     {IBV_RATE_5_GBPS, 2, 5000},         {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},     {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},    {IBV_RATE_80_GBPS, 32, 80000},      {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, -1, 14062},    {IBV_RATE_56_GBPS, -1, 56250},      {IBV_RATE_112_GBPS, -1, 112500},
    {IBV_RATE_168_GBPS, -1, 168750},  {IBV_RATE_25_GBPS, -1, 25781},      {IBV_RATE_100_GBPS, -1, 103125},
    {IBV_RATE_200_GBPS, -1, 206250},  {IBV_RATE_300_GBPS, -1, 309375},    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},    {IBV_RATE_400_GBPS, 160, 425000},   {IBV_RATE_600_GBPS, 240, 637500},
    {IBV_RATE_800_GBPS, 320, 850000}, {IBV_RATE_1200_GBPS, 480, 1275000},
};

}  // namespace

SV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate) return r.mult;
  return -1;
}

SV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult) {
  for (const RateRow& r : kRates)
    if (r.mult == mult && mult > 0) return r.rate;
  return IBV_RATE_MAX;
}

SV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate) {
  for (const RateRow& r : kRates)
    if (r.rate == rate) return r.mbps;
  return -1;
}

SV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps) {
  for (const RateRow& r : kRates)
    if (r.mbps == mbps) return r.rate;
  return IBV_RATE_MAX;
}

// ---- kernel ABI struct conversions (used by librdmacm) ---------------------

SV_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr* dst, struct ib_uverbs_ah_attr* src) {
  std::memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof dst->grh.dgid);
  dst->grh.flow_label = src->grh.flow_label;
  dst->grh.sgid_index = src->grh.sgid_index;
  dst->grh.hop_limit = src->grh.hop_limit;
  dst->grh.traffic_class = src->grh.traffic_class;
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

SV_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr* dst, struct ib_uverbs_qp_attr* src) {
  dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = static_cast<int>(src->qp_access_flags);
  dst->cap = ibv_qp_cap{src->max_send_wr, src->max_recv_wr, src->max_send_sge, src->max_recv_sge, src->max_inline_data};
  ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
  ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;
}

namespace {

// The path record has the same fields on both sides; only the GIDs differ in type.
template <class Dst, class Src>
void copy_path_fields(Dst* dst, const Src* src) {
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = src->raw_traffic;
  dst->flow_label = src->flow_label;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->reversible = src->reversible;
  dst->numb_path = src->numb_path;
  dst->pkey = src->pkey;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->mtu = src->mtu;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
  dst->packet_life_time_selector = src->packet_life_time_selector;
}

}  // namespace

SV_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec* dst, struct ib_user_path_rec* src) {
  std::memcpy(dst->dgid.raw, src->dgid, sizeof dst->dgid);
  std::memcpy(dst->sgid.raw, src->sgid, sizeof dst->sgid);
  copy_path_fields(dst, src);
}

SV_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec* dst, struct ibv_sa_path_rec* src) {
  std::memcpy(dst->dgid, src->dgid.raw, sizeof src->dgid);
  std::memcpy(dst->sgid, src->sgid.raw, sizeof src->sgid);
  copy_path_fields(dst, src);
}

// ---- sysfs -----------------------------------------------------------------

SV_EXPORT const char* ibv_get_sysfs_path(void) {
  static const std::string path = [] {
    const char* env = softverbs::env::sysfs_path();  // nullptr in setuid programs, as in rdma-core
    std::string p = env ? std::string(env).substr(0, IBV_SYSFS_PATH_MAX) : "/sys";
    while (!p.empty() && p.back() == '/') p.pop_back();
    return p;
  }();
  return path.c_str();
}

SV_EXPORT int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  // A provider's devices may have no sysfs directory: it serves their attributes.
  for (softverbs::Provider* p : softverbs::providers()) {
    std::string value;
    int rc = p->read_sysfs_attr(dir, file, &value);
    if (rc == ENODEV) continue;
    if (rc) {
      errno = rc;
      return -1;
    }
    if (value.size() >= size) return -1;
    std::memcpy(buf, value.c_str(), value.size() + 1);
    return static_cast<int>(value.size());
  }
  std::string path = std::string(dir) + "/" + file;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len = ::read(fd, buf, size);
  ::close(fd);
  if (len > 0) {
    if (buf[len - 1] == '\n') {
      buf[--len] = '\0';
    } else if (static_cast<size_t>(len) < size) {
      buf[len] = '\0';
    } else {
      return -1;  // cannot terminate the string without truncating it
    }
  }
  return static_cast<int>(len);
}

// Every capability and limit an emulated device reports, in one place.
// query_device, query_device_ex and query_port report these values and every verb
// enforces them; nothing else in emu/ hard-codes a limit. The values are those of a
// ConnectX-class adapter where that is meaningful (docs/compatibility.md lists them).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace softverbs::emu::caps {

// Identity. The vendor ids are deliberately not Mellanox/NVIDIA ones: tools such as
// perftest switch to vendor-specific paths (mlx5dv) when they see those.
inline constexpr uint32_t kVendorId = 0x0053f5;  // not an assigned IEEE OUI of any NIC vendor
// "SV". The default only: SOFTVERBS_VENDOR_PART_ID (emu/device/config.cpp) sets
// the part id a device reports, for tools that choose a path by it.
inline constexpr uint32_t kVendorPartId = 0x5356;
inline constexpr uint32_t kHwVer = 1;
inline constexpr const char* kFwVer = "1.0.0";
inline constexpr const char* kBoardId = "SOFTVERBS_EMU";

// Device limits (struct ibv_device_attr). The object counts (max_qp, max_cq,
// max_srq, max_pd, max_mr, max_mw, max_ah) are enforced per device
// (Device::charge: ENOMEM one past them) and are chosen so that a program can
// reach each on a machine of a few GiB in seconds: docs/compatibility.md has the
// bytes per object and the times.
inline constexpr uint64_t kMaxMrSize = UINT64_MAX;
inline constexpr uint64_t kPageSizeCap = 0xfffffffffffff000ull;  // 4 KiB and every larger power of two
inline constexpr int kMaxQp = 262144;
inline constexpr int kMaxQpWr = 32768;
inline constexpr unsigned kDeviceCapFlags = IBV_DEVICE_BAD_PKEY_CNTR | IBV_DEVICE_BAD_QKEY_CNTR |
                                            IBV_DEVICE_CHANGE_PHY_PORT | IBV_DEVICE_PORT_ACTIVE_EVENT |
                                            IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN |
                                            IBV_DEVICE_N_NOTIFY_CQ |  // no SRQ resize, as ConnectX
                                            IBV_DEVICE_AUTO_PATH_MIG |  // emu/qp/path_migration.cpp
                                            // Type 1 and type 2B memory windows, as mlx5 reports them.
                                            IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B;
inline constexpr int kMaxSge = 30;
inline constexpr int kMaxSgeRd = 30;
inline constexpr int kMaxCq = 1048576;  // 4 per QP; ConnectX: 16777216
inline constexpr int kMaxCqe = 4194303;
// Regions and windows share the 24-bit key index space (2^24 - 1 usable
// indexes): together they leave a quarter of it free, which keeps the round
// robin search for a free index short (Device::register_mr).
inline constexpr int kMaxMr = 8388608;  // ConnectX: 16777216
inline constexpr int kMaxPd = 8388608;  // ConnectX: 8388608 to 16777216
inline constexpr int kMaxQpRdAtom = 16;
inline constexpr int kMaxEeRdAtom = 0;
inline constexpr int kMaxResRdAtom = kMaxQp * kMaxQpRdAtom;
inline constexpr int kMaxQpInitRdAtom = 16;
inline constexpr int kMaxEeInitRdAtom = 0;
inline constexpr ibv_atomic_cap kAtomicCap = IBV_ATOMIC_HCA;
inline constexpr int kMaxMw = 4194304;  // memory windows of both types (ibv_alloc_mw); ConnectX: 16777216
inline constexpr int kMaxAh = 4194304;  // mlx5 reports INT_MAX (its AHs never reach the kernel)
inline constexpr int kMaxMcastGrp = 2097152;
inline constexpr int kMaxMcastQpAttach = 240;
inline constexpr int kMaxTotalMcastQpAttach = kMaxMcastGrp * kMaxMcastQpAttach;
inline constexpr int kMaxSrq = 1048576;  // ConnectX: 8388608
inline constexpr int kMaxSrqWr = 32767;
inline constexpr int kMaxSrqSge = 31;
inline constexpr uint16_t kMaxPkeys = 128;
inline constexpr uint8_t kLocalCaAckDelay = 16;
inline constexpr uint8_t kPhysPortCnt = 1;
inline constexpr int kNumCompVectors = 1;
inline constexpr uint32_t kMaxInlineData = 512;
// The inline room a send queue is granted and ibv_create_qp writes back: at
// least the room its SGEs' descriptors take in a WQE (16 bytes each, as
// sizeof(ibv_sge)), since ConnectX and rxe size the inline segment from the
// WQE and so grant that much even when asked for 0 (rxe grants exactly this;
// mlx5 rounds further, to its 64-byte WQE blocks). rdma_xclient, among others,
// posts small inline sends on QPs created with max_inline_data 0. Callers have
// checked the request against kMaxInlineData and max_send_sge against kMaxSge.
// max_inline: the device's largest max_inline_data (the active personality's).
inline uint32_t granted_inline_data(const ibv_qp_cap& cap, uint32_t max_inline = kMaxInlineData) {
  const uint32_t sges = cap.max_send_sge * static_cast<uint32_t>(sizeof(ibv_sge));
  const uint32_t room = cap.max_inline_data > sges ? cap.max_inline_data : sges;
  return room < max_inline ? room : max_inline;
}
inline constexpr uint32_t kMaxMsgSz = 1u << 30;
// The longest memory window a bind accepts (mlx5: its KLM holds at most 2 GiB;
// longer gives EOPNOTSUPP at post).
inline constexpr uint64_t kMaxMwLength = 1ull << 31;

// Device memory (ibv_alloc_dm): ConnectX's on-chip MEMIC. max_dm_size is the
// whole budget of the device, shared by every context; allocations are carved
// in units of kDmUnit bytes, at least kDmUnit-aligned (mlx5_ib rounds MEMIC
// requests up to 64 bytes), and log_align_req may ask for up to kDmMaxLogAlign.
inline constexpr uint64_t kMaxDmSize = 128 * 1024;
inline constexpr uint64_t kDmUnit = 64;
inline constexpr uint32_t kDmMaxLogAlign = 17;  // log2(kMaxDmSize)

// On-demand paging (ibv_query_device_ex odp_caps). The emulator pins nothing,
// so every region could be ODP: explicit and implicit ODP are offered, and
// every operation of every service may touch ODP memory. ConnectX reports UC
// no ODP and UD SEND/SRQ_RECV only (docs/compatibility.md).
inline constexpr uint64_t kOdpGeneralCaps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
inline constexpr uint32_t kOdpRcCaps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                                       IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
inline constexpr uint32_t kOdpUcCaps =
    IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
inline constexpr uint32_t kOdpUdCaps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;

// CQ and queue sizing: ConnectX rounds queue depths up to a power of two; the
// depth reported back is what the application may rely on.
inline constexpr int kMinCqe = 1;

// Port (struct ibv_port_attr).
inline constexpr ibv_mtu kMaxMtu = IBV_MTU_4096;
inline constexpr ibv_mtu kDefaultActiveMtu = IBV_MTU_4096;
inline constexpr int kGidTblLen = 16;
inline constexpr uint16_t kPkeyTblLenEth = 1;     // RoCE ports have a single, default P_Key
inline constexpr uint16_t kPkeyTblLenIb = 128;
inline constexpr uint16_t kDefaultPkey = 0xffff;
inline constexpr uint32_t kPortCapFlagsEth = IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS;
inline constexpr uint32_t kPortCapFlagsIb = IBV_PORT_CM_SUP;
inline constexpr uint8_t kActiveWidth = 2;   // 4X
inline constexpr uint8_t kActiveSpeed = 32;  // EDR (25 Gb/s per lane): 100 Gb/s
inline constexpr uint8_t kPhysStateLinkUp = 5;
inline constexpr uint8_t kPhysStatePolling = 2;
inline constexpr uint8_t kPhysStateDisabled = 3;
inline constexpr uint8_t kMaxVlNum = 4;
inline constexpr uint8_t kSubnetTimeout = 18;
inline constexpr uint16_t kSmLid = 1;

// Memory registration access flags the device understands. MW_BIND only allows
// memory windows to be bound to the region later (IBTA 10.6.7.2.1); the kernel's
// ib_check_mr_access accepts it with no other requirement.
inline constexpr unsigned kSupportedAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                             IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                             IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING |
                                             IBV_ACCESS_ON_DEMAND;

// Enhanced connection establishment (ibv_set_ece(3)): the vendor options the
// device implements, under its vendor id (kVendorId). None: a QP settles on 0
// whatever it is offered, and reports that through ibv_query_ece.
inline constexpr uint32_t kEceOptions = 0;

}  // namespace softverbs::emu::caps

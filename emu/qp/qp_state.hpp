// QP state machine rules for ibv_modify_qp(): which state transitions exist
// for each QP type, which attributes each transition requires and accepts,
// and range checks on the attribute values themselves.
//
// The transition table is the one of IBTA Vol 1 §11.2.5.2 ("Modify Queue
// Pair"): for each current/next state pair and each transport service it
// lists the attributes that must be supplied and those that may be supplied.
// The verdict reproduces the Linux kernel's ib_modify_qp_is_ok()
// (drivers/infiniband/core/verbs.c), which every in-tree provider (mlx5, rxe,
// ...) runs before touching hardware, so an application sees the same EINVAL
// from us as from a real device:
//
//   * the caller resolves the pair first (see resolve_modify_qp_transition):
//     cur is attr.cur_qp_state when IBV_QP_CUR_STATE is in the mask, else the
//     QP's state; next is attr.qp_state when IBV_QP_STATE is in the mask, else
//     cur, i.e. a modify without IBV_QP_STATE is checked against the
//     same-state row (INIT->INIT, RTS->RTS, SQD->SQD; RTR->RTR and SQE->SQE do
//     not exist, so attribute-only modifies in those states fail);
//   * IBV_QP_CUR_STATE is refused unless cur is RTR, RTS, SQD or SQE, and
//     even then only where the row lists it as optional;
//   * every required attribute must be present;
//   * any attribute outside required | optional | IBV_QP_STATE fails.
//
// Masks returned by the accessors never include IBV_QP_STATE, which every
// existing transition accepts.
//
// A modify_qp implementation checks, in this order (unknown mask bits are
// refused before anything else, as in the kernel; steps 2 and 3 both answer
// EINVAL, so their relative order is not observable):
//   1. qp_attr_mask_unsupported_bits(mask) != 0        -> EOPNOTSUPP
//   2. validate_qp_attr_values(attr, mask, limits, port) -> EINVAL
//   3. modify_qp_is_ok(type, resolve_modify_qp_transition(...)) false -> EINVAL
//   4. mask_qp_attr_psns(attr, mask), then apply.
// Rules that depend on live QP state beyond its state enum (e.g. refusing to
// leave SQD while the send queue is still draining) are not covered here.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>
#include <string_view>

namespace softverbs::emu {

// ---------------------------------------------------------------------------
// Attribute mask bits
// ---------------------------------------------------------------------------

// Bits 0..20 of enum ibv_qp_attr_mask: the attributes the legacy modify_qp
// command carries (the kernel's IB_QP_ATTR_STANDARD_BITS).
inline constexpr std::uint32_t kQpAttrStandardMask = (1u << 21) - 1;

// Every bit of enum ibv_qp_attr_mask that rdma-core 44 defines. Bits 21..24
// were SMAC/VID attributes of old kernels and are not part of the ABI.
inline constexpr std::uint32_t kQpAttrKnownMask =
    kQpAttrStandardMask | static_cast<std::uint32_t>(IBV_QP_RATE_LIMIT);

// The 22 single-bit values of enum ibv_qp_attr_mask, lowest first.
std::span<const std::uint32_t> qp_attr_mask_bits() noexcept;

// "IBV_QP_STATE", ... for one bit of the mask; "" for anything else.
std::string_view qp_attr_mask_bit_name(std::uint32_t bit) noexcept;

// Bits of attr_mask that no modify_qp path accepts at all. The kernel answers
// those with EOPNOTSUPP before looking at states (uverbs_cmd.c,
// ib_uverbs_modify_qp / ib_uverbs_ex_modify_qp), as does libibverbs'
// ibv_cmd_modify_qp for bits from IBV_QP_RATE_LIMIT up.
constexpr std::uint32_t qp_attr_mask_unsupported_bits(std::uint32_t attr_mask) noexcept {
  return attr_mask & ~kQpAttrKnownMask;
}

// ---------------------------------------------------------------------------
// States and QP types
// ---------------------------------------------------------------------------

// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"; "UNKNOWN" otherwise.
std::string_view qp_state_name(ibv_qp_state state) noexcept;

// True for RESET..ERR, the states a QP can be in (not IBV_QPS_UNKNOWN).
constexpr bool qp_state_is_valid(ibv_qp_state state) noexcept {
  return static_cast<int>(state) >= IBV_QPS_RESET && static_cast<int>(state) <= IBV_QPS_ERR;
}

// True for the QP types the transition table covers: RC, UC, UD, RAW_PACKET,
// XRC_SEND (kernel XRC_INI) and XRC_RECV (kernel XRC_TGT). IBV_QPT_DRIVER is
// not covered: the kernel skips the generic table for driver QPs.
bool qp_type_has_transition_table(ibv_qp_type type) noexcept;

// True if a send-side error moves a QP of this type to SQE rather than ERR.
// IBTA keeps the Send Queue Error state for the unreliable services only (UC,
// UD); a reliable connection that fails a send goes to ERR. This is also why
// the SQE->RTS row names attributes only for UC and UD.
bool qp_type_has_sqe(ibv_qp_type type) noexcept;

// ---------------------------------------------------------------------------
// Transition table
// ---------------------------------------------------------------------------

// Whether the table has a cur->next row at all. Like the kernel's, a row
// exists for a state pair as a whole: a QP type without attributes in that row
// still passes with an empty mask. False for uncovered types or bad states.
bool qp_transition_exists(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) noexcept;

// Attributes that must be in the mask for cur->next; 0 if the row is absent.
std::uint32_t qp_transition_required_mask(ibv_qp_type type, ibv_qp_state cur,
                                          ibv_qp_state next) noexcept;

// Attributes that may be in the mask for cur->next besides the required ones
// and IBV_QP_STATE; 0 if the row is absent.
std::uint32_t qp_transition_optional_mask(ibv_qp_type type, ibv_qp_state cur,
                                          ibv_qp_state next) noexcept;

// The verdict of ib_modify_qp_is_ok() for an already resolved cur->next.
bool modify_qp_is_ok(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next,
                     std::uint32_t attr_mask) noexcept;

struct QpTransition {
  ibv_qp_state cur;
  ibv_qp_state next;
};

// Resolves the pair modify_qp_is_ok() checks, as the providers do before
// calling ib_modify_qp_is_ok(): the caller's cur_qp_state overrides the QP's
// state when IBV_QP_CUR_STATE is set, and a mask without IBV_QP_STATE means
// "stay in cur". A state field holding a value outside RESET..ERR (attr comes
// from C, where any int fits) resolves to IBV_QPS_UNKNOWN, which no
// transition accepts.
QpTransition resolve_modify_qp_transition(ibv_qp_state qp_state, const ibv_qp_attr& attr,
                                          std::uint32_t attr_mask) noexcept;

// ---------------------------------------------------------------------------
// Attribute values
// ---------------------------------------------------------------------------

// Device and port properties the value checks need. Ports are assumed alike:
// the same properties apply to every port 1..phys_port_cnt.
struct QpAttrLimits {
  std::uint8_t phys_port_cnt = 1;
  std::uint16_t pkey_tbl_len = 1;
  int gid_tbl_len = 1;
  ibv_mtu active_mtu = IBV_MTU_1024;
  std::uint8_t link_layer = IBV_LINK_LAYER_ETHERNET;  // enum ibv_link_layer value
  bool grh_required = false;  // IBV_QPF_GRH_REQUIRED in ibv_port_attr.flags
  int max_qp_rd_atom = 16;       // responder depth limit (max_dest_rd_atomic)
  int max_qp_init_rd_atom = 16;  // initiator depth limit (max_rd_atomic)
};

// Builds the limits from what ibv_query_device / ibv_query_port report.
QpAttrLimits make_qp_attr_limits(const ibv_device_attr& dev, const ibv_port_attr& port) noexcept;

// Access flags a QP accepts in qp_access_flags (see the .cpp for the choice).
inline constexpr unsigned int kQpAccessFlagsAllowed =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_ON_DEMAND |
    IBV_ACCESS_OPTIONAL_RANGE;

// Largest static_rate value enum ibv_rate defines.
inline constexpr std::uint8_t kMaxStaticRate = IBV_RATE_1200_GBPS;

// Checks the value of every attribute named in attr_mask against IBTA field
// widths and the limits. Returns 0 or EINVAL. Enum members of attr are read
// as plain integers, so any value a C caller stored is safe to pass. qp_port is the port the QP was
// bound to at RESET->INIT (0 when unknown: the check that needs it is
// skipped). Attributes not in the mask are not looked at. Does not judge the
// mask itself (modify_qp_is_ok does) and does not reject PSNs wider than 24
// bits: the kernel masks those (see mask_qp_attr_psns).
int validate_qp_attr_values(const ibv_qp_attr& attr, std::uint32_t attr_mask,
                            const QpAttrLimits& limits, std::uint8_t qp_port = 0) noexcept;

// Truncates sq_psn / rq_psn (when in the mask) to their 24-bit wire width,
// as the kernel's _ib_modify_qp() does for IB and RoCE ports.
void mask_qp_attr_psns(ibv_qp_attr& attr, std::uint32_t attr_mask) noexcept;

}  // namespace softverbs::emu

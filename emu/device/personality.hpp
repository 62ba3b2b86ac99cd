// Vendor personalities (docs/simulation.md, "Vendor personalities"): the device
// attributes and the behaviours the IBTA leaves open, kept as data so that a
// program can be tested against the adapter it is deployed on. One TOML file per
// personality (data/personalities/NAME.toml); SOFTVERBS_PERSONALITY picks one.
// Without the variable the built-in ConnectX-like values of caps.hpp apply and
// no file is read.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace softverbs::emu {

struct Personality {
  std::string name = "connectx";
  // struct ibv_device_attr (and the limits every verb enforces from it).
  std::string fw_ver;
  uint32_t vendor_id = 0;
  uint32_t vendor_part_id = 0;  // SOFTVERBS_VENDOR_PART_ID still overrides it
  uint32_t hw_ver = 0;
  uint64_t max_mr_size = 0;
  uint64_t page_size_cap = 0;
  int max_qp = 0;
  int max_qp_wr = 0;
  int max_sge = 0;
  int max_sge_rd = 0;
  int max_cq = 0;
  int max_cqe = 0;
  int max_mr = 0;
  int max_pd = 0;
  int max_qp_rd_atom = 0;
  int max_res_rd_atom = 0;
  int max_qp_init_rd_atom = 0;
  ibv_atomic_cap atomic_cap = IBV_ATOMIC_NONE;
  int max_mw = 0;
  int max_ah = 0;
  int max_mcast_grp = 0;
  int max_mcast_qp_attach = 0;
  int max_total_mcast_qp_attach = 0;
  int max_srq = 0;
  int max_srq_wr = 0;
  int max_srq_sge = 0;
  uint8_t local_ca_ack_delay = 0;
  // The largest max_inline_data ibv_create_qp accepts.
  uint32_t max_inline_data = 0;
  // ibv_device_attr.device_cap_flags, and max_pkeys (0: the port's P_Key
  // table length, which depends on the link layer).
  uint32_t device_cap_flags = 0;
  uint16_t max_pkeys = 0;

  // [device_ex]: ibv_query_device_ex's extended fields. odp false: no ODP
  // capabilities, and ibv_reg_mr with IBV_ACCESS_ON_DEMAND is EINVAL.
  // max_dm_size 0: ibv_alloc_dm is EOPNOTSUPP. completion_timestamps false:
  // hca_core_clock and completion_timestamp_mask 0, and a CQ asking for
  // timestamps is EOPNOTSUPP (otherwise the 1 GHz clock of caps.hpp).
  bool odp = true;
  uint64_t max_dm_size = 0;
  bool completion_timestamps = true;

  // [port]: ibv_query_port. max_msg_sz is also the largest message a QP sends
  // or accepts; gid_tbl_len the GID table's size (unused entries read as zero).
  ibv_mtu max_mtu = IBV_MTU_4096;
  int gid_tbl_len = 0;
  uint8_t active_width = 0;
  uint8_t active_speed = 0;
  uint32_t max_msg_sz = 0;
  uint8_t max_vl_num = 0;

  // [completions]: the status of a work request in an error case the IBTA and
  // the adapters answer differently.
  ibv_wc_status bad_lkey = IBV_WC_LOC_PROT_ERR;  // a local SGE no region covers
  // A SEND longer than the receive buffer: the sender's status (the NAK code
  // follows: REM_INV_REQ_ERR is "invalid request", REM_OP_ERR "remote
  // operational error") and the receiver's.
  ibv_wc_status recv_too_small_sender = IBV_WC_REM_INV_REQ_ERR;
  ibv_wc_status recv_too_small_receiver = IBV_WC_LOC_LEN_ERR;
  // SEND with Invalidate naming an ordinary region's rkey: true fails it as an
  // invalid request (IBTA 10.6.7.2.4); false completes it, the region untouched.
  bool send_inv_of_region_fails = true;
  // IBV_WC_GRH on RC and UC receive completions of a RoCE port (rxe).
  bool grh_on_connected = false;
  // An error completion wakes a CQ armed for solicited completions only
  // (IBTA 11.4.2.2).
  bool error_wakes_solicited = true;
  // Work posted to a QP in the error state completes at once, flushed (IBTA
  // 10.8.3.1); false: it stays queued and never completes (rxe).
  bool flush_posted_in_error = true;
  // A send WQE that fails locally at the requester (an SGE no region covers)
  // while WQEs before it are unacknowledged: false fails it at once and flushes
  // those (ConnectX); true lets them complete as their acknowledgements arrive,
  // then fails it (rxe).
  bool local_error_in_order = false;

  // [events]: the affiliated asynchronous events raised.
  bool event_qp_access_err = true;
  bool event_last_wqe_reached = true;
  // IBV_EVENT_SQ_DRAINED only when en_sqd_async_notify asked for it (false), or
  // at every drain (true, rxe).
  bool sq_drained_always = false;

  // [post]: posting. before_rts_refused: a receive in RESET and a send before
  // RTS are EINVAL (SOFTVERBS_POST_BEFORE_RTS, when set, overrides it).
  // bad_wr_on_refusal false: such a refusal, and a receive posted to a QP with
  // an SRQ, leave *bad_wr unwritten (rxe).
  bool before_rts_refused = false;
  bool bad_wr_on_refusal = true;
  // unsupported_opcode / misaligned_atomic: an opcode the QP's service lacks
  // (RDMA READ and atomics on UC, all but SEND on UD) and an atomic whose
  // remote address is not 8-byte aligned are posted and fail when the requester
  // reaches them (false: ConnectX), or ibv_post_send refuses them with EINVAL,
  // *bad_wr naming them (true: rxe's provider checks them before the kernel
  // sees them, so post.bad_wr_on_refusal does not apply).
  bool unsupported_opcode_refused = false;
  bool misaligned_atomic_refused = false;

  // [qp]: validate_attributes false: P_Key indexes past the table, retry_cnt
  // above 7, min_rnr_timer above 31 and path_mtu 0 are accepted by
  // ibv_modify_qp (rxe); true: EINVAL (ConnectX).
  bool validate_qp_attributes = true;
  // uc_sqd_av: a UC QP's SQD->SQD with IBV_QP_AV, which the IBTA allows (and
  // ConnectX takes), is EINVAL (rxe).
  bool uc_sqd_av_refused = false;
  // adaptive_retransmit: RC requesters resend early after a loss, timed from
  // the measured round trip (ConnectX's adaptive retransmission), or only at
  // the local ACK timeout (rxe). SOFTVERBS_ADAPTIVE_RETRANSMIT, when set, wins.
  bool adaptive_retransmit = true;

  // [mr]: local-only regions (no remote access) get rkey 0 (rxe).
  bool local_only_rkey_zero = false;

  // How deep QP and SRQ queues are and what ibv_create_qp/ibv_create_srq write
  // back. false (ConnectX-like): a queue holds the depth asked for and reports
  // it, the IBTA's actual values (11.2.5.2). true (rxe): a queue holds 2^n - 1
  // work requests (rxe_like_depth) but reports the depth asked for, so posting
  // past the reported depth succeeds and ibv_query_qp/ibv_query_srq report more.
  bool queue_sizes_as_requested = false;
  // ibv_modify_srq with IBV_SRQ_MAX_WR resizes the SRQ (rxe) or is EINVAL
  // (ConnectX). device_cap_flags should then carry IBV_DEVICE_SRQ_RESIZE.
  bool srq_resize = false;
};

// The depth of an rxe queue asked to hold `wanted` work requests: the smallest
// 2^n - 1 at least as large (a ring of 2^n slots, one kept empty).
inline uint32_t rxe_like_depth(uint32_t wanted) {
  uint64_t slots = 1;
  while (slots < uint64_t{wanted} + 1) slots <<= 1;
  return static_cast<uint32_t>(slots - 1);
}

// The ConnectX-like values of caps.hpp: the default personality.
Personality builtin_personality();

// Parses a personality file. Every key is optional (an absent one keeps the
// built-in value); an unknown key, a value of the wrong type or out of range,
// or malformed TOML gives false with *error naming the line or the key.
bool parse_personality(std::string_view toml_text, Personality* out, std::string* error);

// SOFTVERBS_PERSONALITY's value: a NAME ([a-z0-9_-], looked up as NAME.toml in
// the installed data directory, then the source tree's data/personalities) or a
// path (anything with a '/'). Returns false with *error on an unknown name, an
// unreadable file or a bad one.
bool load_personality(std::string_view spec, Personality* out, std::string* error);

// The active personality: the built-in one until set_personality is called
// (once, when the devices are first listed, before any exists).
const Personality& personality() noexcept;
void set_personality(const Personality& p);

}  // namespace softverbs::emu

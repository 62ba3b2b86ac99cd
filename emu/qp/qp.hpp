// A queue pair: the verbs object (create, modify, query, post) and the
// transport engine behind it. The engine is three roles, each with its own state
// and file: the requester (requester.hpp/.cpp) sends requests, the completer
// (completer.hpp/.cpp) retires them on responses, the responder
// (responder.hpp/.cpp) executes the peer's requests. They share the QP's
// attributes, queues, timer and lock (mu_), which every `_locked` function holds.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <atomic>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <vector>

#include "emu/objects/handle.hpp"
#include "emu/objects/objects.hpp"
#include "emu/qp/completer.hpp"
#include "emu/qp/requester.hpp"
#include "emu/qp/responder.hpp"
#include "emu/qp/retransmit.hpp"
#include "emu/qp/wq.hpp"
#include "emu/qp/wr_batch.hpp"
#include "wire/packet.hpp"

namespace softverbs::emu {

// What ibv_post_send/ibv_post_recv do with a QP that cannot execute the work
// request yet (SOFTVERBS_POST_BEFORE_RTS, docs/configuration.md): queue it, as
// ConnectX (mlx5 never looks at the QP state when posting; the WQEs wait in the
// queue until the QP reaches RTS), or refuse it with EINVAL, as the IBTA's
// C10-97.2.1 and rxe do (receives in RESET; sends in RESET, INIT and RTR).
enum class EarlyPost { queue, refuse };
// The value's meaning: "queue", "refuse"; nullopt for anything else.
std::optional<EarlyPost> parse_early_post(const char* text);
// The process's choice, read at the first QP creation (an unset or bad value
// means queue; a bad one is reported).
EarlyPost early_post_policy();


class Qp {
 public:
  // domain: the parent domain the QP is created on, whose allocator holds its
  // queues (null: the heap).
  Qp(Pd& pd, const ibv_qp_init_attr& attr, ParentDomain* domain = nullptr);
  ~Qp();
  ibv_qp* ibv() { return &handle_.pub.qp_base; }
  ibv_qp_ex* ibv_ex() { return &handle_.pub; }
  static Qp* from(ibv_qp* qp) { return Handle<ibv_qp_ex, Qp>::owner_of(qp); }
  Pd& pd() { return pd_; }
  Context& context() { return pd_.context(); }
  Device& device() { return pd_.context().device(); }
  ibv_qp_type type() const { return type_; }
  ibv_qp_state state() const { return attr_.qp_state; }
  uint32_t qpn() const { return handle_.pub.qp_base.qp_num; }
  void set_qpn(uint32_t qpn) { handle_.pub.qp_base.qp_num = qpn; }

  int modify(ibv_qp_attr* attr, int attr_mask);
  int query(ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr);
  int post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
  // bind_verb: wr is the one IBV_WR_BIND_MW of a type 1 window that ibv_bind_mw
  // posts (emu/objects/mw.cpp); applications cannot post one themselves.
  int post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr, bool bind_verb = false);

  // ---- the extended post API (qp_ex.cpp, wr_batch.hpp) ----------------------
  // Makes this QP one created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS: a batch
  // area as deep as the send queue and the ibv_wr_* pointers. May throw
  // std::bad_alloc (nothing is changed then).
  void make_extended();
  // The batch area; null for a QP without send ops flags (ibv_qp_to_qp_ex: NULL).
  WrBatch* batch() { return batch_.get(); }
  // Posts a batch built between ibv_wr_start and ibv_wr_complete through the
  // checks of post_send: 0 with every work request queued, or the errno of the
  // first that fails with none queued (mlx5 rolls the whole batch back).
  int post_batch(std::span<const ibv_send_wr> wrs);

  // The capabilities the QP was created with, as reported back to the caller.
  const ibv_qp_cap& cap() const { return cap_; }
  Cq* send_cq() { return send_cq_; }
  Cq* recv_cq() { return recv_cq_; }
  Srq* srq() { return srq_; }
  bool sq_sig_all() const { return sq_sig_all_; }
  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB: the multicast datagrams this QP sends
  // are not delivered back to it (emu/device/mcast.cpp).
  bool blocks_self_mcast() const { return block_self_mcast_; }
  void set_block_self_mcast() { block_self_mcast_ = true; }
  // XRC_RECV: the domain handle the QP was created with (null otherwise).
  Xrcd* xrcd() { return xrcd_; }
  void set_xrcd(Xrcd* xrcd) { xrcd_ = xrcd; }
  ParentDomain* domain() { return domain_; }

  // ---- enhanced connection establishment (ibv_set_ece(3), as mlx5) ---------
  // ibv_query_ece's answer: the options the last modify settled on.
  uint32_t ece_options();
  // ibv_set_ece: the options the next modify offers.
  void set_ece_options(uint32_t options);

  EventCount events;
  // An XRC_RECV QP whose creator's handle is destroyed while handles of
  // ibv_open_qp remain: its async events, which go to that handle only, are
  // dropped from then on (Context::post_async_event).
  void detach_events() { events_detached_.store(true, std::memory_order_release); }
  bool events_detached() const { return events_detached_.load(std::memory_order_acquire); }
  Charge charge;  // max_qp

  // ---- the transport engine (requester.cpp, responder.cpp, completer.cpp)
  // Entry point for a packet addressed to this QP; called by the device's
  // receive path. `dst` is the multicast group a UD packet was sent to (its IP
  // destination), or 0 for a packet to this device's address.
  void receive(const wire::PacketView& pkt, in_addr src, in_addr dst = in_addr{});
  // The same for a packet handed over without bytes (Device::receive_direct),
  // if the QP's lock is free: false, touching nothing, if it is not. `pin` is
  // the caller's; a direct session (direct.cpp) keeps it, and the lock, for
  // the sender's next packets.
  bool try_receive(const wire::PacketView& pkt, in_addr src, QpPin& pin);
  // The QP whose requester or receive path this thread runs under its lock
  // (DirectScope), or null; a packet for it from a device this thread handed a
  // packet to directly goes into its inbox (stash_direct), copied, and is taken
  // before its lock is released.
  static Qp* direct_scope_qp();
  void stash_direct(const wire::PacketView& pkt, in_addr src);
  // Detaches the engine's timer and removes the QP's completions from its CQs;
  // the QP is about to be destroyed.
  void shutdown();
  // Answers a request as if the responder had refused it (the fault layer's nak).
  void forge_nak(uint32_t psn, uint8_t syndrome);
  // Moves the QP to the error state as a local catastrophic error would: every
  // outstanding work request is flushed; with `event`, IBV_EVENT_QP_FATAL.
  void force_error(bool event);

 private:
  // Moves the QP to `next` and does what the transition does to the roles (modify).
  void enter_state_locked(ibv_qp_state cur, ibv_qp_state next);
  // What post_send's checks learn about one send work request.
  struct SendCheck {
    uint64_t total = 0;
    bool is_inline = false;
    in_addr ud_dest{};
  };
  // post_send's checks of one work request against the QP in `state`: 0, or the
  // errno the post fails with (EINVAL; ENOMEM for a full queue, counting
  // `queued` more entries than the queue holds now).
  int check_send_locked(ibv_qp_state state, const ibv_send_wr& wr, uint32_t queued, SendCheck* out,
                        bool bind_verb = false);
  // A validated send work request into the send queue (post_send).
  void enqueue_send_locked(const ibv_send_wr& wr, uint64_t total, bool is_inline, in_addr ud_dest);
  // After a post: flushes what was queued in the error states, or starts it.
  void after_post_send_locked(ibv_qp_state state);

  // ---- shared by the roles -------------------------------------------------
  // The reliable services: RC, and XRC on both sides (IBTA 9.5: XRC follows
  // RC's acknowledgement, retry and ordering rules).
  bool requester_reliable() const { return type_ == IBV_QPT_RC || type_ == IBV_QPT_XRC_SEND; }
  bool responder_reliable() const { return type_ == IBV_QPT_RC || type_ == IBV_QPT_XRC_RECV; }
  bool is_xrc() const { return type_ == IBV_QPT_XRC_SEND || type_ == IBV_QPT_XRC_RECV; }
  // The opcode of this QP's service for an RC opcode: XRC's are the same
  // operations in class 0xA0 (IBTA 9.2.1, Table 38).
  uint8_t service_opcode(uint8_t rc_opcode) const {
    return is_xrc() ? static_cast<uint8_t>(rc_opcode | 0xA0) : rc_opcode;
  }
  // XRC_RECV: binds the QP to the SRQ the XRCETH names, if it is an XRC SRQ
  // of the QP's domain; false otherwise (the request is an invalid request).
  bool bind_xrc_srq_locked(uint32_t srqn);
  // The PD remote access is checked against: the current SRQ's for XRC_RECV.
  const Pd& access_pd() const { return type_ == IBV_QPT_XRC_RECV && srq_ ? srq_->pd() : pd_; }
  void flush_locked();
  // Removes the QP's completions from its send and receive CQs (reset, destroy).
  void clean_cqs_locked();
  // Moves the QP to the error state and flushes it (and raises LAST_WQE_REACHED
  // for an SRQ QP).
  void enter_error_locked();
  // Entering the error state from the QP's timer (it flushes the queues the
  // caller may be iterating over); with `event`, IBV_EVENT_QP_FATAL.
  void request_error_locked(bool event);
  void error_locked(bool event);
  // trace_id: the WQE's (core/trace.hpp), for the trace's completion record.
  void push_completion_locked(Cq* cq, ibv_wc wc, bool solicited, uint64_t trace_id = 0);
  void post_send_completion_locked(const SendWqe& w, ibv_wc_status status);
  // Counts a send WQE's end and fills its completion; false if it has none to
  // report (a successful unsignaled one). count_success false: the caller
  // counts a successful one itself (retire_acked_locked counts a run at once).
  bool send_wc_locked(const SendWqe& w, ibv_wc_status status, ibv_wc* out, bool count_success = true);
  // Successful send completions pushed together (retire_acked_locked).
  void push_send_batch_locked(const ibv_wc* wcs, size_t n);
  // Fails w (the oldest unacknowledged send WQE when null) with `status`, after
  // completing the WQEs before it, and moves the QP to the error state.
  void fail_send_locked(SendWqe* w, ibv_wc_status status);
  // A local error the requester met at w (the WQE at req_.tx_index): fails it
  // at once, or, under the personality's in-order local errors with earlier
  // WQEs unacknowledged, holds it until they are (release_held_error_locked).
  void fail_local_locked(SendWqe& w, ibv_wc_status status);
  void release_held_error_locked();
  void arm_timer_locked();
  void on_timer();
  // The repair timer of adaptive retransmission (retransmit.cpp): armed from
  // arm_timer_locked's clock reading, fired from on_timer.
  void arm_repair_locked(Clock::time_point now, Clock::duration ack_timeout);
  void repair_locked(Clock::time_point now);
  // A sign of loss (a sequence NAK, a read-response gap): a loss episode starts.
  void note_loss_locked();
  // When the QP's timer must fire next for the local ACK or the repair timeout.
  Clock::time_point next_timer_locked() const;
  // The trace's timer records (core/trace.hpp): which timer is armed now.
  void trace_timer_locked(std::string_view which, std::string_view what, Clock::duration in = {});
  // wire
  // To the connected peer, with the traffic class of the QP's path (and h's
  // MigReq bit set to the QP's).
  void transmit_locked(wire::PacketHeaders& h, std::span<const std::span<const uint8_t>> payload);
  // To dest, with IPv4 TOS byte tos (RoCEv2 carries the GRH traffic class there).
  void transmit_to_locked(in_addr dest, const wire::PacketHeaders& h,
                          std::span<const std::span<const uint8_t>> payload, uint8_t tos);
  // The same without packet bytes, to a device of this process when the link
  // allows it (Device::transmit_direct; direct.cpp); false if the packet must
  // be built.
  bool transmit_direct_locked(in_addr dest, const wire::PacketHeaders& h,
                              std::span<const std::span<const uint8_t>> payload, uint8_t tos);
  // A plain ACK (send_ack_locked): folded into this QP's previous one when
  // that one still waits, untaken, in the inbox of the QP it answers
  // (fold_plain_ack_locked, direct.cpp); else transmit_plain_ack_locked sends
  // it, marked as this QP's for the next one.
  bool fold_plain_ack_locked(uint8_t opcode, uint32_t psn, wire::Aeth aeth);
  void transmit_plain_ack_locked(wire::PacketHeaders& h);
  uint32_t mtu_bytes() const { return 128u << attr_.path_mtu; }
  bool resolve_dest_locked();

  // ---- requester (requester.cpp) -------------------------------------------
  void requester_locked();
  bool send_next_packet_locked();
  bool may_start_locked(SendWqe& w);
  void send_read_request_locked(SendWqe& w, uint32_t psn, uint64_t offset);
  void send_atomic_locked(SendWqe& w);
  bool send_data_packet_locked(SendWqe& w, std::shared_lock<SpreadSharedMutex>& mr_lock);
  bool send_ud_locked();
  // Binds a memory window or invalidates an rkey (IBV_WR_BIND_MW, LOCAL_INV).
  bool execute_local_locked(SendWqe& w);
  void retransmit_from_locked(uint32_t psn);

  // ---- completer (completer.cpp) -------------------------------------------
  // Runs the steps of completer.hpp: one function per step, each returning the next.
  void completer_locked(const wire::PacketView& pkt);
  CompStep comp_get_ack_locked(CompContext& c);
  CompStep comp_check_psn_locked(CompContext& c);
  CompStep comp_check_ack_locked(CompContext& c);
  CompStep comp_ack_locked(CompContext& c);
  CompStep comp_rnr_nak_locked(CompContext& c);
  CompStep comp_rnr_retry_locked(CompContext& c);
  CompStep comp_seq_nak_locked(CompContext& c);
  CompStep comp_retry_locked(CompContext& c);
  CompStep comp_error_nak_locked(CompContext& c);
  CompStep comp_read_resp_locked(CompContext& c);
  CompStep comp_do_read_locked(CompContext& c);
  CompStep comp_do_atomic_locked(CompContext& c);
  CompStep comp_update_locked(CompContext& c);
  CompStep comp_error_locked(CompContext& c);
  void ack_through_locked(CompContext& c, uint32_t upto_exclusive);
  // The index of the oldest send WQE not acknowledged (sq_.size() if none).
  uint32_t first_unacked_locked();
  // RDMA READs and atomics posted before the send WQE at index (before every
  // posted one when index is sq_.size()).
  uint64_t rd_before_locked(uint32_t index);
  void retire_acked_locked();
  void check_drained_locked();

  // ---- path migration (path_migration.cpp, IBTA 17.2.8) --------------------
  // The live-state checks of IBV_QP_ALT_PATH / IBV_QP_PATH_MIG_STATE for a
  // modify from cur to next: 0 or EINVAL.
  int check_path_migration_locked(const ibv_qp_attr& attr, uint32_t mask, ibv_qp_state cur, ibv_qp_state next);
  // Stores the alternate path and carries out the requested migration state.
  void apply_path_migration_locked(const ibv_qp_attr& attr, uint32_t mask);
  // Switches to the alternate path and raises IBV_EVENT_PATH_MIG.
  void migrate_locked();
  // Retries on the primary path are exhausted: true if the QP migrated (the
  // caller retries on the new path); false if it must fail (after
  // IBV_EVENT_PATH_MIG_ERR when an alternate path was loaded but not armed).
  bool migrate_on_path_failure_locked();
  // The MigReq bit of a packet from the peer: arms a rearmed QP, migrates an armed one.
  void observe_migreq_locked(bool migreq);
  // The MigReq bit this QP's packets carry: set once migrated (IBTA 9.2.3, 17.2.8).
  bool migreq_locked() const { return attr_.path_mig_state == IBV_MIG_MIGRATED; }

  // ---- responder (responder.cpp) -------------------------------------------
  // Runs the steps of responder.hpp: one function per step, each returning the
  // next; the error steps go through kRespErrors to resp_error_locked.
  void responder_locked(const wire::PacketView& pkt, in_addr src, in_addr dst);
  RespStep resp_check_op_valid_locked(RespContext& r);
  RespStep resp_establish_locked(RespContext& r);
  RespStep resp_check_psn_locked(RespContext& r);
  RespStep resp_duplicate_locked(RespContext& r);
  RespStep resp_nak_psn_locked(RespContext& r);
  RespStep resp_check_op_seq_locked(RespContext& r);
  RespStep resp_check_rkey_locked(RespContext& r);
  RespStep resp_check_resources_locked(RespContext& r);
  RespStep resp_rnr_locked(RespContext& r);
  RespStep resp_check_length_locked(RespContext& r);
  RespStep resp_execute_locked(RespContext& r);
  RespStep resp_execute_send_locked(RespContext& r);
  RespStep resp_execute_write_locked(RespContext& r);
  RespStep resp_execute_read_locked(RespContext& r);
  RespStep resp_execute_atomic_locked(RespContext& r);
  RespStep resp_acknowledge_locked(RespContext& r);
  RespStep resp_drop_locked(RespContext& r);
  RespStep resp_error_locked(RespContext& r, const RespErrorRow& e);
  void send_ack_locked(wire::Aeth aeth, uint32_t psn);
  void send_atomic_ack_locked(uint32_t psn, uint64_t orig);
  void rnr_nak_locked(uint32_t psn);
  bool take_recv_wqe_locked();
  // The length of the receive WQE the next message would take, if one is posted.
  std::optional<uint64_t> next_recv_length_locked();
  // The PD receive buffers are checked against: the SRQ's for a QP attached to
  // one (its WQEs were posted there), else the QP's own.
  const Pd& recv_pd() const { return srq_ ? srq_->pd() : pd_; }
  void complete_recv_locked(ibv_wc_status status, ibv_wc_opcode opcode, uint32_t byte_len, bool with_imm, uint32_t imm,
                            bool with_inv, bool solicited);
  void responder_error_locked(const RespErrorRow& e, uint32_t psn);
  void read_reply_locked(uint32_t psn, uint64_t va, uint32_t rkey, uint64_t len);
  void keep_resource_locked(const ResponderState::Resource& r);
  void ud_receive_locked(const wire::PacketView& pkt, in_addr src, in_addr dst);
  // receive() and try_receive() under mu_.
  void receive_locked(const wire::PacketView& pkt, in_addr src, in_addr dst);
  // Marks this QP as the thread's direct scope for its lifetime, unless one is
  // set already (the outermost wins); drains the inbox at the end.
  class DirectScope {
   public:
    explicit DirectScope(Qp* qp);
    ~DirectScope();
    DirectScope(const DirectScope&) = delete;
    DirectScope& operator=(const DirectScope&) = delete;

   private:
    Qp* qp_;
  };
  // Takes the inbox's packets (direct.cpp), in order, under mu_, if there are
  // at least `at_least`.
  void drain_direct_locked(size_t at_least = 1);
  // Ends the direct session this QP's sending opened (direct.cpp), if any:
  // its receiver's lock and pin are given back.
  void end_direct_session_locked();

  // ---- shared parts: attributes, queues, lock ------------------------------
  Handle<ibv_qp_ex, Qp> handle_;
  Pd& pd_;
  ibv_qp_type type_;
  Cq* send_cq_;
  Cq* recv_cq_;
  Srq* srq_;  // XRC_RECV: the SRQ the last request was for (it holds a use of it)
  Xrcd* xrcd_ = nullptr;
  std::atomic<bool> events_detached_{false};
  bool block_self_mcast_ = false;
  bool sq_sig_all_;
  EarlyPost early_post_;
  ibv_qp_cap cap_{};
  ibv_qp_attr attr_{};

  // Lock order: mu_, then the device's mr_lock(), then an SRQ's mu or a CQ's.
  std::mutex mu_;
  // The queues' memory and ConnectX's doorbell record (parent domains with an
  // allocator only), before the queues that live in it.
  ParentDomain* domain_;
  QueueBuffer queue_mem_;
  QueueBuffer doorbell_;
  WorkQueue<SendWqe> sq_;
  uint64_t rd_posted_ = 0;  // RDMA READs and atomics ever posted (SendWqe::rd_before)
  WorkQueue<RecvWqe> rq_;
  std::unique_ptr<WrBatch> batch_;  // extended QPs only

  // ECE (under mu_): the options set for the next modify, and those settled.
  uint32_t ece_set_ = 0;
  uint32_t ece_get_ = 0;

  // Destination, resolved from the address vector at RTR (and again on migration).
  in_addr dest_addr_{};
  // The payload list of the packet being sent and the SGEs it resolved to
  // (send_data_packet_locked, send_ud_locked): used under mu_ only, and
  // consumed by the transmit before the QP can send again, so a packet
  // allocates nothing and looks no thread-local storage up.
  std::vector<std::span<const uint8_t>> tx_payload_;
  std::vector<std::span<uint8_t>> tx_spans_;
  // The receive buffer pieces a SEND's payload is scattered into
  // (resp_execute_send_locked): the responder's, under mu_, reused.
  std::vector<std::span<uint8_t>> rx_spans_;
  // The view a packet handed over directly is (transmit_direct_locked), under
  // mu_: as_received writes every field of it, so it is not zeroed first for
  // each packet. The receiver is done with it when the transmit returns (an
  // answer for this QP is copied into its inbox, never read from here).
  wire::PacketView tx_view_;
  // An alternate path was loaded since the last migration (or reset).
  bool alt_loaded_ = false;
  // A completion was forced to an error status (or lost to a CQ overrun): the QP
  // enters the error state from its timer, and until then its completions flush.
  bool error_pending_ = false;
  bool error_event_ = false;  // ... with IBV_EVENT_QP_FATAL
  // The QP's one timer: the local ACK timeout (deadline_, armed by the requester)
  // and the RNR wait (rnr_until_, armed by the completer); also the deferred entry
  // to the error state.
  std::chrono::steady_clock::time_point deadline_{};
  std::chrono::steady_clock::time_point rnr_until_{};
  std::shared_ptr<EngineTimer> timer_;
  // The trace has recorded an ACK timeout as armed and not yet as fired or
  // cancelled (the timer itself is re-armed lazily, so this is the trace's view).
  bool trace_ack_armed_ = false;

  // ---- per-role state ------------------------------------------------------
  RequesterState req_;
  CompleterState comp_;
  ResponderState resp_;
  // Adaptive retransmission (retransmit.hpp): on for this connection (the
  // process's SOFTVERBS_ADAPTIVE_RETRANSMIT at RTS), and its state. Last, so
  // that the per-packet state above keeps its place in the cache lines.
  bool adaptive_retx_ = false;
  AdaptiveRetransmit retx_;
};

// Makes a constructed QP live: its QP number on the device and its object number
// in the context. May throw std::bad_alloc, with neither taken.
void publish_qp(Context& ctx, Qp& qp);

}  // namespace softverbs::emu

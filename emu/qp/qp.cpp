// The QP verbs: creation, modify (the state transitions and what each does to
// the roles), query, posting work requests, and flushing them in the error state.
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "core/env.hpp"
#include "core/log.hpp"
#include "core/trace.hpp"
#include "emu/device/caps.hpp"
#include "emu/device/personality.hpp"
#include "emu/qp/qp.hpp"
#include "emu/provider.hpp"
#include "emu/device/fault_actions.hpp"
#include "emu/objects/domain.hpp"
#include "emu/objects/objects.hpp"
#include "fabric/timer.hpp"
#include "emu/qp/qp_state.hpp"
#include "wire/opcode.hpp"

namespace softverbs::emu {
namespace {

// The post-time checks of a bind work request: 0 or the errno ibv_post_send
// returns. Type 1 windows are bound only through ibv_bind_mw (bind_verb), type 2
// windows only by a posted work request (IBTA 10.6.7.2). Everything else about
// the bind is checked when it executes, and fails its completion.
int check_bind_wr(const ibv_send_wr& wr, const ibv_context* qp_context, bool bind_verb) {
  const ibv_mw* mw = wr.bind_mw.mw;
  if (!mw || mw->context != qp_context) return EINVAL;
  if ((mw->type == IBV_MW_TYPE_1) != bind_verb) return EINVAL;
  if (wr.bind_mw.bind_info.length > caps::kMaxMwLength) return EOPNOTSUPP;  // as mlx5
  return 0;
}

QpAttrLimits limits_of(const Device& dev) {
  ibv_device_attr da;
  ibv_port_attr pa;
  dev.fill_device_attr(&da);
  dev.fill_port_attr(&pa);
  return make_qp_attr_limits(da, pa);
}

}  // namespace

std::optional<EarlyPost> parse_early_post(const char* text) {
  const std::string_view v = text ? text : "";
  if (v == "queue") return EarlyPost::queue;
  if (v == "refuse") return EarlyPost::refuse;
  return std::nullopt;
}

EarlyPost early_post_policy() {
  static const EarlyPost policy = [] {
    // Unset: the personality's post.before_rts (queue for ConnectX, refuse for rxe).
    const char* text = env::post_before_rts();
    if (!text) return personality().before_rts_refused ? EarlyPost::refuse : EarlyPost::queue;
    const std::optional<EarlyPost> p = parse_early_post(text);
    if (!p) SV_LOG(kError, "SOFTVERBS_POST_BEFORE_RTS=%s: expected queue or refuse; using queue", text);
    return p.value_or(EarlyPost::queue);
  }();
  return policy;
}

namespace {

// The states in which a send waits for RTS (or is refused, EarlyPost::refuse).
bool before_rts(ibv_qp_state s) { return s == IBV_QPS_RESET || s == IBV_QPS_INIT || s == IBV_QPS_RTR; }

// One buffer holds both queues, as a ConnectX QP buffer does: the send ring,
// then (aligned) the receive ring.
uint32_t rq_wr_of(const ibv_qp_init_attr& a) { return a.srq ? 0 : a.cap.max_recv_wr; }
uint32_t rq_sge_of(const ibv_qp_init_attr& a) { return a.srq ? 0 : a.cap.max_recv_sge; }
size_t sq_bytes(const ibv_qp_init_attr& a) {
  const size_t n = WorkQueue<SendWqe>::bytes_for(a.cap.max_send_wr, a.cap.max_send_sge, a.cap.max_inline_data);
  return (n + 63) & ~size_t{63};
}
size_t queue_bytes(const ibv_qp_init_attr& a) {
  return sq_bytes(a) + WorkQueue<RecvWqe>::bytes_for(rq_wr_of(a), rq_sge_of(a));
}

}  // namespace

Qp::Qp(Pd& pd, const ibv_qp_init_attr& attr, ParentDomain* domain)
    : pd_(pd),
      type_(attr.qp_type),
      send_cq_(Cq::from(attr.send_cq)),
      recv_cq_(Cq::from(attr.recv_cq)),
      srq_(attr.srq ? Srq::from(attr.srq) : nullptr),
      sq_sig_all_(attr.sq_sig_all != 0),
      early_post_(early_post_policy()),
      cap_(attr.cap),
      domain_(domain),
      // As mlx5: the QP's buffer, then its doorbell record.
      queue_mem_(QueueBuffer::custom_only(domain, queue_bytes(attr), kQueueAlign, resource_type_qp())),
      doorbell_(domain && domain->custom_alloc()
                    ? QueueBuffer(domain, kDoorbellSize, kDoorbellSize, resource_type_dbr())
                    : QueueBuffer()),
      sq_(attr.cap.max_send_wr, attr.cap.max_send_sge, attr.cap.max_inline_data, queue_mem_.data()),
      rq_(rq_wr_of(attr), rq_sge_of(attr), 0, queue_mem_.data() ? queue_mem_.data() + sq_bytes(attr) : nullptr) {
  handle_.owner = this;
  ibv_qp& q = handle_.pub.qp_base;
  q.context = pd.context().ibv();
  q.qp_context = attr.qp_context;
  q.pd = pd.ibv();
  q.send_cq = attr.send_cq;
  q.recv_cq = attr.recv_cq;
  q.srq = attr.srq;
  q.handle = 0;
  q.state = IBV_QPS_RESET;
  q.qp_type = attr.qp_type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  q.events_completed = 0;
  if (srq_) {
    cap_.max_recv_wr = 0;
    cap_.max_recv_sge = 0;
  }
  attr_.qp_state = IBV_QPS_RESET;
  attr_.cur_qp_state = IBV_QPS_RESET;
  attr_.cap = cap_;
}

void publish_qp(Context& ctx, Qp& qp) {
  const uint32_t handle = ctx.handles.add(ObjectType::qp, qp.ibv());
  try {
    qp.set_qpn(ctx.device().register_qp(&qp));
  } catch (...) {
    ctx.handles.remove(handle);
    throw;
  }
  qp.ibv()->handle = handle;
}

Qp::~Qp() {
  pthread_mutex_destroy(&handle_.pub.qp_base.mutex);
  pthread_cond_destroy(&handle_.pub.qp_base.cond);
}

int Qp::modify(ibv_qp_attr* attr, int attr_mask) {
  std::lock_guard lock(mu_);
  const auto mask = static_cast<uint32_t>(attr_mask);
  // Mask bits no kernel defines are refused before anything else, as uverbs does.
  if (qp_attr_mask_unsupported_bits(mask)) return EOPNOTSUPP;
  const QpTransition t = resolve_modify_qp_transition(attr_.qp_state, *attr, mask);
  const ibv_qp_state cur = t.cur;
  const ibv_qp_state next = t.next;
  if (!modify_qp_is_ok(type_, cur, next, mask)) return EINVAL;
  // IBTA 10.3.1 lets a UC QP take a new address vector in SQD->SQD; rxe's
  // kernel refuses it (the personality's qp.uc_sqd_av).
  if (type_ == IBV_QPT_UC && cur == IBV_QPS_SQD && next == IBV_QPS_SQD && (mask & IBV_QP_AV) &&
      personality().uc_sqd_av_refused)
    return EINVAL;
  if (int err = validate_qp_attr_values(*attr, mask, limits_of(device()), attr_.port_num)) return err;
  if (int err = check_path_migration_locked(*attr, mask, cur, next)) return err;
  if (mask & IBV_QP_AV) {
    // The destination must be reachable by an emulated port: an IPv4-mapped GID,
    // an emulated port's IB GID, or a LID.
    ibv_qp_attr saved = attr_;
    in_addr saved_dest = dest_addr_;
    attr_.ah_attr = attr->ah_attr;
    bool ok = resolve_dest_locked();
    attr_ = saved;
    if (!ok) {
      dest_addr_ = saved_dest;
      return EINVAL;
    }
  }

  // Apply the attributes the mask names.
  auto has = [attr_mask](int bit) { return (attr_mask & bit) != 0; };
  if (has(IBV_QP_PKEY_INDEX)) attr_.pkey_index = attr->pkey_index;
  if (has(IBV_QP_PORT)) attr_.port_num = attr->port_num;
  if (has(IBV_QP_QKEY)) attr_.qkey = attr->qkey;
  if (has(IBV_QP_ACCESS_FLAGS)) attr_.qp_access_flags = attr->qp_access_flags;
  if (has(IBV_QP_AV)) attr_.ah_attr = attr->ah_attr;
  // path_mtu 0, which only an rxe personality lets through, keeps the port's MTU.
  if (has(IBV_QP_PATH_MTU)) attr_.path_mtu = attr->path_mtu ? attr->path_mtu : device().active_mtu();
  if (has(IBV_QP_DEST_QPN)) attr_.dest_qp_num = attr->dest_qp_num;
  if (has(IBV_QP_RQ_PSN)) attr_.rq_psn = attr->rq_psn & 0xffffff;
  if (has(IBV_QP_MAX_DEST_RD_ATOMIC)) attr_.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (has(IBV_QP_MIN_RNR_TIMER)) attr_.min_rnr_timer = attr->min_rnr_timer;
  if (has(IBV_QP_SQ_PSN)) attr_.sq_psn = attr->sq_psn & 0xffffff;
  if (has(IBV_QP_TIMEOUT)) attr_.timeout = attr->timeout;
  if (has(IBV_QP_RETRY_CNT)) attr_.retry_cnt = attr->retry_cnt;
  if (has(IBV_QP_RNR_RETRY)) attr_.rnr_retry = attr->rnr_retry;
  if (has(IBV_QP_MAX_QP_RD_ATOMIC)) attr_.max_rd_atomic = attr->max_rd_atomic;
  apply_path_migration_locked(*attr, mask);
  if (has(IBV_QP_EN_SQD_ASYNC_NOTIFY)) attr_.en_sqd_async_notify = attr->en_sqd_async_notify;

  if (trace::on())
    trace::modify_qp(device().clock(), device().name(), qpn(), trace::qp_state_name(cur), trace::qp_state_name(next),
                     attr_.dest_qp_num);
  if (next != cur || has(IBV_QP_STATE)) enter_state_locked(cur, next);
  // ECE (mlx5_modify_qp): the options set since the last modify travel with
  // this one, and the device answers the subset it has (caps::kEceOptions).
  if (ece_set_) {
    ece_get_ = ece_set_ & caps::kEceOptions;
    ece_set_ = 0;
  }
  return 0;
}

uint32_t Qp::ece_options() {
  std::lock_guard lock(mu_);
  return ece_get_;
}

void Qp::set_ece_options(uint32_t options) {
  std::lock_guard lock(mu_);
  ece_set_ = options;
  ece_get_ = 0;  // mlx5 forgets what it answered before
}

namespace {
int ece_error(int err) {
  errno = err;
  return err;
}
}  // namespace

// Enhanced connection establishment, as mlx5 (mlx5_query_ece, mlx5_set_ece):
// options under the device's vendor id, offered by ibv_set_ece, settled by the
// next ibv_modify_qp to what the device implements (caps::kEceOptions), and
// read back by ibv_query_ece. The QP is not looked up by number: mlx5 answers
// both from its own struct, with no command.
int EmuProvider::query_ece(ibv_qp* qp, ibv_ece* ece) {
  ece->vendor_id = caps::kVendorId;
  ece->options = Qp::from(qp)->ece_options();
  ece->comp_mask = 0;
  return 0;
}
int EmuProvider::set_ece(ibv_qp* qp, ibv_ece* ece) {
  // libibverbs' own check (ibv_set_ece), which the ABI layer leaves to the
  // provider, then mlx5's; each sets errno and returns it.
  if (!ece->vendor_id) return ece_error(EOPNOTSUPP);
  if (ece->comp_mask || ece->vendor_id != caps::kVendorId) return ece_error(EINVAL);
  Qp::from(qp)->set_ece_options(ece->options);
  return 0;
}

void Qp::enter_state_locked(ibv_qp_state cur, ibv_qp_state next) {
  attr_.qp_state = next;
  attr_.cur_qp_state = next;
  handle_.pub.qp_base.state = next;
  if (next == IBV_QPS_RESET) {
    // Reset discards every outstanding work request without a completion and
    // returns the attributes to their initial values (IBTA 10.3.1 QP states).
    // Like mlx5, it also removes the QP's completions not yet polled (flushes
    // of an earlier error included) from its CQs.
    clean_cqs_locked();
    sq_.clear();
    rq_.clear();
    resp_.rcv = ResponderState::Receiving{};
    resp_.wr = ResponderState::Writing{};
    resp_.resources.clear();
    req_.tx_index = 0;
    req_.tx_offset = 0;
    if (req_.rnr_waiting) trace_timer_locked("rnr_wait", "cancelled");
    if (trace_ack_armed_) trace_timer_locked("ack_timeout", "cancelled");
    req_.rnr_waiting = false;
    req_.held_error = IBV_WC_SUCCESS;
    error_pending_ = false;
    deadline_ = {};
    ibv_qp_attr fresh{};
    fresh.cap = cap_;
    attr_ = fresh;  // path_mig_state MIGRATED: no alternate path
    alt_loaded_ = false;
  } else if (next == IBV_QPS_ERR && cur != IBV_QPS_ERR) {
    error_pending_ = false;
    enter_error_locked();
  } else if (next == IBV_QPS_RTR && cur == IBV_QPS_INIT) {
    resp_.epsn = attr_.rq_psn;
    resp_.msn = 0;
    resp_.prev_opcode = wire::kNoPrevOpcode;
    resp_.nak_sent = false;
    resp_.uc_drop = type_ == IBV_QPT_UC;
    resp_.comm_established = false;
    device().start_progress();
  } else if (next == IBV_QPS_RTS && cur == IBV_QPS_RTR) {
    req_.psn = comp_.unacked_psn = req_.sent_end_psn = attr_.sq_psn;
    req_.tx_index = 0;
    req_.tx_offset = 0;
    comp_.retry_left = attr_.retry_cnt;
    comp_.rnr_retry_left = attr_.rnr_retry;
    req_.rnr_waiting = false;
    retx_ = AdaptiveRetransmit{};  // a new connection: no round trip measured yet
    retx_.sent_mark = req_.sent_end_psn;
    adaptive_retx_ = adaptive_retransmit_enabled(personality().adaptive_retransmit);
    if (!timer_ && requester_reliable()) timer_ = std::make_shared<EngineTimer>(device().scheduler(), [this] { on_timer(); });
    requester_locked();
  } else if (next == IBV_QPS_RTS && cur == IBV_QPS_SQD) {
    attr_.sq_draining = 0;
    requester_locked();
  } else if (next == IBV_QPS_SQD && cur == IBV_QPS_RTS) {
    // The send queue drains: messages under way finish, no new one starts
    // (IBTA 10.3.1, Send Queue Drain state).
    attr_.sq_draining = 1;
    check_drained_locked();
  }
}

int Qp::query(ibv_qp_attr* attr, int /*attr_mask*/, ibv_qp_init_attr* init_attr) {
  std::lock_guard lock(mu_);
  // Like the kernel, every attribute is reported whatever the mask asks for.
  *attr = attr_;
  attr->cap = cap_;
  attr->cur_qp_state = attr_.qp_state;
  std::memset(init_attr, 0, sizeof *init_attr);
  const ibv_qp& q = handle_.pub.qp_base;
  init_attr->qp_context = q.qp_context;
  init_attr->send_cq = q.send_cq;
  init_attr->recv_cq = q.recv_cq;
  init_attr->srq = q.srq;
  init_attr->cap = cap_;
  init_attr->qp_type = type_;
  init_attr->sq_sig_all = sq_sig_all_ ? 1 : 0;
  return 0;
}

int Qp::post_recv(ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  // The fault layer's post_recv rules, one decision per work request: the first
  // that fails the post ends it there (docs/faults.md).
  ibv_recv_wr* fail_at = nullptr;
  int fail_errno = 0;
  if (device().verb_filter().verbs_active()) {
    for (ibv_recv_wr* w = wr; w && !fail_at; w = w->next) {
      if ((fail_errno = post_fault(*this, faults::VerbPoint::post_recv, std::nullopt))) fail_at = w;
    }
  }
  std::lock_guard lock(mu_);
  const ibv_qp_state state = attr_.qp_state;
  for (; wr; wr = wr->next) {
    if (wr == fail_at) {
      *bad_wr = wr;
      return fail_errno;
    }
    // A QP attached to an SRQ has no receive queue of its own. One in RESET
    // keeps the receive for later unless posts before RTS are refused.
    // Neither XRC QP has one: receives are posted to XRC SRQs.
    if (srq_ || is_xrc() || (state == IBV_QPS_RESET && early_post_ == EarlyPost::refuse)) {
      // rxe's kernel refuses these and leaves bad_wr alone (post.bad_wr_on_refusal).
      if (personality().bad_wr_on_refusal || is_xrc()) *bad_wr = wr;
      return EINVAL;
    }
    if (int rc = post_recv_wqe(rq_, *wr)) {
      *bad_wr = wr;
      return rc;
    }
    if (trace::on())
      rq_.back().trace_id = trace::wr_posted(device().clock(), device().name(), "post_recv", qpn(), wr->wr_id, "RECV",
                                             rq_.back().total_length);
  }
  // Work requests posted to a QP in the error state complete at once, flushed
  // (rxe: they never complete, completions.flush_posted_in_error).
  if (state == IBV_QPS_ERR && personality().flush_posted_in_error) flush_locked();
  return 0;
}

int Qp::post_send(ibv_send_wr* wr, ibv_send_wr** bad_wr, bool bind_verb) {
  ibv_send_wr* fail_at = nullptr;
  int fail_errno = 0;
  if (device().verb_filter().verbs_active()) {
    for (ibv_send_wr* w = wr; w && !fail_at; w = w->next) {
      if ((fail_errno = post_fault(*this, faults::VerbPoint::post_send, static_cast<int>(w->opcode)))) fail_at = w;
    }
  }
  std::lock_guard lock(mu_);
  const ibv_qp_state state = attr_.qp_state;
  // The requests before a failing one are posted (bad_wr names the first one
  // that is not) and go to work like any others.
  int rc = 0;
  for (; wr; wr = wr->next) {
    SendCheck c;
    rc = wr == fail_at ? fail_errno : check_send_locked(state, *wr, 0, &c, bind_verb);
    if (!rc) rc = sq_.reserve();  // the ring, at the first post
    if (rc) {
      // rxe leaves bad_wr alone when it refuses a send before RTS.
      if (!(rc == EINVAL && wr != fail_at && before_rts(state) && early_post_ == EarlyPost::refuse &&
            !personality().bad_wr_on_refusal))
        *bad_wr = wr;
      break;
    }
    enqueue_send_locked(*wr, c.total, c.is_inline, c.ud_dest);
  }
  after_post_send_locked(state);
  return rc;
}

int Qp::post_batch(std::span<const ibv_send_wr> wrs) {
  // The fault layer's post_send rules decide per work request, as for
  // ibv_post_send; the first that fails the post fails the whole batch.
  if (device().verb_filter().verbs_active()) {
    for (const ibv_send_wr& w : wrs)
      if (int err = post_fault(*this, faults::VerbPoint::post_send, static_cast<int>(w.opcode))) return err;
  }
  std::lock_guard lock(mu_);
  const ibv_qp_state state = attr_.qp_state;
  // Before RTS even an empty batch fails, as mlx5's wr_complete does there.
  if (state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR) return EINVAL;
  // Every work request is checked before any is queued: all or nothing. An
  // operation the QP type does not have fails the batch (mlx5 has no builder
  // for it at all), where ibv_post_send lets it fail at execution.
  // Each work request is checked once; what the check found is kept for the
  // enqueue (a per-thread list, so a batch allocates nothing once it has been
  // this long).
  static thread_local std::vector<SendCheck> checks;
  checks.resize(wrs.size());
  for (size_t i = 0; i < wrs.size(); ++i) {
    if (!opcode_valid_for(type_, wrs[i].opcode)) return EINVAL;
    if (int err = check_send_locked(state, wrs[i], static_cast<uint32_t>(i), &checks[i])) return err;
  }
  if (!wrs.empty())
    if (int err = sq_.reserve()) return err;  // the ring, at the first post
  for (size_t i = 0; i < wrs.size(); ++i)
    enqueue_send_locked(wrs[i], checks[i].total, checks[i].is_inline, checks[i].ud_dest);
  after_post_send_locked(state);
  return 0;
}

int Qp::check_send_locked(ibv_qp_state state, const ibv_send_wr& wr, uint32_t queued, SendCheck* out,
                          bool bind_verb) {
  // Before RTS the work request waits in the queue (the RTR->RTS transition
  // starts the requester), unless posts before RTS are refused.
  if ((state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR) && early_post_ == EarlyPost::refuse)
    return EINVAL;
  // An opcode of another service is posted (mlx5 does not check it) and fails
  // when the requester reaches it (send_next_packet_locked); only opcodes no
  // emulated service has are refused here.
  if (!opcode_valid_for(IBV_QPT_RC, wr.opcode)) return EINVAL;
  // rxe refuses at post time what the IBTA lets a device fail at execution
  // (post.unsupported_opcode, post.misaligned_atomic; atomics work on
  // naturally aligned 64-bit words, IBTA 9.4.5).
  const bool service = type_ == IBV_QPT_RC || type_ == IBV_QPT_UC || type_ == IBV_QPT_UD || type_ == IBV_QPT_XRC_SEND;
  if (service && personality().unsupported_opcode_refused && !opcode_valid_for(type_, wr.opcode)) return EINVAL;
  if ((wr.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || wr.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) &&
      (wr.wr.atomic.remote_addr & 7) && personality().misaligned_atomic_refused)
    return EINVAL;
  // An XRC_RECV QP has no send queue (IBTA 14.2.4.3).
  if (type_ == IBV_QPT_XRC_RECV) return EINVAL;
  // A bind or local invalidation carries no data: its SGE list is ignored.
  const int num_sge = is_local_op(wr.opcode) ? 0 : wr.num_sge;
  if (num_sge < 0 || static_cast<uint32_t>(num_sge) > sq_.max_sge()) return EINVAL;
  if (wr.opcode == IBV_WR_BIND_MW || bind_verb) {
    if (wr.opcode != IBV_WR_BIND_MW) return EINVAL;
    if (int rc = check_bind_wr(wr, context().ibv(), bind_verb)) return rc;
  }
  uint64_t total = 0;
  for (int i = 0; i < num_sge; ++i) total += wr.sg_list[i].length;
  const bool is_inline = !is_local_op(wr.opcode) && (wr.send_flags & IBV_SEND_INLINE) != 0;
  if (is_inline && total > sq_.max_inline()) return EINVAL;
  // A datagram needs an address handle emulated devices can reach. Its PD is
  // not checked: ConnectX copies the address vector into the WQE and sends
  // through an address handle of any PD of the context.
  in_addr ud_dest{};
  if (type_ == IBV_QPT_UD && (!wr.wr.ud.ah || !resolve_av(device(), Ah::from(wr.wr.ud.ah)->attr(), &ud_dest)))
    return EINVAL;
  if (sq_.size() + static_cast<uint64_t>(queued) >= sq_.capacity()) return ENOMEM;
  *out = SendCheck{total, is_inline, ud_dest};
  return 0;
}

void Qp::after_post_send_locked(ibv_qp_state state) {
  if (state == IBV_QPS_SQE || (state == IBV_QPS_ERR && personality().flush_posted_in_error)) {
    flush_locked();
  } else if (state == IBV_QPS_ERR) {
    // rxe: work posted in the error state stays queued and never completes.
  } else {
    requester_locked();
  }
}

void Qp::make_extended() {
  batch_ = std::make_unique<WrBatch>(cap_.max_send_wr, sq_.max_sge(), cap_.max_inline_data, type_);
  install_wr_ops(&handle_.pub);
}

void Qp::enqueue_send_locked(const ibv_send_wr& wr, uint64_t total, bool is_inline, in_addr ud_dest) {
  SendWqe& wqe = sq_.next();
  wqe.wr_id = wr.wr_id;
  wqe.trace_id = trace::on() ? trace::wr_posted(device().clock(), device().name(), "post_send", qpn(), wr.wr_id,
                                                trace::wr_opcode_name(wr.opcode), total)
                             : 0;
  wqe.opcode = wr.opcode;
  wqe.send_flags = wr.send_flags;
  const int num_sge = is_local_op(wr.opcode) ? 0 : wr.num_sge;
  wqe.num_sge = is_inline ? 0 : static_cast<uint32_t>(num_sge);
  wqe.total_length = total;
  wqe.imm_data = wr.imm_data;  // also invalidate_rkey (a union)
  wqe.is_inline = is_inline;
  wqe.ah = nullptr;
  wqe.bind_mw = nullptr;
  // The slot is reused: its transmission state starts afresh.
  wqe.first_psn = wqe.last_psn = 0;
  wqe.resp_bytes = 0;
  wqe.started = false;
  wqe.acked = false;
  wqe.rd_before = rd_posted_;
  if (is_read_or_atomic(wr.opcode)) ++rd_posted_;
  switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      wqe.remote_addr = wr.wr.rdma.remote_addr;
      wqe.rkey = wr.wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      wqe.remote_addr = wr.wr.atomic.remote_addr;
      wqe.rkey = wr.wr.atomic.rkey;
      wqe.compare_add = wr.wr.atomic.compare_add;
      wqe.swap = wr.wr.atomic.swap;
      break;
    case IBV_WR_BIND_MW:
      wqe.bind_mw = wr.bind_mw.mw;
      wqe.bind_rkey = wr.bind_mw.rkey;
      wqe.bind_info = wr.bind_mw.bind_info;
      break;
    default:
      break;
  }
  wqe.remote_srqn = type_ == IBV_QPT_XRC_SEND ? wr.qp_type.xrc.remote_srqn & 0xffffff : 0;
  if (type_ == IBV_QPT_UD) {
    wqe.ah = wr.wr.ud.ah;
    wqe.remote_qpn = wr.wr.ud.remote_qpn & 0xffffff;
    wqe.remote_qkey = wr.wr.ud.remote_qkey;
    wqe.ud_dest = ud_dest.s_addr;
    const ibv_ah_attr& av = Ah::from(wr.wr.ud.ah)->attr();
    wqe.ud_tclass = av.is_global ? av.grh.traffic_class : 0;
  }
  if (is_inline) {
    // Inline data is copied at post time: the buffer may be reused at once.
    uint8_t* dst = sq_.next_inline();
    for (int i = 0; i < num_sge; ++i) {
      std::memcpy(dst, reinterpret_cast<const void*>(wr.sg_list[i].addr), wr.sg_list[i].length);
      dst += wr.sg_list[i].length;
    }
  } else {
    Sge* sges = sq_.next_sges();
    for (int i = 0; i < num_sge; ++i)
      sges[i] = Sge{wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
  }
  sq_.push();
}

void Qp::shutdown() {
  if (timer_) timer_->detach();
  std::lock_guard lock(mu_);
  clean_cqs_locked();
}

void Qp::clean_cqs_locked() {
  // An XRC_RECV QP has no CQs of its own; its receive completions went to its
  // SRQs' CQs and stay there, as the QP is not theirs to clean.
  if (send_cq_) send_cq_->clean(qpn());
  if (recv_cq_ && recv_cq_ != send_cq_) recv_cq_->clean(qpn());
}

void Qp::enter_error_locked() {
  attr_.qp_state = IBV_QPS_ERR;
  attr_.cur_qp_state = IBV_QPS_ERR;
  handle_.pub.qp_base.state = IBV_QPS_ERR;
  flush_locked();
  if (srq_ && personality().event_last_wqe_reached) {
    // IBTA 10.3.1: a QP attached to an SRQ reports its last WQE once in error
    // (rxe never does: the personality's [events]).
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = IBV_EVENT_QP_LAST_WQE_REACHED;
    context().post_async_event(ev);
  }
}

void Qp::flush_locked() {
  if (req_.rnr_waiting) trace_timer_locked("rnr_wait", "cancelled");
  if (trace_ack_armed_) trace_timer_locked("ack_timeout", "cancelled");
  req_.tx_index = 0;
  req_.tx_offset = 0;
  req_.rnr_waiting = false;
  req_.held_error = IBV_WC_SUCCESS;
  // Every outstanding work request completes with IBV_WC_WR_FLUSH_ERR, signaled or
  // not: completions in error are always generated (IBTA 10.8.3).
  auto push = [this](Cq* cq, uint64_t wr_id, ibv_wc_opcode opcode, uint64_t trace_id) {
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = opcode;
    wc.qp_num = qpn();
    push_completion_locked(cq, wc, false, trace_id);
  };
  if (attr_.qp_state == IBV_QPS_ERR) {
    if (resp_.rcv.active && !srq_) {
      // The receive WQE a message was being placed into comes first.
      push(recv_cq_, resp_.rcv.wqe.wr_id, IBV_WC_RECV, resp_.rcv.wqe.trace_id);
    }
    resp_.rcv = ResponderState::Receiving{};
    while (!rq_.empty()) {
      push(recv_cq_, rq_.front().wr_id, IBV_WC_RECV, rq_.front().trace_id);
      rq_.pop();
    }
  }
  while (!sq_.empty()) {
    const SendWqe& w = sq_.front();
    push(send_cq_, w.wr_id, wc_opcode_of(w.opcode), w.trace_id);
    sq_.pop();
  }
}

}  // namespace softverbs::emu

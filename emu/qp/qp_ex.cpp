// The extended post API (ibv_qp_ex): the staging of a batch (WrBatch) and the
// ibv_wr_* function pointers the application's inline calls jump through. The
// rules (first error wins, all or nothing, one batch per QP) are in wr_batch.hpp.
#include <cerrno>
#include <cstring>

#include "emu/qp/qp.hpp"
#include "emu/qp/wr_batch.hpp"

namespace softverbs::emu {

// ---- WrBatch ---------------------------------------------------------------

WrBatch::WrBatch(uint32_t max_wr, uint32_t max_sge, uint32_t max_inline, ibv_qp_type type)
    : max_wr_(max_wr),
      max_sge_(max_sge ? max_sge : 1),
      max_inline_(max_inline),
      wrs_(max_wr),
      needs_(max_wr),
      sges_(static_cast<size_t>(max_wr) * (max_sge ? max_sge : 1)),
      inline_(static_cast<size_t>(max_wr) * max_inline),
      dest_need_(type == IBV_QPT_UD         ? kNeedUdAddr
                 : type == IBV_QPT_XRC_SEND ? kNeedXrcSrqn
                                            : 0) {}

void WrBatch::start() {
  const std::thread::id me = std::this_thread::get_id();
  std::unique_lock lock(mu_);
  if (open_ && owner_.load(std::memory_order_relaxed) == me) {
    // Waiting would never end: this thread's own batch is the open one.
    fail(EINVAL);
    return;
  }
  free_.wait(lock, [this] { return !open_; });
  open_ = true;
  count_ = 0;
  current_ok_ = false;
  error_ = 0;
  owner_.store(me, std::memory_order_release);
}

void WrBatch::finish() {
  {
    std::lock_guard lock(mu_);
    open_ = false;
    count_ = 0;
    owner_.store(std::thread::id{}, std::memory_order_release);
  }
  free_.notify_one();
}

ibv_send_wr* WrBatch::begin(const ibv_qp_ex& qpx, ibv_wr_opcode opcode, bool needs_data) {
  current_ok_ = false;
  if (count_ >= max_wr_) {
    fail(ENOMEM);  // mlx5: work queue overflow
    return nullptr;
  }
  ibv_send_wr& wr = wrs_[count_];
  wr = ibv_send_wr{};
  wr.wr_id = qpx.wr_id;
  wr.opcode = opcode;
  // The data setter, not IBV_SEND_INLINE, says whether the payload is inline.
  wr.send_flags = qpx.wr_flags & ~static_cast<unsigned>(IBV_SEND_INLINE);
  needs_[count_] = static_cast<uint8_t>((needs_data ? kNeedData : 0) | dest_need_);
  ++count_;
  current_ok_ = true;
  return &wr;
}

ibv_send_wr* WrBatch::current() {
  if (!current_ok_ || count_ == 0) {
    fail(EINVAL);
    return nullptr;
  }
  return &wrs_[count_ - 1];
}

void WrBatch::set_sge_list(size_t num_sge, const ibv_sge* sg_list) {
  ibv_send_wr* wr = current();
  if (!wr) return;
  uint8_t& need = needs_[count_ - 1];
  if (!(need & kNeedData)) return fail(EINVAL);  // data set twice, or an operation without data
  if (num_sge > max_sge_) return fail(ENOMEM);   // mlx5's answer for too many SGEs
  if (num_sge && !sg_list) return fail(EINVAL);
  ibv_sge* dst = &sges_[(count_ - 1) * max_sge_];
  if (num_sge) std::memcpy(dst, sg_list, num_sge * sizeof *dst);
  wr->sg_list = dst;
  wr->num_sge = static_cast<int>(num_sge);
  need &= static_cast<uint8_t>(~kNeedData);
}

void WrBatch::set_inline_list(size_t num_buf, const ibv_data_buf* buf_list) {
  ibv_send_wr* wr = current();
  if (!wr) return;
  uint8_t& need = needs_[count_ - 1];
  if (!(need & kNeedData)) return fail(EINVAL);
  if (num_buf && !buf_list) return fail(EINVAL);
  size_t total = 0;
  for (size_t i = 0; i < num_buf; ++i) {
    total += buf_list[i].length;
    if (total > max_inline_) return fail(ENOMEM);  // mlx5's answer for inline data too large
    if (buf_list[i].length && !buf_list[i].addr) return fail(EINVAL);
  }
  // The bytes are copied now: the caller may reuse its buffers on return. The
  // WR then carries them as one SGE over the copy, which the post copies on.
  uint8_t* dst = max_inline_ ? &inline_[(count_ - 1) * max_inline_] : nullptr;
  size_t off = 0;
  for (size_t i = 0; i < num_buf; ++i) {
    if (buf_list[i].length) std::memcpy(dst + off, buf_list[i].addr, buf_list[i].length);
    off += buf_list[i].length;
  }
  ibv_sge* sge = &sges_[(count_ - 1) * max_sge_];
  *sge = ibv_sge{reinterpret_cast<uintptr_t>(dst), static_cast<uint32_t>(total), 0};
  wr->sg_list = sge;
  wr->num_sge = total ? 1 : 0;
  wr->send_flags |= IBV_SEND_INLINE;
  need &= static_cast<uint8_t>(~kNeedData);
}

void WrBatch::set_ud_addr(ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  ibv_send_wr* wr = current();
  if (!wr) return;
  uint8_t& need = needs_[count_ - 1];
  if (!(need & kNeedUdAddr)) return fail(EINVAL);  // not UD, or set twice
  wr->wr.ud.ah = ah;
  wr->wr.ud.remote_qpn = remote_qpn;
  wr->wr.ud.remote_qkey = remote_qkey;
  need &= static_cast<uint8_t>(~kNeedUdAddr);
}

// The SRQ of the target the request goes to (IBTA 9.5, the XRCETH); mlx5
// takes it for every XRC_SEND work request, as ibv_post_send takes
// wr.qp_type.xrc.remote_srqn.
void WrBatch::set_xrc_srqn(uint32_t remote_srqn) {
  ibv_send_wr* wr = current();
  if (!wr) return;
  uint8_t& need = needs_[count_ - 1];
  if (!(need & kNeedXrcSrqn)) return fail(EINVAL);  // not XRC_SEND, or set twice
  wr->qp_type.xrc.remote_srqn = remote_srqn;
  need &= static_cast<uint8_t>(~kNeedXrcSrqn);
}

int WrBatch::error() const {
  if (error_) return error_;
  for (size_t i = 0; i < count_; ++i)
    if (needs_[i]) return EINVAL;
  return 0;
}

uint64_t supported_send_ops(ibv_qp_type type) {
  constexpr uint64_t kSends = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  constexpr uint64_t kUc = kSends | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
                           IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;
  switch (type) {
    case IBV_QPT_RC:
    case IBV_QPT_XRC_SEND:  // mlx5: MLX5_SUPPORTED_SEND_OPS_FLAGS_XRC is the RC set
      return kUc | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    case IBV_QPT_UC:
      return kUc;
    case IBV_QPT_UD:
      return kSends;
    default:
      return 0;
  }
}

// ---- the function pointers ---------------------------------------------------
namespace {

// The batch of the QP behind qpx if the calling thread is building it.
WrBatch* building(ibv_qp_ex* qpx) {
  WrBatch* b = Qp::from(&qpx->qp_base)->batch();
  return b && b->owned() ? b : nullptr;
}

// Starts a work request of `op` in the caller's batch (nullptr: no batch, or full).
ibv_send_wr* begin(ibv_qp_ex* qpx, ibv_wr_opcode op, bool needs_data = true) {
  WrBatch* b = building(qpx);
  return b ? b->begin(*qpx, op, needs_data) : nullptr;
}

void wr_start(ibv_qp_ex* qpx) {
  if (WrBatch* b = Qp::from(&qpx->qp_base)->batch()) b->start();
}

int wr_complete(ibv_qp_ex* qpx) {
  Qp* qp = Qp::from(&qpx->qp_base);
  WrBatch* b = building(qpx);
  if (!b) return EINVAL;
  int rc = b->error();
  qp->device().scheduler().note_busy();  // posting is work (docs/simulation.md)
  if (!rc) rc = qp->post_batch(b->wrs());
  b->finish();
  return rc;
}

void wr_abort(ibv_qp_ex* qpx) {
  if (WrBatch* b = building(qpx)) b->finish();
}

void wr_rdma_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_RDMA_WRITE)) wr->wr.rdma = {remote_addr, rkey};
}

void wr_rdma_write_imm(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, __be32 imm_data) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_RDMA_WRITE_WITH_IMM)) {
    wr->wr.rdma = {remote_addr, rkey};
    wr->imm_data = imm_data;
  }
}

void wr_rdma_read(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_RDMA_READ)) wr->wr.rdma = {remote_addr, rkey};
}

void wr_atomic_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, uint64_t compare, uint64_t swap) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_ATOMIC_CMP_AND_SWP)) wr->wr.atomic = {remote_addr, compare, swap, rkey};
}

void wr_atomic_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t remote_addr, uint64_t add) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD)) wr->wr.atomic = {remote_addr, add, 0, rkey};
}

void wr_send(ibv_qp_ex* qpx) { begin(qpx, IBV_WR_SEND); }

void wr_send_imm(ibv_qp_ex* qpx, __be32 imm_data) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_SEND_WITH_IMM)) wr->imm_data = imm_data;
}

void wr_send_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_SEND_WITH_INV)) wr->invalidate_rkey = invalidate_rkey;
}

// Local invalidation and memory-window binds carry no data: no setter follows.
void wr_local_inv(ibv_qp_ex* qpx, uint32_t invalidate_rkey) {
  if (ibv_send_wr* wr = begin(qpx, IBV_WR_LOCAL_INV, false)) wr->invalidate_rkey = invalidate_rkey;
}

void wr_bind_mw(ibv_qp_ex* qpx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* bind_info) {
  ibv_send_wr* wr = begin(qpx, IBV_WR_BIND_MW, false);
  if (!wr) return;
  if (!bind_info) return building(qpx)->fail(EINVAL);
  wr->bind_mw.mw = mw;
  wr->bind_mw.rkey = rkey;
  wr->bind_mw.bind_info = *bind_info;
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
  const ibv_sge sge{addr, length, lkey};
  if (WrBatch* b = building(qpx)) b->set_sge_list(1, &sge);
}

void wr_set_sge_list(ibv_qp_ex* qpx, size_t num_sge, const ibv_sge* sg_list) {
  if (WrBatch* b = building(qpx)) b->set_sge_list(num_sge, sg_list);
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
  const ibv_data_buf buf{addr, length};
  if (WrBatch* b = building(qpx)) b->set_inline_list(1, &buf);
}

void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t num_buf, const ibv_data_buf* buf_list) {
  if (WrBatch* b = building(qpx)) b->set_inline_list(num_buf, buf_list);
}

void wr_set_ud_addr(ibv_qp_ex* qpx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  if (WrBatch* b = building(qpx)) b->set_ud_addr(ah, remote_qpn, remote_qkey);
}

void wr_set_xrc_srqn(ibv_qp_ex* qpx, uint32_t remote_srqn) {
  if (WrBatch* b = building(qpx)) b->set_xrc_srqn(remote_srqn);
}

// Operations no emulated QP accepts at creation (TSO, atomic write). The
// pointers are set anyway, so that a call fails the batch instead of jumping
// to NULL.
void wr_send_tso(ibv_qp_ex* qpx, void*, uint16_t, uint16_t) {
  if (WrBatch* b = building(qpx)) b->fail(EOPNOTSUPP);
}
void wr_atomic_write(ibv_qp_ex* qpx, uint32_t, uint64_t, const void*) {
  if (WrBatch* b = building(qpx)) b->fail(EOPNOTSUPP);
}

}  // namespace

void install_wr_ops(ibv_qp_ex* qpx) {
  // Every pointer is set for every QP type. An operation the QP type does not
  // have fails the batch at ibv_wr_complete with EINVAL, as ibv_post_send
  // refuses it (mlx5 leaves such pointers NULL, and a call crashes).
  qpx->wr_start = wr_start;
  qpx->wr_complete = wr_complete;
  qpx->wr_abort = wr_abort;
  qpx->wr_rdma_write = wr_rdma_write;
  qpx->wr_rdma_write_imm = wr_rdma_write_imm;
  qpx->wr_rdma_read = wr_rdma_read;
  qpx->wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  qpx->wr_atomic_fetch_add = wr_atomic_fetch_add;
  qpx->wr_send = wr_send;
  qpx->wr_send_imm = wr_send_imm;
  qpx->wr_send_inv = wr_send_inv;
  qpx->wr_local_inv = wr_local_inv;
  qpx->wr_bind_mw = wr_bind_mw;
  qpx->wr_set_sge = wr_set_sge;
  qpx->wr_set_sge_list = wr_set_sge_list;
  qpx->wr_set_inline_data = wr_set_inline_data;
  qpx->wr_set_inline_data_list = wr_set_inline_data_list;
  qpx->wr_set_ud_addr = wr_set_ud_addr;
  qpx->wr_send_tso = wr_send_tso;
  qpx->wr_set_xrc_srqn = wr_set_xrc_srqn;
  qpx->wr_atomic_write = wr_atomic_write;
}

}  // namespace softverbs::emu

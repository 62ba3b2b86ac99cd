// The extended post API of a QP created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
// (ibv_qp_ex, the ibv_wr_* calls; man page ibv_wr_post(3)).
//
// Between ibv_wr_start and ibv_wr_complete the application builds work requests
// one call at a time. WrBatch stages them as ordinary ibv_send_wr records (with
// their SGEs and inline bytes copied at the call, since the caller may reuse its
// buffers at once); ibv_wr_complete hands the whole batch to Qp::post_batch, which
// checks and queues it through the same code as ibv_post_send, so the engine sees
// one kind of send WQE. As on ConnectX (mlx5), the first error met while building
// is remembered, and ibv_wr_complete then returns it and posts nothing of the
// batch; ibv_wr_abort discards the batch.
//
// One batch is open per QP at a time: ibv_wr_start waits while another thread's
// batch is open (mlx5 holds its send-queue lock from start to complete). Building
// calls from a thread that has no open batch, and ibv_wr_complete/abort without
// ibv_wr_start, change nothing (mlx5 does not check and corrupts its queue): the
// builders and setters are ignored, ibv_wr_complete returns EINVAL. A second
// ibv_wr_start by the thread whose batch is open fails that batch with EINVAL.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace softverbs::emu {

class WrBatch {
 public:
  // Room for max_wr work requests of up to max_sge SGEs and max_inline inline
  // bytes each: the send queue's own limits, so a batch never holds what the
  // queue could not. A UD batch's work requests also need an address, an
  // XRC_SEND batch's the remote SRQ number (ibv_wr_set_xrc_srqn).
  WrBatch(uint32_t max_wr, uint32_t max_sge, uint32_t max_inline, ibv_qp_type type);

  // ---- ownership (ibv_wr_start / ibv_wr_complete / ibv_wr_abort) ----------
  void start();
  // True if the calling thread has the open batch.
  bool owned() const { return owner_.load(std::memory_order_acquire) == std::this_thread::get_id(); }
  // Ends the calling thread's batch (nothing staged survives).
  void finish();

  // ---- building (the calling thread owns the batch) -----------------------
  // Starts the next work request with the wr_id and wr_flags the application
  // has set in the ibv_qp_ex, or records ENOMEM (the batch is as deep as the
  // send queue) and answers nullptr.
  ibv_send_wr* begin(const ibv_qp_ex& qpx, ibv_wr_opcode opcode, bool needs_data);
  // The work request a setter completes: nullptr (and EINVAL recorded) before
  // the first builder, or after a failed one.
  ibv_send_wr* current();
  void set_sge_list(size_t num_sge, const ibv_sge* sg_list);
  void set_inline_list(size_t num_buf, const ibv_data_buf* buf_list);
  void set_ud_addr(ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey);
  void set_xrc_srqn(uint32_t remote_srqn);
  // Keeps the first error of the batch.
  void fail(int err) {
    if (!error_) error_ = err;
  }

  // ---- completing ---------------------------------------------------------
  // The first error recorded while building, or EINVAL for a work request left
  // without its data (an SGE or inline setter) or, UD, without its address
  // or, XRC_SEND, without its SRQ number.
  int error() const;
  std::span<const ibv_send_wr> wrs() const { return {wrs_.data(), count_}; }

 private:
  // What a staged work request still needs from the setters.
  enum Need : uint8_t { kNeedData = 1, kNeedUdAddr = 2, kNeedXrcSrqn = 4 };

  uint32_t max_wr_;
  uint32_t max_sge_;
  uint32_t max_inline_;
  std::vector<ibv_send_wr> wrs_;
  std::vector<uint8_t> needs_;
  std::vector<ibv_sge> sges_;
  std::vector<uint8_t> inline_;
  size_t count_ = 0;
  bool current_ok_ = false;  // the last builder staged a work request
  int error_ = 0;
  uint8_t dest_need_;  // kNeedUdAddr (UD), kNeedXrcSrqn (XRC_SEND) or 0

  std::mutex mu_;
  std::condition_variable free_;
  bool open_ = false;
  std::atomic<std::thread::id> owner_{};
};

// Installs the ibv_wr_* function pointers of an extended QP (emu/qp/qp_ex.cpp).
void install_wr_ops(ibv_qp_ex* qpx);

// The IBV_QP_EX_WITH_* operations a ConnectX accepts for a QP type (mlx5's
// per-type sets: UD only sends, UC no reads or atomics, XRC_SEND as RC); 0 for
// other types.
uint64_t supported_send_ops(ibv_qp_type type);

}  // namespace softverbs::emu

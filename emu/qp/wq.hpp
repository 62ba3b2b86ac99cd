// Work queues: fixed-capacity rings of work queue entries, sized by what the
// QP or SRQ was created with and allocated once, at the first post (reserve()),
// so that an idle queue costs a few dozen bytes and posting allocates at most
// that once: a program may create max_qp QPs with deep queues and use a few.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace softverbs::emu {

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

struct RecvWqe {
  uint64_t wr_id = 0;
  uint32_t num_sge = 0;
  uint64_t total_length = 0;
  uint64_t trace_id = 0;  // the work request's id in the trace (core/trace.hpp), 0 untraced
};

struct SendWqe {
  uint64_t wr_id = 0;
  uint64_t trace_id = 0;  // as RecvWqe's
  ibv_wr_opcode opcode = IBV_WR_SEND;
  unsigned send_flags = 0;
  uint32_t num_sge = 0;
  uint64_t total_length = 0;
  __be32 imm_data = 0;  // or the rkey to invalidate for SEND_WITH_INV
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  ibv_ah* ah = nullptr;      // UD
  uint32_t remote_qpn = 0;   // UD
  uint32_t remote_qkey = 0;  // UD
  uint32_t remote_srqn = 0;  // XRC_SEND: the target's SRQ (its XRCETH)
  uint32_t ud_dest = 0;      // UD: the address the AH resolved to at post time (network order)
  uint8_t ud_tclass = 0;     // UD: the AH's traffic class, the datagram's IPv4 TOS
  bool is_inline = false;    // payload copied into the queue at post time
  // IBV_WR_BIND_MW: the window, the rkey whose key byte it gets, and the
  // region, range and rights it is bound to (IBV_WR_LOCAL_INV names its rkey in
  // imm_data, as SEND_WITH_INV does).
  ibv_mw* bind_mw = nullptr;
  uint32_t bind_rkey = 0;
  ibv_mw_bind_info bind_info{};

  // Transmission state, owned by the requester and completer.
  uint32_t first_psn = 0;   // PSN of the first request packet
  uint32_t last_psn = 0;    // PSN of the last packet (reads: of the last response), set at start
  uint64_t resp_bytes = 0;  // read: response bytes placed so far
  // RDMA READs and atomics posted on this QP before this one (a running count),
  // so the requester counts those in flight between two WQEs by a subtraction.
  uint64_t rd_before = 0;
  bool started = false;     // first_psn/last_psn assigned: some packet has been sent
  bool acked = false;       // acknowledged (or, UC, sent): may complete
};

// The operations max_rd_atomic limits and IBV_SEND_FENCE waits for.
inline bool is_read_or_atomic(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

// Work requests the requester executes itself, with no packet: memory window
// binds and local invalidations (IBTA 10.6.7.2).
inline bool is_local_op(ibv_wr_opcode op) { return op == IBV_WR_BIND_MW || op == IBV_WR_LOCAL_INV; }

// Packets a message of len bytes takes at this path MTU (a zero-length one takes one).
inline uint32_t packets_for(uint64_t len, uint32_t mtu) {
  return len == 0 ? 1 : static_cast<uint32_t>((len + mtu - 1) / mtu);
}

// Whether a QP of this type can execute a send work request of this opcode.
inline bool opcode_valid_for(ibv_qp_type type, ibv_wr_opcode op) {
  switch (type) {
    case IBV_QPT_RC:
      return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV || op == IBV_WR_RDMA_WRITE ||
             op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
             op == IBV_WR_ATOMIC_FETCH_AND_ADD || is_local_op(op);
    case IBV_QPT_UC:
      // Memory windows are bound and invalidated on RC and UC QPs (mlx5, rxe).
      return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE ||
             op == IBV_WR_RDMA_WRITE_WITH_IMM || is_local_op(op);
    case IBV_QPT_UD:
      return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
    case IBV_QPT_XRC_SEND:
      // RC's operations (IBTA 9.5); no memory windows on XRC QPs here.
      return opcode_valid_for(IBV_QPT_RC, op) && !is_local_op(op);
    default:
      return false;
  }
}

// The completion opcode of a send work request.
inline ibv_wc_opcode wc_opcode_of(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    case IBV_WR_BIND_MW:
      return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV:
      return IBV_WC_LOCAL_INV;
    default:
      return IBV_WC_SEND;
  }
}

// A ring of WQE headers plus, per slot, room for max_sge scatter/gather entries
// and (send queues) max_inline bytes of inline payload, all in one buffer of
// bytes_for() bytes: the queue's own heap block, or storage the caller owns (a
// parent domain's allocator gave it: emu/objects/domain.hpp), which must then
// outlive the queue.
template <class Wqe>
class WorkQueue {
  static_assert(std::is_trivially_destructible_v<Wqe>, "WQEs live in raw queue memory");

 public:
  static constexpr size_t kAlign = alignof(Wqe) > alignof(Sge) ? alignof(Wqe) : alignof(Sge);

  WorkQueue() = default;
  // storage: bytes_for() bytes the caller owns (a parent domain's allocator
  // gave them), laid out at once; without it the queue allocates its own
  // buffer at the first post (reserve()).
  WorkQueue(uint32_t max_wr, uint32_t max_sge, uint32_t max_inline = 0, void* storage = nullptr)
      : max_wr_(max_wr), max_sge_(max_sge ? max_sge : 1), max_inline_(max_inline) {
    if (storage) place(storage);
  }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Allocates the ring on first use: 0, or ENOMEM (what a post returns for a
  // full queue too) with the queue still empty and usable later.
  int reserve() noexcept {
    if (wqes_) return 0;
    try {
      own_.reset(new uint8_t[bytes_for(max_wr_, max_sge_, max_inline_)]);
    } catch (const std::bad_alloc&) {
      return ENOMEM;
    }
    place(own_.get());
    return 0;
  }

  // A new depth for a queue that owns its buffer (an SRQ resized with
  // IBV_SRQ_MAX_WR, where the personality allows it): the outstanding entries
  // keep their positions, so head_position() stays meaningful. EINVAL below the
  // entries outstanding or for storage the caller owns; ENOMEM with the queue
  // unchanged.
  int resize(uint32_t max_wr) noexcept {
    if (max_wr == 0 || max_wr < size() || (wqes_ && !own_)) return EINVAL;
    if (!wqes_) {  // no ring yet: reserve() sizes it
      max_wr_ = max_wr;
      sync_slots();
      return 0;
    }
    std::unique_ptr<uint8_t[]> buf;
    try {
      buf.reset(new uint8_t[bytes_for(max_wr, max_sge_, max_inline_)]);
    } catch (const std::bad_alloc&) {
      return ENOMEM;
    }
    WorkQueue bigger(max_wr, max_sge_, max_inline_, buf.get());
    for (uint64_t n = head_; n != tail_; ++n) {
      const uint32_t from = index(n);
      const uint32_t to = bigger.index(n);
      bigger.wqes_[to] = wqes_[from];
      std::copy_n(&sges_[static_cast<size_t>(from) * max_sge_], max_sge_, &bigger.sges_[static_cast<size_t>(to) * max_sge_]);
      if (max_inline_)
        std::copy_n(&inline_[static_cast<size_t>(from) * max_inline_], max_inline_,
                    &bigger.inline_[static_cast<size_t>(to) * max_inline_]);
    }
    max_wr_ = max_wr;
    sync_slots();
    wqes_ = bigger.wqes_;
    sges_ = bigger.sges_;
    inline_ = bigger.inline_;
    own_ = std::move(buf);
    return 0;
  }

  // The bytes a queue of these dimensions keeps in its buffer (aligned to kAlign).
  static size_t bytes_for(uint32_t max_wr, uint32_t max_sge, uint32_t max_inline = 0) {
    const size_t slots = slots_for(max_wr);
    return inline_offset(slots, max_sge ? max_sge : 1) + static_cast<size_t>(max_wr) * max_inline;
  }

  uint32_t capacity() const { return max_wr_; }
  uint32_t max_sge() const { return max_sge_; }
  uint32_t max_inline() const { return max_inline_; }
  uint32_t size() const { return static_cast<uint32_t>(tail_ - head_); }
  bool empty() const { return head_ == tail_; }
  bool full() const { return size() >= max_wr_; }

  // Slot for the next post (after reserve()); valid until push().
  Wqe& next() { return wqes_[tail_slot_]; }
  Sge* next_sges() { return &sges_[static_cast<size_t>(tail_slot_) * max_sge_]; }
  uint8_t* next_inline() { return max_inline_ ? &inline_[static_cast<size_t>(tail_slot_) * max_inline_] : nullptr; }
  void push() {
    ++tail_;
    tail_slot_ = step(tail_slot_);
  }
  // The entry the last push() queued.
  Wqe& back() { return wqes_[tail_slot_ ? tail_slot_ - 1 : slots_for(max_wr_) - 1]; }

  // The i-th outstanding entry from the head (0 = oldest).
  Wqe& at(uint32_t i) { return wqes_[slot_at(i)]; }
  Sge* sges_at(uint32_t i) { return &sges_[static_cast<size_t>(slot_at(i)) * max_sge_]; }
  uint8_t* inline_at(uint32_t i) {
    return max_inline_ ? &inline_[static_cast<size_t>(slot_at(i)) * max_inline_] : nullptr;
  }
  Wqe& front() { return at(0); }
  void pop() {
    ++head_;
    head_slot_ = step(head_slot_);
  }
  // Positions only grow, also across clear(): a position remembered by the
  // engine (the first unacknowledged send WQE) stays meaningful.
  void clear() {
    head_ = tail_;
    head_slot_ = tail_slot_;
  }
  // The position of the head entry since the queue was created.
  uint64_t head_position() const { return head_; }

 private:
  // Lays the entries, their SGEs and their inline room out in storage.
  void place(void* storage) {
    auto* base = static_cast<uint8_t*>(storage);
    const size_t slots = slots_for(max_wr_);
    wqes_ = reinterpret_cast<Wqe*>(base);
    std::uninitialized_value_construct_n(wqes_, slots);
    sges_ = reinterpret_cast<Sge*>(base + sges_offset(slots));
    std::uninitialized_value_construct_n(sges_, slots * max_sge_);
    inline_ = base + inline_offset(slots, max_sge_);
    std::memset(inline_, 0, static_cast<size_t>(max_wr_) * max_inline_);
  }
  static size_t slots_for(uint32_t max_wr) { return max_wr ? max_wr : 1; }
  static size_t round(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  static size_t sges_offset(size_t slots) { return round(slots * sizeof(Wqe)); }
  static size_t inline_offset(size_t slots, uint32_t max_sge) {
    return sges_offset(slots) + round(slots * max_sge * sizeof(Sge));
  }
  uint32_t index(uint64_t n) const { return static_cast<uint32_t>(n % slots_for(max_wr_)); }
  // The slots of the head and tail positions (index(head_), index(tail_)),
  // kept as the positions move: an entry is found with no division. Worked
  // out anew when the depth changes.
  void sync_slots() {
    head_slot_ = index(head_);
    tail_slot_ = index(tail_);
  }
  uint32_t step(uint32_t slot) const { return slot + 1 == slots_for(max_wr_) ? 0 : slot + 1; }
  uint32_t slot_at(uint32_t i) const {
    const uint64_t n = slots_for(max_wr_);
    const uint64_t s = uint64_t{head_slot_} + i;
    return static_cast<uint32_t>(s < n ? s : s - n < n ? s - n : s % n);
  }

  uint32_t max_wr_ = 0;
  uint32_t max_sge_ = 1;
  uint32_t max_inline_ = 0;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
  uint32_t head_slot_ = 0;
  uint32_t tail_slot_ = 0;
  std::unique_ptr<uint8_t[]> own_;  // the buffer, unless the caller gave one
  Wqe* wqes_ = nullptr;
  Sge* sges_ = nullptr;
  uint8_t* inline_ = nullptr;
};

// Posts one receive work request to a receive queue (a QP's or an SRQ's): 0, or
// EINVAL (too many SGEs) / ENOMEM (queue full) with nothing queued.
inline int post_recv_wqe(WorkQueue<RecvWqe>& rq, const ibv_recv_wr& wr) {
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > rq.max_sge()) return EINVAL;
  if (rq.full()) return ENOMEM;
  if (int err = rq.reserve()) return err;
  RecvWqe& wqe = rq.next();
  wqe.wr_id = wr.wr_id;
  wqe.num_sge = static_cast<uint32_t>(wr.num_sge);
  wqe.total_length = 0;
  Sge* sges = rq.next_sges();
  for (int i = 0; i < wr.num_sge; ++i) {
    sges[i] = Sge{wr.sg_list[i].addr, wr.sg_list[i].length, wr.sg_list[i].lkey};
    wqe.total_length += wr.sg_list[i].length;
  }
  rq.push();
  return 0;
}

}  // namespace softverbs::emu

// The device's tables of QPs, memory regions and windows by their 24-bit
// numbers (QPN, key index), read on every packet without a lock.
//
// A table is a radix tree of three levels of 256: the slot of a number never
// moves and is never freed while the device lives (devices live as long as
// the process), so a reader may look at a slot while a writer changes it.
// Writers (creation, destruction) are serialised by the device's mu_; readers
// take no lock. QPNs and key indexes are handed out in sequence, so a few
// leaves hold them all.
//
// A QP's slot also counts the threads using the QP it found there (pins): its
// destruction empties the slot, then waits until no pin is left, so a QP is
// never touched once ibv_destroy_qp has unregistered it (QpPin). Regions and
// windows are kept alive by the device's mr_lock() instead, as before.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace softverbs::emu {

class Qp;

template <class Slot>
class RadixTable {
 public:
  RadixTable() = default;
  ~RadixTable() {
    for (auto& m : root_) {
      Mid* mid = m.load(std::memory_order_relaxed);
      if (!mid) continue;
      for (auto& l : mid->leaves) delete l.load(std::memory_order_relaxed);
      delete mid;
    }
  }
  RadixTable(const RadixTable&) = delete;
  RadixTable& operator=(const RadixTable&) = delete;

  // The slot of a 24-bit number, or nullptr when no number near it was ever
  // stored (its slot would be empty). Any thread, no lock.
  Slot* find(uint32_t n) const noexcept {
    const Mid* mid = root_[(n >> 16) & 0xff].load(std::memory_order_acquire);
    if (!mid) return nullptr;
    Leaf* leaf = mid->leaves[(n >> 8) & 0xff].load(std::memory_order_acquire);
    return leaf ? &leaf->slots[n & 0xff] : nullptr;
  }
  // The slot of n, created if needed. Writers only (serialised by the
  // caller); may throw std::bad_alloc, leaving the table as it was.
  Slot& get(uint32_t n) {
    std::atomic<Mid*>& m = root_[(n >> 16) & 0xff];
    Mid* mid = m.load(std::memory_order_relaxed);
    if (!mid) {
      mid = new Mid;
      m.store(mid, std::memory_order_release);
    }
    std::atomic<Leaf*>& l = mid->leaves[(n >> 8) & 0xff];
    Leaf* leaf = l.load(std::memory_order_relaxed);
    if (!leaf) {
      leaf = new Leaf;
      l.store(leaf, std::memory_order_release);
    }
    return leaf->slots[n & 0xff];
  }

 private:
  struct Leaf {
    Slot slots[256];
  };
  struct Mid {
    std::atomic<Leaf*> leaves[256] = {};
  };
  std::atomic<Mid*> root_[256] = {};
};

// A region's or a window's slot.
template <class T>
struct PtrSlot {
  std::atomic<T*> ptr{nullptr};
};

// A QP's slot: a cache line of its own, as the threads driving different QPs
// pin theirs on every packet.
struct alignas(64) QpSlot {
  std::atomic<Qp*> qp{nullptr};
  std::atomic<uint32_t> pins{0};
};

using QpTable = RadixTable<QpSlot>;

// The QP of a number, kept from destruction while the pin lives (the QP's
// destroy waits for it: Device::unregister_qp). Empty when there is no such QP.
class QpPin {
 public:
  QpPin(const QpTable& table, uint32_t qpn) noexcept : slot_(table.find(qpn & 0xffffff)) {
    if (!slot_) return;
    // Sequentially consistent with unregister_qp's emptying of the slot and
    // reading of the pins: either it sees this pin and waits, or this sees
    // the slot empty.
    slot_->pins.fetch_add(1, std::memory_order_seq_cst);
    qp_ = slot_->qp.load(std::memory_order_seq_cst);
  }
  ~QpPin() {
    if (slot_) slot_->pins.fetch_sub(1, std::memory_order_release);
  }
  QpPin(const QpPin&) = delete;
  QpPin& operator=(const QpPin&) = delete;
  explicit operator bool() const noexcept { return qp_ != nullptr; }
  Qp* operator->() const noexcept { return qp_; }
  Qp* get() const noexcept { return qp_; }
  // Keeps the pin past this object's life (a direct session, emu/qp/direct.cpp):
  // the caller gives it back with unpin.
  QpSlot* keep() noexcept { return std::exchange(slot_, nullptr); }
  static void unpin(QpSlot* slot) noexcept { slot->pins.fetch_sub(1, std::memory_order_release); }

 private:
  QpSlot* slot_;
  Qp* qp_ = nullptr;
};

}  // namespace softverbs::emu

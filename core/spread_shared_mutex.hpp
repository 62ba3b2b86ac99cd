// SpreadSharedMutex: a reader-writer lock whose readers touch only a cache
// line of their own thread's, for state that every packet reads and almost
// nothing writes (a device's memory regions and windows: emu::Device::mr_lock).
//
// std::shared_mutex keeps one reader count: two threads that each stream
// packets of their own QP pair move its cache line between their cores on
// every lock and unlock. Here a reader counts itself in one of kCells cells,
// chosen from its thread (so its unlock finds the same cell), and a writer
// raises a flag and waits until every cell is empty.
//
// Readers may nest (a requester that holds it delivers to a QP of the same
// device, whose responder takes it again), as with glibc's default rwlock,
// which prefers readers. So a writer never makes a reader that already holds
// the lock wait for it: it waits a bounded time for the readers to leave,
// and if they do not (one of them may be waiting to nest), it lowers its flag,
// lets them through and tries again. Writers (registration, deregistration,
// window binding) are rare and short; readers are not starved by them.
//
// Ordering: a reader adds itself, then reads the flag; a writer raises the
// flag, then reads the cells (both sequentially consistent), so either the
// reader sees the flag and backs out, or the writer sees the reader.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace softverbs {

class SpreadSharedMutex {
 public:
  static constexpr size_t kCells = 16;

  SpreadSharedMutex() = default;
  SpreadSharedMutex(const SpreadSharedMutex&) = delete;
  SpreadSharedMutex& operator=(const SpreadSharedMutex&) = delete;

  void lock_shared() noexcept {
    std::atomic<int64_t>& readers = cells_[cell()].readers;
    for (;;) {
      readers.fetch_add(1, std::memory_order_seq_cst);
      if (!writer_.load(std::memory_order_seq_cst)) return;
      readers.fetch_sub(1, std::memory_order_release);
      for (unsigned spins = 0; writer_.load(std::memory_order_acquire); ++spins) relax(spins);
    }
  }
  void unlock_shared() noexcept { cells_[cell()].readers.fetch_sub(1, std::memory_order_release); }

  void lock() {
    writers_.lock();
    for (unsigned round = 0;; ++round) {
      writer_.store(true, std::memory_order_seq_cst);
      for (unsigned spins = 0; spins < kWriterPatience; ++spins) {
        if (no_readers()) return;
        relax(spins);
      }
      // A reader that holds the lock may be waiting to take it again: let it.
      writer_.store(false, std::memory_order_release);
      relax(round + kYieldAfter);
    }
  }
  void unlock() noexcept {
    writer_.store(false, std::memory_order_release);
    writers_.unlock();
  }

 private:
  // How many looks at the cells a writer makes before it gives way, and after
  // how many spins a waiter yields its CPU instead of pausing.
  static constexpr unsigned kWriterPatience = 4096;
  static constexpr unsigned kYieldAfter = 64;

  struct alignas(64) Cell {
    std::atomic<int64_t> readers{0};
  };

  // The calling thread's cell, given out in turn when a thread first takes a
  // lock of this kind, so that threads started together get cells of their
  // own (a hash of the thread pointer put two threads in one cell about once
  // in 16, and glibc reuses thread stacks, so a process kept the collision and
  // its two streaming threads shared one line). Initial-exec TLS: an offset
  // from the thread pointer, not a call, in a shared library.
  static size_t cell() noexcept {
    [[gnu::tls_model("initial-exec")]] static thread_local size_t mine = kCells;  // kCells: none yet
    if (mine == kCells) [[unlikely]]
      mine = next_cell_.fetch_add(1, std::memory_order_relaxed) % kCells;
    return mine;
  }
  static inline std::atomic<size_t> next_cell_{0};
  bool no_readers() const noexcept {
    for (const Cell& c : cells_)
      if (c.readers.load(std::memory_order_seq_cst) != 0) return false;
    return true;
  }
  static void relax(unsigned spins) noexcept {
    if (spins >= kYieldAfter) {
      ::sched_yield();
      return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  Cell cells_[kCells];
  alignas(64) std::atomic<bool> writer_{false};
  std::mutex writers_;  // one writer at a time
};

}  // namespace softverbs

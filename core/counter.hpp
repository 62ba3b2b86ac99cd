// A statistics counter for the hot paths: per-packet and per-completion counts
// of a device (fabric::LinkCounters, emu::Device::Counters).
//
// Threads that drive QP pairs of their own between the same devices count the
// same events; one atomic per counter would make every count a cache-line
// transfer between their cores. Each thread adds to one of kShards
// cache-line-sized cells instead (the cell of its CPU), and a read sums the
// cells. A read is not a snapshot of all counters at one instant
// (neither was a set of relaxed atomics), but every count made before the read
// began is in it, and a counter never goes backwards between two reads of one
// thread unless fetch_sub took a count back.
#pragma once

#include <sched.h>
#include <sys/rseq.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace softverbs {

class ShardedCounter {
 public:
  static constexpr size_t kShards = 8;

  ShardedCounter() = default;
  ShardedCounter(const ShardedCounter&) = delete;
  ShardedCounter& operator=(const ShardedCounter&) = delete;

  // The names and arguments of std::atomic's, so that a counter reads like one;
  // nothing returns the previous value, which would need every cell.
  void fetch_add(uint64_t n, std::memory_order order = std::memory_order_relaxed) noexcept {
    cells_[shard()].v.fetch_add(n, order);
  }
  void fetch_sub(uint64_t n, std::memory_order order = std::memory_order_relaxed) noexcept {
    cells_[shard()].v.fetch_sub(n, order);
  }
  // Several counts in a row (a packet's packets and bytes): the cell is chosen
  // once, by here(), and each add goes to it.
  static size_t here() noexcept { return shard(); }
  void add_at(size_t cell, uint64_t n) noexcept { cells_[cell].v.fetch_add(n, std::memory_order_relaxed); }
  // The sum of the cells (unsigned arithmetic: a count taken back in another
  // cell than it was made in still sums right).
  uint64_t load(std::memory_order order = std::memory_order_relaxed) const noexcept {
    uint64_t sum = 0;
    for (const Cell& c : cells_) sum += c.v.load(order);
    return sum;
  }
  operator uint64_t() const noexcept { return load(); }

 private:
  struct alignas(64) Cell {
    std::atomic<uint64_t> v{0};
  };
  // The cell of the CPU this thread runs on, read from the thread's rseq
  // area, which glibc registers for every thread and the kernel keeps up to
  // date (its first field, cpu_id_start, is always a CPU number): one load at
  // an offset from the thread pointer, with no call (sched_getcpu reads the
  // same field, but through the PLT). Without a registered area,
  // sched_getcpu. Threads on different CPUs never share a cell; a thread
  // that moves meanwhile only counts in another cell, atomically.
  static size_t shard() noexcept {
    if (__rseq_size > 0) {
      const auto* area = static_cast<const char*>(__builtin_thread_pointer()) + __rseq_offset;
      return *reinterpret_cast<const volatile uint32_t*>(area) % kShards;
    }
    const int cpu = ::sched_getcpu();
    return cpu > 0 ? static_cast<size_t>(cpu) % kShards : 0;
  }
  Cell cells_[kShards];
};

}  // namespace softverbs

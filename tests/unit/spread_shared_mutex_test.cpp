// SpreadSharedMutex (core/spread_shared_mutex.hpp), the device's region lock:
// writers exclude readers and each other while readers on several threads
// stream through it, a reader may take it again while a writer waits (as a
// requester delivering to a QP of its own device does), and a writer gets
// through a steady stream of readers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "core/spread_shared_mutex.hpp"

namespace softverbs {
namespace {

using namespace std::chrono_literals;

// Two words a writer changes together: a reader that ever sees them differ
// ran beside a writer.
struct Guarded {
  uint64_t a = 0;
  uint64_t b = 0;
};

TEST(SpreadSharedMutex, WritersExcludeReadersAndEachOther) {
  SpreadSharedMutex mu;
  Guarded g;
  std::atomic<bool> torn{false};
  std::atomic<uint64_t> reads{0};
  constexpr int kWrites = 2000;
  std::vector<std::thread> threads;
  std::atomic<int> writers_done{0};
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&] {
      while (reads.load() < 3) std::this_thread::yield();  // the readers are under way
      for (int i = 0; i < kWrites; ++i) {
        std::unique_lock lock(mu);
        ++g.a;
        std::atomic_signal_fence(std::memory_order_seq_cst);
        ++g.b;
      }
      writers_done.fetch_add(1);
    });
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&] {
      while (writers_done.load() < 2) {
        std::shared_lock lock(mu);
        if (g.a != g.b) torn = true;
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_FALSE(torn.load());
  EXPECT_EQ(g.a, 2u * kWrites);
  EXPECT_EQ(g.b, 2u * kWrites);
  EXPECT_GT(reads.load(), 0u);
}

// A reader that holds the lock takes it again while a writer waits for it:
// neither waits for the other forever.
TEST(SpreadSharedMutex, AReaderNestsWhileAWriterWaits) {
  SpreadSharedMutex mu;
  std::shared_lock outer(mu);
  std::atomic<bool> writer_started{false};
  auto writer = std::async(std::launch::async, [&] {
    writer_started = true;
    std::unique_lock lock(mu);
    return true;
  });
  while (!writer_started.load()) std::this_thread::yield();
  for (int i = 0; i < 100; ++i) std::this_thread::yield();  // likely: its flag is up
  // Whether or not the writer has raised its flag yet, the nested reader gets in.
  { std::shared_lock inner(mu); }
  EXPECT_EQ(writer.wait_for(0s), std::future_status::timeout) << "the writer got in beside a reader";
  outer.unlock();
  ASSERT_EQ(writer.wait_for(30s), std::future_status::ready) << "the writer never got the lock";
  EXPECT_TRUE(writer.get());
}

// Readers that keep coming (two threads, each always holding or about to)
// do not keep a writer out.
TEST(SpreadSharedMutex, AWriterGetsThroughAStreamOfReaders) {
  SpreadSharedMutex mu;
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r)
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        std::shared_lock lock(mu);
      }
    });
  auto writer = std::async(std::launch::async, [&] {
    for (int i = 0; i < 100; ++i) std::unique_lock lock(mu);
    return true;
  });
  const auto status = writer.wait_for(30s);
  stop = true;
  for (auto& t : readers) t.join();
  ASSERT_EQ(status, std::future_status::ready) << "a writer was kept out by readers";
}

}  // namespace
}  // namespace softverbs

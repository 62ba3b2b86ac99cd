// The device's lock-free lookups (emu/device/object_table.hpp) and its sharded
// counters (core/counter.hpp): numbers far apart, a destroyed QP that a pin
// keeps alive until the pin is dropped, regions and windows sharing the key
// index space, and counts from several threads summed when read.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/counter.hpp"
#include "emu/device/object_table.hpp"
#include "emu/objects/objects.hpp"
#include "tests/unit/qp_harness.hpp"

namespace softverbs::emu {
namespace {

TEST(RadixTable, SlotsOfNumbersFarApart) {
  RadixTable<PtrSlot<int>> t;
  EXPECT_EQ(t.find(0), nullptr);
  EXPECT_EQ(t.find(0xffffff), nullptr);
  int a = 1, b = 2, c = 3;
  t.get(0).ptr.store(&a);
  t.get(0xffffff).ptr.store(&b);
  t.get(0x10100).ptr.store(&c);
  ASSERT_NE(t.find(0), nullptr);
  EXPECT_EQ(t.find(0)->ptr.load(), &a);
  EXPECT_EQ(t.find(0xffffff)->ptr.load(), &b);
  EXPECT_EQ(t.find(0x10100)->ptr.load(), &c);
  // A neighbour in the same leaf has an empty slot; one in no leaf has none.
  ASSERT_NE(t.find(1), nullptr);
  EXPECT_EQ(t.find(1)->ptr.load(), nullptr);
  EXPECT_EQ(t.find(0x20000), nullptr);
  EXPECT_EQ(&t.get(0x10100), t.find(0x10100)) << "a slot never moves";
}

TEST(QpSlot, OneCacheLineEach) {
  EXPECT_EQ(alignof(QpSlot), 64u);
  EXPECT_EQ(sizeof(QpSlot), 64u);
}

TEST(ShardedCounter, SumsTheCountsOfEveryThread) {
  ShardedCounter c;
  constexpr int kThreads = 4, kEach = 100000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&] {
      for (int k = 0; k < kEach; ++k) c.fetch_add(2, std::memory_order_relaxed);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.load(), uint64_t{2} * kThreads * kEach);
  // A count taken back on another thread (another cell, maybe) still sums right.
  std::thread([&] { c.fetch_sub(1); }).join();
  EXPECT_EQ(c.load(), uint64_t{2} * kThreads * kEach - 1);
  EXPECT_EQ(static_cast<uint64_t>(c), c.load());
}

class DeviceTables : public ::testing::Test, public harness::TwoDevices {};

// The QP pointers below are never dereferenced by the tables: stand-ins.
Qp* fake_qp(uintptr_t n) { return reinterpret_cast<Qp*>(n * 64); }

TEST_F(DeviceTables, QpNumbersFoundWithoutLock) {
  Device& d = dev(0);
  const uint32_t a = d.register_qp(fake_qp(1));
  const uint32_t b = d.register_qp(fake_qp(2));
  EXPECT_NE(a, b);
  EXPECT_EQ(d.find_qp(a), fake_qp(1));
  EXPECT_EQ(d.find_qp(b), fake_qp(2));
  EXPECT_EQ(d.find_qp(b + 1000), nullptr);
  EXPECT_EQ(dev(1).find_qp(a), nullptr) << "QP numbers are per device";
  {
    const QpPin pin = d.pin_qp(a);
    ASSERT_TRUE(pin);
    EXPECT_EQ(pin.get(), fake_qp(1));
  }
  d.unregister_qp(a);
  EXPECT_EQ(d.find_qp(a), nullptr);
  EXPECT_FALSE(d.pin_qp(a));
  EXPECT_EQ(d.find_qp(b), fake_qp(2));
  d.unregister_qp(b);
}

TEST_F(DeviceTables, DestroyWaitsForThePinsOfTheQp) {
  Device& d = dev(0);
  const uint32_t qpn = d.register_qp(fake_qp(3));
  std::atomic<bool> returned{false};
  std::thread destroyer;
  {
    const QpPin pin = d.pin_qp(qpn);
    ASSERT_TRUE(pin);
    destroyer = std::thread([&] {
      d.unregister_qp(qpn);
      returned.store(true);
    });
    // Once the QP has left the table, new lookups miss it; the destroyer is
    // still waiting for this pin, whatever the timing.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (d.find_qp(qpn) && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    EXPECT_EQ(d.find_qp(qpn), nullptr);
    EXPECT_FALSE(d.pin_qp(qpn));
    EXPECT_FALSE(returned.load()) << "unregister_qp returned while the QP was pinned";
    EXPECT_EQ(pin.get(), fake_qp(3)) << "a pin keeps the QP it found";
  }
  destroyer.join();
  EXPECT_TRUE(returned.load());
}

}  // namespace
}  // namespace softverbs::emu

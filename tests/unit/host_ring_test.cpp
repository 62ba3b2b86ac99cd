// HostRing (fabric/host_ring.hpp), the shared-memory packet ring of the
// same-host path: records of every size wrap around the end in order, a full
// ring refuses until the consumer takes, records read in place keep their
// room until released, the consumer's published features, the wake-up
// handshake and the lease that holds it back, and a consumer that survives
// whatever a hostile producer writes into the shared mapping or passes as the
// ring's file.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "fabric/host_ring.hpp"

namespace softverbs::fabric {
namespace {

using Bytes = std::vector<uint8_t>;
constexpr size_t kSmall = 4096;  // a small ring, so the tests wrap often

struct Pair {
  explicit Pair(size_t data = kSmall) {
    producer = HostRing::create(&fd, data);
    EXPECT_TRUE(producer);
    std::string why;
    consumer = HostRing::attach(fd, &why, data);
    EXPECT_TRUE(consumer) << why;
  }
  ~Pair() {
    if (fd >= 0) ::close(fd);
  }
  int fd = -1;
  std::unique_ptr<HostRing> producer, consumer;
};

Bytes record(uint32_t n, size_t size) {
  Bytes b(size);
  for (size_t i = 0; i < size; ++i) b[i] = static_cast<uint8_t>(n * 31 + i);
  return b;
}

TEST(HostRing, RecordsOfEverySizeWrapAroundInOrder) {
  Pair p;
  std::mt19937 rng(7);
  uint32_t written = 0, read = 0;
  Bytes out;
  // Many times the ring's size, the producer a few records ahead.
  while (read < 5000) {
    while (written - read < 5) {
      const size_t size = rng() % 700;
      const Bytes r = record(written, size);
      // Split across the two spans as the link does (prefix, packet).
      const size_t cut = size / 3;
      if (!p.producer->put(std::span(r).first(cut), std::span(r).subspan(cut))) break;
      ++written;
    }
    ASSERT_EQ(p.consumer->take(out), 1);
    // The record's bytes tell which one it is and how it was built.
    ASSERT_EQ(out, record(read, out.size()));
    ++read;
  }
  while (p.consumer->take(out) == 1) ++read;
  EXPECT_EQ(read, written);
  EXPECT_FALSE(p.consumer->pending());
}

TEST(HostRing, AFullRingRefusesUntilTheConsumerTakes) {
  Pair p;
  const Bytes r = record(1, 1000);
  int put = 0;
  while (p.producer->put(r, {})) ++put;
  EXPECT_EQ(put, 4);  // 4 × (8 + 1000) bytes fit in 4096, a fifth does not
  EXPECT_FALSE(p.producer->put(r, {}));
  Bytes out;
  ASSERT_EQ(p.consumer->take(out), 1);
  EXPECT_EQ(out, r);
  EXPECT_TRUE(p.producer->put(r, {}));
  // Larger than any record may be: never accepted.
  EXPECT_FALSE(p.producer->put(Bytes(HostRing::kMaxRecord + 1), {}));
}

// Records read in place (next) keep their room while the ring is held, even
// when later records are taken (copied) meanwhile; the last unhold gives it all
// back. Without a hold, release() gives back what was read.
TEST(HostRing, RecordsReadInPlaceKeepTheirRoomUntilReleased) {
  Pair p;
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(p.producer->put(record(i, 1000), {}));
  ASSERT_FALSE(p.producer->put(record(9, 1000), {}));  // full
  p.consumer->hold();
  std::span<const uint8_t> first, second;
  ASSERT_EQ(p.consumer->next(&first), 1);
  ASSERT_EQ(p.consumer->next(&second), 1);
  Bytes out;
  ASSERT_EQ(p.consumer->take(out), 1);  // a copy of the third, while the first two are in use
  EXPECT_EQ(out, record(2, 1000));
  p.consumer->release();
  EXPECT_FALSE(p.producer->put(record(9, 1000), {}));  // held: no room came back
  EXPECT_TRUE(std::equal(first.begin(), first.end(), record(0, 1000).begin()));
  EXPECT_TRUE(std::equal(second.begin(), second.end(), record(1, 1000).begin()));
  EXPECT_EQ(first.size(), 1000u);
  p.consumer->unhold();
  for (uint32_t i = 4; i < 7; ++i) EXPECT_TRUE(p.producer->put(record(i, 1000), {})) << i;  // three records' room
  EXPECT_FALSE(p.producer->put(record(9, 1000), {}));
  std::span<const uint8_t> rec;
  ASSERT_EQ(p.consumer->next(&rec), 1);  // the fourth, then the three new ones (wrapping)
  EXPECT_TRUE(std::equal(rec.begin(), rec.end(), record(3, 1000).begin()));
  p.consumer->release();
  for (uint32_t i = 4; i < 7; ++i) {
    ASSERT_EQ(p.consumer->next(&rec), 1);
    EXPECT_TRUE(std::equal(rec.begin(), rec.end(), record(i, 1000).begin())) << i;
  }
  EXPECT_EQ(p.consumer->next(&rec), 0);
  EXPECT_FALSE(p.consumer->pending());
  p.consumer->release();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(p.producer->put(record(i, 1000), {})) << i;
}

// What the consumer's owner takes is published at attach for the producer.
TEST(HostRing, FeaturesArePublishedAtAttach) {
  int fd = -1;
  auto producer = HostRing::create(&fd, kSmall);
  ASSERT_TRUE(producer);
  EXPECT_FALSE(producer->attached());
  EXPECT_EQ(producer->features(), 0u);
  std::string why;
  auto consumer = HostRing::attach(fd, &why, kSmall, 5);
  ASSERT_TRUE(consumer) << why;
  EXPECT_TRUE(producer->attached());
  EXPECT_EQ(producer->features(), 5u);
  ::close(fd);
  Pair plain;  // a consumer that takes nothing extra
  EXPECT_TRUE(plain.producer->attached());
  EXPECT_EQ(plain.producer->features(), 0u);
}

TEST(HostRing, OneWakeUpPerSleep) {
  Pair p;
  EXPECT_FALSE(p.consumer->arm());  // empty: it may sleep
  const Bytes r = record(2, 10);
  ASSERT_TRUE(p.producer->put(r, {}));
  EXPECT_TRUE(p.producer->take_wake());   // the one wake-up
  ASSERT_TRUE(p.producer->put(r, {}));
  EXPECT_FALSE(p.producer->take_wake());  // already woken
  EXPECT_TRUE(p.consumer->arm());         // records wait: do not sleep
  p.consumer->disarm();
  ASSERT_TRUE(p.producer->put(r, {}));
  EXPECT_FALSE(p.producer->take_wake());  // a polling consumer needs none
  EXPECT_FALSE(p.producer->closed());
  p.consumer->close();
  EXPECT_TRUE(p.producer->closed());
}

// A consumer whose application polls lends its producer a lease: no wake-up
// until it runs out or ends, and need_wake stays for the put after it.
TEST(HostRing, ALeaseHoldsTheWakeUpBack) {
  Pair p;
  EXPECT_FALSE(p.consumer->arm());
  EXPECT_TRUE(p.consumer->armed());
  p.consumer->lease(1000);
  const Bytes r = record(3, 10);
  ASSERT_TRUE(p.producer->put(r, {}));
  EXPECT_FALSE(p.producer->take_wake(999));  // leased beyond now
  EXPECT_TRUE(p.consumer->armed());           // still asked for, for later
  EXPECT_TRUE(p.consumer->end_lease(true));       // and the record is there
  EXPECT_TRUE(p.producer->take_wake(999));    // no lease: the wake-up
  EXPECT_FALSE(p.consumer->armed());
  Bytes out;
  ASSERT_EQ(p.consumer->take(out), 1);
  EXPECT_FALSE(p.consumer->end_lease(true));  // nothing waits
  // A lease that has run out holds nothing back.
  EXPECT_FALSE(p.consumer->arm());
  p.consumer->lease(1000);
  ASSERT_TRUE(p.producer->put(r, {}));
  EXPECT_TRUE(p.producer->take_wake(1000));
}

// The answer lease outlives the lease when the consumer goes off to work:
// answers (ACKs, READ and atomic responses) still come without a wake-up,
// anything else wakes it; ending both lets answers wake it too.
TEST(HostRing, TheAnswerLeaseHoldsOnlyAnswersBack) {
  Pair p;
  EXPECT_FALSE(p.consumer->arm());
  p.consumer->lease(1000);
  EXPECT_FALSE(p.consumer->end_lease(false));  // off to work; nothing came
  const Bytes r = record(3, 10);
  ASSERT_TRUE(p.producer->put(r, {}));
  EXPECT_FALSE(p.producer->take_wake(999, true));  // an answer: held back
  EXPECT_TRUE(p.consumer->armed());
  EXPECT_TRUE(p.producer->take_wake(999, false));  // a request: the wake-up
  EXPECT_FALSE(p.consumer->armed());
  EXPECT_TRUE(p.consumer->arm());  // the record waits: no sleep
  p.consumer->lease(1000);
  EXPECT_TRUE(p.consumer->end_lease(false));  // and is there
  EXPECT_FALSE(p.producer->take_wake(999, true));
  EXPECT_TRUE(p.consumer->end_lease(true));  // may block: every lease ends
  EXPECT_TRUE(p.producer->take_wake(999, true));
  Bytes out;
  ASSERT_EQ(p.consumer->take(out), 1);
  // A passed answer lease holds nothing back.
  EXPECT_FALSE(p.consumer->arm());
  p.consumer->lease(1000);
  EXPECT_FALSE(p.consumer->end_lease(false));
  ASSERT_TRUE(p.producer->put(r, {}));
  EXPECT_TRUE(p.producer->take_wake(1000, true));
}

TEST(HostRing, AttachRefusesAFileThatIsNotASealedRing) {
  std::string why;
  const int plain = ::memfd_create("plain", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(::ftruncate(plain, HostRing::kHeaderBytes + kSmall), 0);
  EXPECT_FALSE(HostRing::attach(plain, &why, kSmall));  // unsealed: it could shrink under us
  EXPECT_NE(why.find("sealed"), std::string::npos) << why;
  ::close(plain);
  Pair p;
  EXPECT_FALSE(HostRing::attach(p.fd, &why, kSmall * 2));  // not the expected size
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  EXPECT_FALSE(HostRing::attach(fds[0], &why, kSmall));  // not a file at all
  ::close(fds[0]);
  ::close(fds[1]);
}

// Whatever the producer writes into the mapping, the consumer reports a
// garbled ring or takes records within bounds, copied or in place; it never
// reads outside.
TEST(HostRing, HostileContentsNeverCrashTheConsumer) {
  std::mt19937_64 rng(42);
  Bytes out;
  for (int round = 0; round < 3000; ++round) {
    Pair p;
    std::span<uint8_t> raw = p.consumer->raw();
    // Some valid records first, so the garbage lands among real ones.
    for (int i = 0; i < static_cast<int>(rng() % 8); ++i) (void)p.producer->put(record(i, rng() % 900), {});
    auto poke64 = [&](size_t at, uint64_t v) { std::memcpy(raw.data() + at, &v, sizeof v); };
    auto poke32 = [&](size_t at, uint32_t v) { std::memcpy(raw.data() + at, &v, sizeof v); };
    switch (round % 6) {
      case 0: poke64(64, rng()); break;                             // any head
      case 1: poke64(64, rng() % (2 * kSmall)); break;              // a head near the ring
      case 2: poke32(HostRing::kHeaderBytes, static_cast<uint32_t>(rng())); break;  // the first length
      case 3: poke32(HostRing::kHeaderBytes, HostRing::kWrap); break;               // a wrap at 0
      case 4:                                                       // random bytes anywhere in the data
        for (int i = 0; i < 16; ++i) raw[HostRing::kHeaderBytes + rng() % kSmall] = static_cast<uint8_t>(rng());
        poke64(64, rng() % (3 * kSmall));
        break;
      default:  // lengths claiming more than the head allows
        poke64(64, 16);
        poke32(HostRing::kHeaderBytes, 4000);
        break;
    }
    int r = 0;
    if (round % 2) {
      for (int i = 0; i < 100 && (r = p.consumer->take(out)) == 1; ++i) ASSERT_LE(out.size(), HostRing::kMaxRecord);
    } else {
      // In place: every span lies within the ring's data, and reading it is safe.
      const uint8_t* begin = raw.data() + HostRing::kHeaderBytes;
      const uint8_t* end = raw.data() + raw.size();
      std::span<const uint8_t> rec;
      uint64_t sum = 0;
      for (int i = 0; i < 100 && (r = p.consumer->next(&rec)) == 1; ++i) {
        ASSERT_LE(rec.size(), HostRing::kMaxRecord);
        ASSERT_TRUE(rec.data() >= begin && rec.data() + rec.size() <= end);
        for (uint8_t b : rec) sum += b;
      }
      p.consumer->release();
      (void)sum;
    }
    EXPECT_GE(r, -1);
  }
}

}  // namespace
}  // namespace softverbs::fabric

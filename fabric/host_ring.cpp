// HostRing: the shared-memory packet ring of the same-host path (see the
// header for the layout and the trust rules).
#include "fabric/host_ring.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

namespace softverbs::fabric {
namespace {

constexpr uint64_t kMagic = 0x31474e4952565300ull;  // "\0SVRING1"
// Header offsets: each counter on a cache line of its own.
constexpr size_t kMagicAt = 0;
constexpr size_t kHeadAt = 64;
constexpr size_t kTailAt = 128;
constexpr size_t kWakeAt = 192;
constexpr size_t kClosedAt = 256;
constexpr size_t kAttachedAt = 320;
// On need_wake's line: a producer that finds need_wake set reads them all.
constexpr size_t kLeaseAt = kWakeAt + 8;
constexpr size_t kAnswerLeaseAt = kWakeAt + 16;
constexpr size_t kRecordHeader = 8;

constexpr size_t round8(size_t n) { return (n + 7) & ~size_t{7}; }

std::atomic_ref<uint64_t> at(uint8_t* base, size_t off) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + off));
}

}  // namespace

std::unique_ptr<HostRing> HostRing::create(int* fd, size_t data_bytes) {
  const int f = ::memfd_create("softverbs-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (f < 0) return nullptr;
  const size_t total = kHeaderBytes + data_bytes;
  void* p = MAP_FAILED;
  if (::ftruncate(f, static_cast<off_t>(total)) == 0 &&
      ::fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
    p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(f);
    errno = err;
    return nullptr;
  }
  std::unique_ptr<HostRing> ring(new HostRing(static_cast<uint8_t*>(p), data_bytes));
  ring->word(kMagicAt) = kMagic;
  // A consumer starts asleep: the first packet wakes it.
  at(ring->base_, kWakeAt).store(1, std::memory_order_release);
  *fd = f;
  return ring;
}

std::unique_ptr<HostRing> HostRing::attach(int fd, std::string* why, size_t data_bytes, uint32_t features) {
  const size_t total = kHeaderBytes + data_bytes;
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (::fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != total) {
    if (why) *why = "not a ring file of the expected size";
    return nullptr;
  }
  // Without the seal the peer could shrink the file under the mapping, and a
  // read past its end would kill this process (SIGBUS).
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    if (why) *why = "ring file not sealed against shrinking";
    return nullptr;
  }
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    if (why) *why = std::string("mmap: ") + std::strerror(errno);
    return nullptr;
  }
  std::unique_ptr<HostRing> ring(new HostRing(static_cast<uint8_t*>(p), data_bytes));
  if (std::memcmp(ring->base_ + kMagicAt, &kMagic, sizeof kMagic) != 0) {
    if (why) *why = "bad ring magic";
    return nullptr;
  }
  // Start where the producer is now: it has written nothing yet unless it is
  // hostile, and then whatever it wrote is checked like everything else.
  ring->tail_ = ring->read_ = at(ring->base_, kTailAt).load(std::memory_order_acquire);
  at(ring->base_, kAttachedAt).store(1 | (uint64_t{features} << 1), std::memory_order_release);
  return ring;
}

HostRing::~HostRing() { ::munmap(base_, kHeaderBytes + size_); }

bool HostRing::put(std::span<const std::span<const uint8_t>> parts) {
  size_t len = 0;
  for (const auto& p : parts) {
    if (p.size() > kMaxRecord - len) return false;
    len += p.size();
  }
  const size_t need = kRecordHeader + round8(len);
  const uint64_t tail = at(base_, kTailAt).load(std::memory_order_acquire);
  if (tail > head_ || head_ - tail > size_) return false;  // a consumer that wrote nonsense: treated as full
  const size_t free_bytes = size_ - static_cast<size_t>(head_ - tail);
  const size_t pos = static_cast<size_t>(head_ % size_);
  const size_t to_end = size_ - pos;
  const size_t skip = to_end < need ? to_end : 0;
  if (free_bytes < skip + need) return false;
  uint8_t* data = base_ + kHeaderBytes;
  if (skip) {
    const uint32_t wrap = kWrap;
    std::memcpy(data + pos, &wrap, sizeof wrap);
  }
  uint8_t* rec = data + (pos + skip) % size_;
  const uint32_t n = static_cast<uint32_t>(len);
  std::memcpy(rec, &n, sizeof n);
  std::memset(rec + 4, 0, 4);
  uint8_t* to = rec + kRecordHeader;
  for (const auto& p : parts) {
    if (!p.empty()) std::memcpy(to, p.data(), p.size());  // memcpy(null, ..., 0) is UB
    to += p.size();
  }
  head_ += skip + need;
  // seq_cst: the store of the head and the load of need_wake (take_wake) must
  // not be reordered, or a consumer arming meanwhile would sleep on a record.
  at(base_, kHeadAt).store(head_, std::memory_order_seq_cst);
  return true;
}

bool HostRing::take_wake() {
  auto wake = at(base_, kWakeAt);
  return wake.load(std::memory_order_seq_cst) != 0 && wake.exchange(0, std::memory_order_seq_cst) != 0;
}

bool HostRing::closed() const { return at(base_, kClosedAt).load(std::memory_order_acquire) != 0; }

bool HostRing::attached() const { return at(base_, kAttachedAt).load(std::memory_order_acquire) != 0; }

bool HostRing::take_wake(uint64_t now_ns, bool answer) {
  auto wake = at(base_, kWakeAt);
  if (wake.load(std::memory_order_seq_cst) == 0) return false;
  // seq_cst against end_lease(): either this sees the lease gone, or the
  // consumer ending it sees the record put before.
  if (at(base_, kLeaseAt).load(std::memory_order_seq_cst) > now_ns) return false;
  if (answer && at(base_, kAnswerLeaseAt).load(std::memory_order_seq_cst) > now_ns) return false;
  return wake.exchange(0, std::memory_order_seq_cst) != 0;
}

uint32_t HostRing::features() const {
  const uint64_t v = at(base_, kAttachedAt).load(std::memory_order_acquire);
  return (v & 1) ? static_cast<uint32_t>(v >> 1) : 0;
}

bool HostRing::pending() const { return at(base_, kHeadAt).load(std::memory_order_acquire) != read_; }

int HostRing::next(std::span<const uint8_t>* rec) {
  for (;;) {
    const uint64_t head = at(base_, kHeadAt).load(std::memory_order_acquire);
    if (head == read_) return 0;
    const uint64_t avail = head - read_;
    if (head < read_ || avail > size_ || avail % 8 != 0 || avail < kRecordHeader) return -1;
    const size_t pos = static_cast<size_t>(read_ % size_);
    const uint8_t* data = base_ + kHeaderBytes;
    uint32_t len = 0;
    std::memcpy(&len, data + pos, sizeof len);  // read once: the peer may change it
    if (len == kWrap) {
      if (pos == 0 || size_ - pos > avail) return -1;
      read_ += size_ - pos;
      continue;
    }
    const size_t need = kRecordHeader + round8(len);
    if (len > kMaxRecord || need > size_ - pos || need > avail) return -1;
    *rec = std::span<const uint8_t>(data + pos + kRecordHeader, len);
    read_ += need;
    return 1;
  }
}

void HostRing::release() {
  if (holds_ > 0 || tail_ == read_) return;
  tail_ = read_;
  at(base_, kTailAt).store(tail_, std::memory_order_release);
}

void HostRing::unhold() {
  if (holds_ > 0 && --holds_ == 0) release();
}

int HostRing::take(std::vector<uint8_t>& out) {
  std::span<const uint8_t> rec;
  const int r = next(&rec);
  if (r == 1) out.assign(rec.begin(), rec.end());
  release();  // a wrap mark read before an empty ring is given back too
  return r;
}

bool HostRing::arm() {
  at(base_, kWakeAt).store(1, std::memory_order_seq_cst);
  return at(base_, kHeadAt).load(std::memory_order_seq_cst) != read_;
}

void HostRing::disarm() {
  auto wake = at(base_, kWakeAt);
  if (wake.load(std::memory_order_relaxed) != 0) wake.store(0, std::memory_order_relaxed);
}

bool HostRing::armed() const { return at(base_, kWakeAt).load(std::memory_order_seq_cst) != 0; }

void HostRing::lease(uint64_t until_ns) {
  at(base_, kAnswerLeaseAt).store(until_ns, std::memory_order_seq_cst);
  at(base_, kLeaseAt).store(until_ns, std::memory_order_seq_cst);
}

bool HostRing::end_lease(bool answers_too) {
  at(base_, kLeaseAt).store(0, std::memory_order_seq_cst);
  if (answers_too) at(base_, kAnswerLeaseAt).store(0, std::memory_order_seq_cst);
  return at(base_, kHeadAt).load(std::memory_order_seq_cst) != read_;
}

void HostRing::close() { at(base_, kClosedAt).store(1, std::memory_order_release); }

}  // namespace softverbs::fabric

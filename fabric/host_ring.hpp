// HostRing: a single-producer, single-consumer ring of packets in a shared
// memory file (memfd), one per direction between two processes of one host.
// The same-host path (fabric/host_link.hpp) writes packets here instead of
// making one system call per packet; the connection it came over carries the
// ring's file (SCM_RIGHTS), the wake-ups and the end of the peer.
//
// Layout: a 4 KiB header, then kDataBytes of records. The header holds three
// counters on cache lines of their own: `head` (bytes the producer has
// written, monotonic), `tail` (bytes the consumer has taken, monotonic) and
// `need_wake` (set by a consumer about to sleep: the producer that takes it
// down sends one wake-up), plus `closed` (the consumer is gone), `attached`
// (the consumer has mapped it: bit 0, and above it the features its owner
// takes, which the producer may use; consumers before features wrote 1) and
// `lease` and `answer_lease` (on need_wake's line: until when, in ns of the
// host's CLOCK_MONOTONIC, the consumer's application polls the ring itself: a
// producer then leaves need_wake for later instead of waking it, for any
// packet under `lease`, for answers to the consumer's own requests (ACKs,
// RDMA READ and atomic responses) under `answer_lease`; 0: none; a consumer
// that writes nonsense there only delays its own wake-ups). A
// record is a 32-bit length, 4 reserved bytes, then that many bytes, padded to 8; a
// record that does not fit before the end is preceded by a wrap mark (length
// kWrap) and starts at offset 0. A record never exceeds kMaxRecord.
//
// The peer is another process, so nothing read from the mapping is trusted:
// the consumer keeps its own tail, checks the head against it and every length
// against the ring's bounds and kMaxRecord, reads each length once, and
// reports a ring that breaks these rules as garbled (its owner then drops it).
// A record's bytes may be read in place (next()): its span is the consumer's
// own, fixed when the length was read, so whatever the producer writes there
// meanwhile changes what the bytes say, never where they are. Whoever reads
// them in place reads each field it acts on once into its own memory (the
// packet parser does: wire/packet.hpp) and treats the rest as data. The file
// is sealed against shrinking before it is shared, and the consumer refuses
// one that is not, so the mapping cannot fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace softverbs::fabric {

class HostRing {
 public:
  static constexpr size_t kHeaderBytes = 4096;
  static constexpr size_t kDataBytes = size_t{4} << 20;
  static constexpr size_t kMaxRecord = 8 + 65536;  // the 8-byte source prefix and a UDP payload
  static constexpr uint32_t kWrap = 0xffffffffu;

  // A new ring in a sealed memfd; *fd gets the file to pass to the consumer
  // (close-on-exec; the caller closes it). Null (and errno) on failure.
  static std::unique_ptr<HostRing> create(int* fd, size_t data_bytes = kDataBytes);
  // Maps a ring received from a peer; takes no ownership of fd. Null and
  // *why set when the file is not a sealed file of the expected size.
  // `features` is what the consumer's owner takes (its meaning is the
  // owner's: fabric/host_link.cpp), published for the producer.
  static std::unique_ptr<HostRing> attach(int fd, std::string* why, size_t data_bytes = kDataBytes,
                                          uint32_t features = 0);
  ~HostRing();
  HostRing(const HostRing&) = delete;
  HostRing& operator=(const HostRing&) = delete;

  // Producer. Appends one record made of `parts` in order, each copied once
  // from where it lies (a packet's payload straight from the sender's memory:
  // fabric::Link::send_gathered); false when the ring has no room for it now
  // (or the consumer's tail is nonsense: then never).
  bool put(std::span<const std::span<const uint8_t>> parts);
  // The same, for a record made of `a` then `b`.
  bool put(std::span<const uint8_t> a, std::span<const uint8_t> b) {
    const std::span<const uint8_t> parts[2] = {a, b};
    return put(parts);
  }
  // After put: true once per consumer sleep, when the producer must wake it.
  bool take_wake();
  // The same, but false while the consumer's lease lasts beyond now_ns (it
  // polls the ring itself), or, for an `answer` (an ACK, an RDMA READ or
  // atomic response), its answer lease: need_wake then stays for a later put.
  bool take_wake(uint64_t now_ns, bool answer = false);
  // The consumer said it is gone.
  bool closed() const;
  // The consumer has mapped the ring (attach() says so in the header).
  bool attached() const;
  // The features the consumer published at attach() (0 before; an advertisement
  // only: a consumer that lies about them harms nobody but itself).
  uint32_t features() const;

  // Consumer. 1: one record copied into `out` (and released, unless held);
  // 0: empty; -1: garbled.
  int take(std::vector<uint8_t>& out);
  // The next record in place: 1 and *rec its bytes in the mapping, valid until
  // it is released; 0: empty; -1: garbled. The producer may not reuse its room
  // until release().
  int next(std::span<const uint8_t>* rec);
  // Gives the producer back the room of every record read so far, unless held.
  void release();
  // While held (counted), release() gives nothing back, so the records that
  // were read in place stay where they are even if more are taken meanwhile;
  // the last unhold() releases them all.
  void hold() { ++holds_; }
  void unhold();
  // Whether a record waits (no system call; a garbled head counts as one, so
  // that take() reports it).
  bool pending() const;
  // About to sleep: asks the producer for a wake-up. True if records arrived
  // meanwhile (the caller takes them instead of sleeping).
  bool arm();
  // The producer need not wake this consumer (it is polling).
  void disarm();
  // Whether a wake-up is asked for (armed and not yet taken down).
  bool armed() const;
  // The consumer's application polls the ring until until_ns (a promise its
  // owner keeps with a timer: fabric/host_lease.cpp): both leases.
  void lease(uint64_t until_ns);
  // Ends the lease, and the answer lease too if answers_too; true if records
  // arrived meanwhile (they may have come without a wake-up: the caller takes
  // them).
  bool end_lease(bool answers_too);
  void close();

  // Tests: the raw mapping, to write hostile contents into it.
  std::span<uint8_t> raw() { return {base_, kHeaderBytes + size_}; }

 private:
  HostRing(uint8_t* base, size_t size) : base_(base), size_(size) {}
  uint64_t& word(size_t at) const { return *reinterpret_cast<uint64_t*>(base_ + at); }

  uint8_t* base_;
  size_t size_;
  // Each side's own copy of its counter: the shared one is only published,
  // never read back (the peer may have written anything there).
  uint64_t head_ = 0;
  uint64_t tail_ = 0;  // published: the producer may reuse what lies before it
  uint64_t read_ = 0;  // the next record to read (read_ >= tail_)
  int holds_ = 0;
};

}  // namespace softverbs::fabric

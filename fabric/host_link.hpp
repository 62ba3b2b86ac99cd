// The lossless path between emulated devices of different processes on one
// host: each device also listens on an AF_UNIX SOCK_SEQPACKET socket in the
// abstract namespace named after its IPv4 address ("\0softverbs/roce/A.B.C.D"),
// and a packet for an address that has such a name goes through a connection
// to it instead of UDP.
//
// Why: the kernel drops UDP datagrams silently when a receiver's socket buffer
// is full, and an ordinary user cannot raise that buffer past
// net.core.rmem_max (208 KiB on Debian). RC recovers from the loss, UC and UD
// cannot. A local socket never drops: a sender whose receiver is behind
// waits, which is what a lossless (PFC) RoCE fabric gives its senders. The
// wait is bounded (SOFTVERBS_HOST_LINK), so a receiver that stops reading costs
// a counted drop, never a hang; and while a sender waits it keeps taking its
// own device's incoming packets off its sockets, so two devices that send to
// each other with full queues cannot block each other.
//
// SOCK_SEQPACKET rather than SOCK_DGRAM: both keep packet boundaries, but an
// unconnected datagram receiver holds only net.unix.max_dgram_qlen packets
// (10 without systemd's setting), while a connection holds what the sender's
// buffer allows (net.core.wmem_max for an ordinary user).
//
// Every other destination (a kernel rxe peer, another host, a process with the
// path turned off) has no such name and gets UDP from the inner link, which
// stays bound: it is what claims the address, and what real peers reach.
// Packets keep their exact RoCEv2 bytes (BTH..ICRC); an 8-byte prefix carries
// the sender's IPv4 address, so the receive path, the capture and the fault
// layer see exactly what UDP would have given them (source address, port 4791).
// Abstract names belong to the network namespace, as UDP addresses do, and
// vanish with the socket, so a stale name cannot exist.
//
// Shared-memory rings (fabric/host_ring.hpp). A connection's first message
// passes a sealed memfd (SCM_RIGHTS): a ring the sender then writes its packets
// into, prefix and bytes as above, with no system call per packet. The
// connection stays for what a ring cannot say: a wake-up (an 8-byte message)
// when the receiver said it is going to sleep (the ring's need_wake, taken down
// by the one sender that sends it: one wake-up per sleep, not per packet), and
// the end of either process (EOF or EPIPE on the connection). The receiver
// reads its rings on every drain, and on every ibv_poll_cq of an application
// thread (poll_shared(): memory reads only). The progress thread, woken through
// the connection's epoll, keeps reading the rings for kSpin after the last
// record before it arms them and sleeps, so a stream of packets (a WRITE's
// data, its ACK) costs one wake-up per burst rather than per packet. A full
// ring makes the sender wait as a full socket did (bounded, taking in its own
// device's packets meanwhile). A receiver that closes its ring (its HostLink
// went away) or whose process ends (the sender's epoll set watches its own
// connections for their end; a liveness poll() until the receiver has mapped
// the ring and every kLivenessEvery packets after) sends the sender back to
// peer_for(),
// and a ring whose contents break its rules is dropped with its connection.
// Where no memfd can be made, packets go on the connection as before;
// SOFTVERBS_HOST_LINK=socket keeps them there.
//
// Wake-up leases. An application thread that polls a CQ again with nothing
// found and nothing posted in between (the scheduler's busy epoch unchanged)
// reads the rings itself on every poll, so a wake-up of the progress thread for
// a packet it is about to read costs a context switch on its CPU and a system
// call on the sender's for nothing (an ACK its ibv_poll_cq waits for, the
// peer's SEND in ib_send_lat). Such a poll writes a lease into its rings (now +
// kLease, renewed at half-time), and a sender that finds one leaves need_wake
// for later instead of waking. The lease ends when the thread goes off to work
// (RealTimeScheduler::note_busy: it posts, or a poll found completions) or may
// block (note_may_block, wait_readable): the rings get 0, and records that
// came meanwhile are read by that thread itself, as its next poll would have,
// the few looks' rest by the progress thread. Answers to this device's own
// requests (ACKs, RDMA READ and atomic responses) have a lease of their own
// that going off to work does not end: what they bring is seen only by a
// poll, which reads the rings, or by a thread that blocks through the
// library, which ends it; so a streaming requester (ib_write_bw's client,
// which posts and finds completions all the time) is not preempted by its
// progress thread for every burst of ACKs. A thread that stops polling
// without blocking through the library leaves a packet that came meanwhile
// waiting until the lease runs out (at most kLease): a timer of the progress
// thread then serves what came. A sender leaves a wake-up out only while the
// lease lasts beyond its clock by kLeaseMargin.
//
// Two costs a ring does not need (docs/wire.md §1.1.1): its packets are parsed
// where they lie in the mapping (only the record's length and prefix are read
// into private memory first, the parser reads each header field once, the QP
// copies the payload once), and they carry no ICRC to a receiver that
// published kRingTakesNoIcrc in the ring, marked by their prefix ('S' 'V' 4).
// A packet built without its ICRC that ends up going another way gets it in
// send(). Where nothing on the sender's side needs the whole packet either, it
// comes in pieces (send_gathered, fabric/host_gather.cpp: headers, payload
// straight from the sender's registered memory, zero tail), copied once into
// the record the built packet would have made.
#pragma once

#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fabric/host_ring.hpp"
#include "fabric/link.hpp"
#include "fabric/scheduler.hpp"

namespace softverbs::fabric {

struct HostLinkOptions {
  bool enabled = true;  // false: UDP only ("udp")
  // How long a sender waits for a full receiver before it drops the packet.
  std::chrono::milliseconds wait{100};
  bool ring = true;  // false: packets on the connection ("socket")
};

// SOFTVERBS_HOST_LINK: "unix" (the default), "unix:MS", "socket", "socket:MS"
// or "udp"; nullopt and
// *error set for anything else.
std::optional<HostLinkOptions> parse_host_link(const char* text, std::string* error);
// The process's options, from the environment at the first call (a bad value
// is logged and the default used).
const HostLinkOptions& host_link_options();

class HostLink final : public LinkDecorator, private RealTimeScheduler::LeaseHolder {
 public:
  // The prefix in front of every packet on the connections and in the rings
  // (docs/wire.md §1.1.1).
  static constexpr size_t kPrefixBytes = 8;

  // Binds the abstract name of addr and listens on it (non-blocking,
  // close-on-exec); returns the socket, or -errno.
  static int bind(in_addr addr);
  // The abstract name of addr, with its leading NUL.
  static std::string name_of(in_addr addr);

  // `inner` is the device's UDP link; `fd` a socket from bind(), owned from now
  // on, or -1 (every packet then goes to `inner`). `counters` gets the packets
  // dropped after the wait.
  HostLink(Link& inner, RealTimeScheduler& scheduler, int fd, in_addr self, LinkCounters& counters,
           HostLinkOptions options, std::string name);
  ~HostLink() override;
  HostLink(const HostLink&) = delete;
  HostLink& operator=(const HostLink&) = delete;

  // icrc false (the packet's ICRC field was not computed) only where
  // needs_icrc(dst) said false; should the packet then go another way (the
  // ring's receiver went away), it gets its ICRC here first.
  void send(in_addr dst, std::span<const uint8_t> packet, uint8_t tos = 0, bool icrc = true) override;
  // False for a destination whose ring's receiver takes packets without their
  // ICRC (the shared memory between two processes of one user is no wire:
  // docs/wire.md §1.1.1); true for everything else, the inner link's UDP included.
  bool needs_icrc(in_addr dst) override;
  // A packet in pieces (Link::send_gathered) into the ring of a destination
  // that needs no ICRC (needs_icrc false): its headers, payload and tail are
  // each copied once into the ring's record, the same record send() would
  // write for the built packet. False, with nothing sent, for any other
  // destination (no connection yet, the socket mode, UDP) or when the ring's
  // receiver went away: the caller then builds the packet and send()s it.
  bool send_gathered(in_addr dst, const wire::GatheredPacket& packet, uint8_t tos) override;
  // The inner link's batch, then what waits for this device on the host path.
  bool drain() override;
  // The rings only: no system call (Link::poll_shared).
  bool poll_shared() override;
  void watch() override;
  std::string rx_state() override;

  // How many sends found their receiver full and waited (diagnostics, tests).
  uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }
  // How many wake-ups this device sent to receivers of its rings, and how
  // many of the rings it receives on ask for one (diagnostics, tests).
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  size_t armed_rings();

 private:
  // A destination reached through its abstract name: a connection to it.
  struct Peer {
    explicit Peer(int f) : fd(f) {}
    ~Peer();
    int fd;
    // A wait for it ran out: later packets do not wait until one goes through.
    std::atomic<bool> stalled{false};
    // The ring the packets go into (null: on the connection), one writer at a time.
    std::mutex ring_mu;
    std::unique_ptr<HostRing> ring;
    uint32_t since_check = 0;  // packets put since the connection was last looked at
    std::atomic<bool> dead{false};  // the progress thread saw the connection end
  };
  // An accepted connection and the ring its sender passed over it (shared
  // with the batches that point into it, which keep it mapped).
  struct Conn {
    int fd;
    std::shared_ptr<HostRing> ring;
  };
  struct Entry {
    std::shared_ptr<Peer> peer;  // null: UDP, until retry_at
    Clock::time_point retry_at{};
  };
  struct Datagram {
    in_addr src;
    uint8_t tos;  // the sender's TOS byte, from the prefix
    std::vector<uint8_t> owned;  // the bytes, when copied (a connection's, the stash's)
    const uint8_t* in_ring = nullptr;  // else the bytes in a held ring
    size_t len = 0;
    bool icrc_skipped = false;  // sent without its ICRC (IpFields::icrc_skipped)
    std::span<const uint8_t> bytes() const {
      return in_ring ? std::span<const uint8_t>(in_ring, len) : std::span<const uint8_t>(owned);
    }
  };
  // Packets taken for delivery. in_place: ring records are left where they
  // are, and their rings held (HostRing::hold) until delivered; else copied.
  // Vectors: every poll makes a batch, and one that finds nothing allocates
  // nothing (a std::deque allocates when it is made: a malloc and free per
  // ibv_poll_cq, 5 % of a streaming client's samples).
  struct Batch {
    explicit Batch(bool place) : in_place(place) {}
    std::vector<Datagram> packets;
    std::vector<std::shared_ptr<HostRing>> held;
    bool in_place;
  };

  std::shared_ptr<Peer> peer_for(in_addr dst);
  void forget(in_addr dst, const std::shared_ptr<Peer>& peer);
  // One attempt through a peer: 1 sent, 0 dropped (counted), -1 the peer is gone.
  int send_to(const std::shared_ptr<Peer>& peer, in_addr dst, std::span<const uint8_t> packet, uint8_t tos,
              bool icrc);
  // A ring record of `parts` (the prefix, then the packet), `len` bytes in all.
  int send_ring(Peer& peer, in_addr dst, std::span<const std::span<const uint8_t>> parts, size_t len);
  // The 8-byte prefix of a packet sent with TOS byte tos; icrc false: one
  // whose ICRC was not computed (only for a ring whose receiver takes that).
  void prefix_for(uint8_t tos, bool icrc, uint8_t* out) const;
  // The peer dst has a connection to now, or null (none made here).
  std::shared_ptr<Peer> known_peer(in_addr dst);
  // Whether a peer's receiver takes packets without their ICRC.
  static bool takes_no_icrc(const Peer& peer);
  // Gives a new connection its ring (the first message); false: none.
  bool offer_ring(Peer& peer);
  // Waits for room in a peer's ring like wait_for_room; false when the time
  // ran out or the peer is gone (*gone).
  bool wait_for_ring(Peer& peer, Clock::time_point deadline, bool* gone);
  // Under rx_mu_: what waits in the rings, into `out`; garbled rings are dropped.
  bool read_rings_locked(Batch& out);
  bool read_ring_locked(Conn& c, Batch& out);
  void close_connection_locked(size_t i);
  // The progress thread's turn: drain, keep reading the rings for kSpin,
  // then arm them and sleep.
  void serve();
  // Wake-up leases (fabric/host_lease.cpp). An application thread's poll at
  // `now`: starts or renews the lease (under rx_mu_).
  void renew_lease_locked(Clock::time_point now);
  // An application thread's poll: the time for its lease and app_poll_ (read
  // anew every few polls while a lease lasts; it also stores app_poll_).
  Clock::time_point poll_time();
  // What a sender compares a receiver's lease with: now, plus the margin.
  uint64_t lease_horizon_ns() const;
  void end_lease(bool answers_too) override;
  // The progress thread, when a lease may have run out: serves what came.
  void check_lease();
  bool rings_pending();
  // This thread's polls are end_lease()'s looks (they renew no lease) while on.
  static void ending_lease(bool on);
  // Hands a batch up, then lets go of the rings it held.
  void deliver(Batch& batch);
  // Waits for room at the peer until `deadline`, taking this device's own
  // incoming packets into the stash meanwhile. False when the time ran out.
  bool wait_for_room(int peer_fd, Clock::time_point deadline);
  void pull_into_stash();
  // Under rx_mu_: accepts new connections and appends what waits on the
  // connections (at most kPerConnection each) to `out`. True if it did anything.
  bool collect_locked(Batch& out);
  // Reads one connection; closes it at its end.
  bool read_connection_locked(int conn, Batch& out);

  RealTimeScheduler& scheduler_;
  int fd_;
  in_addr self_;
  LinkCounters& counters_;
  HostLinkOptions options_;
  std::string name_;
  uint8_t prefix_[8];
  std::once_flag watched_;
  std::atomic<uint64_t> waits_{0};
  std::atomic<uint64_t> wakeups_{0};

  std::mutex peers_mu_;
  std::unordered_map<in_addr_t, Entry> peers_;

  // The listening socket and the accepted connections, in one epoll set that
  // the progress thread watches. Reads (drain and a waiting sender) hold
  // rx_mu_, so the stash always holds packets older than the sockets'.
  int epoll_ = -1;
  std::mutex rx_mu_;
  std::vector<Conn> connections_;
  // Our connections to the receivers we write rings to, watched for their end.
  std::unordered_map<int, std::weak_ptr<Peer>> outgoing_;
  std::atomic<bool> any_ring_{false};      // some connection has a ring: poll_shared looks
  std::atomic<bool> serve_posted_{false};  // a serve() is queued (for a wake-up another thread read, a lease's rest)
  std::atomic<bool> watching_{false};  // watch() ran: the progress thread serves this link
  std::atomic<bool> unserved_wake_{false};  // a wake-up was read before watch()
  // When an application thread last polled the rings (Clock ticks since its epoch).
  std::atomic<Clock::duration::rep> app_poll_{0};
  Batch stash_{false};
  std::atomic<bool> stash_pending_{false};

  // The wake-up lease (see the file comment): whether this link lends them
  // (its scheduler hears the application threads), until when the rings say
  // for every packet and for answers (Clock ticks; 0: none; answers_until_
  // is never before lease_until_), and whether check_lease() is queued.
  bool leases_ = false;
  std::atomic<Clock::duration::rep> lease_until_{0};
  std::atomic<Clock::duration::rep> answers_until_{0};
  std::atomic<bool> lease_timer_{false};
  // check_lease() runs on a timer: it finds this link gone through it.
  std::shared_ptr<char> alive_ = std::make_shared<char>(0);
};

}  // namespace softverbs::fabric
